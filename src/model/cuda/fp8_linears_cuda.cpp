// The CUDA backend's FP8 linear layers (model/cuda/fp8_linears_cuda.hpp).
#include "model/cuda/fp8_linears_cuda.hpp"

#include <algorithm>
#include <string>
#include <tuple>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/fp8_block_cast.hpp"
#include "kernels/cuda/fp8_cast.hpp"
#include "model/cuda/carver.hpp"

namespace laoyao::model {

namespace kc = kernels::cuda;

namespace {

kc::GemmOperand operand(Fp8Format f) { return f == Fp8Format::E4M3 ? kc::GemmOperand::E4M3 : kc::GemmOperand::E5M2; }

// Column-major D[m, n] = op(A) B with A stored [k, m] (transposed) and B [k, n]: Hopper's TN FP8 GEMM.
kc::GemmProblem tn(int64_t m, int64_t n, int64_t k, Fp8Format a, Fp8Format b) {
  kc::GemmProblem p;
  p.m = m, p.n = n, p.k = k;
  p.trans_a = true;
  p.lda = k, p.ldb = k, p.ldd = m;
  p.a_type = operand(a), p.b_type = operand(b);
  return p;
}

}  // namespace

CudaFp8Linears::CudaFp8Linears(const GptConfig& local, const GptParameterLayout& layout, int64_t max_rows,
                               int64_t expert_rows, cudaStream_t stream, kc::CublasLtGemm* gemm)
    : spec_(*local.fp8), stream_(stream), gemm_(gemm), fwd_format_(fp8_format_of(spec_.formats, false)),
      grad_format_(fp8_format_of(spec_.formats, true)), len_(spec_.amax_history_len), max_rows_(max_rows),
      expert_rows_(expert_rows) {
  std::map<int64_t, const ParamSpec*> by_offset;
  for (const ParamSpec& p : layout.table.specs) by_offset[p.offset] = &p;
  // The decoder's layers, then the MTP layers' (their eh_proj with their layer's linears).
  for (int64_t l = 0; l < local.layer_count(); ++l) {
    if (!spec_.layer_in_fp8(l, local.num_layers)) continue;
    const GptLayerOffsets& L = layout.layers[static_cast<size_t>(l)];
    const int64_t eh_proj = l >= local.num_layers ? layout.mtp[static_cast<size_t>(l - local.num_layers)].eh_proj : -1;
    if (local.is_moe_layer(l)) {  // the routed experts: E slots a linear
      const int64_t E = local.moe.num_experts, H = local.hidden, F = local.moe.ffn;
      for (const auto& [w, N, K] : {std::tuple{L.experts_fc1, local.fc1_rows(F), H}, std::tuple{L.experts_fc2, H, F}}) {
        if (N % 16 != 0 || K % 16 != 0)
          throw UsageError("FP8 linear layers: the experts' weights are [" + std::to_string(N) + ", " +
                           std::to_string(K) + "]; the FP8 grouped GEMMs need both sizes multiples of 16");
        Experts x;
        x.index = n_, x.E = E, x.N = N, x.K = K;
        n_ += E;
        max_k_ = std::max(max_k_, K), max_n_ = std::max(max_n_, N), max_experts_ = std::max(max_experts_, E);
        experts_.emplace(w, x);
      }
    }
    for (const int64_t w : {L.qkv_w, L.q_proj_w, L.q_down_w, L.q_up_w, L.kv_down_w, L.kv_up_w, L.proj_w, L.fc1_w,
                            L.fc2_w, L.shared_fc1, L.shared_fc2, eh_proj}) {
      if (w < 0) continue;
      const ParamSpec& p = *by_offset.at(w);
      Slot s;
      s.index = n_++, s.N = p.shape.at(0), s.K = p.shape.at(1);
      if (s.N % 16 != 0 || s.K % 16 != 0)
        throw UsageError("FP8 linear layers: " + p.name + " is [" + std::to_string(s.N) + ", " + std::to_string(s.K) +
                         "]; cuBLASLt's FP8 GEMMs need both sizes multiples of 16");
      max_k_ = std::max(max_k_, s.K), max_n_ = std::max(max_n_, s.N);
      slots_.emplace(w, s);
    }
  }
  if (!experts_.empty() && blockwise())
    throw UsageError("FP8 block scaling (model.fp8_recipe blockwise) with Mixture of Experts: the experts' FP8 "
                     "grouped GEMMs take per-tensor scales only (LAOYAO_DEVICE=cpu trains it on the CPU backend)");
  if (!experts_.empty() && !kc::grouped_gemm_fp8_supported())  // (before any step: nothing half-written)
    throw UsageError("FP8 with Mixture of Experts: the experts' FP8 grouped GEMMs run on Hopper GPUs (compute "
                     "capability 9.0) only; train this model without model.fp8 (--fp8-format) here");
  if (max_rows_ % 16 != 0)
    throw UsageError("FP8 linear layers: a micro-batch of " + std::to_string(max_rows_) +
                     " rows; cuBLASLt's FP8 GEMMs need the tokens a multiple of 16");
  auto carve = [&](Carver& a) {
    fwd_history_ = a.take<float>(len_ * 2 * n_), fwd_scale_ = a.take<float>(2 * n_), fwd_max_ = a.take<float>(2 * n_);
    bwd_history_ = a.take<float>(len_ * n_), bwd_scale_ = a.take<float>(n_), bwd_max_ = a.take<float>(n_);
    input_scale_ = a.take<float>(kStride * n_), input_inv_ = a.take<float>(kStride * n_);
    weight_scale_ = a.take<float>(kStride * n_), weight_inv_ = a.take<float>(kStride * n_);
    grad_scale_ = a.take<float>(kStride * n_), grad_inv_ = a.take<float>(kStride * n_);
    amax_ = a.take<float>(1);
    expert_amax_ = a.take<float>(max_experts_);
    for (auto& [w, s] : slots_) {
      s.wq = a.take<uint8_t>(s.N * s.K), s.wqt = a.take<uint8_t>(s.N * s.K);
      if (blockwise()) {  // (fp8_block_cast.hpp's layouts of 128 x 128 tiles)
        const int64_t nb = (s.N + 127) / 128, kb = (s.K + 127) / 128;
        s.w_inv = a.take<float>(nb * kc::fp8_block_scale_ld(kb)), s.wt_inv = a.take<float>(kb * kc::fp8_block_scale_ld(nb));
      }
    }
    for (auto& [w, x] : experts_) x.wq = a.take<uint8_t>(x.E * x.N * x.K), x.wqt = a.take<uint8_t>(x.E * x.N * x.K);
  };
  Carver measure;
  carve(measure);
  state_ = kc::DeviceBuffer(measure.used);
  Carver real{static_cast<char*>(state_.ptr), 0};
  carve(real);
  // Transformer Engine's initial state: scales 1, histories 0.
  std::vector<float> ones(static_cast<size_t>(2 * n_), 1.0f), fwd_max(static_cast<size_t>(2 * n_)),
      bwd_max(static_cast<size_t>(n_), static_cast<float>(fp8_max(grad_format_)));
  std::fill(fwd_max.begin(), fwd_max.end(), static_cast<float>(fp8_max(fwd_format_)));
  auto upload = [&](float* dst, const std::vector<float>& v, size_t count) {
    LAOYAO_CUDA_CHECK(cudaMemcpyAsync(dst, v.data(), sizeof(float) * count, cudaMemcpyHostToDevice, stream_));
  };
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(state_.ptr, 0, state_.bytes, stream_));
  upload(fwd_scale_, ones, ones.size());
  upload(bwd_scale_, ones, static_cast<size_t>(n_));
  upload(fwd_max_, fwd_max, fwd_max.size());
  upload(bwd_max_, bwd_max, bwd_max.size());
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream_));  // (the host vectors go out of scope)

  // The experts' transposes have a row pitch of 16-byte multiples (the TMA maps' strides).
  if (experts_.empty()) expert_rows_ = 0;
  expert_ld_ = expert_ld(expert_rows_);
  auto carve_scratch = [&](Carver& a) {
    xq_ = a.take<uint8_t>(max_rows_ * max_k_), dyq_ = a.take<uint8_t>(max_rows_ * max_n_);
    dyqt_ = a.take<uint8_t>(max_rows_ * max_n_);
    exq_ = a.take<uint8_t>(expert_rows_ * max_k_), edyq_ = a.take<uint8_t>(expert_rows_ * max_n_);
    edyqt_ = a.take<uint8_t>(expert_ld_ * max_n_);
    if (blockwise()) {  // 1 x 128 blocks along the features ([blocks][rows]) or the tokens ([blocks][features])
      const int64_t rb = (max_rows_ + 127) / 128, ld_rows = kc::fp8_block_scale_ld(max_rows_);
      xq_inv_ = a.take<float>(std::max((max_k_ + 127) / 128 * ld_rows, rb * kc::fp8_block_scale_ld(max_k_)));
      dyq_inv_ = a.take<float>((max_n_ + 127) / 128 * ld_rows);
      dyqt_inv_ = a.take<float>(rb * kc::fp8_block_scale_ld(max_n_));
    }
  };
  Carver ms;
  carve_scratch(ms);
  scratch_ = kc::DeviceBuffer(ms.used);
  Carver rs{static_cast<char*>(scratch_.ptr), 0};
  carve_scratch(rs);
}

