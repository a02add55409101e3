// Context parallelism's attention through cuDNN (Megatron-Core's split, --context-parallel-size):
// each sequence is cut into 2 cp_size chunks and this rank holds chunks cp_rank and
// 2 cp_size - 1 - cp_rank, in that order (get_batch_on_this_cp_rank), so its queries meet the
// whole sequence's keys with balanced causal work. The attention is computed in blocks merged by
// their log-sum-exp, as Transformer Engine's context-parallel attention merges its steps':
//   - the rank's own tokens, causal (its two chunks are in order, so one causal block over its 2c
//     tokens is exactly their attention among themselves): CudnnAttention, as without CP;
//   - the other ranks' keys, which every rank's keys and values (all-gathered) put in place order,
//     leaving out this rank's two chunks: chunk cp_rank's queries see the first cp_rank of those
//     remote chunks, chunk 2 cp_size - 1 - cp_rank's the first 2 cp_size - 2 - cp_rank, each in
//     full (no mask): two unmasked cuDNN blocks with fewer queries than keys.
// The backward runs the same blocks against the merged output and statistics (which give each
// block's exact share of the softmax), adds the blocks' query gradients, and sends each remote
// key's and value's gradient back to its rank (reduce-scatter), where it joins the local ones.
//
// --cp-comm-type all_gather: one exchange of keys and values per pass (an all-gather), the blocks
// above. --cp-comm-type p2p (Megatron's default, given a ring exchange): Transformer Engine's
// ring. Step i (1 .. cp_size - 1) attends the keys and values of rank j = cp_rank - i (mod
// cp_size), which arrive from the previous rank while step i - 1's block runs (a second stream;
// each rank passes on what it received). Rank j's chunks are j and 2 cp_size - 1 - j, so for
// j < cp_rank both query chunks see its first chunk alone (2c queries, c keys), and for
// j > cp_rank only the second query chunk sees it, both chunks (c queries, 2c keys); one unmasked
// cuDNN block a step, merged as it lands. The backward passes the keys and values around again,
// and beside them each source's key and value gradients, which every rank adds its block's to
// before passing them on, so that after the last step they arrive home.
// Fused or split QKV rows (qkv_rows.hpp); not separate ones (multi-latent attention), not
// documents, no dropout. The collectives are the caller's (kernels know no process group),
// enqueued in the same order on every rank.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "kernels/cuda/attention_cudnn.hpp"
#include "kernels/cuda/device_buffer.hpp"

namespace laoyao::kernels::cuda {

struct CpCollectives {
  // Every rank's n bf16 elements at send, rank after rank into recv [cp_size * n].
  std::function<void(const __nv_bfloat16* send, __nv_bfloat16* recv, size_t n)> all_gather;
  // recv [n] = the sum over the ranks of their send [cp_rank * n, (cp_rank + 1) * n).
  std::function<void(const __nv_bfloat16* send, __nv_bfloat16* recv, size_t n)> reduce_scatter;
  // p2p (optional: without it, the all-gather's blocks): n elements of send to rank cp_rank + 1 and
  // n from rank cp_rank - 1 into recv (mod cp_size), on `stream`.
  std::function<void(const __nv_bfloat16* send, __nv_bfloat16* recv, size_t n, cudaStream_t stream)> ring;
};

class CudnnCpAttention {
 public:
  using bf16 = __nv_bfloat16;
  // local: the causal attention over this rank's tokens (its shape's s: the rank's 2 chunks of a
  // sequence; b: the largest batch), on `stream`. Throws laoyao::Error for separate rows, an odd s,
  // or a cp_rank outside 0..cp_size-1.
  // Its cuDNN graphs run through local's handle (so `stream` must be local's).
  CudnnCpAttention(CudnnAttention& local, int64_t cp_rank, int64_t cp_size, cudaStream_t stream, CpCollectives comm);
  CudnnCpAttention(const CudnnCpAttention&) = delete;
  CudnnCpAttention& operator=(const CudnnCpAttention&) = delete;
  ~CudnnCpAttention();
  bool ring() const { return static_cast<bool>(comm_.ring); }

  // As CudnnAttention's, for the rank's queries against the whole sequences' keys: ctx [b*s, H*D]
  // and lse [b, H, s] overwritten.
  void forward(const bf16* qkv, bf16* ctx, float* lse, int64_t b);
  // dqkv overwritten (in the local attention's rows).
  void backward(const bf16* qkv, const bf16* ctx, const bf16* dctx, const float* lse, bf16* dqkv, int64_t b);

