// cuDNN backend descriptors, the graph builder and execution plans (see cudnn_graph.hpp).
#include "kernels/cuda/cudnn_graph.hpp"

#include "kernels/cuda/cuda_check.hpp"

namespace laoyao::kernels::cuda {

std::string cudnn_last_error() {
  char buf[1024] = {0};
  cudnnGetLastErrorString(buf, sizeof(buf));
  return buf;
}

namespace {
[[noreturn]] void cudnn_fail(const std::string& what, cudnnStatus_t st) {
  std::string msg = what + ": " + cudnnGetErrorString(st);
  const std::string detail = cudnn_last_error();
  if (!detail.empty()) msg += " (" + detail + ")";
  throw Error(msg);
}
}  // namespace

CudnnDescriptor::CudnnDescriptor(cudnnBackendDescriptorType_t type) {
  LAOYAO_CUDA_CHECK(cudnnBackendCreateDescriptor(type, &d_));
}

CudnnDescriptor::~CudnnDescriptor() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

CudnnDescriptor& CudnnDescriptor::operator=(CudnnDescriptor&& o) noexcept {
  if (this != &o) {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = std::exchange(o.d_, nullptr);
  }
  return *this;
}

CudnnDescriptor& CudnnDescriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                                      int64_t count, const void* values) {
  const cudnnStatus_t st = cudnnBackendSetAttribute(d_, name, type, count, values);
  if (st != CUDNN_STATUS_SUCCESS) cudnn_fail("cudnnBackendSetAttribute(attribute " + std::to_string(name) + ")", st);
  return *this;
}

void CudnnDescriptor::finalize(const char* what) {
  const cudnnStatus_t st = cudnnBackendFinalize(d_);
  if (st != CUDNN_STATUS_SUCCESS) cudnn_fail(std::string("cudnnBackendFinalize(") + what + ")", st);
}

void CudnnPlan::execute(cudnnHandle_t handle, const std::vector<Binding>& bindings, void* workspace) const {
  std::vector<void*> ptrs;
  for (int64_t uid : uids_) {
    const void* p = nullptr;
    for (const Binding& b : bindings)
      if (b.first == uid) p = b.second;
    if (!p) throw Error("cuDNN " + engine_ + ": no memory bound to tensor " + std::to_string(uid));
    ptrs.push_back(const_cast<void*>(p));  // cuDNN's variant pack takes void* for inputs too
  }
  CudnnDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids_.size()), uids_.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()), ptrs.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize("variant pack");
  const cudnnStatus_t st = cudnnBackendExecute(handle, plan_.get(), pack.get());
  if (st != CUDNN_STATUS_SUCCESS) cudnn_fail("cudnnBackendExecute(" + engine_ + ")", st);
}

CudnnGraph::Dims CudnnGraph::packed(const Dims& dims) {
  Dims s{};
  int64_t acc = 1;
  for (int i = 3; i >= 0; --i) {
    s[static_cast<size_t>(i)] = acc;
    acc *= dims[static_cast<size_t>(i)];
  }
  return s;
}

int CudnnGraph::add(Tensor t) {
  CudnnDescriptor d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t alignment = 16;
  d.set_type(CUDNN_ATTR_TENSOR_DATA_TYPE, t.type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.strides.data())
      .set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, t.uid)
      .set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, alignment)
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &t.is_virtual);
  if (t.by_value) d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &t.by_value);
  if (t.ragged >= 0) d.set_desc(CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, desc(t.ragged));
  d.finalize("tensor");
  tensors_.push_back(t);
  tensor_descs_.push_back(std::move(d));
  return static_cast<int>(tensors_.size()) - 1;
}

int CudnnGraph::tensor(int64_t uid, Dims dims, Dims strides, cudnnDataType_t type, int ragged) {
  return add({uid, dims, strides, type, false, false, ragged});
}

int CudnnGraph::scalar(int64_t uid, cudnnDataType_t type) {
  return add({uid, {1, 1, 1, 1}, {1, 1, 1, 1}, type, false, true});
}

int CudnnGraph::virtual_tensor(Dims dims, cudnnDataType_t type) { return virtual_tensor(dims, packed(dims), type); }

int CudnnGraph::virtual_tensor(Dims dims, Dims strides, cudnnDataType_t type, int ragged) {
  return add({next_virtual_uid_++, dims, strides, type, true, false, ragged});
}

int CudnnGraph::matmul(int a, int b, int c, Overrides o) {
  CudnnDescriptor m(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  m.set_type(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT).finalize("matmul descriptor");
  CudnnDescriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, desc(a))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, desc(b))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, desc(c))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
  if (o.m >= 0) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, desc(o.m));
  if (o.n >= 0) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, desc(o.n));
  if (o.k >= 0) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, desc(o.k));
  op.finalize("matmul operation");
  op_attrs_.push_back(std::move(m));
  ops_.push_back(std::move(op));
  return c;
}

