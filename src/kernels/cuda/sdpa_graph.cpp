// cuDNN's fused attention graphs for any geometry (see sdpa_graph.hpp).
#include "kernels/cuda/sdpa_graph.hpp"

#include <array>
#include <limits>

namespace laoyao::kernels::cuda {

const float kSdpaNegInfValue = -std::numeric_limits<float>::infinity();

namespace {

using Dims = CudnnGraph::Dims;

Dims transposed(const Dims& d) { return {d[0], d[1], d[3], d[2]}; }

// -inf where the key is later than the query (row index < column index), x elsewhere.
int causal_mask(CudnnGraph& g, int x, int neg_inf, const Dims& s_dims) {
  const int row = g.gen_index(x, g.virtual_tensor(s_dims, CUDNN_DATA_INT32), 2);
  const int col = g.gen_index(x, g.virtual_tensor(s_dims, CUDNN_DATA_INT32), 3);
  const int keep = g.compare_ge(row, col, g.virtual_tensor(s_dims, CUDNN_DATA_BOOLEAN));
  return g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, g.virtual_tensor(s_dims), neg_inf, keep);
}

// The bound tensors both graphs share; with documents their lengths and each tensor's offsets.
struct Inputs {
  int q, kt, v, o, stats, scale, neg_inf;
  int seq_q = -1, seq_kv = -1;  // documents: their lengths
  std::array<int, kRaggedOffsets> off{-1, -1, -1, -1, -1};
  bool documents() const { return seq_q >= 0; }
  CudnnGraph::Overrides scores() const { return {seq_q, seq_kv, -1}; }   // [query, key] products
  CudnnGraph::Overrides by_keys() const { return {seq_kv, -1, seq_q}; }  // [key, dim] = [key, query] @ [query, dim]
  CudnnGraph::Overrides by_queries() const { return {seq_q, -1, seq_kv}; }
};

struct Shapes {
  Dims q, k, v, o, rows, scores;
  explicit Shapes(const SdpaGeometry& a)
      : q{a.b, a.H, a.sq, a.D}, k{a.b, a.G, a.skv, a.D}, v{a.b, a.G, a.skv, a.Dv}, o{a.b, a.H, a.sq, a.Dv},
        rows{a.b, a.H, a.sq, 1}, scores{a.b, a.H, a.sq, a.skv} {}
};

// backward: V bound transposed (the backward's dO V^T).
Inputs bind_inputs(CudnnGraph& g, const SdpaGeometry& a, bool backward) {
  const Shapes d(a);
  Inputs in;
  if (a.documents) {
    const Dims lengths{a.b, 1, 1, 1}, offsets{a.b + 1, 1, 1, 1}, unit{1, 1, 1, 1};
    in.seq_q = g.tensor(kSdpaSeqQ, lengths, unit, CUDNN_DATA_INT32);
    in.seq_kv = g.tensor(kSdpaSeqKV, lengths, unit, CUDNN_DATA_INT32);
    for (int i = 0; i < kRaggedOffsets; ++i)
      in.off[size_t(i)] = g.tensor(kSdpaOffsets + i, offsets, unit, CUDNN_DATA_INT64);
  }
  in.q = g.tensor(kSdpaQ, d.q, a.q, CUDNN_DATA_BFLOAT16, in.off[kOffQ]);
  in.kt = g.tensor(kSdpaK, transposed(d.k), transposed(a.k), CUDNN_DATA_BFLOAT16, in.off[kOffK]);
  in.v = backward ? g.tensor(kSdpaV, transposed(d.v), transposed(a.v), CUDNN_DATA_BFLOAT16, in.off[kOffV])
                  : g.tensor(kSdpaV, d.v, a.v, CUDNN_DATA_BFLOAT16, in.off[kOffV]);
  in.o = g.tensor(kSdpaO, d.o, a.o, CUDNN_DATA_BFLOAT16, in.off[kOffO]);
  in.stats = g.tensor(kSdpaStats, d.rows, a.stats, CUDNN_DATA_FLOAT, in.off[kOffStats]);
  in.scale = g.scalar(kSdpaScale, CUDNN_DATA_FLOAT);
  // (Only where a mask uses it: a bound tensor no operation reads is not in cuDNN's plan, and a
  // variant pack naming it is refused at execution.)
  in.neg_inf = a.causal || a.documents ? g.scalar(kSdpaNegInf, CUDNN_DATA_FLOAT) : -1;
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

// d = a @ b summed over the heads of each query group: straight into `out` for MHA, else through a
// per-query-head product ([b, H, keys, dim]) and a reduction over the group's heads.
void group_matmul(CudnnGraph& g, const SdpaGeometry& a, int64_t dim, int lhs, int rhs, int out,
                  CudnnGraph::Overrides o) {
  if (a.H == a.G) {
    g.matmul(lhs, rhs, out, o);
    return;
  }
  const int full = g.matmul(lhs, rhs, g.virtual_tensor({a.b, a.H, a.skv, dim}, CUDNN_DATA_BFLOAT16), o);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
}

}  // namespace

CudnnPlan build_sdpa_forward(cudnnHandle_t handle, const SdpaGeometry& a, const char* what) {
  CudnnGraph g;
  const Inputs in = bind_inputs(g, a, false);
  const Shapes d(a);
  const int s = g.matmul(in.q, in.kt, g.virtual_tensor(d.scores), in.scores());
  const int scaled = g.pointwise(CUDNN_POINTWISE_MUL, s, g.virtual_tensor(d.scores), in.scale);
  const int padded = padding_mask(g, in, scaled, d.scores);
  const int masked = a.causal ? causal_mask(g, padded, in.neg_inf, d.scores) : padded;
  // Softmax and its statistics, lse = max + log(sum(exp(x - max))), which the backward reads.
  const int mx = g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, g.virtual_tensor(d.rows));
  const int shifted = g.pointwise(CUDNN_POINTWISE_SUB, masked, g.virtual_tensor(d.scores), mx);
  const int e = g.pointwise(CUDNN_POINTWISE_EXP, shifted, g.virtual_tensor(d.scores));
  const int sum = g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, g.virtual_tensor(d.rows));
  const int log_sum = g.pointwise(CUDNN_POINTWISE_LOG, sum, g.virtual_tensor(d.rows));
  g.pointwise(CUDNN_POINTWISE_ADD, mx, in.stats, log_sum);
  // The probabilities in the input type: the second matmul takes bf16 operands.
  const int p = g.pointwise(CUDNN_POINTWISE_DIV, e, g.virtual_tensor(d.scores, CUDNN_DATA_BFLOAT16), sum);
  g.matmul(p, in.v, in.o, in.by_queries());
  return g.plan(handle, what);
}