const CudaFp8Linears::Slot& CudaFp8Linears::slot(int64_t w) const {
  auto it = slots_.find(w);
  if (it == slots_.end()) throw Error("CudaFp8Linears: parameter " + std::to_string(w) + " is not an FP8 linear");
  return it->second;
}

const CudaFp8Linears::Experts& CudaFp8Linears::experts(int64_t w) const {
  auto it = experts_.find(w);
  if (it == experts_.end())
    throw Error("CudaFp8Linears: parameter " + std::to_string(w) + " is not an FP8 experts' linear");
  return it->second;
}

int64_t CudaFp8Linears::index_of(int64_t w) const {
  if (auto it = slots_.find(w); it != slots_.end()) return it->second.index;
  for (const auto& [o, x] : experts_)
    if (w >= o && w < o + x.E * x.N * x.K && (w - o) % (x.N * x.K) == 0) return x.index + (w - o) / (x.N * x.K);
  throw Error("CudaFp8Linears: parameter " + std::to_string(w) + " is not an FP8 linear or expert's linear");
}

void CudaFp8Linears::current_scale(const bf16* x, int64_t n, Fp8Format f, float* scale) {
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(amax_, 0, sizeof(float), stream_));
  kc::fp8_amax(x, n, amax_, stream_);
  kc::fp8_current_scale(amax_, f, scale, stream_);
}

