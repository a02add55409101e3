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

#include "kernels/cuda/attention_reference.hpp"
#include "kernels/cuda/cudnn_graph.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/qkv_rows.hpp"

namespace laoyao::kernels::cuda {

class CudnnAttention {
 public:
  // The shape's b is the largest batch the object serves; forward/backward take the actual one
  // (plans are built once per distinct batch size, and kept with their workspace: a captured CUDA
  // graph may still name them).
  CudnnAttention(const AttentionShape& shape, cudaStream_t stream, QkvRows rows = QkvRows::Fused);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Head dims cuDNN's fused kernels take: multiples of 8 up to max_head_dim (128 for QKV rows, 256
  // for separate rows, whose larger dims cuDNN's Hopper engines take; construction says when not).
  static bool supports(const AttentionShape& shape);
  static int64_t max_head_dim(const AttentionShape& shape) { return shape.Dv > 0 ? 256 : 128; }

  // ctx [b*s, H*D] and lse [b, H, s] overwritten; qkv (and dqkv) in the constructor's rows (Fused
  // or Split).
  void forward(const __nv_bfloat16* qkv, __nv_bfloat16* ctx, float* lse, int64_t b);
  // dqkv overwritten (every element).
  void backward(const __nv_bfloat16* qkv, const __nv_bfloat16* ctx, const __nv_bfloat16* dctx, const float* lse,
                __nv_bfloat16* dqkv, int64_t b);
  // QkvRows::Separate: q [b*s, H*D], k [b*s, G*D], v [b*s, G*Dv] -> ctx [b*s, H*Dv], lse; the
  // backward overwrites dq, dk and dv.
  void forward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* ctx,
               float* lse, int64_t b);
  void backward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const __nv_bfloat16* ctx,
                const __nv_bfloat16* dctx, const float* lse, __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                int64_t b);

  // The engines in use, for `laoyao doctor` and logs: "sdpa forward engine N, sdpa backward engine M".
  std::string engines() const;
  int64_t device_bytes() const;  // workspace and scratch held
  const AttentionShape& shape() const { return shape_; }

 private:
  struct Plans {
    CudnnPlan fwd, bwd;
    DeviceBuffer workspace;  // cuDNN's own, for both plans
  };
  Plans& plans_for(int64_t b);
  void run_forward(int64_t b, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                   __nv_bfloat16* ctx, float* lse);
  void run_backward(int64_t b, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                    const __nv_bfloat16* ctx, const __nv_bfloat16* dctx, const float* lse, __nv_bfloat16* dq,
                    __nv_bfloat16* dk, __nv_bfloat16* dv);
  bool gathers_q() const { return rows_ == QkvRows::Fused && shape_.H != shape_.G; }
  // Where cuDNN reads the query heads: qkv itself (MHA, split rows), or q_ after gathering them.
  const __nv_bfloat16* query_heads(const __nv_bfloat16* qkv, const AttentionShape& a);
  size_t dq_accum_bytes() const;          // the fp32 dQ accumulator, full batch
  size_t backward_scratch_bytes() const;  // our part of the workspace: dQ accumulator, row sums

  AttentionShape shape_;
  cudaStream_t stream_;
  QkvRows rows_;
  cudnnHandle_t handle_ = nullptr;
  std::map<int64_t, std::unique_ptr<Plans>> plans_;  // by batch size
  DeviceBuffer scratch_;  // our part of the backward's workspace (dQ accumulator, row sums), full batch
  DeviceBuffer q_, dq_;  // GQA from fused rows: the gathered query heads [b*s, H*D] and their gradient
  float scale_ = 0.0f;   // by-value scalar: cuDNN reads it from host memory at execution
};

}  // namespace laoyao::kernels::cuda
