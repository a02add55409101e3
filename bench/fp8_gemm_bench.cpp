// FP8 GEMMs of Llama-3-8B's linear layers at 8192 tokens (issue #39): each layer's forward
// (E4M3 x E4M3, fast accumulation) and input gradient (E5M2 output gradient x E4M3 transposed
// weight) through CublasLtGemm::gemm_fp8, timed with CUDA events (median of 20) beside the same
// GEMM in bf16, and under block scaling (1 x 128 blocks of the activation or gradient by the weight's
// 128 x 128 tiles, the split accumulator), with the block casts' times beside the per-tensor cast's.
// With a folder argument it also writes each case's FP8 operands, their scale_inv
// and our output there, for bench/fp8_gemm_vs_torch.py to run torch._scaled_mm on the same values.
//   laoyao_bench_fp8_gemm [FOLDER]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/cuda_bench_util.hpp"
#include "core/fp8.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/fp8_block_cast.hpp"
#include "kernels/cuda/fp8_cast.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"

using namespace laoyao;
using namespace laoyao::kernels::cuda;
using laoyao::bench::median_ms;
using laoyao::bench::random_bf16;

namespace {

// An FP8 copy of a [rows, cols] bf16 tensor under current scaling, and its transpose.
struct Fp8Tensor {
  DeviceBuffer q, qt, scale, scale_inv, amax;
  Fp8Tensor(const DeviceBuffer& x, int64_t rows, int64_t cols, Fp8Format f, cudaStream_t stream)
      : q(rows * cols), qt(rows * cols), scale(sizeof(float)), scale_inv(sizeof(float)), amax(sizeof(float)) {
    LAOYAO_CUDA_CHECK(cudaMemsetAsync(amax.ptr, 0, sizeof(float), stream));
    fp8_amax(x.as<__nv_bfloat16>(), rows * cols, amax.as<float>(), stream);
    fp8_current_scale(amax.as<float>(), f, scale.as<float>(), stream);
    fp8_cast_transpose(x.as<__nv_bfloat16>(), rows, cols, scale.as<float>(), f, q.as<uint8_t>(), qt.as<uint8_t>(),
                       scale_inv.as<float>(), nullptr, stream);
  }
};

// Block scaling's copies of a [rows, cols] bf16 tensor: 1 x 128 blocks both ways, or the weight's
// 128 x 128 tiles and their transpose (fp8_block_cast.hpp's layouts).
struct Fp8Blocks {
  DeviceBuffer q, qt, inv, invt;
  Fp8Blocks(int64_t rows, int64_t cols, bool tiles)
      : q(rows * cols), qt(rows * cols),
        inv(4 * (tiles ? (rows + 127) / 128 * fp8_block_scale_ld((cols + 127) / 128)
                       : (cols + 127) / 128 * fp8_block_scale_ld(rows))),
        invt(4 * (tiles ? (cols + 127) / 128 * fp8_block_scale_ld((rows + 127) / 128)
                        : (rows + 127) / 128 * fp8_block_scale_ld(cols))) {}
  Fp8BlockOut out() { return {q.as<uint8_t>(), inv.as<float>(), qt.as<uint8_t>(), invt.as<float>()}; }
};

void write(const std::string& path, const DeviceBuffer& d, size_t bytes) {
  std::vector<char> h(bytes);
  LAOYAO_CUDA_CHECK(cudaMemcpy(h.data(), d.ptr, bytes, cudaMemcpyDeviceToHost));
  std::ofstream(path, std::ios::binary).write(h.data(), static_cast<std::streamsize>(bytes));
}

}  // namespace