int CudnnGraph::pointwise_op(cudnnPointwiseMode_t mode, cudnnDataType_t math, int x, int y, int b, int t,
                             int64_t axis) {
  CudnnDescriptor p(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  p.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode).set_type(CUDNN_ATTR_POINTWISE_MATH_PREC, math);
  if (axis >= 0) p.set_int64(CUDNN_ATTR_POINTWISE_AXIS, axis);
  p.finalize("pointwise descriptor");
  const float one = 1.0f;
  CudnnDescriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p)
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, desc(x))
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, desc(y))
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
  if (b >= 0) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, desc(b));
  if (t >= 0) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, desc(t));
  op.finalize("pointwise operation");
  op_attrs_.push_back(std::move(p));
  ops_.push_back(std::move(op));
  return y;
}

int CudnnGraph::pointwise(cudnnPointwiseMode_t mode, int x, int y, int b, int t) {
  return pointwise_op(mode, CUDNN_DATA_FLOAT, x, y, b, t, -1);
}

int CudnnGraph::gen_index(int x, int y, int64_t axis, cudnnDataType_t math) {
  return pointwise_op(CUDNN_POINTWISE_GEN_INDEX, math, x, y, -1, -1, axis);
}

int CudnnGraph::compare_ge(int x, int b, int y) {
  return pointwise_op(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, x, y, b, -1, -1);
}

int CudnnGraph::compare_lt(int x, int b, int y) {
  return pointwise_op(CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, x, y, b, -1, -1);
}

int CudnnGraph::logical_and(int x, int b, int y) {
  return pointwise_op(CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, x, y, b, -1, -1);
}

int CudnnGraph::reshape(int x, int y) {
  CudnnDescriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, desc(x))
      .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, desc(y))
      .finalize("reshape operation");
  ops_.push_back(std::move(op));
  return y;
}

int CudnnGraph::reduction(cudnnReduceTensorOp_t rop, int x, int y) {
  CudnnDescriptor r(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &rop)
      .set_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT)
      .finalize("reduction descriptor");
  CudnnDescriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, desc(x))
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, desc(y))
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r)
      .finalize("reduction operation");
  op_attrs_.push_back(std::move(r));
  ops_.push_back(std::move(op));
  return y;
}

CudnnPlan CudnnGraph::plan(cudnnHandle_t handle, const char* what) {
  const std::string name(what);
  CudnnDescriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const auto& op : ops_) ops.push_back(op.get());
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()), ops.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  graph.finalize((name + " operation graph").c_str());

  // Heuristic mode A first; the fallback list where A offers nothing that finalizes. The first
  // engine config that finalizes is taken.
  std::string refusals;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    CudnnDescriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) {
      refusals += " heuristics(mode " + std::to_string(mode) + "): " + cudnn_last_error() + ";";
      continue;
    }
    int64_t count = 0;
    LAOYAO_CUDA_CHECK(
        cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    std::vector<CudnnDescriptor> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(cfgs.back().get());
    }
    int64_t got = 0;
    if (count > 0)
      LAOYAO_CUDA_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
    for (int64_t i = 0; i < got; ++i) {
      CudnnDescriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
          .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[static_cast<size_t>(i)]);
      if (cudnnBackendFinalize(plan.get()) != CUDNN_STATUS_SUCCESS) {
        refusals += " engine config " + std::to_string(i) + ": " + cudnn_last_error() + ";";
        continue;
      }
      int64_t ws = 0, n = 0;
      LAOYAO_CUDA_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                                 1, &n, &ws));
      // The engine's global index names the path in messages and in `laoyao doctor`.
      std::string engine = name + " engine";
      CudnnDescriptor eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      cudnnBackendDescriptor_t eng_raw = eng.get();
      int64_t index = -1;
      if (cudnnBackendGetAttribute(cfgs[static_cast<size_t>(i)].get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng_raw) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendGetAttribute(eng_raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index) ==
              CUDNN_STATUS_SUCCESS)
        engine.append(" ").append(std::to_string(index));  // (not " " + string: GCC 12's -Wrestrict false alarm)
      std::vector<int64_t> uids;
      for (const Tensor& t : tensors_)
        if (!t.is_virtual) uids.push_back(t.uid);
      return CudnnPlan(std::move(plan), std::move(uids), ws, engine);
    }
  }
  throw Error("cuDNN offers no engine for the " + name + " graph on this GPU:" + refusals);
}

}  // namespace laoyao::kernels::cuda
