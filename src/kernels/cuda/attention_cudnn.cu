// Causal attention through cuDNN's fused flash attention (see attention_cudnn.hpp).
//
// cuDNN recognises scaled dot-product attention as a pattern of its graph API and runs it as one
// fused kernel: the graphs below spell the pattern out op by op (matmul, scale, causal mask,
// softmax with its statistics, matmul), the way cuDNN's frontend library expands its SDPA node.
// Tensors are 4-D [batch, heads, sequence, head dim] views with strides into our buffers.
#include <algorithm>
#include <array>
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
enum : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kOne, kDO, kDQ, kDK, kDV, kSoftmaxSum, kDQAccum,
  // Documents: their lengths (as the queries' and as the keys'), and the element offsets of each
  // document in q, k, v, o, the statistics and the dQ accumulator (kOffsets + RaggedOffset).
  kSeqQ, kSeqKV, kOffsets
};

// The tensors' element offsets of a document, per token of it: their token strides.
enum RaggedOffset { kOffQ, kOffK, kOffV, kOffO, kOffStats, kRaggedOffsets };

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

// The bound tensors both graphs share. With documents (b: the plans' document count), the
// documents' lengths and each tensor's offsets: q, k, v, o at their rows' token strides, the
// statistics token-major ([T, H]) instead of [b, H, s].
struct Inputs {
  int q, kt, v, o, stats, scale, neg_inf;
  int seq_q = -1, seq_kv = -1;  // documents: their lengths
  std::array<int, kRaggedOffsets> off{-1, -1, -1, -1, -1};
  bool documents() const { return seq_q >= 0; }
  CudnnGraph::Overrides scores() const { return {seq_q, seq_kv, -1}; }   // [query, key] products
  CudnnGraph::Overrides by_keys() const { return {seq_kv, -1, seq_q}; }  // [key, dim] = [key, query] @ [query, dim]
  CudnnGraph::Overrides by_queries() const { return {seq_q, -1, seq_kv}; }
};

// The statistics' (and the backward's row sums') strides: [b, H, s] dense, [T, H] over documents.
Dims row_strides(const AttentionShape& a, bool documents) {
  return documents ? Dims{a.s * a.H, 1, a.H, 1} : CudnnGraph::packed({a.b, a.H, a.s, 1});
}

// backward: V bound transposed (the backward's dO V^T).
Inputs bind_inputs(CudnnGraph& g, const AttentionShape& a, const Views& v, bool backward, bool documents) {
  const Dims qd{a.b, a.H, a.s, a.D}, kd{a.b, a.G, a.s, a.D}, vd{a.b, a.G, a.s, a.dv()}, od{a.b, a.H, a.s, a.dv()};
  const Dims row_dims{a.b, a.H, a.s, 1};
  Inputs in;
  if (documents) {
    const Dims lengths{a.b, 1, 1, 1}, offsets{a.b + 1, 1, 1, 1}, unit{1, 1, 1, 1};
    in.seq_q = g.tensor(kSeqQ, lengths, unit, CUDNN_DATA_INT32);
    in.seq_kv = g.tensor(kSeqKV, lengths, unit, CUDNN_DATA_INT32);
    for (int i = 0; i < kRaggedOffsets; ++i) in.off[size_t(i)] = g.tensor(kOffsets + i, offsets, unit, CUDNN_DATA_INT64);
  }
  in.q = g.tensor(kQ, qd, v.q, CUDNN_DATA_BFLOAT16, in.off[kOffQ]);
  in.kt = g.tensor(kK, transposed(kd), transposed(v.kv), CUDNN_DATA_BFLOAT16, in.off[kOffK]);
  in.v = backward ? g.tensor(kV, transposed(vd), transposed(v.v), CUDNN_DATA_BFLOAT16, in.off[kOffV])
                      : g.tensor(kV, vd, v.v, CUDNN_DATA_BFLOAT16, in.off[kOffV]);
  in.o = g.tensor(kO, od, v.o, CUDNN_DATA_BFLOAT16, in.off[kOffO]);
  in.stats = g.tensor(kStats, row_dims, row_strides(a, documents), CUDNN_DATA_FLOAT, in.off[kOffStats]);
  in.scale = g.scalar(kScale, CUDNN_DATA_FLOAT);
  in.neg_inf = g.scalar(kNegInf, CUDNN_DATA_FLOAT);
  return in;
}