int main(int argc, char** argv) {
  laoyao::bench::read_runtime_options();
  const std::string folder = argc > 1 ? argv[1] : "";
  struct Layer { const char* name; int64_t T, K, N; };
  const Layer layers[] = {{"qkv", 8192, 4096, 6144}, {"proj", 8192, 4096, 4096}, {"fc1", 8192, 4096, 28672},
                          {"fc2", 8192, 14336, 4096}};
  cudaStream_t stream;
  LAOYAO_CUDA_CHECK(cudaStreamCreate(&stream));
  std::printf("| layer | gemm | bf16 TFLOP/s | fp8 TFLOP/s | fp8 / bf16 | blockwise TFLOP/s | blockwise / bf16 |\n"
              "|---|---|---|---|---|---|---|\n");
  std::vector<std::string> casts;
  for (const Layer& l : layers) {
    DeviceBuffer x = random_bf16(l.T * l.K, "x"), w = random_bf16(l.N * l.K, "w", 0.02),
                 dy = random_bf16(l.T * l.N, "dy", 1e-3);
    const Fp8Tensor qx(x, l.T, l.K, Fp8Format::E4M3, stream), qw(w, l.N, l.K, Fp8Format::E4M3, stream),
        qdy(dy, l.T, l.N, Fp8Format::E5M2, stream);
    Fp8Blocks bx(l.T, l.K, false), bw(l.N, l.K, true), bdy(l.T, l.N, false);
    auto cast_x = [&] { fp8_block_cast_1d(x.as<__nv_bfloat16>(), l.T, l.K, Fp8Format::E4M3, bx.out(), stream); };
    auto cast_dy = [&] { fp8_block_cast_1d(dy.as<__nv_bfloat16>(), l.T, l.N, Fp8Format::E5M2, bdy.out(), stream); };
    auto cast_w = [&] { fp8_block_cast_2d(w.as<__nv_bfloat16>(), l.N, l.K, Fp8Format::E4M3, bw.out(), stream); };
    cast_x(), cast_dy(), cast_w();
    {  // the casts: the per-tensor cast with its transpose (its scale given) beside the block casts
      DeviceBuffer q(l.T * l.K), qt(l.T * l.K), s(sizeof(float)), inv(sizeof(float));
      const float one = 1.0f;
      LAOYAO_CUDA_CHECK(cudaMemcpy(s.ptr, &one, sizeof one, cudaMemcpyHostToDevice));
      const double per_tensor = median_ms([&] { fp8_cast_transpose(x.as<__nv_bfloat16>(), l.T, l.K, s.as<float>(),
                                                                   Fp8Format::E4M3, q.as<uint8_t>(), qt.as<uint8_t>(),
                                                                   inv.as<float>(), nullptr, stream); },
                                          stream, 20);
      const double x_ms = median_ms(cast_x, stream, 20), w_ms = median_ms(cast_w, stream, 20);
      const double gb = 3.0 * l.T * l.K / 1e9;  // (bf16 in, two FP8 copies out)
      char line[256];
      std::snprintf(line, sizeof line, "| %s | %lld x %lld | %.3f (%.0f GB/s) | %.3f (%.0f GB/s) | %.3f |", l.name,
                    static_cast<long long>(l.T), static_cast<long long>(l.K), per_tensor, gb / per_tensor * 1e3, x_ms,
                    gb / x_ms * 1e3, w_ms);
      casts.emplace_back(line);
    }
    DeviceBuffer y(sizeof(__nv_bfloat16) * l.T * l.N), dx(sizeof(__nv_bfloat16) * l.T * l.K);
    CublasLtGemm gemm;
    GemmProblem fwd;  // y^T [N, T] = w x^T
    fwd.m = l.N, fwd.n = l.T, fwd.k = l.K, fwd.trans_a = true, fwd.lda = l.K, fwd.ldb = l.K, fwd.ldd = l.N;
    fwd.a_type = fwd.b_type = GemmOperand::E4M3, fwd.fast_accum = true;
    GemmProblem dgrad = fwd;  // dx^T [K, T] = w^T dy^T, through w's transposed copy
    dgrad.m = l.K, dgrad.n = l.T, dgrad.k = l.N, dgrad.lda = l.N, dgrad.ldb = l.N, dgrad.ldd = l.K;
    dgrad.b_type = GemmOperand::E5M2, dgrad.fast_accum = false;
    GemmProblem fwd_blk = fwd, dgrad_blk = dgrad;  // (the split accumulator, as block scaling takes)
    fwd_blk.fast_accum = false;
    fwd_blk.a_scale = dgrad_blk.a_scale = GemmScale::Blk128, fwd_blk.b_scale = dgrad_blk.b_scale = GemmScale::Vec128;
    const double flops = 2.0 * l.T * l.K * l.N;
    struct Case { const char* name; std::function<void()> bf16, fp8, blk; };
    const Case cases[] = {
        {"fwd",
         [&] { gemm.linear_forward(x.as<__nv_bfloat16>(), w.as<__nv_bfloat16>(), nullptr, y.as<__nv_bfloat16>(), l.T,
                                   l.K, l.N, stream); },
         [&] { gemm.gemm_fp8(fwd, qw.q.as<uint8_t>(), qw.scale_inv.as<float>(), qx.q.as<uint8_t>(),
                             qx.scale_inv.as<float>(), y.ptr, nullptr, 1.0f, 0.0f, stream); },
         [&] { gemm.gemm_fp8(fwd_blk, bw.q.as<uint8_t>(), bw.inv.as<float>(), bx.q.as<uint8_t>(), bx.inv.as<float>(),
                             y.ptr, nullptr, 1.0f, 0.0f, stream); }},
        {"dgrad",
         [&] { gemm.linear_backward_input(dy.as<__nv_bfloat16>(), w.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(), l.T,
                                          l.K, l.N, stream); },
         [&] { gemm.gemm_fp8(dgrad, qw.qt.as<uint8_t>(), qw.scale_inv.as<float>(), qdy.q.as<uint8_t>(),
                             qdy.scale_inv.as<float>(), dx.ptr, nullptr, 1.0f, 0.0f, stream); },
         [&] { gemm.gemm_fp8(dgrad_blk, bw.qt.as<uint8_t>(), bw.invt.as<float>(), bdy.q.as<uint8_t>(),
                             bdy.inv.as<float>(), dx.ptr, nullptr, 1.0f, 0.0f, stream); }}};
    for (const Case& c : cases) {
      const float bf16_ms = median_ms(c.bf16, stream, 20), fp8_ms = median_ms(c.fp8, stream, 20),
                  blk_ms = median_ms(c.blk, stream, 20);
      std::printf("| %s | %s | %.0f | %.0f | %.2f | %.0f | %.2f |\n", l.name, c.name, flops / bf16_ms / 1e9,
                  flops / fp8_ms / 1e9, bf16_ms / fp8_ms, flops / blk_ms / 1e9, bf16_ms / blk_ms);
      if (folder.empty()) continue;
      c.fp8();  // (the output of the FP8 GEMM, after the bf16 one timed into the same buffer)
      LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::string p = folder + "/" + l.name + "_" + c.name;
      const bool f = std::string(c.name) == "fwd";
      // mat1 row-major [T, inner], mat2 stored [out, inner] row-major (torch: .t() is column-major).
      write(p + ".a.bin", f ? qx.q : qdy.q, static_cast<size_t>(l.T * (f ? l.K : l.N)));
      write(p + ".b.bin", f ? qw.q : qw.qt, static_cast<size_t>(l.N * l.K));
      write(p + ".a_scale_inv.bin", f ? qx.scale_inv : qdy.scale_inv, sizeof(float));
      write(p + ".b_scale_inv.bin", qw.scale_inv, sizeof(float));
      write(p + ".out.bin", f ? y : dx, static_cast<size_t>(l.T * (f ? l.N : l.K)) * 2);
      std::ofstream(p + ".json") << "{\"T\": " << l.T << ", \"inner\": " << (f ? l.K : l.N)
                                 << ", \"out\": " << (f ? l.N : l.K) << ", \"a\": \"" << (f ? "e4m3" : "e5m2")
                                 << "\", \"fast_accum\": " << (f ? "true" : "false") << ", \"ms\": " << fp8_ms
                                 << ", \"bf16_ms\": " << bf16_ms << "}\n";
    }
  }
  std::printf("\n| layer | activation | per-tensor cast + transpose ms | 1 x 128 block cast, both ways, ms | weight "
              "128 x 128 cast ms |\n|---|---|---|---|---|\n");
  for (const std::string& line : casts) std::printf("%s\n", line.c_str());
  LAOYAO_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
