// Causal attention through cuDNN's fused flash attention (see attention_cudnn.hpp).
//
// cuDNN recognises scaled dot-product attention as a pattern of its graph API and runs it as one
// fused kernel: the graphs below spell the pattern out op by op (matmul, scale, causal mask,
// softmax with its statistics, matmul), the way cuDNN's frontend library expands its SDPA node.
// Tensors are 4-D [batch, heads, sequence, head dim] views with strides into our buffers.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cudnn.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using Dims = CudnnGraph::Dims;

// Variant-pack ids of the tensors bound to memory.
enum : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kOne, kDO, kDQ, kDK, kDV, kSoftmaxSum, kDQAccum };

// Where q, k, v, ctx and their gradients sit: element strides [batch, head, position, dim].
struct Views {
  Dims q, kv, v, o;      // kv: the keys' (and, but for separate rows, the values')
  int64_t k_off, v_off;  // element offsets of k and v: within a fused row, or from the split rows' start
};

// Fused rows: MHA's q read in place, GQA's gathered into [b*s, H*D]. Split rows (qkv_rows.hpp): q
// as gathered, k and v from the [b*s, G, 2, D] block after it.
// Separate rows: each tensor token-major in its own buffer.
Views views_of(const AttentionShape& a, QkvRows rows) {
  const int64_t Q = a.H / a.G, row = a.G * (Q + 2) * a.D, hd = a.H * a.D;
  Views v;
  v.o = {a.s * hd, a.D, hd, 1};
  if (rows == QkvRows::Separate) {
    const int64_t dv = a.dv();
    v.q = v.o;
    v.kv = {a.s * a.G * a.D, a.D, a.G * a.D, 1};
    v.v = {a.s * a.G * dv, dv, a.G * dv, 1};
    v.o = {a.s * a.H * dv, dv, a.H * dv, 1};
    v.k_off = v.v_off = 0;
    return v;
  }
  if (rows == QkvRows::Split) {
    const int64_t kv_row = 2 * a.G * a.D;
    v.q = v.o;
    v.kv = v.v = {a.s * kv_row, 2 * a.D, kv_row, 1};
    v.k_off = a.b * a.s * hd;
    v.v_off = v.k_off + a.D;
    return v;
  }
  v.q = a.H != a.G ? v.o : Dims{a.s * row, (Q + 2) * a.D, row, 1};
  v.kv = v.v = {a.s * row, (Q + 2) * a.D, row, 1};
  v.k_off = Q * a.D;
  v.v_off = (Q + 1) * a.D;
  return v;
}

// The masked scores' value (the frontend's for cuDNN 9.10 on): exp of it is exactly 0.
const float kNegInfValue = -std::numeric_limits<float>::infinity();

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

Dims transposed(const Dims& d) { return {d[0], d[1], d[3], d[2]}; }

// -inf where the key is later than the query (row index < column index), x elsewhere.
int causal_mask(CudnnGraph& g, int x, int neg_inf, const Dims& s_dims) {
  const int row = g.gen_index(x, g.virtual_tensor(s_dims, CUDNN_DATA_INT32), 2);
  const int col = g.gen_index(x, g.virtual_tensor(s_dims, CUDNN_DATA_INT32), 3);
  const int keep = g.compare_ge(row, col, g.virtual_tensor(s_dims, CUDNN_DATA_BOOLEAN));
  return g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, g.virtual_tensor(s_dims), neg_inf, keep);
}

// The bound tensors both graphs share.
struct Inputs {
  int q, kt, v, o, stats, scale, neg_inf;
};

