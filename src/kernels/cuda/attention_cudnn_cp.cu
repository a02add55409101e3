// Context parallelism's attention through cuDNN (see attention_cudnn_cp.hpp).
#include "kernels/cuda/attention_cudnn_cp.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/sdpa_graph.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using Dims = CudnnGraph::Dims;

constexpr int kThreads = 256;

int blocks_for(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535)); }

// dst[i * dst_pitch + j] (+)= src[i * src_pitch + j] for i < height, j < width (elements, bf16; the
// sum in fp32), in units of V elements (V = 8: 16-byte vectors, when every pitch, width and
// pointer allows).
template <int V, bool kAdd>
__global__ void copy_rows_kernel(bf16* __restrict__ dst, int64_t dst_pitch, const bf16* __restrict__ src,
                                 int64_t src_pitch, int64_t height, int64_t width) {
  const int64_t per_row = width / V, n = height * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, j = (i % per_row) * V;
    bf16* d = dst + r * dst_pitch + j;
    const bf16* s = src + r * src_pitch + j;
    if constexpr (V == 8) {
      uint4 sv = *reinterpret_cast<const uint4*>(s);
      if constexpr (kAdd) {
        uint4 dv = *reinterpret_cast<const uint4*>(d);
        bf16* a = reinterpret_cast<bf16*>(&dv);
        const bf16* b = reinterpret_cast<const bf16*>(&sv);
#pragma unroll
        for (int k = 0; k < 8; ++k) a[k] = __float2bfloat16(__bfloat162float(a[k]) + __bfloat162float(b[k]));
        sv = dv;
      }
      *reinterpret_cast<uint4*>(d) = sv;
    } else {
      *d = kAdd ? __float2bfloat16(__bfloat162float(*d) + __bfloat162float(*s)) : *s;
    }
  }
}

void copy_rows(bf16* dst, int64_t dst_pitch, const bf16* src, int64_t src_pitch, int64_t height, int64_t width,
               bool add, cudaStream_t stream) {
  if (height <= 0 || width <= 0) return;
  const bool vec = dst_pitch % 8 == 0 && src_pitch % 8 == 0 && width % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  const int64_t n = height * (vec ? width / 8 : width);
  if (vec && add)
    copy_rows_kernel<8, true><<<blocks_for(n), kThreads, 0, stream>>>(dst, dst_pitch, src, src_pitch, height, width);
  else if (vec)
    copy_rows_kernel<8, false><<<blocks_for(n), kThreads, 0, stream>>>(dst, dst_pitch, src, src_pitch, height, width);
  else if (add)
    copy_rows_kernel<1, true><<<blocks_for(n), kThreads, 0, stream>>>(dst, dst_pitch, src, src_pitch, height, width);
  else
    copy_rows_kernel<1, false><<<blocks_for(n), kThreads, 0, stream>>>(dst, dst_pitch, src, src_pitch, height, width);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

// The remote blocks' output and statistics (part, part_lse) merged into the local block's (ctx,
// lse), in place, for the tokens of the halves that have them: with L = log(e^l1 + e^l2), out =
// e^(l1 - L) o1 + e^(l2 - L) o2 in fp32. One thread a (token, head) row of D values.
__global__ void merge_blocks(bf16* __restrict__ ctx, float* __restrict__ lse, const bf16* __restrict__ part,
                             const float* __restrict__ part_lse, int64_t b, int64_t H, int64_t s, int64_t D,
                             bool first, bool second) {
  const int64_t n = b * s * H, c = s / 2;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i % H, t = i / H, bi = t / s, pos = t % s;
    if (!(pos < c ? first : second)) continue;
    const int64_t at = (bi * H + h) * s + pos;
    const float l1 = lse[at], l2 = part_lse[at], m = fmaxf(l1, l2);
    const float L = m + log1pf(expf(-fabsf(l1 - l2)));
    const float w1 = expf(l1 - L), w2 = expf(l2 - L);
    bf16* o = ctx + (t * H + h) * D;
    const bf16* p = part + (t * H + h) * D;
    for (int64_t d = 0; d < D; ++d)
      o[d] = __float2bfloat16(w1 * __bfloat162float(o[d]) + w2 * __bfloat162float(p[d]));
    lse[at] = L;
  }
}