// Documents: -inf where the query or the key lies past its document's length (cuDNN's padding
// mask, which its fused kernels take with the ragged offsets), x elsewhere.
int padding_mask(CudnnGraph& g, const Inputs& in, int x, const Dims& s_dims) {
  if (!in.documents()) return x;
  const int row = g.gen_index(x, g.virtual_tensor(s_dims, CUDNN_DATA_INT32), 2, CUDNN_DATA_INT32);
  const int col = g.gen_index(x, g.virtual_tensor(s_dims, CUDNN_DATA_INT32), 3, CUDNN_DATA_INT32);
  const int row_in = g.compare_lt(row, in.seq_q, g.virtual_tensor(s_dims, CUDNN_DATA_BOOLEAN));
  const int col_in = g.compare_lt(col, in.seq_kv, g.virtual_tensor(s_dims, CUDNN_DATA_BOOLEAN));
  const int keep = g.logical_and(row_in, col_in, g.virtual_tensor(s_dims, CUDNN_DATA_BOOLEAN));
  return g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, g.virtual_tensor(s_dims), in.neg_inf, keep);
}

// (With documents, a.b is the plans' document count.)
CudnnPlan build_forward(cudnnHandle_t handle, const AttentionShape& a, QkvRows rows, bool documents) {
  const Views v = views_of(a, rows);
  CudnnGraph g;
  const Inputs in = bind_inputs(g, a, v, false, documents);
  const Dims row_dims{a.b, a.H, a.s, 1}, s_dims{a.b, a.H, a.s, a.s};

  const int s = g.matmul(in.q, in.kt, g.virtual_tensor(s_dims), in.scores());
  const int scaled = g.pointwise(CUDNN_POINTWISE_MUL, s, g.virtual_tensor(s_dims), in.scale);
  const int masked = causal_mask(g, padding_mask(g, in, scaled, s_dims), in.neg_inf, s_dims);
  // Softmax and its statistics, lse = max + log(sum(exp(x - max))), which the backward reads.
  const int mx = g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, g.virtual_tensor(row_dims));
  const int shifted = g.pointwise(CUDNN_POINTWISE_SUB, masked, g.virtual_tensor(s_dims), mx);
  const int e = g.pointwise(CUDNN_POINTWISE_EXP, shifted, g.virtual_tensor(s_dims));
  const int sum = g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, g.virtual_tensor(row_dims));
  const int log_sum = g.pointwise(CUDNN_POINTWISE_LOG, sum, g.virtual_tensor(row_dims));
  g.pointwise(CUDNN_POINTWISE_ADD, mx, in.stats, log_sum);
  // The probabilities in the input type: the second matmul takes bf16 operands.
  const int p = g.pointwise(CUDNN_POINTWISE_DIV, e, g.virtual_tensor(s_dims, CUDNN_DATA_BFLOAT16), sum);
  g.matmul(p, in.v, in.o, in.by_queries());
  return g.plan(handle, documents ? "sdpa forward over documents" : "sdpa forward");
}

// d = a @ b summed over the heads of each query group: straight into `out` for MHA, else through a
// per-query-head product ([b, H, s, dim]) and a reduction over the group's heads.
void group_matmul(CudnnGraph& g, const AttentionShape& a, int64_t dim, int lhs, int rhs, int out,
                  CudnnGraph::Overrides o) {
  if (a.H == a.G) {
    g.matmul(lhs, rhs, out, o);
    return;
  }
  const int full = g.matmul(lhs, rhs, g.virtual_tensor({a.b, a.H, a.s, dim}, CUDNN_DATA_BFLOAT16), o);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
}

