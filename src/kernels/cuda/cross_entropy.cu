// Cross entropy forward/backward over BF16 logits (see cross_entropy.hpp). One thread block per
// token row. The forward reads the row once: each thread keeps an online (max, sum of exp) pair over
// its strided columns, and the pairs are merged in a fixed tree order, so the loss is reproducible;
// the training form then writes the gradient in a second pass. Accurate expf/exp2f (not __expf):
// the fast intrinsic's error grows with |argument| and V terms are summed.
//
// The training form keeps the row on chip where it fits a cluster of blocks (Hopper's thread block
// clusters): each block holds a slice of the row in shared memory from the first pass, the blocks
// merge their (max, sum) through distributed shared memory, and the gradient is computed from the
// held slice. One read of the logits from memory and one write, where the one-block kernel reads
// the row twice (a 304 KB row of Qwen's 151936 logits does not stay in L2 between its passes
// while hundreds of rows are in flight).
#include <cooperative_groups.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/cross_entropy.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "core/runtime_options.hpp"
#include "kernels/cuda/smem_attribute.hpp"

namespace laoyao::kernels::cuda {
namespace {

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;

constexpr int kThreads = 512;
constexpr float kLog2e = 1.4426950408889634f;
// A block's slice of a row in the cluster kernel: two blocks an SM (2 x 100 KB of its 227 KB).
constexpr int64_t kSliceBytes = 100 * 1024;
constexpr int kMaxCluster = 8;  // the portable cluster size: rows up to 8 x 100 KB (409600 logits)

// Merge (m, s) with (om, os): both are sums of exp(z - m) over disjoint sets; an empty set is (-inf, 0).
__device__ __forceinline__ void merge(float& m, float& s, float om, float os) {
  const float nm = fmaxf(m, om);
  if (nm == -INFINITY) return;  // both empty (avoid -inf - -inf = NaN)
  s = s * expf(m - nm) + os * expf(om - nm);
  m = nm;
}

__global__ void cross_entropy_backward_kernel(bf16* __restrict__ logits, const int64_t* __restrict__ targets,
                                              const float* __restrict__ lse, const float* __restrict__ dloss,
                                              int64_t V, int64_t v0) {
  const int64_t t = blockIdx.x;
  bf16* z = logits + t * V;
  const float l = lse[t], g = dloss[t];
  const int64_t target = targets[t] - v0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = expf(__bfloat162float(z[j]) - l);
    z[j] = __float2bfloat16((j == target ? p - 1.0f : p) * g);
  }
}

template <int kWidth>
struct alignas(kWidth * sizeof(bf16)) Pack {
  bf16 v[kWidth];
};

// One pack of logits into a thread's online (max m, sum s of exp(z - m)).
template <int kWidth>
__device__ __forceinline__ void accumulate(const Pack<kWidth>& pk, float& m, float& s) {
  float v[kWidth], mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kWidth; ++i) v[i] = __bfloat162float(pk.v[i]), mx = fmaxf(mx, v[i]);
  if (mx > m) {
    s *= exp2f((m - mx) * kLog2e);  // 0 while the sum is still empty
    m = mx;
  }
#pragma unroll
  for (int i = 0; i < kWidth; ++i) s += exp2f((v[i] - m) * kLog2e);
}

// The block's threads' pairs merged in a fixed tree order; the result in warp 0's lane 0 (shm, shs:
// 32 floats of shared memory each). Every thread must call it.
__device__ __forceinline__ void block_merge(float& m, float& s, float* shm, float* shs) {
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) shm[warp] = m, shs[warp] = s;
  __syncthreads();
  if (warp == 0) {
    m = lane < int(blockDim.x >> 5) ? shm[lane] : -INFINITY;
    s = lane < int(blockDim.x >> 5) ? shs[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1)
      merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  }
}