size_t bf16_bytes(int64_t n) { return sizeof(bf16) * static_cast<size_t>(n); }

}  // namespace

CudnnCpAttention::CudnnCpAttention(CudnnAttention& local, int64_t cp_rank, int64_t cp_size, cudaStream_t stream,
                                   CpCollectives comm)
    : local_(local),
      shape_(local.shape()),
      rows_(local.rows()),
      cp_rank_(cp_rank),
      cp_size_(cp_size),
      chunk_(local.shape().s / 2),
      stream_(stream),
      comm_(std::move(comm)) {
  if (rows_ == QkvRows::Separate)
    throw Error("context-parallel attention: separate q, k and v rows (multi-latent attention) are not built");
  if (cp_size < 2 || cp_rank < 0 || cp_rank >= cp_size)
    throw Error("context-parallel attention: rank " + std::to_string(cp_rank) + " of " + std::to_string(cp_size));
  if (shape_.s % 2 != 0 || shape_.s <= 0)
    throw Error("context-parallel attention: a rank's " + std::to_string(shape_.s) +
                " tokens of a sequence are not two equal chunks");
  if (!comm_.ring && (!comm_.all_gather || !comm_.reduce_scatter))
    throw Error("context-parallel attention: no collectives");
  scale_ = shape_.scale;
  const AttentionShape& a = shape_;
  const int64_t T = a.b * a.s, kv_row = 2 * a.G * a.D, remote_tokens = a.b * (2 * cp_size - 2) * chunk_;
  if (rows_ == QkvRows::Fused) q_ = DeviceBuffer(bf16_bytes(T * a.H * a.D)), kv_ = DeviceBuffer(bf16_bytes(T * kv_row));
  part_ = DeviceBuffer(bf16_bytes(T * a.H * a.D));
  part_lse_ = DeviceBuffer(sizeof(float) * static_cast<size_t>(a.b * a.H * a.s));
  if (ring()) {  // (the earlier ranks' blocks take every query: cuDNN's backward scratch for s rows)
    ring_kv_ = DeviceBuffer(bf16_bytes(2 * T * kv_row));
    ring_dkv_ = DeviceBuffer(bf16_bytes(2 * T * kv_row));
    block_dkv_ = DeviceBuffer(bf16_bytes(T * kv_row));
    dq_sum_ = DeviceBuffer(bf16_bytes(T * a.H * a.D));
    dq_accum_ = DeviceBuffer(sizeof(float) * static_cast<size_t>(a.b * a.H * a.s * a.D));
    row_sums_ = DeviceBuffer(sizeof(float) * static_cast<size_t>(a.b * a.H * a.s));
    LAOYAO_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    LAOYAO_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    LAOYAO_CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
    if (cp_rank > 0) plans_for(a.b, kRingEarlier);  // (cuDNN's engines checked at construction)
    if (cp_rank < cp_size - 1) plans_for(a.b, kRingLater);
    return;
  }
  all_ = DeviceBuffer(bf16_bytes(cp_size * T * kv_row));
  remote_ = DeviceBuffer(bf16_bytes(remote_tokens * kv_row));
  dremote_ = DeviceBuffer(bf16_bytes(remote_tokens * kv_row));
  if (cp_rank > 0) dfirst_ = DeviceBuffer(bf16_bytes(remote_tokens * kv_row));
  recv_ = DeviceBuffer(bf16_bytes(T * kv_row));
  dq_accum_ = DeviceBuffer(sizeof(float) * static_cast<size_t>(a.b * a.H * chunk_ * a.D));
  row_sums_ = DeviceBuffer(sizeof(float) * static_cast<size_t>(a.b * a.H * chunk_));
  plans_for(a.b, kGatheredSecond);  // (cuDNN's engines for the blocks checked at construction)
  if (cp_rank > 0) plans_for(a.b, kGatheredFirst);
}