void CudaFp8Linears::new_weights(const bf16* params) {
  for (const auto& [w, s] : slots_) {
    if (blockwise()) {
      kc::fp8_block_cast_2d(params + w, s.N, s.K, fwd_format_, {s.wq, s.w_inv, s.wqt, s.wt_inv}, stream_);
      continue;
    }
    const int64_t i = s.index;
    // Delayed: the weight's scale as the step's first forward finds it (the forward's scales move
    // only at that forward's end), its amax recorded into this pass's row.
    float* scale = delayed() ? fwd_scale_ + 2 * i + 1 : at(weight_scale_, i);
    if (!delayed()) current_scale(params + w, s.N * s.K, fwd_format_, scale);
    kc::fp8_cast_transpose(params + w, s.N, s.K, scale, fwd_format_, s.wq, s.wqt, at(weight_inv_, i),
                           delayed() ? fwd_history_ + 2 * i + 1 : nullptr, stream_);
  }
  for (const auto& [w, x] : experts_) {  // every expert's weight, as GroupedLinear casts them all
    const int64_t i = x.index;
    kc::Fp8Slots slots{fwd_scale_ + 2 * i + 1, 2, at(weight_inv_, i), kStride, fwd_history_ + 2 * i + 1, 2};
    if (!delayed()) {  // each expert's weight its own amax
      LAOYAO_CUDA_CHECK(cudaMemsetAsync(expert_amax_, 0, sizeof(float) * static_cast<size_t>(x.E), stream_));
      kc::fp8_batched_cast_transpose(params + w, x.E, x.N, x.K, {nullptr, 0, nullptr, 0, expert_amax_, 1}, fwd_format_,
                                     nullptr, nullptr, stream_);
      kc::fp8_current_scales(expert_amax_, 1, x.E, fwd_format_, at(weight_scale_, i), kStride, stream_);
      slots = {at(weight_scale_, i), kStride, at(weight_inv_, i), kStride, nullptr, 0};
    }
    kc::fp8_batched_cast_transpose(params + w, x.E, x.N, x.K, slots, fwd_format_, x.wq, x.wqt, stream_);
  }
}