// A pack's gradient in place: (softmax - onehot) * g, rounded once; j the pack's first column.
template <int kWidth>
__device__ __forceinline__ void gradient(Pack<kWidth>& pk, int64_t j, int64_t target, float l, float g) {
#pragma unroll
  for (int i = 0; i < kWidth; ++i) {
    const float p = exp2f((__bfloat162float(pk.v[i]) - l) * kLog2e);
    pk.v[i] = __float2bfloat16((j + i == target ? p - 1.0f : p) * g);
  }
}

// The forward, and with kGrad the gradient written over the logits in a second pass over the row:
// kWidth logits per load (8: 16-byte vectors), exp2 of log2e-scaled differences, each thread's
// online (max, sum) merged in a fixed tree order, so the loss is reproducible. A vocabulary shard
// (target_logit given) writes its own lse and its target logit (0 when the target is another
// shard's) instead of the loss.
template <int kWidth, bool kGrad>
__global__ void cross_entropy_kernel(bf16* __restrict__ logits, const int64_t* __restrict__ targets,
                                           const float* __restrict__ dloss, float* __restrict__ loss,
                                           float* __restrict__ lse_out, int64_t V, int64_t v0,
                                           float* __restrict__ target_logit) {
  __shared__ float shm[32], shs[32], sh_lse;
  const int64_t t = blockIdx.x;
  bf16* z = logits + t * V;
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = int64_t(threadIdx.x) * kWidth; j < V; j += int64_t(blockDim.x) * kWidth)
    accumulate(*reinterpret_cast<const Pack<kWidth>*>(z + j), m, s);
  block_merge(m, s, shm, shs);
  if (threadIdx.x == 0) {
    const int64_t target = targets[t] - v0;
    const float log_sum = logf(s);
    if (target_logit)
      target_logit[t] = target >= 0 && target < V ? __bfloat162float(z[target]) : 0.0f;
    else
      loss[t] = target >= 0 && target < V ? log_sum - (__bfloat162float(z[target]) - m) : NAN;
    lse_out[t] = sh_lse = m + log_sum;
  }
  if (!kGrad) return;
  __syncthreads();  // every thread has read its logits before any is overwritten
  const float l = sh_lse, g = dloss[t];
  const int64_t target = targets[t];
  for (int64_t j = int64_t(threadIdx.x) * kWidth; j < V; j += int64_t(blockDim.x) * kWidth) {
    Pack<kWidth> pk = *reinterpret_cast<const Pack<kWidth>*>(z + j);
    gradient(pk, j, target, l, g);
    *reinterpret_cast<Pack<kWidth>*>(z + j) = pk;
  }
}

