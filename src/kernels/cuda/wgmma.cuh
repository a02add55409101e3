// Hopper warpgroup-MMA helpers the grouped GEMMs share (grouped_gemm.cu: cp.async-fed,
// grouped_gemm_tma.cu: TMA-fed): shared-memory matrix descriptors for the 128-byte swizzle, the
// wgmma fences, and one stage of four m64n128k16 or m64n256k16 bf16 -> fp32 MMAs (or, for the FP8
// grouped GEMMs, four k32 E4M3 / E5M2 ones over the same bytes).
//
// Shared tiles (16-byte chunk c of a 128-byte row r stored at chunk c ^ (r % 8): the 128B swizzle
// of wgmma, the one TMA's CU_TENSOR_MAP_SWIZZLE_128B writes, which also keeps the cp.async stores
// free of bank conflicts), BK = 64 reduction elements a stage:
//   K-major [rows][64] (reduction contiguous): row r at 128 r bytes; descriptor: 8-row groups 1024
//     bytes apart (SBO), a k16 step is +32 bytes.
//   MN-major [cols / 64][64 reduction rows][64] (output dim contiguous, read transposed): 64-wide
//     column blocks 8 KiB apart (LBO), 8-row groups 1024 bytes apart (SBO), a k16 step is 16 rows
//     (+2048 bytes).
// Accumulators of the m64nNk16 fp32 wgmma, thread (warp q of the warpgroup, g = lane / 4,
// t = lane % 4): d[4j + 0, 1] = D[16q + g][8j + 2t + 0, 1], d[4j + 2, 3] = D[16q + g + 8][same].
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

// wgmma runs on sm_90a alone: compiled for another GPU (the one binary's Blackwell code), these
// helpers trap instead, and the kernels using them are never launched there (grouped_gemm.hpp's
// grouped_gemm_kernels() takes the portable ones).
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LAOYAO_WGMMA(...) __trap()
#else
#define LAOYAO_WGMMA(...) asm volatile(__VA_ARGS__)
#endif

namespace laoyao::kernels::cuda::wgmma {

constexpr int BK = 64;  // reduction a stage: 64 bf16 = one 128-byte swizzle row
constexpr int BN = 128; // the n of each warpgroup's wgmma

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The first 1024-byte boundary at or after p (swizzle atoms are 8 rows of 128 bytes).
__device__ __forceinline__ __nv_bfloat16* align_1024(unsigned char* p) {
  return reinterpret_cast<__nv_bfloat16*>(p + ((1024u - (smem_u32(p) & 1023u)) & 1023u));
}

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"), 128-byte swizzle:
// start address, leading and stride byte offsets, all in 16-byte units.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) | (1ull << 62);
}