CudnnCpAttention::~CudnnCpAttention() {
  if (comm_stream_) {
    (void)cudaStreamSynchronize(comm_stream_);
    (void)cudaStreamDestroy(comm_stream_);
  }
  for (cudaEvent_t e : {fork_, joined_})
    if (e) (void)cudaEventDestroy(e);
}

CudnnCpAttention::Plans& CudnnCpAttention::plans_for(int64_t b, Block block) {
  if (b <= 0 || b > shape_.b)
    throw Error("context-parallel attention: batch " + std::to_string(b) + " outside 1.." + std::to_string(shape_.b));
  const auto key = std::make_pair(b, static_cast<int>(block));
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  const AttentionShape& a = shape_;
  const int64_t s = a.s, c = chunk_, kv_row = 2 * a.G * a.D, remote = (2 * cp_size_ - 2) * c;
  SdpaGeometry g;
  g.b = b, g.H = a.H, g.G = a.G, g.D = g.Dv = a.D;
  g.q = g.o = {s * a.H * a.D, a.D, a.H * a.D, 1};  // the rank's packed queries / output, or a half of them
  g.stats = {a.H * s, s, 1, 1};                      // [b, H, s], or a half of it
  switch (block) {
    case kGatheredFirst:
    case kGatheredSecond:  // a half's queries, the remote keys in place order
      g.sq = c, g.skv = remote_chunks(block == kGatheredFirst ? kFirst : kSecond) * c;
      g.k = g.v = {remote * kv_row, 2 * a.D, kv_row, 1};
      break;
    case kRingEarlier:  // every query, the source's first chunk (its rows' first c of s)
      g.sq = s, g.skv = c;
      g.k = g.v = {s * kv_row, 2 * a.D, kv_row, 1};
      break;
    case kRingLater:  // the second half's queries, the source's two chunks
      g.sq = c, g.skv = s;
      g.k = g.v = {s * kv_row, 2 * a.D, kv_row, 1};
      break;
  }
  g.softmax_sum = CudnnGraph::packed({b, a.H, g.sq, 1});
  g.dq_accum = CudnnGraph::packed({b, a.H, g.sq, a.D});
  g.causal = false;
  auto p = std::make_unique<Plans>();
  p->fwd = build_sdpa_forward(local_.handle(), g, "context-parallel sdpa forward (remote keys)");
  p->bwd = build_sdpa_backward(local_.handle(), g, "context-parallel sdpa backward (remote keys)");
  p->workspace = DeviceBuffer(static_cast<size_t>(std::max<int64_t>({p->fwd.workspace_bytes(),
                                                                      p->bwd.workspace_bytes(), 256})));
  return *plans_.emplace(key, std::move(p)).first->second;
}

int64_t CudnnCpAttention::remote_index(int64_t rank, Half half) const {
  const int64_t place = half == kFirst ? rank : 2 * cp_size_ - 1 - rank;
  return place - (cp_rank_ < place ? 1 : 0) - (2 * cp_size_ - 1 - cp_rank_ < place ? 1 : 0);
}

std::pair<const CudnnCpAttention::bf16*, const CudnnCpAttention::bf16*> CudnnCpAttention::pack(const bf16* qkv,
                                                                                                int64_t b) {
  const AttentionShape& a = shape_;
  const int64_t T = b * a.s, hd = a.H * a.D, Q = a.H / a.G;
  if (rows_ != QkvRows::Fused) return {qkv, qkv + T * hd};  // split rows: q [T, H*D], then the keys and values [T, G, 2, D]
  // Fused rows: a group's Q query heads, then its k and v, in each row.
  copy_rows(q_.as<bf16>(), Q * a.D, qkv, (Q + 2) * a.D, T * a.G, Q * a.D, false, stream_);
  copy_rows(kv_.as<bf16>(), 2 * a.D, qkv + Q * a.D, (Q + 2) * a.D, T * a.G, 2 * a.D, false, stream_);
  return {q_.as<bf16>(), kv_.as<bf16>()};
}

