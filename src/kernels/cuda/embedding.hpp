// Embedding lookups for BF16 activations (Megatron LanguageModelEmbedding: word + learned position
// embeddings) and their deterministic fp32 gradient. Same semantics as kernels/cpu/ops.hpp
// embedding_forward/backward.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace laoyao::kernels::cuda {

// y[t, :] = bf16(wte[ids[t], :] + wpe[pos_ids[t], :]), the sum taken in fp32 and rounded once (as
// torch's bf16 add). pos_ids/wpe nullptr: word embedding only (RoPE models). An id outside its
// table cannot throw from the device: its output row is NaN, which the loss then shows.
// Vocabulary-parallel (id_offset >= 0): wte holds rows [id_offset, id_offset + rows) of the table
// and the ids of other ranks' rows look up zeros (the ranks' outputs are then summed).
void embedding_forward(const int64_t* ids, const __nv_bfloat16* wte, const int64_t* pos_ids, const __nv_bfloat16* wpe,
                       __nv_bfloat16* y, int64_t T, int64_t C, int64_t rows, int64_t pos_rows, cudaStream_t stream,
                       int64_t id_offset = -1);

// Bytes of scratch embedding_backward needs for T tokens and a table of `rows` rows.
size_t embedding_backward_scratch_bytes(int64_t T, int64_t rows);

// dtable[ids[t], :] += dy[t, :] in fp32 (dtable is Megatron's fp32 main_grad). Deterministic, no
// float atomics: the tokens are stably sorted by id (CUB radix sort), then one block per distinct id
// adds its tokens' rows in token order, starting from the row's current value, which is the exact
// order of the CPU reference. Ids outside [0, rows) are skipped. Use it once per table (word: ids,
// position: pos_ids). rows < 2^31. A vocabulary shard's table holds rows [id_offset, id_offset + rows).
void embedding_backward(const int64_t* ids, const __nv_bfloat16* dy, float* dtable, int64_t T, int64_t C,
                        int64_t rows, void* scratch, size_t scratch_bytes, cudaStream_t stream,
                        int64_t id_offset = 0);

}  // namespace laoyao::kernels::cuda
