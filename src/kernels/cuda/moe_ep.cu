// Expert parallelism's row groups (see moe_ep.hpp).
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/moe.hpp"
#include "kernels/cuda/moe_ep.hpp"

namespace laoyao::kernels::cuda {
namespace {

// One thread: at most kMoeMaxExperts additions, cheaper than a scan's launches.
__global__ void moe_ep_source_offsets_kernel(const int32_t* __restrict__ counts, int P, int E, int me,
                                             int32_t* __restrict__ offsets) {
  const int El = E / P;
  int32_t at = 0;
  for (int s = 0; s < P; ++s)
    for (int e = 0; e < El; ++e) {
      offsets[s * El + e] = at;
      at += counts[s * E + me * El + e];
    }
  offsets[E] = at;
}

}  // namespace

void moe_ep_source_offsets(const int32_t* counts, int64_t P, int64_t E, int64_t me, int32_t* offsets,
                           cudaStream_t stream) {
  if (P < 1 || E < 1 || E > kMoeMaxExperts || E % P != 0 || me < 0 || me >= P)
    throw Error("moe_ep_source_offsets: " + std::to_string(E) + " experts (at most " +
                std::to_string(kMoeMaxExperts) + ") over " + std::to_string(P) + " ranks (rank " + std::to_string(me) +
                ")");
  moe_ep_source_offsets_kernel<<<1, 1, 0, stream>>>(counts, int(P), int(E), int(me), offsets);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