CudnnPlan build_backward(cudnnHandle_t handle, const AttentionShape& a, QkvRows rows, bool documents) {
  const Views v = views_of(a, rows);
  CudnnGraph g;
  const Inputs in = bind_inputs(g, a, v, true, documents);
  const Dims qd{a.b, a.H, a.s, a.D}, kd{a.b, a.G, a.s, a.D}, vd{a.b, a.G, a.s, a.dv()}, od{a.b, a.H, a.s, a.dv()};
  const Dims row_dims{a.b, a.H, a.s, 1}, s_dims{a.b, a.H, a.s, a.s};
  const Dims s_t_strides{a.H * a.s * a.s, a.s * a.s, 1, a.s};  // [b, H, key, query] over the same memory
  const int d_o = g.tensor(kDO, od, v.o, CUDNN_DATA_BFLOAT16, in.off[kOffO]);
  const int dq = g.tensor(kDQ, qd, v.q, CUDNN_DATA_BFLOAT16, in.off[kOffQ]);
  const int dk = g.tensor(kDK, kd, v.kv, CUDNN_DATA_BFLOAT16, in.off[kOffK]);
  const int dv = g.tensor(kDV, vd, v.v, CUDNN_DATA_BFLOAT16, in.off[kOffV]);
  const int one = g.scalar(kOne, CUDNN_DATA_FLOAT);
  // Workspace-resident intermediates (in our part of the workspace, bound at execution): with
  // documents, as cuDNN's frontend lays them out for ragged tensors (Transformer Engine's THD), the
  // row sums with the statistics' strides and offsets, the fp32 dQ accumulator with dQ's.
  const int softmax_sum =
      g.tensor(kSoftmaxSum, row_dims, row_strides(a, documents), CUDNN_DATA_FLOAT, in.off[kOffStats]);
  const int dq_accum = g.tensor(kDQAccum, qd, documents ? v.q : CudnnGraph::packed(qd), CUDNN_DATA_FLOAT, in.off[kOffQ]);

  // softmax_sum = rowsum(dO * O): the softmax backward's subtrahend.
  const int d_o_o = g.pointwise(CUDNN_POINTWISE_MUL, d_o, g.virtual_tensor(od), in.o);
  const int rowsum = g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o_o, g.virtual_tensor(row_dims));
  g.pointwise(CUDNN_POINTWISE_MUL, rowsum, softmax_sum, one);
  // P again from the saved statistics.
  const int s = g.matmul(in.q, in.kt, g.virtual_tensor(s_dims), in.scores());
  const int scaled = g.pointwise(CUDNN_POINTWISE_MUL, s, g.virtual_tensor(s_dims), in.scale);
  const int padded = padding_mask(g, in, scaled, s_dims);
  const int shifted = g.pointwise(CUDNN_POINTWISE_SUB, padded, g.virtual_tensor(s_dims), in.stats);
  const int masked = causal_mask(g, shifted, in.neg_inf, s_dims);
  const int p = g.pointwise(CUDNN_POINTWISE_EXP, masked, g.virtual_tensor(s_dims));
  // dV = P^T dO.
  const int p_t = g.reshape(p, g.virtual_tensor(transposed(s_dims), s_t_strides, CUDNN_DATA_BFLOAT16));
  group_matmul(g, a, a.dv(), p_t, d_o, dv, in.by_keys());
  // dS = scale * P * (dO V^T - softmax_sum).
  const int dp = g.matmul(d_o, in.v, g.virtual_tensor(s_dims), in.scores());
  const int centered = g.pointwise(CUDNN_POINTWISE_SUB, dp, g.virtual_tensor(s_dims), softmax_sum);
  const int dp_p = g.pointwise(CUDNN_POINTWISE_MUL, centered, g.virtual_tensor(s_dims), p);
  const int ds = g.pointwise(CUDNN_POINTWISE_MUL, dp_p, g.virtual_tensor(s_dims), in.scale);
  // dK = dS^T Q.
  const int ds_t = g.reshape(ds, g.virtual_tensor(transposed(s_dims), s_t_strides, CUDNN_DATA_BFLOAT16));
  group_matmul(g, a, a.D, ds_t, in.q, dk, in.by_keys());
  // dQ = dS K, accumulated in fp32, then rounded to bf16.
  const int k = g.reshape(in.kt, g.virtual_tensor(kd, v.kv, CUDNN_DATA_FLOAT, in.off[kOffK]));
  g.matmul(ds, k, dq_accum, in.by_queries());
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
  return g.plan(handle, documents ? "sdpa backward over documents" : "sdpa backward");
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