  int64_t device_bytes() const;

 private:
  enum Half { kFirst = 0, kSecond = 1 };  // the rank's chunk cp_rank, and chunk 2 cp_size - 1 - cp_rank
  // The blocks' shapes: the all-gather's (a half's queries against a prefix of the remote keys),
  // and the ring's, against an earlier rank's first chunk (every query) or a later rank's two
  // chunks (the second half's queries).
  enum Block { kGatheredFirst = 0, kGatheredSecond = 1, kRingEarlier = 2, kRingLater = 3 };
  struct Plans {
    CudnnPlan fwd, bwd;
    DeviceBuffer workspace;
  };
  // The remote chunks half's queries see (a prefix of the remote keys), and their plans for b.
  int64_t remote_chunks(Half half) const { return half == kFirst ? cp_rank_ : 2 * cp_size_ - 2 - cp_rank_; }
  Plans& plans_for(int64_t b, Block block);
  // The queries packed [b*s, H*D] (fused rows: gathered into q_; split rows: qkv itself), and this
  // rank's keys and values [b*s, G*2D] (fused rows: into kv_; split rows: within qkv).
  std::pair<const bf16*, const bf16*> pack(const bf16* qkv, int64_t b);
  // Every rank's keys and values gathered and put in place order into remote_ [b, remote chunks,
  // G*2D]; returns the packed queries.
  const bf16* gather(const bf16* qkv, int64_t b);
  void forward_gathered(const bf16* qkv, bf16* ctx, float* lse, int64_t b);
  void backward_gathered(const bf16* qkv, const bf16* ctx, const bf16* dctx, const float* lse, bf16* dqkv, int64_t b);
  void forward_ring(const bf16* qkv, bf16* ctx, float* lse, int64_t b);
  void backward_ring(const bf16* qkv, const bf16* ctx, const bf16* dctx, const float* lse, bf16* dqkv, int64_t b);
  // The ring's block of step i: the source rank's kind, and its queries' offset (tokens).
  Block ring_block(int64_t step) const { return (cp_rank_ - step + cp_size_) % cp_size_ < cp_rank_ ? kRingEarlier : kRingLater; }
  // The ring's exchange of n elements on comm_, after what `stream_` has enqueued so far; join():
  // stream_ waits for everything enqueued on comm_.
  void ring_exchange(const bf16* send, bf16* recv, size_t n);
  void join();
  // The key and value gradients that came home join dqkv's keys' and values' rows.
  void add_kv_grads(bf16* dqkv, const bf16* dkv, int64_t b);
  // The remote blocks' query gradients [b*s, H*D] join dqkv's queries' rows.
  void add_q_grads(bf16* dqkv, const bf16* dq, int64_t b);
  // The remote chunk index of rank `rank`'s `half`, among the remote chunks in place order.
  int64_t remote_index(int64_t rank, Half half) const;

  CudnnAttention& local_;
  AttentionShape shape_;  // the local attention's
  QkvRows rows_;
  int64_t cp_rank_, cp_size_, chunk_;  // chunk_: tokens of a chunk (s / 2)
  cudaStream_t stream_;
  CpCollectives comm_;
  std::map<std::pair<int64_t, int>, std::unique_ptr<Plans>> plans_;  // by (batch, half)
  float scale_ = 0.0f;
  // Scratch for the largest batch (T = b*s tokens, a key/value row G*2D): q_ [T, H*D] (fused rows),
  // kv_ [T, G*2D] (fused rows: the keys and values sent), all_ [cp][T, G*2D] (gathered; in the
  // backward the gradients sent back), remote_ and dremote_ [b, 2cp - 2 chunks, G*2D], dfirst_ (the
  // first half's key gradients, remote_'s layout), part_ [T, H*D] (the remote blocks' output, in the
  // backward their query gradient), part_lse_ [b, H, s], recv_ [T, G*2D], and cuDNN's backward
  // scratch (dQ accumulator [b, H, c, D], row sums [b, H, c]).
  DeviceBuffer q_, kv_, all_, remote_, dremote_, dfirst_, part_, part_lse_, recv_, dq_accum_, row_sums_;
  // The ring's: keys and values received [2][T, G*2D] (one arriving while the other is attended),
  // the travelling key and value gradients [2][T, G*2D], a block's own [T, G*2D], and the query
  // gradients' sum [T, H*D]; its stream and events.
  DeviceBuffer ring_kv_, ring_dkv_, block_dkv_, dq_sum_;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, joined_ = nullptr;
};

}  // namespace laoyao::kernels::cuda
