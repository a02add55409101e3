// Multi-latent attention's query, key and value on the GPU, in bf16: kernels/cpu/ops.hpp's
// mla_qkv_forward / mla_qkv_backward (kernels/cpu/mla.cpp says how, as Megatron-Core's
// MLASelfAttention builds them), with the positions of pretraining (token t at t % s) and the
// model's RoPE table for the decoupled dims. One pass over each token's rows: the no-pe parts
// copied, the RoPE'd parts de-interleaved and rotated (fp32, each product rounded before the sum as
// the CPU op does), the shared key rotated for every head; the backward sums the heads' gradients
// of the shared key in fp32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/rope.hpp"

namespace laoyao::kernels::cuda {

struct MlaDims {
  int64_t b = 0, s = 0;                   // b sequences of s tokens, batch-major
  int64_t H = 0;                          // this rank's heads
  int64_t dqk = 0, dr = 0, dv = 0;        // qk_head_dim, qk_pos_emb_head_dim, v_head_dim
};

// q [T, H*(dqk+dr)], kv [T, H*(dqk+dv)], k_pe rows of k_pe_ld values (dr used) -> query, key
// [T, H*(dqk+dr)] and value [T, H*dv], all overwritten. table.rot_dim <= dr (the rest passes
// through); s <= table.max_positions (else laoyao::Error, before any launch).
void mla_prepare_forward(const __nv_bfloat16* q, const __nv_bfloat16* kv, const __nv_bfloat16* k_pe, int64_t k_pe_ld,
                         const RopeDeviceTable& table, __nv_bfloat16* query, __nv_bfloat16* key,
                         __nv_bfloat16* value, const MlaDims& d, cudaStream_t stream);
// Overwrites dq, dkv and dk_pe's dr columns of each row of dk_pe_ld values (the heads' sum).
void mla_prepare_backward(const __nv_bfloat16* dquery, const __nv_bfloat16* dkey, const __nv_bfloat16* dvalue,
                          const RopeDeviceTable& table, __nv_bfloat16* dq, __nv_bfloat16* dkv, __nv_bfloat16* dk_pe,
                          int64_t dk_pe_ld, const MlaDims& d, cudaStream_t stream);

}  // namespace laoyao::kernels::cuda