const CudnnCpAttention::bf16* CudnnCpAttention::gather(const bf16* qkv, int64_t b) {
  const AttentionShape& a = shape_;
  const int64_t s = a.s, c = chunk_, T = b * s, kv_row = 2 * a.G * a.D, remote = (2 * cp_size_ - 2) * c;
  const auto [q, send] = pack(qkv, b);
  comm_.all_gather(send, all_.as<bf16>(), static_cast<size_t>(T * kv_row));
  for (int64_t r = 0; r < cp_size_; ++r) {
    if (r == cp_rank_) continue;
    for (Half half : {kFirst, kSecond})
      copy_rows(remote_.as<bf16>() + remote_index(r, half) * c * kv_row, remote * kv_row,
                all_.as<bf16>() + (r * T + half * c) * kv_row, s * kv_row, b, c * kv_row, false, stream_);
  }
  return q;
}

void CudnnCpAttention::forward(const bf16* qkv, bf16* ctx, float* lse, int64_t b) {
  if (ring()) forward_ring(qkv, ctx, lse, b);
  else forward_gathered(qkv, ctx, lse, b);
}

void CudnnCpAttention::backward(const bf16* qkv, const bf16* ctx, const bf16* dctx, const float* lse, bf16* dqkv,
                                int64_t b) {
  if (ring()) backward_ring(qkv, ctx, dctx, lse, dqkv, b);
  else backward_gathered(qkv, ctx, dctx, lse, dqkv, b);
}