void CudaFp8Linears::pass_done(Fp8Pass pass) {
  if (!delayed() || n_ == 0 || (pass != Fp8Pass::TrainingForward && pass != Fp8Pass::Backward)) return;
  const bool max_algo = spec_.amax_compute_algo == AmaxComputeAlgo::Max, forward = pass == Fp8Pass::TrainingForward;
  float* history = forward ? fwd_history_ : bwd_history_;
  const int64_t n = forward ? 2 * n_ : n_;
  // Row 0 holds the pass's amaxes, every tensor's in a fixed order on every rank.
  if (amax_group_) amax_group_->all_reduce_max_device(history, static_cast<size_t>(n), stream_);
  kc::fp8_delayed_update(history, forward ? fwd_scale_ : bwd_scale_, forward ? fwd_max_ : bwd_max_, n, len_, max_algo,
                         spec_.margin, stream_);
}

void CudaFp8Linears::forward(int64_t w, const bf16* x, const bf16* bias, bf16* y, int64_t rows,
                             const bf16* residual) {
  const Slot& s = slot(w);
  const int64_t i = s.index;
  if (rows > max_rows_) throw Error("CudaFp8Linears: " + std::to_string(rows) + " rows, built for " +
                                    std::to_string(max_rows_));
  if (blockwise()) return blockwise_forward(s, x, bias, y, rows, residual);
  // A recomputed forward casts with the scale of the forward it repeats, recording nothing.
  if (pass_ != Fp8Pass::Recompute) {
    if (delayed())
      LAOYAO_CUDA_CHECK(cudaMemcpyAsync(at(input_scale_, i), fwd_scale_ + 2 * i, sizeof(float), cudaMemcpyDeviceToDevice,
                                        stream_));
    else
      current_scale(x, rows * s.K, fwd_format_, at(input_scale_, i));
  }
  const bool record = delayed() && pass_ != Fp8Pass::Recompute;
  kc::fp8_cast(x, rows * s.K, at(input_scale_, i), fwd_format_, xq_, at(input_inv_, i),
               record ? fwd_history_ + 2 * i : nullptr, stream_);
  // y^T [N, rows] = w x^T (column-major): A the weight [K, N] transposed, B the input [K, rows].
  kc::GemmProblem p = tn(s.N, rows, s.K, fwd_format_, fwd_format_);
  p.bias = bias != nullptr;
  p.fast_accum = true;  // Transformer Engine's forward GEMM
  gemm_->gemm_fp8(p, s.wq, at(weight_inv_, i), xq_, at(input_inv_, i), y, bias, 1.0f, residual ? 1.0f : 0.0f, stream_,
                  residual);
}

void CudaFp8Linears::backward(int64_t w, const bf16* x, const bf16* dy, bf16* dx, float* dw, bool accumulate,
                              int64_t rows) {
  const Slot& s = slot(w);
  const int64_t i = s.index;
  if (blockwise()) return blockwise_backward(s, x, dy, dx, dw, accumulate, rows);
  // The output gradient (recorded: a backward's amaxes update its scales at the pass's end), with
  // its transpose for the weight gradient.
  float* gscale = delayed() ? bwd_scale_ + i : at(grad_scale_, i);
  if (!delayed()) current_scale(dy, rows * s.N, grad_format_, gscale);
  kc::fp8_cast_transpose(dy, rows, s.N, gscale, grad_format_, dx ? dyq_ : nullptr, dw ? dyqt_ : nullptr, at(grad_inv_, i),
                         delayed() ? bwd_history_ + i : nullptr, stream_);
  if (dx) {
    // dx^T [K, rows] = w^T dy^T: A the weight's transposed copy, B the output gradient.
    const kc::GemmProblem p = tn(s.K, rows, s.N, fwd_format_, grad_format_);
    gemm_->gemm_fp8(p, s.wqt, at(weight_inv_, i), dyq_, at(grad_inv_, i), dx, nullptr, 1.0f, 0.0f, stream_);
  }
  if (dw) {
    // The forward's input cast again with its scale, transposed only: the same FP8 values.
    kc::fp8_cast_transpose(x, rows, s.K, at(input_scale_, i), fwd_format_, nullptr, xq_, nullptr, nullptr, stream_);
    // dw^T [K, N] (+)= x^T dy: A the input's transposed copy [rows, K], B the gradient's [rows, N].
    kc::GemmProblem p = tn(s.K, s.N, rows, fwd_format_, grad_format_);
    p.d_fp32 = true;
    gemm_->gemm_fp8(p, xq_, at(input_inv_, i), dyqt_, at(grad_inv_, i), dw, nullptr, 1.0f, accumulate ? 1.0f : 0.0f,
                    stream_);
  }
}