Inputs bind_inputs(CudnnGraph& g, const AttentionShape& a, const Views& v, bool v_transposed) {
  const Dims qd{a.b, a.H, a.s, a.D}, kd{a.b, a.G, a.s, a.D}, vd{a.b, a.G, a.s, a.dv()}, od{a.b, a.H, a.s, a.dv()};
  const Dims row_dims{a.b, a.H, a.s, 1};
  Inputs in;
  in.q = g.tensor(kQ, qd, v.q, CUDNN_DATA_BFLOAT16);
  in.kt = g.tensor(kK, transposed(kd), transposed(v.kv), CUDNN_DATA_BFLOAT16);
  in.v = v_transposed ? g.tensor(kV, transposed(vd), transposed(v.v), CUDNN_DATA_BFLOAT16)
                      : g.tensor(kV, vd, v.v, CUDNN_DATA_BFLOAT16);
  in.o = g.tensor(kO, od, v.o, CUDNN_DATA_BFLOAT16);
  in.stats = g.tensor(kStats, row_dims, CudnnGraph::packed(row_dims), CUDNN_DATA_FLOAT);
  in.scale = g.scalar(kScale, CUDNN_DATA_FLOAT);
  in.neg_inf = g.scalar(kNegInf, CUDNN_DATA_FLOAT);
  return in;
}

CudnnPlan build_forward(cudnnHandle_t handle, const AttentionShape& a, QkvRows rows) {
  const Views v = views_of(a, rows);
  CudnnGraph g;
  const Inputs in = bind_inputs(g, a, v, false);
  const Dims row_dims{a.b, a.H, a.s, 1}, s_dims{a.b, a.H, a.s, a.s};

  const int s = g.matmul(in.q, in.kt, g.virtual_tensor(s_dims));
  const int scaled = g.pointwise(CUDNN_POINTWISE_MUL, s, g.virtual_tensor(s_dims), in.scale);
  const int masked = causal_mask(g, scaled, in.neg_inf, s_dims);
  // Softmax and its statistics, lse = max + log(sum(exp(x - max))), which the backward reads.
  const int mx = g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, g.virtual_tensor(row_dims));
  const int shifted = g.pointwise(CUDNN_POINTWISE_SUB, masked, g.virtual_tensor(s_dims), mx);
  const int e = g.pointwise(CUDNN_POINTWISE_EXP, shifted, g.virtual_tensor(s_dims));
  const int sum = g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, g.virtual_tensor(row_dims));
  const int log_sum = g.pointwise(CUDNN_POINTWISE_LOG, sum, g.virtual_tensor(row_dims));
  g.pointwise(CUDNN_POINTWISE_ADD, mx, in.stats, log_sum);
  // The probabilities in the input type: the second matmul takes bf16 operands.
  const int p = g.pointwise(CUDNN_POINTWISE_DIV, e, g.virtual_tensor(s_dims, CUDNN_DATA_BFLOAT16), sum);
  g.matmul(p, in.v, in.o);
  return g.plan(handle, "sdpa forward");
}

// d = a @ b summed over the heads of each query group: straight into `out` for MHA, else through a
// per-query-head product ([b, H, s, dim]) and a reduction over the group's heads.
void group_matmul(CudnnGraph& g, const AttentionShape& a, int64_t dim, int lhs, int rhs, int out) {
  if (a.H == a.G) {
    g.matmul(lhs, rhs, out);
    return;
  }
  const int full = g.matmul(lhs, rhs, g.virtual_tensor({a.b, a.H, a.s, dim}, CUDNN_DATA_BFLOAT16));
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
}