void CudnnCpAttention::forward_gathered(const bf16* qkv, bf16* ctx, float* lse, int64_t b) {
  const AttentionShape& a = shape_;
  const int64_t c = chunk_, hd = a.H * a.D;
  local_.forward(qkv, ctx, lse, b);
  const bf16* q = gather(qkv, b);
  const bf16* kv = remote_.as<bf16>();
  for (Half half : {kFirst, kSecond}) {
    if (remote_chunks(half) == 0) continue;
    Plans& p = plans_for(b, half == kFirst ? kGatheredFirst : kGatheredSecond);
    const std::vector<CudnnPlan::Binding> bindings{
        {kSdpaQ, q + half * c * hd},  {kSdpaK, kv}, {kSdpaV, kv + a.D}, {kSdpaO, part_.as<bf16>() + half * c * hd},
        {kSdpaStats, part_lse_.as<float>() + half * c}, {kSdpaScale, &scale_}, {kSdpaNegInf, &kSdpaNegInfValue}};
    p.fwd.execute(local_.handle(), bindings, p.workspace.ptr);
  }
  const int64_t rows = b * a.s * a.H;
  merge_blocks<<<blocks_for(rows), kThreads, 0, stream_>>>(ctx, lse, part_.as<bf16>(), part_lse_.as<float>(), b, a.H,
                                                          a.s, a.D, remote_chunks(kFirst) > 0, true);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

void CudnnCpAttention::backward_gathered(const bf16* qkv, const bf16* ctx, const bf16* dctx, const float* lse,
                                         bf16* dqkv, int64_t b) {
  const AttentionShape& a = shape_;
  const int64_t s = a.s, c = chunk_, T = b * s, hd = a.H * a.D, kv_row = 2 * a.G * a.D;
  const int64_t remote = (2 * cp_size_ - 2) * c;
  local_.backward(qkv, ctx, dctx, lse, dqkv, b);
  const bf16* q = gather(qkv, b);
  const bf16* kv = remote_.as<bf16>();
  bf16* dq = part_.as<bf16>();  // the remote blocks' query gradient, [T, H*D]
  const float one = 1.0f;
  for (Half half : {kSecond, kFirst}) {
    const int64_t chunks = remote_chunks(half);
    if (chunks == 0) {  // (the first half when cp_rank is 0: no remote keys, no gradient from them)
      LAOYAO_CUDA_CHECK(cudaMemset2DAsync(dq + half * c * hd, bf16_bytes(s * hd), 0, bf16_bytes(c * hd),
                                          static_cast<size_t>(b), stream_));
      continue;
    }
    Plans& p = plans_for(b, half == kFirst ? kGatheredFirst : kGatheredSecond);
    // The second half's remote keys hold the first's (a prefix of them): its gradients go to
    // dremote_, the first half's to dfirst_ and are added there.
    bf16* dkv = half == kSecond ? dremote_.as<bf16>() : dfirst_.as<bf16>();
    LAOYAO_CUDA_CHECK(cudaMemsetAsync(dq_accum_.ptr, 0, dq_accum_.bytes, stream_));
    const std::vector<CudnnPlan::Binding> bindings{
        {kSdpaQ, q + half * c * hd},         {kSdpaK, kv},
        {kSdpaV, kv + a.D},                  {kSdpaO, ctx + half * c * hd},
        {kSdpaDO, dctx + half * c * hd},     {kSdpaStats, lse + half * c},
        {kSdpaScale, &scale_},               {kSdpaNegInf, &kSdpaNegInfValue},
        {kSdpaOne, &one},                    {kSdpaDQ, dq + half * c * hd},
        {kSdpaDK, dkv},                      {kSdpaDV, dkv + a.D},
        {kSdpaSoftmaxSum, row_sums_.ptr},    {kSdpaDQAccum, dq_accum_.ptr}};
    p.bwd.execute(local_.handle(), bindings, p.workspace.ptr);
    if (half == kSecond && chunks < 2 * cp_size_ - 2)  // the remote chunks past its prefix: no gradient
      LAOYAO_CUDA_CHECK(cudaMemset2DAsync(dremote_.as<bf16>() + chunks * c * kv_row, bf16_bytes(remote * kv_row), 0,
                                          bf16_bytes((2 * cp_size_ - 2 - chunks) * c * kv_row),
                                          static_cast<size_t>(b), stream_));
    if (half == kFirst)
      copy_rows(dremote_.as<bf16>(), remote * kv_row, dkv, remote * kv_row, b, chunks * c * kv_row, true, stream_);
  }
  add_q_grads(dqkv, dq, b);
  // Each remote chunk's key and value gradients back to their rank: rank-major slots of that rank's
  // token order, this rank's own slot zeros.
  bf16* dsend = all_.as<bf16>();  // (the gathered keys are in remote_ now: all_ carries the gradients back)
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(dsend + cp_rank_ * T * kv_row, 0, bf16_bytes(T * kv_row), stream_));
  for (int64_t r = 0; r < cp_size_; ++r) {
    if (r == cp_rank_) continue;
    for (Half half : {kFirst, kSecond})
      copy_rows(dsend + (r * T + half * c) * kv_row, s * kv_row, dremote_.as<bf16>() + remote_index(r, half) * c * kv_row,
                remote * kv_row, b, c * kv_row, false, stream_);
  }
  comm_.reduce_scatter(dsend, recv_.as<bf16>(), static_cast<size_t>(T * kv_row));
  add_kv_grads(dqkv, recv_.as<bf16>(), b);
}

void CudnnCpAttention::add_q_grads(bf16* dqkv, const bf16* dq, int64_t b) {
  const AttentionShape& a = shape_;
  const int64_t T = b * a.s, hd = a.H * a.D, Q = a.H / a.G;
  if (rows_ == QkvRows::Fused)
    copy_rows(dqkv, (Q + 2) * a.D, dq, Q * a.D, T * a.G, Q * a.D, true, stream_);
  else
    copy_rows(dqkv, T * hd, dq, T * hd, 1, T * hd, true, stream_);
}