// The training form with the row held on chip: a cluster of blocks a row (blockIdx.x / cluster
// size), block r holding columns [r * slice, (r + 1) * slice) in shared memory (slice a multiple of
// 8, V % 8 == 0). Each block merges its threads' pairs as the one-block kernel does; after the
// cluster barrier every block merges the blocks' pairs in rank order (the same bits everywhere),
// and a second barrier keeps each block's pair alive until its peers have read it.
__global__ void __launch_bounds__(kThreads, 2)
    cross_entropy_cluster_kernel(bf16* __restrict__ logits, const int64_t* __restrict__ targets,
                                 const float* __restrict__ dloss, float* __restrict__ loss,
                                 float* __restrict__ lse_out, int64_t V, int64_t slice) {
  extern __shared__ Pack<8> held[];
  __shared__ float shm[32], shs[32];
  __shared__ float2 block_pair, row_pair;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), blocks = cluster.num_blocks();
  const int64_t t = blockIdx.x / blocks, j0 = int64_t(rank) * slice;
  const int64_t packs = (j0 < V ? (j0 + slice < V ? slice : V - j0) : 0) / 8;
  bf16* z = logits + t * V + j0;
  const int64_t target = targets[t];
  // The target's logit, read before any block of the cluster overwrites its slice.
  const float target_z = rank == 0 && threadIdx.x == 0 && target >= 0 && target < V
                             ? __bfloat162float(logits[t * V + target])
                             : 0.0f;
  // kLoads packs a thread in flight before it uses them: with two blocks an SM, one load each would
  // leave too few bytes in flight for the memory's speed.
  constexpr int kLoads = 4;
  float m = -INFINITY, s = 0.0f;
  for (int64_t p0 = threadIdx.x; p0 < packs; p0 += kLoads * kThreads) {
    Pack<8> pk[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      if (p0 + u * kThreads < packs) pk[u] = reinterpret_cast<const Pack<8>*>(z)[p0 + u * kThreads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      if (p0 + u * kThreads < packs) {
        held[p0 + u * kThreads] = pk[u];
        accumulate(pk[u], m, s);
      }
  }
  block_merge(m, s, shm, shs);
  if (threadIdx.x == 0) block_pair = make_float2(m, s);
  cluster.sync();
  if (threadIdx.x == 0) {
    float rm = -INFINITY, rs = 0.0f;
    for (unsigned r = 0; r < blocks; ++r) {
      const float2 peer = *cluster.map_shared_rank(&block_pair, r);
      merge(rm, rs, peer.x, peer.y);
    }
    const float log_sum = logf(rs);
    row_pair = make_float2(rm + log_sum, log_sum);
    if (rank == 0) {
      loss[t] = target >= 0 && target < V ? log_sum - (target_z - rm) : NAN;
      lse_out[t] = rm + log_sum;
    }
  }
  cluster.sync();  // peers done reading block_pair; row_pair visible to the block
  const float l = row_pair.x, g = dloss[t];
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    Pack<8> pk = held[p];
    gradient(pk, j0 + 8 * p, target, l, g);
    reinterpret_cast<Pack<8>*>(z)[p] = pk;
  }
}

// The cluster kernel's plan for a row of V logits: blocks a row and the slice each holds (0
// blocks: the row does not fit, or V % 8 != 0, or LAOYAO_CE_CLUSTER=0).
struct ClusterPlan {
  int blocks = 0;
  int64_t slice = 0;
};

ClusterPlan cluster_plan(int64_t V, const void* logits) {
  if (V % 8 != 0 || reinterpret_cast<uintptr_t>(logits) % 16 != 0) return {};
  if (!runtime_options().ce_cluster) return {};
  const int64_t packs = V / 8, per_block = kSliceBytes / 16;
  const int64_t blocks = (packs + per_block - 1) / per_block;
  if (blocks > kMaxCluster) return {};
  const int64_t slice_packs = (packs + blocks - 1) / blocks;
  return {int(blocks), slice_packs * 8};
}

void launch_cluster(const ClusterPlan& plan, bf16* logits, const int64_t* targets, const float* dloss, float* loss,
                    float* lse, int64_t T, int64_t V, cudaStream_t stream) {
  static SmemSite site;
  site.once([] { allow_smem(cross_entropy_cluster_kernel, size_t(kSliceBytes)); });
  if (T * plan.blocks > int64_t(0x7fffffff))
    throw Error("cross_entropy_forward_backward: too many rows for one launch");
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(T * plan.blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(plan.slice) * sizeof(bf16);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(plan.blocks);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  LAOYAO_CUDA_CHECK(
      cudaLaunchKernelEx(&cfg, cross_entropy_cluster_kernel, logits, targets, dloss, loss, lse, V, plan.slice));
}

// Each token's loss over the whole vocabulary from every shard's (lse, target logit): gathered is
// [ranks][2][T], a shard's T lse values then its T target logits.
__global__ void cross_entropy_combine_kernel(const float* __restrict__ gathered, const int64_t* __restrict__ targets,
                                             float* __restrict__ loss, float* __restrict__ lse, int64_t T,
                                             int64_t V, int ranks) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  float m = -INFINITY, target = 0.0f;
  for (int r = 0; r < ranks; ++r) m = fmaxf(m, gathered[(2 * int64_t(r)) * T + t]);
  float s = 0.0f;
  for (int r = 0; r < ranks; ++r) {
    s += expf(gathered[(2 * int64_t(r)) * T + t] - m);
    target += gathered[(2 * int64_t(r) + 1) * T + t];
  }
  const float l = m + logf(s);
  lse[t] = l;
  loss[t] = targets[t] >= 0 && targets[t] < V ? l - target : NAN;
}