void CudaFp8Linears::blockwise_forward(const Slot& s, const bf16* x, const bf16* bias, bf16* y, int64_t rows,
                                       const bf16* residual) {
  // y^T [N, rows] = w x^T: the weight's 128 x 128 tiles by the input's 1 x 128 blocks along K, the
  // split accumulator (Transformer Engine's block-scaled GEMMs all take it).
  kc::fp8_block_cast_1d(x, rows, s.K, fwd_format_, {xq_, xq_inv_, nullptr, nullptr}, stream_);
  kc::GemmProblem p = tn(s.N, rows, s.K, fwd_format_, fwd_format_);
  p.bias = bias != nullptr;
  p.a_scale = kc::GemmScale::Blk128, p.b_scale = kc::GemmScale::Vec128;
  gemm_->gemm_fp8(p, s.wq, s.w_inv, xq_, xq_inv_, y, bias, 1.0f, residual ? 1.0f : 0.0f, stream_, residual);
}

void CudaFp8Linears::blockwise_backward(const Slot& s, const bf16* x, const bf16* dy, bf16* dx, float* dw,
                                        bool accumulate, int64_t rows) {
  // The output gradient in 1 x 128 blocks both ways: along N for dx, along the tokens for dw.
  kc::fp8_block_cast_1d(dy, rows, s.N, grad_format_,
                        {dx ? dyq_ : nullptr, dyq_inv_, dw ? dyqt_ : nullptr, dyqt_inv_}, stream_);
  if (dx) {  // dx^T [K, rows] = w^T dy^T: the transposed tiles by dy's blocks along N
    kc::GemmProblem p = tn(s.K, rows, s.N, fwd_format_, grad_format_);
    p.a_scale = kc::GemmScale::Blk128, p.b_scale = kc::GemmScale::Vec128;
    gemm_->gemm_fp8(p, s.wqt, s.wt_inv, dyq_, dyq_inv_, dx, nullptr, 1.0f, 0.0f, stream_);
  }
  if (dw) {  // dw^T [K, N] (+)= x^T dy: both along the tokens (the input cast again, transposed only)
    kc::fp8_block_cast_1d(x, rows, s.K, fwd_format_, {nullptr, nullptr, xq_, xq_inv_}, stream_);
    kc::GemmProblem p = tn(s.K, s.N, rows, fwd_format_, grad_format_);
    p.d_fp32 = true;
    p.a_scale = p.b_scale = kc::GemmScale::Vec128;
    gemm_->gemm_fp8(p, xq_, xq_inv_, dyqt_, dyqt_inv_, dw, nullptr, 1.0f, accumulate ? 1.0f : 0.0f, stream_);
  }
}

