// Causal attention through cuDNN's fused flash attention (its graph API, cudnn_graph.hpp): the path
// Megatron's `--attention-backend fused` names, and the fastest on Hopper and Blackwell. With
// QkvRows::Fused, the same layouts as attention_flash.hpp: q, k, v read from Megatron-Core's fused
// QKV rows (k and v in place; the query heads of a GQA group are gathered into a scratch buffer
// first, since their columns are not an affine function of the head), dqkv in the fused layout.
// With QkvRows::Split (qkv_rows.hpp, what the QK norm can write), q, k and v are all read in place
// and dqkv is written in the split layout: no gather, no scatter. With QkvRows::Separate, q, k and v
// (and their gradients) are buffers of their own, the value head dim may differ from the query's
// (multi-latent attention: 192 and 128 at DeepSeek-V2-Lite's size). ctx is written in [b*s, H*Dv],
// lse [b, H, s] (the natural-log softmax denominator of the scaled scores, as cuDNN's "stats").
//
// Tried and dropped (fifteenth session): one execution a query group, reading the group's Q
// consecutive query heads and its k and v in place (no gather, no scatter). cuDNN ran those
// smaller GQA problems slower than the whole one plus both copies, fwd+bwd TFLOP/s gathered ->
// per group: 363 -> 337 (b=8 H=16 G=4 s=4096 D=64), 348 -> 296 (b=4), 322 -> 237 (b=2), 395 -> 271
// (b=1 H=32 G=8 s=8192); the flagship's step at micro-batch 8 557.5 -> 563.9 ms.
//
// Documents (packed variable-length sequences, --reset-attention-mask or packed fine-tuning rows):
// the micro-batch's documents become the batch of cuDNN's graphs (its ragged offsets and padding
// mask, as Transformer Engine's THD layout), each attending causally within itself; the plans are
// built per document count bucket (documents_bucket), at the full row length. The statistics (lse)
// are then token-major, [b*s, H].
//
// No attention dropout: cuDNN draws its own random numbers, which could not match the CPU's mask,
// so a model with attention dropout keeps our flash kernels. The plans for one shape are built at
// construction (once, outside the step); construction throws laoyao::Error with cuDNN's reason
// when it has no engine for the shape.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_reference.hpp"
#include "kernels/cuda/cudnn_graph.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/qkv_rows.hpp"

namespace laoyao::kernels::cuda {

// A micro-batch's documents, for cuDNN's attention over them (device memory, filled by
// fill_cudnn_documents on the host and copied).
struct CudnnDocuments {
  int64_t count = 0;                // the plans' batch: documents_bucket(the documents)
  const int64_t* start = nullptr;   // [count + 1]: document i is tokens [start[i], start[i + 1]) of b*s
  const int32_t* length = nullptr;  // [count]: start[i + 1] - start[i], 0 past the last document
};

// The plans' document count for n documents (as Transformer Engine buckets its THD batches): 32 up
// to 32, then the next power of two up to 512, then the next multiple of 512.
int64_t documents_bucket(int64_t n);

// The documents that key_start [b*s] (host; each query's first key) describes: start and length
// (host) resized to documents_bucket of their number (+ 1 for start), which is returned; at most
// documents_bucket(b*s). Throws laoyao::Error unless key_start is documents: key_start[t] the place
// of the first token of t's document, documents of consecutive tokens within each sequence.
int64_t fill_cudnn_documents(const int32_t* key_start, int64_t b, int64_t s, std::vector<int64_t>& start,
                             std::vector<int32_t>& length);

class CudnnAttention {
 public:
  // The shape's b is the largest batch the object serves; forward/backward take the actual one
  // (plans are built once per distinct batch size, and kept with their workspace: a captured CUDA
  // graph may still name them).
  // With documents, the plans over documents (CudnnDocuments) are built instead, the smallest
  // bucket's at construction (cuDNN's engines for them checked), the others at their first use.
  CudnnAttention(const AttentionShape& shape, cudaStream_t stream, QkvRows rows = QkvRows::Fused,
                 bool documents = false);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Head dims cuDNN's fused kernels take: multiples of 8 up to max_head_dim (128 for QKV rows, 256
  // for separate rows, whose larger dims cuDNN's Hopper engines take; construction says when not).
  static bool supports(const AttentionShape& shape);
  static int64_t max_head_dim(const AttentionShape& shape) { return shape.Dv > 0 ? 256 : 128; }