// Each tensor's element offsets of the documents: start[i] times the tensor's token stride.
struct TokenStrides {
  int64_t of[kRaggedOffsets];
};

// Each tensor's array of n offsets starts `stride` entries after the previous one's.
__global__ void document_offsets(const int64_t* __restrict__ start, int64_t n, int64_t stride, TokenStrides strides,
                                 int64_t* __restrict__ offsets) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    for (int k = 0; k < kRaggedOffsets; ++k) offsets[k * stride + i] = start[i] * strides.of[k];
}

// The entries between two tensors' offset arrays of count + 1: whole 256 bytes, so that each array
// is as aligned as the graph's tensors say (CudnnGraph: 16 bytes).
int64_t offsets_stride(int64_t count) { return (count + 1 + 31) / 32 * 32; }

}  // namespace

int64_t documents_bucket(int64_t n) {
  if (n <= 32) return 32;
  if (n <= 512) {
    int64_t b = 64;
    while (b < n) b *= 2;
    return b;
  }
  return (n + 511) / 512 * 512;
}

int64_t fill_cudnn_documents(const int32_t* key_start, int64_t b, int64_t s, std::vector<int64_t>& start,
                             std::vector<int32_t>& length) {
  start.clear();
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < s; ++i) {
      const int64_t t = r * s + i, first = key_start[t];
      if (first == i) {
        start.push_back(t);
      } else if (i == 0 || first != key_start[t - 1]) {
        throw Error("cuDNN attention over documents: token " + std::to_string(i) + " of sequence " +
                    std::to_string(r) + " attends from place " + std::to_string(first) +
                    ", not from its document's first token (documents of consecutive tokens only)");
      }
    }
  const int64_t n = static_cast<int64_t>(start.size()), count = documents_bucket(n);
  start.resize(static_cast<size_t>(count + 1), b * s);
  length.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) length[size_t(i)] = static_cast<int32_t>(start[size_t(i + 1)] - start[size_t(i)]);
  return count;
}

bool CudnnAttention::supports(const AttentionShape& a) {
  const int64_t most = max_head_dim(a);
  auto fits = [&](int64_t d) { return d % 8 == 0 && d >= 8 && d <= most; };
  return fits(a.D) && fits(a.dv()) && a.G > 0 && a.H % a.G == 0 && a.s > 0;
}

CudnnAttention::CudnnAttention(const AttentionShape& shape, cudaStream_t stream, QkvRows rows, bool documents)
    : shape_(shape), stream_(stream), rows_(rows), documents_(documents) {
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
    plans_for(shape.b, documents ? documents_bucket(1) : 0);
  } catch (...) {
    cudnnDestroy(handle_);
    throw;
  }
}

CudnnAttention::~CudnnAttention() {
  if (handle_) cudnnDestroy(handle_);
}