void CudnnCpAttention::add_kv_grads(bf16* dqkv, const bf16* dkv, int64_t b) {
  const AttentionShape& a = shape_;
  const int64_t T = b * a.s, hd = a.H * a.D, Q = a.H / a.G, kv_row = 2 * a.G * a.D;
  if (rows_ == QkvRows::Fused)
    copy_rows(dqkv + Q * a.D, (Q + 2) * a.D, dkv, 2 * a.D, T * a.G, 2 * a.D, true, stream_);
  else
    copy_rows(dqkv + T * hd, T * kv_row, dkv, T * kv_row, 1, T * kv_row, true, stream_);
}

// ---- the ring (--cp-comm-type p2p)

void CudnnCpAttention::ring_exchange(const bf16* send, bf16* recv, size_t n) {
  LAOYAO_CUDA_CHECK(cudaEventRecord(fork_, stream_));
  LAOYAO_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, fork_, 0));
  comm_.ring(send, recv, n, comm_stream_);
}

void CudnnCpAttention::join() {
  LAOYAO_CUDA_CHECK(cudaEventRecord(joined_, comm_stream_));
  LAOYAO_CUDA_CHECK(cudaStreamWaitEvent(stream_, joined_, 0));
}

void CudnnCpAttention::forward_ring(const bf16* qkv, bf16* ctx, float* lse, int64_t b) {
  const AttentionShape& a = shape_;
  const int64_t c = chunk_, T = b * a.s, hd = a.H * a.D, kv_row = 2 * a.G * a.D;
  const size_t n = static_cast<size_t>(T * kv_row);
  const auto [q, own] = pack(qkv, b);
  bf16* slot[2] = {ring_kv_.as<bf16>(), ring_kv_.as<bf16>() + T * kv_row};
  ring_exchange(own, slot[0], n);  // the previous rank's keys arrive while the local block runs
  local_.forward(qkv, ctx, lse, b);
  for (int64_t step = 1; step < cp_size_; ++step) {
    join();
    const bf16* kv = slot[(step - 1) % 2];
    // Passed on while this step's block runs (the other slot's block, the step before, is done:
    // the exchange waits for what the stream has enqueued).
    if (step + 1 < cp_size_) ring_exchange(kv, slot[step % 2], n);
    const Block block = ring_block(step);
    const int64_t first = block == kRingEarlier ? 0 : c;  // the queries' first token of each sequence
    Plans& p = plans_for(b, block);
    const std::vector<CudnnPlan::Binding> bindings{
        {kSdpaQ, q + first * hd},  {kSdpaK, kv}, {kSdpaV, kv + a.D}, {kSdpaO, part_.as<bf16>() + first * hd},
        {kSdpaStats, part_lse_.as<float>() + first}, {kSdpaScale, &scale_}, {kSdpaNegInf, &kSdpaNegInfValue}};
    p.fwd.execute(local_.handle(), bindings, p.workspace.ptr);
    const int64_t rows = b * a.s * a.H;
    merge_blocks<<<blocks_for(rows), kThreads, 0, stream_>>>(ctx, lse, part_.as<bf16>(), part_lse_.as<float>(), b,
                                                            a.H, a.s, a.D, block == kRingEarlier, true);
    LAOYAO_CUDA_CHECK(cudaGetLastError());
  }
}

