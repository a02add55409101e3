// The graphs of cuDNN's fused scaled dot-product attention (its graph API, cudnn_graph.hpp), spelled
// out op by op (matmul, scale, masks, softmax with its statistics, matmul) the way cuDNN's frontend
// library expands its SDPA node, for any geometry: each tensor a 4-D [batch, heads, position, dim]
// view with strides into the caller's buffers, as many queries as keys or not, causal or not. The
// callers (attention_cudnn.cu: a sequence's causal attention; attention_cudnn_cp.cu: context
// parallelism's blocks) choose the views and bind the memory.
#pragma once
#include <cudnn.h>

#include <cstdint>

#include "kernels/cuda/cudnn_graph.hpp"

namespace laoyao::kernels::cuda {

// Variant-pack ids of the tensors bound to memory.
enum SdpaUid : int64_t {
  kSdpaQ = 1, kSdpaK, kSdpaV, kSdpaO, kSdpaStats, kSdpaScale, kSdpaNegInf, kSdpaOne, kSdpaDO, kSdpaDQ, kSdpaDK,
  kSdpaDV, kSdpaSoftmaxSum, kSdpaDQAccum,
  // Documents: their lengths (as the queries' and as the keys'), and the element offsets of each
  // document in q, k, v, o and the statistics (kSdpaOffsets + SdpaRagged).
  kSdpaSeqQ, kSdpaSeqKV, kSdpaOffsets
};

// The tensors' element offsets of a document, per token of it: their token strides.
enum SdpaRagged { kOffQ, kOffK, kOffV, kOffO, kOffStats, kRaggedOffsets };

// The masked scores' value (the frontend's for cuDNN 9.10 on): exp of it is exactly 0. Bound by
// value at execution (kSdpaNegInf).
extern const float kSdpaNegInfValue;

struct SdpaGeometry {
  using Dims = CudnnGraph::Dims;
  int64_t b = 0, H = 0, G = 0;  // batch (with documents: the plans' document count), heads, query groups
  int64_t sq = 0, skv = 0;      // queries and keys of a batch entry
  int64_t D = 0, Dv = 0;        // query/key and value head dims
  // Element strides [batch, head, position, dim]: the queries (and dQ), keys (dK), values (dV),
  // output (dO); the statistics [b, H, sq, 1] (lse: the natural-log softmax denominator of the
  // scaled scores), the backward's row sums and its fp32 dQ accumulator (our part of the workspace).
  Dims q{}, k{}, v{}, o{}, stats{}, softmax_sum{}, dq_accum{};
  bool causal = true;      // key i of query i's row and those before it (top-left aligned)
  bool documents = false;  // ragged: each batch entry a document, at offsets bound per tensor
};

CudnnPlan build_sdpa_forward(cudnnHandle_t handle, const SdpaGeometry& g, const char* what);
CudnnPlan build_sdpa_backward(cudnnHandle_t handle, const SdpaGeometry& g, const char* what);

}  // namespace laoyao::kernels::cuda