CudnnAttention::Plans& CudnnAttention::plans_for(int64_t b, int64_t documents) {
  if (b <= 0 || b > shape_.b)
    throw Error("cuDNN attention: batch " + std::to_string(b) + " outside 1.." + std::to_string(shape_.b));
  if (documents > 0 && !documents_)  // (its scratch is sized for documents only when built for them)
    throw Error("cuDNN attention: documents given to an object built without them");
  if (documents < 0 || (documents > 0 && documents != documents_bucket(documents)))
    throw Error("cuDNN attention: plans for " + std::to_string(documents) + " documents: not a documents_bucket");
  const auto key = std::make_pair(documents > 0, documents > 0 ? documents : b);
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  AttentionShape a = shape_;
  a.b = key.second;
  auto p = std::make_unique<Plans>();
  p->fwd = build_forward(handle_, a, rows_, key.first);
  p->bwd = build_backward(handle_, a, rows_, key.first);
  p->workspace = DeviceBuffer(static_cast<size_t>(std::max<int64_t>(
      {p->fwd.workspace_bytes(), p->bwd.workspace_bytes(), 256})));
  if (key.first) p->offsets = DeviceBuffer(sizeof(int64_t) * kRaggedOffsets * offsets_stride(a.b));
  return *plans_.emplace(key, std::move(p)).first->second;
}

void CudnnAttention::bind_documents(Plans& p, const CudnnDocuments* docs, std::vector<CudnnPlan::Binding>& bindings) {
  if (!docs) return;
  if (!docs->start || !docs->length) throw Error("cuDNN attention: documents without their starts and lengths");
  // Token strides as views_of gives them ([batch, head, position, dim]: position's), and the
  // token-major statistics'.
  const Views v = views_of(shape_, rows_);
  const TokenStrides strides{{v.q[2], v.kv[2], v.v[2], v.o[2], shape_.H}};
  const int64_t n = docs->count + 1, stride = offsets_stride(docs->count);
  int64_t* offsets = p.offsets.as<int64_t>();
  document_offsets<<<static_cast<int>((n + 255) / 256), 256, 0, stream_>>>(docs->start, n, stride, strides,
                                                                            offsets);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  bindings.push_back({kSeqQ, docs->length});
  bindings.push_back({kSeqKV, docs->length});
  for (int k = 0; k < kRaggedOffsets; ++k) bindings.push_back({kOffsets + k, offsets + k * stride});
}

const bf16* CudnnAttention::query_heads(const bf16* qkv, const AttentionShape& a) {
  if (!gathers_q()) return qkv;  // MHA or split rows: read in place
  launch_copy<true>(const_cast<bf16*>(qkv), q_.as<bf16>(), a, stream_);
  return q_.as<bf16>();
}

void CudnnAttention::forward(const bf16* qkv, bf16* ctx, float* lse, int64_t b, const CudnnDocuments* docs) {
  if (rows_ == QkvRows::Separate) throw Error("cuDNN attention: built for separate q, k and v rows, given one buffer");
  AttentionShape a = shape_;
  a.b = b;
  const Views v = views_of(a, rows_);
  run_forward(b, docs, query_heads(qkv, a), qkv + v.k_off, qkv + v.v_off, ctx, lse);
}

void CudnnAttention::forward(const bf16* q, const bf16* k, const bf16* v, bf16* ctx, float* lse, int64_t b,
                             const CudnnDocuments* docs) {
  if (rows_ != QkvRows::Separate) throw Error("cuDNN attention: given separate q, k and v, built for QKV rows");
  run_forward(b, docs, q, k, v, ctx, lse);
}

void CudnnAttention::run_forward(int64_t b, const CudnnDocuments* docs, const bf16* q, const bf16* k, const bf16* v,
                                 bf16* ctx, float* lse) {
  Plans& p = plans_for(b, docs ? docs->count : 0);
  std::vector<CudnnPlan::Binding> bindings{{kQ, q},          {kK, k},          {kV, v},
                                           {kO, ctx},        {kStats, lse},    {kScale, &scale_},
                                           {kNegInf, &kNegInfValue}};
  bind_documents(p, docs, bindings);
  p.fwd.execute(handle_, bindings, p.workspace.ptr);
}