void CudaFp8Linears::grouped_forward(int64_t w, const bf16* x, const kc::RowGroups& groups, bf16* y, uint8_t* xt) {
  const Experts& X = experts(w);
  const int64_t i = X.index;
  check_expert_rows(groups);
  // Each expert's input scale (a recomputed forward keeps the one of the forward it repeats).
  if (pass_ != Fp8Pass::Recompute) {
    if (delayed()) {
      LAOYAO_CUDA_CHECK(cudaMemcpy2DAsync(at(input_scale_, i), sizeof(float) * kStride, fwd_scale_ + 2 * i,
                                          2 * sizeof(float), sizeof(float), static_cast<size_t>(X.E),
                                          cudaMemcpyDeviceToDevice, stream_));
    } else {
      LAOYAO_CUDA_CHECK(cudaMemsetAsync(expert_amax_, 0, sizeof(float) * static_cast<size_t>(X.E), stream_));
      kc::fp8_grouped_amax(x, X.K, groups, expert_amax_, 1, stream_);
      kc::fp8_current_scales(expert_amax_, 1, X.E, fwd_format_, at(input_scale_, i), kStride, stream_);
    }
  }
  const bool record = delayed() && pass_ != Fp8Pass::Recompute;
  const kc::Fp8Slots slots{at(input_scale_, i), kStride, at(input_inv_, i), kStride,
                           record ? fwd_history_ + 2 * i : nullptr, 2};
  const bool backward_follows = pass_ == Fp8Pass::TrainingForward || pass_ == Fp8Pass::Recompute;
  kc::fp8_grouped_cast_transpose(x, X.K, groups, slots, fwd_format_, exq_, backward_follows ? xt : nullptr, expert_ld_,
                                 stream_);
  kc::grouped_gemm_fp8_nt(exq_, fwd_format_, X.wq, y, groups, X.N, X.K,
                          {at(input_inv_, i), at(weight_inv_, i), kStride, kStride}, false, stream_);
}

void CudaFp8Linears::grouped_backward(int64_t w, const uint8_t* xt, const bf16* dy, const kc::RowGroups& groups,
                                      bf16* dx, float* dw, bool accumulate) {
  const Experts& X = experts(w);
  const int64_t i = X.index;
  check_expert_rows(groups);
  // Each expert's output gradient (recorded: the backward's amaxes), with its transpose for dw.
  kc::Fp8Slots slots{bwd_scale_ + i, 1, at(grad_inv_, i), kStride, delayed() ? bwd_history_ + i : nullptr, 1};
  if (!delayed()) {
    LAOYAO_CUDA_CHECK(cudaMemsetAsync(expert_amax_, 0, sizeof(float) * static_cast<size_t>(X.E), stream_));
    kc::fp8_grouped_amax(dy, X.N, groups, expert_amax_, 1, stream_);
    kc::fp8_current_scales(expert_amax_, 1, X.E, grad_format_, at(grad_scale_, i), kStride, stream_);
    slots.scale = at(grad_scale_, i), slots.scale_stride = kStride;
  }
  kc::fp8_grouped_cast_transpose(dy, X.N, groups, slots, grad_format_, dx ? edyq_ : nullptr, dw ? edyqt_ : nullptr,
                                 expert_ld_, stream_);
  if (dx)  // dX = dY @ W_g: the nt GEMM over the weights' transposes, the split accumulator
    kc::grouped_gemm_fp8_nt(edyq_, grad_format_, X.wqt, dx, groups, X.K, X.N,
                            {at(grad_inv_, i), at(weight_inv_, i), kStride, kStride}, true, stream_);
  if (dw)  // (the input's transposed cast from the forward)
    kc::grouped_gemm_fp8_wgrad(edyqt_, grad_format_, xt, expert_ld_, dw, groups, X.N, X.K,
                               {at(grad_inv_, i), at(input_inv_, i), kStride, kStride}, accumulate, stream_);
}

void CudaFp8Linears::check_expert_rows(const kc::RowGroups& groups) const {
  if (groups.first + groups.rows > expert_rows_)
    throw Error("CudaFp8Linears: " + std::to_string(groups.first + groups.rows) + " expert rows, built for " +
                std::to_string(expert_rows_));
}

CudaFp8Linears::Scaling CudaFp8Linears::download_scaling(int64_t w, bool backward) const {
  const int64_t i = index_of(w), k = backward ? 1 : 2, width = backward ? n_ : 2 * n_;
  const float* history = backward ? bwd_history_ : fwd_history_;
  const float* scale = backward ? bwd_scale_ + i : fwd_scale_ + 2 * i;
  Scaling out;
  out.scale.resize(static_cast<size_t>(k));
  out.history.resize(static_cast<size_t>(len_ * k));
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  LAOYAO_CUDA_CHECK(cudaMemcpy(out.scale.data(), scale, sizeof(float) * k, cudaMemcpyDeviceToHost));
  for (int64_t r = 0; r < len_; ++r)
    LAOYAO_CUDA_CHECK(cudaMemcpy(out.history.data() + r * k, history + r * width + k * i, sizeof(float) * k,
                                 cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace laoyao::model