// Writes through the generic proxy (cp.async, st.shared) made visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void fence() { LAOYAO_WGMMA("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { LAOYAO_WGMMA("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N of this warpgroup's committed wgmma groups are still in flight.
template <int N>
__device__ __forceinline__ void wait() {
  LAOYAO_WGMMA("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from touching the accumulators before the wgmma that writes them has retired.
template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The read-write operands of 64 accumulators d[o] .. d[o + 63], in order (inline asm names each).
#define LAOYAO_WGMMA_ACC64(d, o) \
  "+f"(d[(o) + 0]), "+f"(d[(o) + 1]), "+f"(d[(o) + 2]), "+f"(d[(o) + 3]), "+f"(d[(o) + 4]), \
  "+f"(d[(o) + 5]), "+f"(d[(o) + 6]), "+f"(d[(o) + 7]), "+f"(d[(o) + 8]), "+f"(d[(o) + 9]), \
  "+f"(d[(o) + 10]), "+f"(d[(o) + 11]), "+f"(d[(o) + 12]), "+f"(d[(o) + 13]), "+f"(d[(o) + 14]), \
  "+f"(d[(o) + 15]), "+f"(d[(o) + 16]), "+f"(d[(o) + 17]), "+f"(d[(o) + 18]), "+f"(d[(o) + 19]), \
  "+f"(d[(o) + 20]), "+f"(d[(o) + 21]), "+f"(d[(o) + 22]), "+f"(d[(o) + 23]), "+f"(d[(o) + 24]), \
  "+f"(d[(o) + 25]), "+f"(d[(o) + 26]), "+f"(d[(o) + 27]), "+f"(d[(o) + 28]), "+f"(d[(o) + 29]), \
  "+f"(d[(o) + 30]), "+f"(d[(o) + 31]), "+f"(d[(o) + 32]), "+f"(d[(o) + 33]), "+f"(d[(o) + 34]), \
  "+f"(d[(o) + 35]), "+f"(d[(o) + 36]), "+f"(d[(o) + 37]), "+f"(d[(o) + 38]), "+f"(d[(o) + 39]), \
  "+f"(d[(o) + 40]), "+f"(d[(o) + 41]), "+f"(d[(o) + 42]), "+f"(d[(o) + 43]), "+f"(d[(o) + 44]), \
  "+f"(d[(o) + 45]), "+f"(d[(o) + 46]), "+f"(d[(o) + 47]), "+f"(d[(o) + 48]), "+f"(d[(o) + 49]), \
  "+f"(d[(o) + 50]), "+f"(d[(o) + 51]), "+f"(d[(o) + 52]), "+f"(d[(o) + 53]), "+f"(d[(o) + 54]), \
  "+f"(d[(o) + 55]), "+f"(d[(o) + 56]), "+f"(d[(o) + 57]), "+f"(d[(o) + 58]), "+f"(d[(o) + 59]), \
  "+f"(d[(o) + 60]), "+f"(d[(o) + 61]), "+f"(d[(o) + 62]), "+f"(d[(o) + 63])

// D (64 x 128, fp32, this warpgroup's fragments) += A (64 x 16) B (16 x 128), bf16 from shared
// memory; TA / TB: 1 when A / B is MN-major (read transposed), 0 when K-major.
template <int TA, int TB>
__device__ __forceinline__ void mma_n128(float (&d)[64], uint64_t da, uint64_t db) {
  LAOYAO_WGMMA(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : LAOYAO_WGMMA_ACC64(d, 0)
      : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
}

// D (64 x 256, fp32, this warpgroup's fragments: d[4j..4j+3] as for n128, j < 32) += A (64 x 16)
// B (16 x 256).
template <int TA, int TB>
__device__ __forceinline__ void mma_n256(float (&d)[128], uint64_t da, uint64_t db) {
  LAOYAO_WGMMA(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, %131, %132;\n}\n"
      : LAOYAO_WGMMA_ACC64(d, 0), LAOYAO_WGMMA_ACC64(d, 64)
      : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
}

// FP8 (E4M3 / E5M2) wgmmas, k32: both operands K-major (Hopper's FP8 wgmma transposes neither), the
// same 128-byte swizzle, so a stage of 128 reduction elements is the bf16 stage's bytes. scale-d
// (the predicate): 0 overwrites D, as the split accumulator's first MMA of a stage does. FA / FB:
// 0 E4M3, 1 E5M2 (core/fp8.hpp's Fp8Format order).
#define LAOYAO_WGMMA_FP8_N128(FA_NAME, FB_NAME)                                                      \
  LAOYAO_WGMMA(                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                  \
      "wgmma.mma_async.sync.aligned.m64n128k32.f32." FA_NAME "." FB_NAME " {"                        \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                       \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"               \
      "}, %64, %65, p, 1, 1;\n}\n"                                                                   \
      : LAOYAO_WGMMA_ACC64(d, 0)                                                                     \
      : "l"(da), "l"(db), "r"(accumulate))
#define LAOYAO_WGMMA_FP8_N256(FA_NAME, FB_NAME)                                                      \
  LAOYAO_WGMMA(                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n256k32.f32." FA_NAME "." FB_NAME " {"                        \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                       \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "             \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "  \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
      "}, %128, %129, p, 1, 1;\n}\n"                                                                 \
      : LAOYAO_WGMMA_ACC64(d, 0), LAOYAO_WGMMA_ACC64(d, 64)                                          \
      : "l"(da), "l"(db), "r"(accumulate))

// D (64 x W, fp32) = (accumulate ? D : 0) + A (64 x 32) B (32 x W), FP8 from shared memory.
template <int FA, int FB, int W>
__device__ __forceinline__ void mma_fp8(float (&d)[W / 2], uint64_t da, uint64_t db, int accumulate) {
  static_assert(W == 128 || W == 256, "m64n128k32 or m64n256k32");
  static_assert((FA == 0 || FA == 1) && FB == 0, "E4M3 or E5M2 A, E4M3 B: the forms the FP8 GEMMs use");
  if constexpr (W == 128) {
    if constexpr (FA == 0) LAOYAO_WGMMA_FP8_N128("e4m3", "e4m3"); else LAOYAO_WGMMA_FP8_N128("e5m2", "e4m3");
  } else {
    if constexpr (FA == 0) LAOYAO_WGMMA_FP8_N256("e4m3", "e4m3"); else LAOYAO_WGMMA_FP8_N256("e5m2", "e4m3");
  }
}
#undef LAOYAO_WGMMA_FP8_N128
#undef LAOYAO_WGMMA_FP8_N256

// Issues (and commits as one group) this warpgroup's four k16 wgmmas on one stage: its 64 rows of
// A at shared address a, B (W = 128 or 256 columns) at b.
template <int TA, int TB, int W = BN>
__device__ __forceinline__ void mma_stage(float (&acc)[W / 2], uint32_t a, uint32_t b) {
  static_assert(W == 128 || W == 256, "m64n128k16 or m64n256k16");
  fence();
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk) {
    const uint64_t da = TA ? sw128_desc(a + kk * 2048, 8192, 1024) : sw128_desc(a + kk * 32, 16, 1024);
    const uint64_t db = TB ? sw128_desc(b + kk * 2048, 8192, 1024) : sw128_desc(b + kk * 32, 16, 1024);
    if constexpr (W == 128)
      mma_n128<TA, TB>(acc, da, db);
    else
      mma_n256<TA, TB>(acc, da, db);
  }
  commit();
}

// The same for FP8 operands (both K-major): four k32 wgmmas over the stage's 128 reduction
// elements; `fresh` starts D over (the split accumulator's per-stage partial sums).
template <int FA, int FB, int W = BN>
__device__ __forceinline__ void mma_stage_fp8(float (&acc)[W / 2], uint32_t a, uint32_t b, bool fresh = false) {
  fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    mma_fp8<FA, FB, W>(acc, sw128_desc(a + kk * 32, 16, 1024), sw128_desc(b + kk * 32, 16, 1024),
                       fresh && kk == 0 ? 0 : 1);
  commit();
}

}  // namespace laoyao::kernels::cuda::wgmma
