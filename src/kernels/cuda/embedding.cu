// Embedding forward (word + position, bf16 out) and its deterministic backward (see embedding.hpp).
// Backward pass 1 sorts (id, token) pairs with CUB's stable LSD radix sort, so the tokens of one id
// are contiguous and in token order; pass 2 gives each run of equal ids to one block, whose threads
// own columns: no two threads ever write the same element, so no atomics and a fixed summation order.
#include <cub/device/device_radix_sort.cuh>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/embedding.hpp"

namespace laoyao::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

__global__ void embedding_forward_kernel(const int64_t* __restrict__ ids, const bf16* __restrict__ wte,
                                         const int64_t* __restrict__ pos_ids, const bf16* __restrict__ wpe,
                                         bf16* __restrict__ y, int64_t T, int64_t C, int64_t rows, int64_t pos_rows,
                                         int64_t id_offset) {
  const int64_t n = T * C, stride = int64_t(gridDim.x) * blockDim.x;
  // A vocabulary shard (id_offset >= 0) looks up zeros for the ids of other shards.
  const float outside = id_offset >= 0 ? 0.0f : NAN;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t t = e / C, c = e - t * C;
    const int64_t id = ids[t] - (id_offset > 0 ? id_offset : 0);
    float v = id >= 0 && id < rows ? __bfloat162float(wte[id * C + c]) : outside;
    if (pos_ids) {
      const int64_t p = pos_ids[t];
      v += p >= 0 && p < pos_rows ? __bfloat162float(wpe[p * C + c]) : NAN;
    }
    y[e] = __float2bfloat16(v);
  }
}

// Sort keys: the id as uint32, an invalid one mapped to `rows` (sorted last, then skipped); values:
// the token index.
__global__ void embedding_keys_kernel(const int64_t* __restrict__ ids, uint32_t* __restrict__ keys,
                                      uint32_t* __restrict__ tokens, int64_t T, int64_t rows, int64_t id_offset) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const int64_t id = ids[t] - id_offset;
  keys[t] = uint32_t(id >= 0 && id < rows ? id : rows);
  tokens[t] = uint32_t(t);
}

// One block per sorted position; only the first position of each run of equal keys works.
__global__ void embedding_accumulate_kernel(const uint32_t* __restrict__ keys, const uint32_t* __restrict__ tokens,
                                            const bf16* __restrict__ dy, float* __restrict__ dtable, int64_t T,
                                            int64_t C, uint32_t rows) {
  const int64_t i = blockIdx.x;
  const uint32_t id = keys[i];
  if (id >= rows || (i > 0 && keys[i - 1] == id)) return;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = dtable[int64_t(id) * C + c];
    for (int64_t j = i; j < T && keys[j] == id; ++j) acc += __bfloat162float(dy[int64_t(tokens[j]) * C + c]);
    dtable[int64_t(id) * C + c] = acc;
  }
}

constexpr size_t kAlign = 256;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int key_bits(int64_t rows) {  // bits that hold every key 0 .. rows (rows is the invalid-id key)
  int b = 1;
  while (b < 32 && (uint64_t(1) << b) <= uint64_t(rows)) ++b;
  return b;
}

size_t cub_temp_bytes(int64_t T, int64_t rows) {
  size_t bytes = 0;
  LAOYAO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                                    static_cast<uint32_t*>(nullptr),
                                                    static_cast<const uint32_t*>(nullptr),
                                                    static_cast<uint32_t*>(nullptr), int(T), 0, key_bits(rows)));
  return bytes;
}

void check_sizes(int64_t T, int64_t rows, const char* op) {
  if (T > int64_t(0x7fffffff) || rows >= int64_t(0x7fffffff))
    throw Error(std::string(op) + ": " + std::to_string(T) + " tokens or " + std::to_string(rows) +
                " rows exceed the 32-bit sort keys");
}

}  // namespace

void embedding_forward(const int64_t* ids, const bf16* wte, const int64_t* pos_ids, const bf16* wpe, bf16* y,
                       int64_t T, int64_t C, int64_t rows, int64_t pos_rows, cudaStream_t stream, int64_t id_offset) {
  if (T <= 0 || C <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (T * C + kThreads - 1) / kThreads;
  embedding_forward_kernel<<<unsigned(blocks < 16384 ? blocks : 16384), kThreads, 0, stream>>>(
      ids, wte, pos_ids, wpe, y, T, C, rows, pos_rows, id_offset);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

size_t embedding_backward_scratch_bytes(int64_t T, int64_t rows) {
  if (T <= 0) return 0;
  check_sizes(T, rows, "embedding_backward_scratch_bytes");
  // keys in/out and tokens in/out (uint32 each), then CUB's temporary storage.
  return 4 * round_up(size_t(T) * sizeof(uint32_t)) + round_up(cub_temp_bytes(T, rows));
}

void embedding_backward(const int64_t* ids, const bf16* dy, float* dtable, int64_t T, int64_t C, int64_t rows,
                        void* scratch, size_t scratch_bytes, cudaStream_t stream, int64_t id_offset) {
  if (T <= 0 || C <= 0) return;
  check_sizes(T, rows, "embedding_backward");
  const size_t need = embedding_backward_scratch_bytes(T, rows);
  if (scratch_bytes < need)
    throw Error("embedding_backward: scratch of " + std::to_string(scratch_bytes) + " bytes, " +
                std::to_string(need) + " needed");
  const size_t slot = round_up(size_t(T) * sizeof(uint32_t));
  auto* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<uint32_t*>(base);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + slot);
  auto* tok_in = reinterpret_cast<uint32_t*>(base + 2 * slot);
  auto* tok_out = reinterpret_cast<uint32_t*>(base + 3 * slot);
  void* temp = base + 4 * slot;
  size_t temp_bytes = need - 4 * slot;

  embedding_keys_kernel<<<unsigned((T + 255) / 256), 256, 0, stream>>>(ids, keys_in, tok_in, T, rows, id_offset);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
  LAOYAO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, tok_in, tok_out, int(T), 0,
                                                    key_bits(rows), stream));
  embedding_accumulate_kernel<<<unsigned(T), 256, 0, stream>>>(keys_out, tok_out, dy, dtable, T, C, uint32_t(rows));
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