CudnnPlan build_backward(cudnnHandle_t handle, const AttentionShape& a, QkvRows rows) {
  const Views v = views_of(a, rows);
  CudnnGraph g;
  const Inputs in = bind_inputs(g, a, v, true);
  const Dims qd{a.b, a.H, a.s, a.D}, kd{a.b, a.G, a.s, a.D}, vd{a.b, a.G, a.s, a.dv()}, od{a.b, a.H, a.s, a.dv()};
  const Dims row_dims{a.b, a.H, a.s, 1}, s_dims{a.b, a.H, a.s, a.s};
  const Dims s_t_strides{a.H * a.s * a.s, a.s * a.s, 1, a.s};  // [b, H, key, query] over the same memory
  const int d_o = g.tensor(kDO, od, v.o, CUDNN_DATA_BFLOAT16);
  const int dq = g.tensor(kDQ, qd, v.q, CUDNN_DATA_BFLOAT16);
  const int dk = g.tensor(kDK, kd, v.kv, CUDNN_DATA_BFLOAT16);
  const int dv = g.tensor(kDV, vd, v.v, CUDNN_DATA_BFLOAT16);
  const int one = g.scalar(kOne, CUDNN_DATA_FLOAT);
  // Workspace-resident intermediates (in our part of the workspace, bound at execution).
  const int softmax_sum = g.tensor(kSoftmaxSum, row_dims, CudnnGraph::packed(row_dims), CUDNN_DATA_FLOAT);
  const int dq_accum = g.tensor(kDQAccum, qd, CudnnGraph::packed(qd), CUDNN_DATA_FLOAT);

  // softmax_sum = rowsum(dO * O): the softmax backward's subtrahend.
  const int d_o_o = g.pointwise(CUDNN_POINTWISE_MUL, d_o, g.virtual_tensor(od), in.o);
  const int rowsum = g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o_o, g.virtual_tensor(row_dims));
  g.pointwise(CUDNN_POINTWISE_MUL, rowsum, softmax_sum, one);
  // P again from the saved statistics.
  const int s = g.matmul(in.q, in.kt, g.virtual_tensor(s_dims));
  const int scaled = g.pointwise(CUDNN_POINTWISE_MUL, s, g.virtual_tensor(s_dims), in.scale);
  const int shifted = g.pointwise(CUDNN_POINTWISE_SUB, scaled, g.virtual_tensor(s_dims), in.stats);
  const int masked = causal_mask(g, shifted, in.neg_inf, s_dims);
  const int p = g.pointwise(CUDNN_POINTWISE_EXP, masked, g.virtual_tensor(s_dims));
  // dV = P^T dO.
  const int p_t = g.reshape(p, g.virtual_tensor(transposed(s_dims), s_t_strides, CUDNN_DATA_BFLOAT16));
  group_matmul(g, a, a.dv(), p_t, d_o, dv);
  // dS = scale * P * (dO V^T - softmax_sum).
  const int dp = g.matmul(d_o, in.v, g.virtual_tensor(s_dims));
  const int centered = g.pointwise(CUDNN_POINTWISE_SUB, dp, g.virtual_tensor(s_dims), softmax_sum);
  const int dp_p = g.pointwise(CUDNN_POINTWISE_MUL, centered, g.virtual_tensor(s_dims), p);
  const int ds = g.pointwise(CUDNN_POINTWISE_MUL, dp_p, g.virtual_tensor(s_dims), in.scale);
  // dK = dS^T Q.
  const int ds_t = g.reshape(ds, g.virtual_tensor(transposed(s_dims), s_t_strides, CUDNN_DATA_BFLOAT16));
  group_matmul(g, a, a.D, ds_t, in.q, dk);
  // dQ = dS K, accumulated in fp32, then rounded to bf16.
  const int k = g.reshape(in.kt, g.virtual_tensor(kd, v.kv, CUDNN_DATA_FLOAT));
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
  return g.plan(handle, "sdpa backward");
}

constexpr int kCopyThreads = 256;

// Gathers the query heads of each token from the fused qkv row into [b*s, H*D] (GQA: a group's
// query heads sit between the group's k and v of the previous group), or scatters their gradient
// back. 16-byte vectors: D is a multiple of 8.
template <bool kGather>
__global__ void copy_query_heads(bf16* __restrict__ fused, bf16* __restrict__ packed, int64_t tokens, int H, int Q,
                                 int D) {
  const int vecs = D / 8;
  const int64_t n = tokens * H * vecs;
  const int64_t row = int64_t(H / Q) * (Q + 2) * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int vi = static_cast<int>(i % vecs);
    const int h = static_cast<int>((i / vecs) % H);
    const int64_t t = i / (int64_t(vecs) * H);
    uint4* f = reinterpret_cast<uint4*>(fused + t * row + (int64_t(h / Q) * (Q + 2) + h % Q) * D) + vi;
    uint4* p = reinterpret_cast<uint4*>(packed + (t * H + h) * D) + vi;
    if (kGather)
      *p = *f;
    else
      *f = *p;
  }
}