void check_rows(int64_t T, const char* op) {
  if (T > int64_t(0x7fffffff)) throw Error(std::string(op) + ": too many rows for one launch");
}

// One launch of the row kernel: the 16-byte vector path when the rows allow it.
template <bool kGrad>
void launch_rows(bf16* logits, const int64_t* targets, const float* dloss, float* loss, float* lse, int64_t T,
                 int64_t V, cudaStream_t stream, const char* op, int64_t v0 = 0, float* target_logit = nullptr) {
  if (T <= 0) return;
  if (V <= 0) throw Error(std::string(op) + ": empty vocabulary");
  check_rows(T, op);
  if (V % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0)
    cross_entropy_kernel<8, kGrad>
        <<<unsigned(T), kThreads, 0, stream>>>(logits, targets, dloss, loss, lse, V, v0, target_logit);
  else
    cross_entropy_kernel<1, kGrad>
        <<<unsigned(T), kThreads, 0, stream>>>(logits, targets, dloss, loss, lse, V, v0, target_logit);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void cross_entropy_forward(const bf16* logits, const int64_t* targets, float* loss, float* lse, int64_t T, int64_t V,
                           cudaStream_t stream) {
  // The kernel only reads the logits without kGrad.
  launch_rows<false>(const_cast<bf16*>(logits), targets, nullptr, loss, lse, T, V, stream, "cross_entropy_forward");
}

void cross_entropy_forward_backward(bf16* logits, const int64_t* targets, const float* dloss, float* loss, float* lse,
                                    int64_t T, int64_t V, cudaStream_t stream) {
  if (T > 0) {
    const ClusterPlan plan = cluster_plan(V, logits);
    if (plan.blocks > 0) return launch_cluster(plan, logits, targets, dloss, loss, lse, T, V, stream);
  }
  launch_rows<true>(logits, targets, dloss, loss, lse, T, V, stream, "cross_entropy_forward_backward");
}

void cross_entropy_backward(bf16* logits, const int64_t* targets, const float* lse, const float* dloss, int64_t T,
                            int64_t V, cudaStream_t stream, int64_t v0) {
  if (T <= 0 || V <= 0) return;
  check_rows(T, "cross_entropy_backward");
  cross_entropy_backward_kernel<<<unsigned(T), kThreads, 0, stream>>>(logits, targets, lse, dloss, V, v0);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

int cross_entropy_cluster_blocks(int64_t V) {
  alignas(16) static const char aligned[16] = {};
  return cluster_plan(V, aligned).blocks;
}

void cross_entropy_shard_stats(const bf16* logits, const int64_t* targets, float* stats, int64_t T, int64_t V,
                               int64_t v0, cudaStream_t stream) {
  launch_rows<false>(const_cast<bf16*>(logits), targets, nullptr, nullptr, stats, T, V, stream,
                     "cross_entropy_shard_stats", v0, stats + T);
}

void cross_entropy_combine_shards(const float* gathered, const int64_t* targets, float* loss, float* lse, int64_t T,
                                  int64_t V, int ranks, cudaStream_t stream) {
  if (T <= 0) return;
  cross_entropy_combine_kernel<<<unsigned((T + 255) / 256), 256, 0, stream>>>(gathered, targets, loss, lse, T, V,
                                                                             ranks);
  LAOYAO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace laoyao::kernels::cuda
