// cuDNN's graph API through its backend descriptors (cudnn_graph.h), without the frontend library:
// a few owning wrappers and a small builder. A graph is a list of tensors (4-D here, each with a
// unique id, strides and a data type; virtual tensors live only inside the fused kernel) and of
// operations (matmul, pointwise, reduction) between them. `CudnnGraph::plan` asks cuDNN's heuristics
// for engine configurations, keeps the first one that finalizes into an execution plan, and
// `CudnnPlan::execute` runs it on a stream with the device pointers of the non-virtual tensors.
//
// Plans are built once, outside the step: building costs milliseconds (cuDNN may compile a kernel),
// executing costs one cudnnBackendExecute.
#pragma once
#include <cudnn.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace laoyao::kernels::cuda {

// One cuDNN backend descriptor, owned (destroyed with the object). Move-only.
class CudnnDescriptor {
 public:
  CudnnDescriptor() = default;
  explicit CudnnDescriptor(cudnnBackendDescriptorType_t type);
  ~CudnnDescriptor();
  CudnnDescriptor(CudnnDescriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  CudnnDescriptor& operator=(CudnnDescriptor&& o) noexcept;
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  // Sets attribute `name` to `count` values of `type` at `values`; throws naming the attribute.
  CudnnDescriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                       const void* values);
  CudnnDescriptor& set_int64(cudnnBackendAttributeName_t name, int64_t v) { return set(name, CUDNN_TYPE_INT64, 1, &v); }
  CudnnDescriptor& set_desc(cudnnBackendAttributeName_t name, const CudnnDescriptor& d) {
    cudnnBackendDescriptor_t p = d.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
  }
  CudnnDescriptor& set_type(cudnnBackendAttributeName_t name, cudnnDataType_t t) {
    return set(name, CUDNN_TYPE_DATA_TYPE, 1, &t);
  }
  // Finalizes; `what` names the descriptor in the error.
  void finalize(const char* what);

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// The error text cuDNN keeps for its most recent failure ("" when none).
std::string cudnn_last_error();

// A finalized execution plan and the ids of the tensors its variant pack names.
class CudnnPlan {
 public:
  CudnnPlan() = default;
  CudnnPlan(CudnnDescriptor plan, std::vector<int64_t> uids, int64_t workspace_bytes, std::string engine)
      : plan_(std::move(plan)), uids_(std::move(uids)), workspace_(workspace_bytes), engine_(std::move(engine)) {}

  bool valid() const { return plan_.get() != nullptr; }
  int64_t workspace_bytes() const { return workspace_; }
  const std::string& engine() const { return engine_; }
  // One (uid, pointer) per non-virtual tensor of the graph: device memory, or host memory for a
  // by-value scalar. Throws if one is missing.
  using Binding = std::pair<int64_t, const void*>;
  void execute(cudnnHandle_t handle, const std::vector<Binding>& bindings, void* workspace) const;

 private:
  CudnnDescriptor plan_;
  std::vector<int64_t> uids_;
  int64_t workspace_ = 0;
  std::string engine_;
};

// A matmul's actual rows (m), columns (n) and inner size (k) for each batch entry: tensors [batch,
// 1, 1, 1] of int32 (variable-length sequences), or -1 for its operands' dims.
struct CudnnMatmulOverrides {
  int m = -1, n = -1, k = -1;
};

// Builds one operation graph. Tensor handles are indices into the builder's list.
class CudnnGraph {
 public:
  using Dims = std::array<int64_t, 4>;
  struct Tensor {
    int64_t uid;
    Dims dims, strides;
    cudnnDataType_t type;
    bool is_virtual, by_value;
    int ragged = -1;  // the tensor of its batch entries' element offsets, or -1
  };

  // A tensor the caller binds to memory at execution (uid chosen by the caller). With `ragged`
  // (a tensor of dims [batch + 1, 1, 1, 1]), batch entry i starts ragged[i] elements from the bound
  // pointer (packed variable-length sequences), and the batch stride is unused.
  int tensor(int64_t uid, Dims dims, Dims strides, cudnnDataType_t type, int ragged = -1);
  // A scalar passed by value at execution (host memory), dims [1,1,1,1].
  int scalar(int64_t uid, cudnnDataType_t type);
  // An intermediate that stays inside the fused kernel; packed strides unless given.
  int virtual_tensor(Dims dims, cudnnDataType_t type = CUDNN_DATA_FLOAT);
  int virtual_tensor(Dims dims, Dims strides, cudnnDataType_t type, int ragged = -1);
  // Packed (row-major) strides of dims.
  static Dims packed(const Dims& dims);

  using Overrides = CudnnMatmulOverrides;
  int matmul(int a, int b, int c, Overrides o = {});  // c = a @ b over the last two dims, fp32 compute
  // y = mode(x [, b] [, t]) with fp32 math (BINARY_SELECT: y = t ? x : b).
  int pointwise(cudnnPointwiseMode_t mode, int x, int y, int b = -1, int t = -1);
  // y = the index of each element along `axis` (computed in `math`: int32 for the padding mask)
  int gen_index(int x, int y, int64_t axis, cudnnDataType_t math = CUDNN_DATA_FLOAT);
  int compare_ge(int x, int b, int y);        // y (boolean) = x >= b
  int compare_lt(int x, int b, int y);        // y (boolean) = x < b
  int logical_and(int x, int b, int y);       // y (boolean) = x && b
  int reduction(cudnnReduceTensorOp_t op, int x, int y);  // y's unit dims are the reduced ones
  int reshape(int x, int y);                              // y: x under other dims/strides (a transpose)

  const Tensor& at(int t) const { return tensors_[static_cast<size_t>(t)]; }
  // Finalizes the graph and the first heuristic engine configuration that cuDNN accepts. `what`
  // names the graph in errors, which carry cuDNN's own last error text.
  CudnnPlan plan(cudnnHandle_t handle, const char* what);

 private:
  int add(Tensor t);
  int pointwise_op(cudnnPointwiseMode_t mode, cudnnDataType_t math, int x, int y, int b, int t, int64_t axis);
  const CudnnDescriptor& desc(int t) const { return tensor_descs_[static_cast<size_t>(t)]; }

  std::vector<Tensor> tensors_;
  std::vector<CudnnDescriptor> tensor_descs_;
  std::vector<CudnnDescriptor> op_attrs_;  // matmul/pointwise/reduction descriptors the ops point to
  std::vector<CudnnDescriptor> ops_;
  int64_t next_virtual_uid_ = 1'000'000;
};

}  // namespace laoyao::kernels::cuda
