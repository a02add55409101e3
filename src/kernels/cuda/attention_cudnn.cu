// Causal attention through cuDNN's fused flash attention (see attention_cudnn.hpp): the graphs are
// sdpa_graph.hpp's, over views of our buffers.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cudnn.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/sdpa_graph.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using Dims = CudnnGraph::Dims;

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

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The statistics' (and the backward's row sums') strides: [b, H, s] dense, [T, H] over documents.
Dims row_strides(const AttentionShape& a, bool documents) {
  return documents ? Dims{a.s * a.H, 1, a.H, 1} : CudnnGraph::packed({a.b, a.H, a.s, 1});
}

// The causal attention of b sequences (or, with documents, a.b documents) as sdpa_graph.hpp's
// geometry.
SdpaGeometry geometry_of(const AttentionShape& a, QkvRows rows, bool documents) {
  const Views v = views_of(a, rows);
  SdpaGeometry g;
  g.b = a.b, g.H = a.H, g.G = a.G, g.sq = g.skv = a.s, g.D = a.D, g.Dv = a.dv();
  g.q = v.q, g.k = v.kv, g.v = v.v, g.o = v.o;
  g.stats = g.softmax_sum = row_strides(a, documents);
  g.dq_accum = documents ? v.q : CudnnGraph::packed({a.b, a.H, a.s, a.D});
  g.causal = true;
  g.documents = documents;
  return g;
}

CudnnPlan build_forward(cudnnHandle_t handle, const AttentionShape& a, QkvRows rows, bool documents) {
  return build_sdpa_forward(handle, geometry_of(a, rows, documents),
                            documents ? "sdpa forward over documents" : "sdpa forward");
}

CudnnPlan build_backward(cudnnHandle_t handle, const AttentionShape& a, QkvRows rows, bool documents) {
  return build_sdpa_backward(handle, geometry_of(a, rows, documents),
                             documents ? "sdpa backward over documents" : "sdpa backward");
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
  bindings.push_back({kSdpaSeqQ, docs->length});
  bindings.push_back({kSdpaSeqKV, docs->length});
  for (int k = 0; k < kRaggedOffsets; ++k) bindings.push_back({kSdpaOffsets + k, offsets + k * stride});
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
  std::vector<CudnnPlan::Binding> bindings{{kSdpaQ, q},          {kSdpaK, k},          {kSdpaV, v},
                                           {kSdpaO, ctx},        {kSdpaStats, lse},    {kSdpaScale, &scale_},
                                           {kSdpaNegInf, &kSdpaNegInfValue}};
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
      {kSdpaQ, q},     {kSdpaK, k},     {kSdpaV, v},   {kSdpaO, ctx},
      {kSdpaDO, dctx}, {kSdpaStats, lse}, {kSdpaScale, &scale_}, {kSdpaNegInf, &kSdpaNegInfValue},
      {kSdpaOne, &one}, {kSdpaDQ, dq},  {kSdpaDK, dk}, {kSdpaDV, dv},
      {kSdpaSoftmaxSum, softmax_sum}, {kSdpaDQAccum, dq_accum}};
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