void CudnnAttention::backward(const bf16* qkv, const bf16* ctx, const bf16* dctx, const float* lse, bf16* dqkv,
                              int64_t b, const CudnnDocuments* docs) {
  if (rows_ == QkvRows::Separate) throw Error("cuDNN attention: built for separate q, k and v rows, given one buffer");
  AttentionShape a = shape_;
  a.b = b;
  const Views v = views_of(a, rows_);
  // The scratch holds the last forward's layer: gather this layer's query heads again.
  const bf16* q = query_heads(qkv, a);
  bf16* dq = gathers_q() ? dq_.as<bf16>() : dqkv;
  run_backward(b, docs, q, qkv + v.k_off, qkv + v.v_off, ctx, dctx, lse, dq, dqkv + v.k_off, dqkv + v.v_off);
  if (gathers_q()) launch_copy<false>(dqkv, dq_.as<bf16>(), a, stream_);
}

void CudnnAttention::backward(const bf16* q, const bf16* k, const bf16* v, const bf16* ctx, const bf16* dctx,
                              const float* lse, bf16* dq, bf16* dk, bf16* dv, int64_t b, const CudnnDocuments* docs) {
  if (rows_ != QkvRows::Separate) throw Error("cuDNN attention: given separate q, k and v, built for QKV rows");
  run_backward(b, docs, q, k, v, ctx, dctx, lse, dq, dk, dv);
}

void CudnnAttention::run_backward(int64_t b, const CudnnDocuments* docs, const bf16* q, const bf16* k, const bf16* v,
                                  const bf16* ctx, const bf16* dctx, const float* lse, bf16* dq, bf16* dk, bf16* dv) {
  Plans& p = plans_for(b, docs ? docs->count : 0);
  // Our part of the workspace: the fp32 dQ accumulator (zeroed: cuDNN adds into it) and the
  // softmax row sums; over documents both token-major, the same sizes.
  char* ws = static_cast<char*>(scratch_.ptr);
  float* dq_accum = reinterpret_cast<float*>(ws);
  float* softmax_sum = reinterpret_cast<float*>(ws + aligned(dq_accum_bytes()));
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, dq_accum_bytes(), stream_));
  const float one = 1.0f;
  std::vector<CudnnPlan::Binding> bindings{
      {kQ, q},     {kK, k},     {kV, v},   {kO, ctx},
      {kDO, dctx}, {kStats, lse}, {kScale, &scale_}, {kNegInf, &kNegInfValue},
      {kOne, &one}, {kDQ, dq},  {kDK, dk}, {kDV, dv},
      {kSoftmaxSum, softmax_sum}, {kDQAccum, dq_accum}};
  bind_documents(p, docs, bindings);
  p.bwd.execute(handle_, bindings, p.workspace.ptr);
}

size_t CudnnAttention::dq_accum_bytes() const {
  // Over documents with dQ's token stride (a fused MHA row's is the whole row).
  const int64_t per_token = documents_ ? views_of(shape_, rows_).q[2] : shape_.H * shape_.D;
  return sizeof(float) * static_cast<size_t>(shape_.b * shape_.s * per_token);
}

size_t CudnnAttention::backward_scratch_bytes() const {
  return aligned(dq_accum_bytes()) + aligned(sizeof(float) * shape_.b * shape_.H * shape_.s);
}

std::string CudnnAttention::engines() const {
  const Plans& p = *plans_.begin()->second;  // (the first built: the construction's)
  return p.fwd.engine() + ", " + p.bwd.engine();
}

int64_t CudnnAttention::device_bytes() const {
  size_t bytes = scratch_.bytes + q_.bytes + dq_.bytes;
  for (const auto& [b, p] : plans_) bytes += p->workspace.bytes;
  return static_cast<int64_t>(bytes);
}

}  // namespace laoyao::kernels::cuda
