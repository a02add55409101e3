// Where q, k and v of T tokens sit between the QK norm and cuDNN's attention.
//
// Fused: Megatron-Core's linear_qkv rows, per token G groups of [q (H/G heads), k, v], D values
// each (what the QKV GEMM writes, and what every other attention path reads).
// Split: all query heads first, token-major ([T, H, D]: head h of token t at row t*H + h), then the
// keys and values ([T, G, 2, D]: group g's k of token t at row T*H + 2*(t*G + g), its v the next
// row). cuDNN reads GQA's query heads there with one stride per dimension, so the QK norm can
// write them where cuDNN reads them, and read cuDNN's dq where cuDNN writes it, instead of a
// gather before each attention call and a scatter after the backward.
// Separate: q [T, H, D], k [T, G, D] and v [T, G, Dv] in three buffers of their own (multi-latent
// attention's query, key and value, whose value head dim differs from the query's).
#pragma once

namespace laoyao::kernels::cuda {

enum class QkvRows { Fused, Split, Separate };

}  // namespace laoyao::kernels::cuda