CudnnPlan build_sdpa_backward(cudnnHandle_t handle, const SdpaGeometry& a, const char* what) {
  CudnnGraph g;
  const Inputs in = bind_inputs(g, a, true);
  const Shapes d(a);
  const Dims s_t_strides{a.H * a.sq * a.skv, a.sq * a.skv, 1, a.skv};  // [b, H, key, query] over the scores
  const int d_o = g.tensor(kSdpaDO, d.o, a.o, CUDNN_DATA_BFLOAT16, in.off[kOffO]);
  const int dq = g.tensor(kSdpaDQ, d.q, a.q, CUDNN_DATA_BFLOAT16, in.off[kOffQ]);
  const int dk = g.tensor(kSdpaDK, d.k, a.k, CUDNN_DATA_BFLOAT16, in.off[kOffK]);
  const int dv = g.tensor(kSdpaDV, d.v, a.v, CUDNN_DATA_BFLOAT16, in.off[kOffV]);
  const int one = g.scalar(kSdpaOne, CUDNN_DATA_FLOAT);
  // Workspace-resident intermediates (in the caller's part of the workspace, bound at execution):
  // with documents, as cuDNN's frontend lays them out for ragged tensors (Transformer Engine's
  // THD), the row sums with the statistics' strides and offsets, the fp32 dQ accumulator with dQ's.
  const int softmax_sum = g.tensor(kSdpaSoftmaxSum, d.rows, a.softmax_sum, CUDNN_DATA_FLOAT, in.off[kOffStats]);
  const int dq_accum = g.tensor(kSdpaDQAccum, d.q, a.dq_accum, CUDNN_DATA_FLOAT, in.off[kOffQ]);

  // softmax_sum = rowsum(dO * O): the softmax backward's subtrahend.
  const int d_o_o = g.pointwise(CUDNN_POINTWISE_MUL, d_o, g.virtual_tensor(d.o), in.o);
  const int rowsum = g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o_o, g.virtual_tensor(d.rows));
  g.pointwise(CUDNN_POINTWISE_MUL, rowsum, softmax_sum, one);
  // P again from the saved statistics.
  const int s = g.matmul(in.q, in.kt, g.virtual_tensor(d.scores), in.scores());
  const int scaled = g.pointwise(CUDNN_POINTWISE_MUL, s, g.virtual_tensor(d.scores), in.scale);
  const int padded = padding_mask(g, in, scaled, d.scores);
  const int shifted = g.pointwise(CUDNN_POINTWISE_SUB, padded, g.virtual_tensor(d.scores), in.stats);
  const int masked = a.causal ? causal_mask(g, shifted, in.neg_inf, d.scores) : shifted;
  const int p = g.pointwise(CUDNN_POINTWISE_EXP, masked, g.virtual_tensor(d.scores));
  // dV = P^T dO.
  const int p_t = g.reshape(p, g.virtual_tensor(transposed(d.scores), s_t_strides, CUDNN_DATA_BFLOAT16));
  group_matmul(g, a, a.Dv, p_t, d_o, dv, in.by_keys());
  // dS = scale * P * (dO V^T - softmax_sum).
  const int dp = g.matmul(d_o, in.v, g.virtual_tensor(d.scores), in.scores());
  const int centered = g.pointwise(CUDNN_POINTWISE_SUB, dp, g.virtual_tensor(d.scores), softmax_sum);
  const int dp_p = g.pointwise(CUDNN_POINTWISE_MUL, centered, g.virtual_tensor(d.scores), p);
  const int ds = g.pointwise(CUDNN_POINTWISE_MUL, dp_p, g.virtual_tensor(d.scores), in.scale);
  // dK = dS^T Q.
  const int ds_t = g.reshape(ds, g.virtual_tensor(transposed(d.scores), s_t_strides, CUDNN_DATA_BFLOAT16));
  group_matmul(g, a, a.D, ds_t, in.q, dk, in.by_keys());
  // dQ = dS K, accumulated in fp32, then rounded to bf16.
  const int k = g.reshape(in.kt, g.virtual_tensor(d.k, a.k, CUDNN_DATA_FLOAT, in.off[kOffK]));
  g.matmul(ds, k, dq_accum, in.by_queries());
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
  return g.plan(handle, what);
}

}  // namespace laoyao::kernels::cuda