void CudnnCpAttention::backward_ring(const bf16* qkv, const bf16* ctx, const bf16* dctx, const float* lse,
                                     bf16* dqkv, int64_t b) {
  const AttentionShape& a = shape_;
  const int64_t s = a.s, c = chunk_, T = b * s, hd = a.H * a.D, kv_row = 2 * a.G * a.D;
  const size_t n = static_cast<size_t>(T * kv_row);
  const auto [q, own] = pack(qkv, b);
  bf16* slot[2] = {ring_kv_.as<bf16>(), ring_kv_.as<bf16>() + T * kv_row};
  bf16* dslot[2] = {ring_dkv_.as<bf16>(), ring_dkv_.as<bf16>() + T * kv_row};
  bf16* dkv = block_dkv_.as<bf16>();
  bf16* dq = part_.as<bf16>();
  const float one = 1.0f;
  ring_exchange(own, slot[0], n);
  local_.backward(qkv, ctx, dctx, lse, dqkv, b);
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(dq_sum_.ptr, 0, dq_sum_.bytes, stream_));
  int64_t travelling = 0;  // the key and value gradients in flight arrive in dslot[travelling]
  for (int64_t step = 1; step < cp_size_; ++step) {
    join();  // this step's keys and values (and the gradients passed on after the step before)
    const bf16* kv = slot[(step - 1) % 2];
    if (step + 1 < cp_size_) ring_exchange(kv, slot[step % 2], n);
    const Block block = ring_block(step);
    const int64_t first = block == kRingEarlier ? 0 : c;
    Plans& p = plans_for(b, block);
    LAOYAO_CUDA_CHECK(cudaMemsetAsync(dq_accum_.ptr, 0, dq_accum_.bytes, stream_));
    const std::vector<CudnnPlan::Binding> bindings{
        {kSdpaQ, q + first * hd},         {kSdpaK, kv},
        {kSdpaV, kv + a.D},               {kSdpaO, ctx + first * hd},
        {kSdpaDO, dctx + first * hd},     {kSdpaStats, lse + first},
        {kSdpaScale, &scale_},            {kSdpaNegInf, &kSdpaNegInfValue},
        {kSdpaOne, &one},                 {kSdpaDQ, dq + first * hd},
        {kSdpaDK, dkv},                   {kSdpaDV, dkv + a.D},
        {kSdpaSoftmaxSum, row_sums_.ptr}, {kSdpaDQAccum, dq_accum_.ptr}};
    p.bwd.execute(local_.handle(), bindings, p.workspace.ptr);
    if (block == kRingEarlier) {  // every query's gradient; the source's second chunk got none
      copy_rows(dq_sum_.as<bf16>(), hd, dq, hd, T, hd, true, stream_);
      LAOYAO_CUDA_CHECK(cudaMemset2DAsync(dkv + c * kv_row, bf16_bytes(s * kv_row), 0, bf16_bytes(c * kv_row),
                                          static_cast<size_t>(b), stream_));
    } else {  // the second halves' queries
      copy_rows(dq_sum_.as<bf16>() + c * hd, s * hd, dq + c * hd, s * hd, b, c * hd, true, stream_);
    }
    // The source's gradients so far (from the ranks before this one on the ring) take this block's,
    // then travel on with its keys: after the last step they reach the source.
    bf16* send = dslot[travelling];
    if (step == 1)
      LAOYAO_CUDA_CHECK(cudaMemcpyAsync(send, dkv, bf16_bytes(T * kv_row), cudaMemcpyDeviceToDevice, stream_));
    else
      copy_rows(send, T * kv_row, dkv, T * kv_row, 1, T * kv_row, true, stream_);
    travelling = 1 - travelling;
    ring_exchange(send, dslot[travelling], n);
  }
  add_q_grads(dqkv, dq_sum_.as<bf16>(), b);
  join();  // this rank's own key and value gradients, home
  add_kv_grads(dqkv, dslot[travelling], b);
}

int64_t CudnnCpAttention::device_bytes() const {
  size_t bytes = q_.bytes + kv_.bytes + all_.bytes + remote_.bytes + dremote_.bytes + dfirst_.bytes + part_.bytes +
                 part_lse_.bytes + recv_.bytes + dq_accum_.bytes + row_sums_.bytes + ring_kv_.bytes + ring_dkv_.bytes +
                 block_dkv_.bytes + dq_sum_.bytes;
  for (const auto& [k, p] : plans_) bytes += p->workspace.bytes;
  return static_cast<int64_t>(bytes);
}

}  // namespace laoyao::kernels::cuda