  // ctx [b*s, H*D] and lse [b, H, s] overwritten; qkv (and dqkv) in the constructor's rows (Fused
  // or Split). With docs (not null), attention within each document, lse [b*s, H].
  void forward(const __nv_bfloat16* qkv, __nv_bfloat16* ctx, float* lse, int64_t b,
               const CudnnDocuments* docs = nullptr);
  // dqkv overwritten (every element; with documents, every element of a token of one).
  void backward(const __nv_bfloat16* qkv, const __nv_bfloat16* ctx, const __nv_bfloat16* dctx, const float* lse,
                __nv_bfloat16* dqkv, int64_t b, const CudnnDocuments* docs = nullptr);
  // QkvRows::Separate: q [b*s, H*D], k [b*s, G*D], v [b*s, G*Dv] -> ctx [b*s, H*Dv], lse; the
  // backward overwrites dq, dk and dv.
  void forward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* ctx,
               float* lse, int64_t b, const CudnnDocuments* docs = nullptr);
  void backward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const __nv_bfloat16* ctx,
                const __nv_bfloat16* dctx, const float* lse, __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                int64_t b, const CudnnDocuments* docs = nullptr);

  // The engines in use, for `laoyao doctor` and logs: "sdpa forward engine N, sdpa backward engine M".
  std::string engines() const;
  int64_t device_bytes() const;  // workspace and scratch held
  const AttentionShape& shape() const { return shape_; }
  QkvRows rows() const { return rows_; }
  // Its cuDNN handle, on its stream (for graphs built beside its own: attention_cudnn_cp.hpp).
  cudnnHandle_t handle() const { return handle_; }

 private:
  struct Plans {
    CudnnPlan fwd, bwd;
    DeviceBuffer workspace;  // cuDNN's own, for both plans
    DeviceBuffer offsets;    // documents: each tensor's element offsets of them, [kinds][count + 1]
  };
  // The plans for b sequences, or (documents > 0) for that many documents (a documents_bucket).
  Plans& plans_for(int64_t b, int64_t documents);
  // The bindings of the documents' lengths and offsets (computed into p.offsets on the stream).
  void bind_documents(Plans& p, const CudnnDocuments* docs, std::vector<CudnnPlan::Binding>& bindings);
  void run_forward(int64_t b, const CudnnDocuments* docs, const __nv_bfloat16* q, const __nv_bfloat16* k,
                   const __nv_bfloat16* v, __nv_bfloat16* ctx, float* lse);
  void run_backward(int64_t b, const CudnnDocuments* docs, const __nv_bfloat16* q, const __nv_bfloat16* k,
                    const __nv_bfloat16* v, const __nv_bfloat16* ctx, const __nv_bfloat16* dctx, const float* lse,
                    __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv);
  bool gathers_q() const { return rows_ == QkvRows::Fused && shape_.H != shape_.G; }
  // Where cuDNN reads the query heads: qkv itself (MHA, split rows), or q_ after gathering them.
  const __nv_bfloat16* query_heads(const __nv_bfloat16* qkv, const AttentionShape& a);
  size_t dq_accum_bytes() const;          // the fp32 dQ accumulator, full batch (over documents, dQ's layout)
  size_t backward_scratch_bytes() const;  // our part of the workspace: dQ accumulator, row sums

  AttentionShape shape_;
  cudaStream_t stream_;
  QkvRows rows_;
  bool documents_;
  cudnnHandle_t handle_ = nullptr;
  std::map<std::pair<bool, int64_t>, std::unique_ptr<Plans>> plans_;  // by (documents, batch size)
  DeviceBuffer scratch_;  // our part of the backward's workspace (dQ accumulator, row sums), full batch
  DeviceBuffer q_, dq_;  // GQA from fused rows: the gathered query heads [b*s, H*D] and their gradient
  float scale_ = 0.0f;   // by-value scalar: cuDNN reads it from host memory at execution
};

}  // namespace laoyao::kernels::cuda