template <bool kGather>
void launch_copy(bf16* fused, bf16* packed, const AttentionShape& a, cudaStream_t stream) {
  const int64_t n = a.b * a.s * a.H * (a.D / 8);
  const int blocks = static_cast<int>(std::min<int64_t>((n + kCopyThreads - 1) / kCopyThreads, 65535));
  copy_query_heads<kGather><<<blocks, kCopyThreads, 0, stream>>>(fused, packed, a.b * a.s, static_cast<int>(a.H),
                                                                  static_cast<int>(a.H / a.G), static_cast<int>(a.D));
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool CudnnAttention::supports(const AttentionShape& a) {
  const int64_t most = max_head_dim(a);
  auto fits = [&](int64_t d) { return d % 8 == 0 && d >= 8 && d <= most; };
  return fits(a.D) && fits(a.dv()) && a.G > 0 && a.H % a.G == 0 && a.s > 0;
}

CudnnAttention::CudnnAttention(const AttentionShape& shape, cudaStream_t stream, QkvRows rows)
    : shape_(shape), stream_(stream), rows_(rows) {
  if (rows != QkvRows::Separate && shape.dv() != shape.D)
    throw Error("cuDNN attention: a value head dim unlike the query's needs separate q, k and v rows");
  if (!supports(shape))
    throw Error("cuDNN attention: head dims " + std::to_string(shape.D) + " and " + std::to_string(shape.dv()) +
                " are not multiples of 8 up to " + std::to_string(max_head_dim(shape)));
  scale_ = shape.scale;
  LAOYAO_CUDA_CHECK(cudnnCreate(&handle_));
  try {
    LAOYAO_CUDA_CHECK(cudnnSetStream(handle_, stream_));
    if (gathers_q()) {
      q_ = DeviceBuffer(sizeof(bf16) * shape.b * shape.s * shape.H * shape.D);
      dq_ = DeviceBuffer(sizeof(bf16) * shape.b * shape.s * shape.H * shape.D);
    }
    scratch_ = DeviceBuffer(backward_scratch_bytes());
    plans_for(shape.b);
  } catch (...) {
    cudnnDestroy(handle_);
    throw;
  }
}

CudnnAttention::~CudnnAttention() {
  if (handle_) cudnnDestroy(handle_);
}

CudnnAttention::Plans& CudnnAttention::plans_for(int64_t b) {
  if (b <= 0 || b > shape_.b)
    throw Error("cuDNN attention: batch " + std::to_string(b) + " outside 1.." + std::to_string(shape_.b));
  auto it = plans_.find(b);
  if (it != plans_.end()) return *it->second;
  AttentionShape a = shape_;
  a.b = b;
  auto p = std::make_unique<Plans>();
  p->fwd = build_forward(handle_, a, rows_);
  p->bwd = build_backward(handle_, a, rows_);
  p->workspace = DeviceBuffer(static_cast<size_t>(std::max<int64_t>(
      {p->fwd.workspace_bytes(), p->bwd.workspace_bytes(), 256})));
  return *plans_.emplace(b, std::move(p)).first->second;
}

const bf16* CudnnAttention::query_heads(const bf16* qkv, const AttentionShape& a) {
  if (!gathers_q()) return qkv;  // MHA or split rows: read in place
  launch_copy<true>(const_cast<bf16*>(qkv), q_.as<bf16>(), a, stream_);
  return q_.as<bf16>();
}

void CudnnAttention::forward(const bf16* qkv, bf16* ctx, float* lse, int64_t b) {
  if (rows_ == QkvRows::Separate) throw Error("cuDNN attention: built for separate q, k and v rows, given one buffer");
  AttentionShape a = shape_;
  a.b = b;
  const Views v = views_of(a, rows_);
  run_forward(b, query_heads(qkv, a), qkv + v.k_off, qkv + v.v_off, ctx, lse);
}

void CudnnAttention::forward(const bf16* q, const bf16* k, const bf16* v, bf16* ctx, float* lse, int64_t b) {
  if (rows_ != QkvRows::Separate) throw Error("cuDNN attention: given separate q, k and v, built for QKV rows");
  run_forward(b, q, k, v, ctx, lse);
}

void CudnnAttention::run_forward(int64_t b, const bf16* q, const bf16* k, const bf16* v, bf16* ctx, float* lse) {
  Plans& p = plans_for(b);
  p.fwd.execute(handle_,
                {{kQ, q}, {kK, k}, {kV, v}, {kO, ctx}, {kStats, lse}, {kScale, &scale_}, {kNegInf, &kNegInfValue}},
                p.workspace.ptr);
}

void CudnnAttention::backward(const bf16* qkv, const bf16* ctx, const bf16* dctx, const float* lse, bf16* dqkv,
                              int64_t b) {
  if (rows_ == QkvRows::Separate) throw Error("cuDNN attention: built for separate q, k and v rows, given one buffer");
  AttentionShape a = shape_;
  a.b = b;
  const Views v = views_of(a, rows_);
  // The scratch holds the last forward's layer: gather this layer's query heads again.
  const bf16* q = query_heads(qkv, a);
  bf16* dq = gathers_q() ? dq_.as<bf16>() : dqkv;
  run_backward(b, q, qkv + v.k_off, qkv + v.v_off, ctx, dctx, lse, dq, dqkv + v.k_off, dqkv + v.v_off);
  if (gathers_q()) launch_copy<false>(dqkv, dq_.as<bf16>(), a, stream_);
}

void CudnnAttention::backward(const bf16* q, const bf16* k, const bf16* v, const bf16* ctx, const bf16* dctx,
                              const float* lse, bf16* dq, bf16* dk, bf16* dv, int64_t b) {
  if (rows_ != QkvRows::Separate) throw Error("cuDNN attention: given separate q, k and v, built for QKV rows");
  run_backward(b, q, k, v, ctx, dctx, lse, dq, dk, dv);
}

void CudnnAttention::run_backward(int64_t b, const bf16* q, const bf16* k, const bf16* v, const bf16* ctx,
                                  const bf16* dctx, const float* lse, bf16* dq, bf16* dk, bf16* dv) {
  Plans& p = plans_for(b);
  // Our part of the workspace: the fp32 dQ accumulator (zeroed: cuDNN adds into it) and the
  // softmax row sums.
  char* ws = static_cast<char*>(scratch_.ptr);
  float* dq_accum = reinterpret_cast<float*>(ws);
  float* softmax_sum = reinterpret_cast<float*>(ws + aligned(dq_accum_bytes()));
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, sizeof(float) * b * shape_.H * shape_.s * shape_.D, stream_));
  const float one = 1.0f;
  p.bwd.execute(handle_,
                {{kQ, q}, {kK, k}, {kV, v}, {kO, ctx}, {kDO, dctx}, {kStats, lse}, {kScale, &scale_},
                 {kNegInf, &kNegInfValue}, {kOne, &one}, {kDQ, dq}, {kDK, dk}, {kDV, dv}, {kSoftmaxSum, softmax_sum},
                 {kDQAccum, dq_accum}},
                p.workspace.ptr);
}

size_t CudnnAttention::dq_accum_bytes() const { return sizeof(float) * shape_.b * shape_.H * shape_.s * shape_.D; }

size_t CudnnAttention::backward_scratch_bytes() const {
  return aligned(dq_accum_bytes()) + aligned(sizeof(float) * shape_.b * shape_.H * shape_.s);
}

std::string CudnnAttention::engines() const {
  const Plans& p = *plans_.at(shape_.b);
  return p.fwd.engine() + ", " + p.bwd.engine();
}

int64_t CudnnAttention::device_bytes() const {
  size_t bytes = scratch_.bytes + q_.bytes + dq_.bytes;
  for (const auto& [b, p] : plans_) bytes += p->workspace.bytes;
  return static_cast<int64_t>(bytes);
}

}  // namespace laoyao::kernels::cuda
