#include "model/cuda/moe_layers_cuda.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/bias_gelu.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/grouped_gemm.hpp"
#include "kernels/cpu/moe.hpp"
#include "kernels/cuda/moe_ep.hpp"
#include "kernels/cuda/stream_wait.hpp"
#include "kernels/cuda/swiglu.hpp"
#include "model/cuda/carver.hpp"

namespace laoyao::model {

namespace kc = laoyao::kernels::cuda;

CudaMoeLayers::CudaMoeLayers(const GptConfig& cfg, int64_t max_tokens, int64_t seq_length, dist::ProcessGroup* ep,
                             MoeSequenceShares shares)
    : cfg_(cfg), shares_(shares) {
  const MoeConfig& m = cfg.moe;
  E_ = m.num_experts, k_ = m.topk, H_ = cfg.hidden, F_ = m.ffn, Fs_ = m.shared_ffn;
  if (ep && ep->size() > 1) ep_ = ep, P_ = ep->size(), me_ = ep->rank(), gather_ = m.allgather_dispatcher;
  if (m.expert_parallel != P_)
    throw Error("CudaMoeLayers: the config's expert-parallel size " + std::to_string(m.expert_parallel) +
                " is not the group's " + std::to_string(P_));
  if (E_ % P_ != 0)
    throw UsageError(std::to_string(E_) + " experts do not split over " + std::to_string(P_) +
                     " expert-parallel ranks (--num-experts must be a multiple of --expert-model-parallel-size)");
  El_ = E_ / P_;
  if (shares_.ranks < 1 || seq_length % shares_.ranks != 0 || shares_.rank < 0 || shares_.rank >= shares_.ranks)
    throw Error("CudaMoeLayers: share " + std::to_string(shares_.rank) + " of " + std::to_string(shares_.ranks) +
                " of a sequence of " + std::to_string(seq_length));
  // Whole experts under TP: only this rank's share's pairs get rows.
  const bool shared_out = shares_.whole_experts && shares_.ranks > 1;
  // PEFT's adapters on the MoE layers' linear_fc1 / linear_fc2: every row of one rank's experts
  // (train/run_setup.cpp refuses them with expert or tensor parallelism, as the CPU backend does).
  const int64_t adapter_dim = cfg.lora && (cfg.lora->fc1 || cfg.lora->fc2) ? cfg.lora->dim : 0;
  if (adapter_dim > 0 && (ep_ || shares_.ranks > 1))
    throw Error("CudaMoeLayers: LoRA adapters on experts split over expert or tensor parallelism are not built");
  if (adapter_dim > 0 && cfg.fp8)  // (the FP8 experts' and shared expert's paths run no adapters)
    throw Error("CudaMoeLayers: LoRA adapters on FP8 experts are not built (train/run_setup.cpp refuses them)");
  const bool swiglu = cfg.activation == Activation::SwiGLU;
  F1_ = swiglu ? 2 * F_ : F_;
  Fs1_ = swiglu ? 2 * Fs_ : Fs_;
  if (E_ > kc::kMoeMaxExperts)
    throw UsageError("the CUDA backend routes to at most " + std::to_string(kc::kMoeMaxExperts) +
                     " experts (--num-experts " + std::to_string(E_) + ")");
  if (H_ % 8 != 0 || F_ % 8 != 0 || Fs_ % 8 != 0)
    throw UsageError("the CUDA backend's MoE kernels need --hidden-size, --moe-ffn-hidden-size and "
                     "--moe-shared-expert-intermediate-size to be multiples of 8");
  router_.num_experts = E_;
  router_.topk = k_;
  router_.sigmoid = m.sigmoid, router_.sqrt_softplus = m.sqrt_softplus;
  router_.pre_softmax = m.pre_softmax;
  router_.topk_scaling_factor = m.topk_scaling_factor ? static_cast<float>(*m.topk_scaling_factor) : 0.0f;
  router_.num_groups = m.num_groups, router_.group_topk = m.group_topk;
  losses_.aux_coeff = static_cast<float>(m.aux_loss_coeff);
  losses_.seq_aux_coeff = static_cast<float>(m.seq_aux_loss_coeff);
  losses_.z_coeff = static_cast<float>(m.z_loss_coeff);
  losses_.seq_length = seq_length;
  losses_.global_aux_coeff = static_cast<float>(m.global_aux_loss_coeff);
  losses_.context_parallel_size = std::max<int64_t>(cfg.context_parallel, 1);  // (its group: set_context_parallel_group)

  // Nl: rows this rank's experts may get, every rank's every token under expert parallelism
  // (dropless routing bounds nothing tighter).
  const int64_t T = max_tokens, N = T * k_, Nl = P_ * N;
  const bool aux = losses_.aux_coeff > 0 || losses_.seq_aux_coeff > 0 || losses_.global_aux_coeff > 0;
  // The aux losses count their own top-k when the routing's is biased or limited to groups.
  const bool aux_apart = aux && (m.expert_bias || m.num_groups > 0);
  slot_.assign(static_cast<size_t>(cfg.layer_count()), -1);  // (multi-token prediction's layers too)
  int64_t layers = 0;
  for (int64_t l = 0; l < cfg.layer_count(); ++l)
    if (cfg.is_moe_layer(l)) slot_[static_cast<size_t>(l)] = layers++;

  auto carve_saved = [&](Carver& a) {
    saved_layers_.assign(static_cast<size_t>(layers), Saved{});
    for (auto& S : saved_layers_) {
      S.logits = a.take<float>(T * E_);
      S.probs = a.take<float>(N);
      // The router kernels take null for what no enabled loss needs.
      S.scores = aux ? a.take<float>(T * E_) : nullptr;
      S.lse = losses_.z_coeff > 0 ? a.take<float>(T) : nullptr;
      S.stats = a.take<float>(static_cast<int64_t>(kc::moe_aux_stats_floats(T, E_, losses_)));
      S.topk_idx = a.take<int32_t>(N);
      S.counts = a.take<int32_t>(E_);
      S.aux_idx = aux_apart ? a.take<int32_t>(N) : nullptr;
      S.aux_counts = aux_apart ? a.take<int32_t>(E_) : nullptr;
      S.share_idx = shared_out ? a.take<int32_t>(N) : nullptr;
      S.share_counts = shared_out ? a.take<int32_t>(E_) : nullptr;
      S.offsets = a.take<int32_t>(E_ + 1);
      S.sorted_token = a.take<int32_t>(N);
      S.permuted_row = a.take<int32_t>(N);
      S.fc1_out = a.take<bf16>(Nl * F1_);
      S.act_out = a.take<bf16>(Nl * F_);
      S.expert_out = a.take<bf16>((gather_ ? Nl : N) * H_);  // gathered: this rank's expert rows
      S.shared_u = a.take<bf16>(T * Fs1_);
      S.shared_g = a.take<bf16>(T * Fs_);
      S.ep_counts = a.take<int32_t>(ep_ ? P_ * E_ : 0);
      S.local_offsets = a.take<int32_t>(ep_ ? E_ + 1 : 0);
      S.local_x = a.take<bf16>(ep_ ? Nl * H_ : 0);
      S.permuted_x = a.take<bf16>(ep_ ? 0 : N * H_);
      S.fc1_in_t = a.take<uint8_t>(cfg.fp8 ? H_ * CudaFp8Linears::expert_ld(N) : 0);
      S.fc2_in_t = a.take<uint8_t>(cfg.fp8 ? F_ * CudaFp8Linears::expert_ld(N) : 0);
      S.kept = a.take<uint8_t>(m.capacity_factor ? N : 0);
      S.probs_g = a.take<float>(gather_ ? Nl : 0);
      S.rows_g = a.take<int32_t>(gather_ ? Nl : 0);
    }
  };
  auto carve_scratch = [&](Carver& a) {
    permuted_x_ = a.take<bf16>(ep_ && !gather_ ? N * H_ : 0);
    shared_out_ = a.take<bf16>(Fs_ > 0 ? T * H_ : 0);
    dexpert_ = a.take<bf16>(gather_ ? 0 : N * H_);  // gathered: local_y_ holds the output gradients
    dact_ = a.take<bf16>(Nl * F_);
    dfc1_ = a.take<bf16>(Nl * F1_);
    dpermuted_ = a.take<bf16>(gather_ ? 0 : N * H_);
    dlogits_ = a.take<bf16>(T * E_);
    dshared_ = a.take<bf16>(Fs_ > 0 ? T * H_ : 0);
    dshared_g_ = a.take<bf16>(T * Fs_);
    dshared_u_ = a.take<bf16>(T * Fs1_);
    dprobs_ = a.take<float>(N);
    permuted_probs_ = a.take<float>(m.capacity_factor ? N : 0);
    lora_z_ = a.take<bf16>(N * adapter_dim);  // (N >= T: the shared expert's rows fit too)
    lora_dz_ = a.take<bf16>(N * adapter_dim);
    perm_scratch_ = a.take<char>(static_cast<int64_t>(std::max(kc::moe_permutation_scratch_bytes(T, E_),
                                                               kc::moe_permutation_scratch_bytes(P_ * T, El_))));
    local_y_ = a.take<bf16>(ep_ ? Nl * H_ : 0);
    local_dx_ = a.take<bf16>(ep_ ? Nl * H_ : 0);
    const int64_t Tg = gather_ ? P_ * T : 0;  // the group's tokens
    gathered_ = a.take<bf16>(Tg * H_);
    partial_ = a.take<bf16>(Tg * H_);
    reduced_ = a.take<bf16>(gather_ ? T * H_ : 0);
    idx_g_ = a.take<int32_t>(Tg * k_);
    idx_l_ = a.take<int32_t>(Tg * k_);
    sorted_l_ = a.take<int32_t>(Tg * k_);
    counts_l_ = a.take<int32_t>(gather_ ? El_ : 0);
    dprobs_g_ = a.take<float>(Tg * k_);
  };
  Carver measure;
  carve_saved(measure);
  saved_ = kc::DeviceBuffer(std::max<size_t>(measure.used, 1));
  Carver real{static_cast<char*>(saved_.ptr), 0};
  carve_saved(real);
  // Zeros first: the weight-gradient GEMMs read up to a reduction step of rows past the last
  // group's end (weighted by zeros), which under the all-gather dispatcher (or with only a share's
  // pairs here) are rows of earlier steps, or never written; they must hold finite values.
  const bool bounded_rows = gather_ || shared_out;
  if (bounded_rows) LAOYAO_CUDA_CHECK(cudaMemset(saved_.ptr, 0, saved_.bytes));
  Carver measure_scratch;
  carve_scratch(measure_scratch);
  scratch_ = kc::DeviceBuffer(measure_scratch.used);
  Carver real_scratch{static_cast<char*>(scratch_.ptr), 0};
  carve_scratch(real_scratch);
  // The same for the scratch rows the GeLU activation runs over past the experts' (the bound).
  if (bounded_rows) LAOYAO_CUDA_CHECK(cudaMemset(scratch_.ptr, 0, scratch_.bytes));

  if (ep_) {
    host_counts_ = kc::PinnedHostBuffer(sizeof(int32_t) * static_cast<size_t>(P_ * E_));
    int lo = 0, hi = 0;
    LAOYAO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    LAOYAO_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, hi));
    LAOYAO_CUDA_CHECK(cudaEventCreateWithFlags(&comm_start_, cudaEventDisableTiming));
    LAOYAO_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
  }
  if (phases_.enabled()) load_host_ = kc::PinnedHostBuffer(sizeof(int32_t) * static_cast<size_t>(layers * E_));
  sums_ = kc::DeviceBuffer(8 * sizeof(float));
  train_sums_ = sums_.as<float>();
  discard_sums_ = train_sums_ + 4;
  LAOYAO_CUDA_CHECK(cudaMemset(sums_.ptr, 0, sums_.bytes));
  if (losses_.global_aux_coeff > 0) {
    global_ = kc::DeviceBuffer(static_cast<size_t>(layers * E_) * (sizeof(double) + sizeof(float)) +
                               static_cast<size_t>(E_) * sizeof(int32_t));
    global_running_ = global_.as<double>();
    global_mean_ = reinterpret_cast<float*>(global_running_ + layers * E_);
    global_counts_ = reinterpret_cast<int32_t*>(global_mean_ + layers * E_);
    global_steps_.assign(static_cast<size_t>(layers), 0);
    LAOYAO_CUDA_CHECK(cudaMemset(global_.ptr, 0, global_.bytes));
  }
  if (m.expert_bias) {
    if (!m.sigmoid)
      throw UsageError("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid or sqrtsoftplus");
    expert_load_ = kc::DeviceBuffer(sizeof(int32_t) * static_cast<size_t>(layers * E_));
    LAOYAO_CUDA_CHECK(cudaMemset(expert_load_.ptr, 0, expert_load_.bytes));
  }
  LAOYAO_CUDA_CHECK(cudaDeviceSynchronize());  // the memset ran on the legacy stream; ours do not wait for it
  if (!swiglu) {
    zero_bias_ = kc::DeviceBuffer(sizeof(bf16) * std::max(F_, Fs_));
    LAOYAO_CUDA_CHECK(cudaMemset(zero_bias_.ptr, 0, zero_bias_.bytes));  // bf16 zero is all-zero bits
    LAOYAO_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

CudaMoeLayers::~CudaMoeLayers() {
  if (comm_) {
    (void)cudaStreamSynchronize(comm_);
    (void)cudaStreamDestroy(comm_);
  }
  for (cudaEvent_t e : {comm_start_, comm_done_})
    if (e) (void)cudaEventDestroy(e);
}

// The GeLU kernels take no device row count: under the all-gather dispatcher they run over every
// row the bound allows; the rows past the experts' hold zeros or earlier steps' finite values, and
// what is computed there is never weighed (the GEMMs store only the groups' rows, the weight
// gradients zero the output gradients' rows past a group).
void CudaMoeLayers::activation_forward(const bf16* u, bf16* g, int64_t rows, int64_t F, cudaStream_t stream,
                                       const int32_t* rows_end) const {
  if (cfg_.activation == Activation::SwiGLU)
    kc::swiglu_forward(u, g, rows, F, stream, rows_end);
  else
    kc::bias_gelu_forward(u, zero_bias_.as<bf16>(), g, rows, F, stream, cfg_.activation == Activation::GeluErf);
}

void CudaMoeLayers::activation_backward(const bf16* u, const bf16* dg, bf16* du, int64_t rows, int64_t F,
                                        cudaStream_t stream, const int32_t* rows_end) const {
  if (cfg_.activation == Activation::SwiGLU)
    kc::swiglu_backward(u, dg, du, rows, F, stream, rows_end);
  else
    kc::bias_gelu_backward(dg, u, zero_bias_.as<bf16>(), du, rows, F, stream, cfg_.activation == Activation::GeluErf);
}

kc::RowGroups CudaMoeLayers::expert_groups(const Saved& S, int64_t N) const {
  if (ep_) return {S.local_offsets, P_ * El_, El_, S.local_rows};
  return {S.offsets, E_, E_, N};
}

kc::RowGroups CudaMoeLayers::source_groups(const Saved& S, int64_t s0, int64_t s1) const {
  int64_t rows = 0;
  for (int64_t s = s0; s < s1; ++s) rows += S.source_rows[static_cast<size_t>(s)];
  const int64_t first = s0 < P_ ? S.source_first[static_cast<size_t>(s0)] : S.local_rows;
  return {S.local_offsets + s0 * El_, (s1 - s0) * El_, El_, rows, first};
}

void CudaMoeLayers::copy_own_rows(const Saved& S, const bf16* rows, bf16* local, cudaStream_t stream) const {
  const int64_t n = S.source_rows[static_cast<size_t>(me_)];
  if (n > 0)
    LAOYAO_CUDA_CHECK(cudaMemcpyAsync(local + S.source_first[static_cast<size_t>(me_)] * H_,
                                      rows + S.own_first_sent * H_, sizeof(bf16) * static_cast<size_t>(n * H_),
                                      cudaMemcpyDeviceToDevice, stream));
}

void CudaMoeLayers::copy_own_rows_back(const Saved& S, const bf16* local, bf16* rows, cudaStream_t stream) const {
  const int64_t n = S.source_rows[static_cast<size_t>(me_)];
  if (n > 0)
    LAOYAO_CUDA_CHECK(cudaMemcpyAsync(rows + S.own_first_sent * H_,
                                      local + S.source_first[static_cast<size_t>(me_)] * H_,
                                      sizeof(bf16) * static_cast<size_t>(n * H_), cudaMemcpyDeviceToDevice, stream));
}

void CudaMoeLayers::experts_forward(const Saved& S, const Context& ctx, const bf16* in, const kc::RowGroups& groups,
                                    bf16* out, const int32_t* rows_end) const {
  if (groups.rows == 0) return;
  const bf16* P = ctx.params;
  const int64_t first_row = groups.first;
  if (CudaFp8Linears* f = fp8_experts(ctx)) {
    f->grouped_forward(ctx.W.experts_fc1, in, groups, S.fc1_out, S.fc1_in_t);
    activation_forward(S.fc1_out + first_row * F1_, S.act_out + first_row * F_, groups.rows, F_, ctx.stream, rows_end);
    f->grouped_forward(ctx.W.experts_fc2, S.act_out, groups, out, S.fc2_in_t);
    return;
  }
  kc::grouped_gemm_nt(in, P + ctx.W.experts_fc1, S.fc1_out, groups, F1_, H_, ctx.stream);
  adapter_forward(ctx, ctx.W.experts_fc1_lora, in + first_row * H_, S.fc1_out + first_row * F1_, groups.rows, H_, F1_);
  activation_forward(S.fc1_out + first_row * F1_, S.act_out + first_row * F_, groups.rows, F_, ctx.stream, rows_end);
  kc::grouped_gemm_nt(S.act_out, P + ctx.W.experts_fc2, out, groups, H_, F_, ctx.stream);
  adapter_forward(ctx, ctx.W.experts_fc2_lora, S.act_out + first_row * F_, out + first_row * H_, groups.rows, F_, H_);
}

void CudaMoeLayers::experts_backward_input(const Saved& S, const Context& ctx, const bf16* in, const bf16* dy,
                                           const kc::RowGroups& groups, bf16* dx, const int32_t* rows_end) const {
  if (groups.rows == 0) return;
  const bf16* P = ctx.params;
  const int64_t first_row = groups.first, rows = groups.rows;
  if (CudaFp8Linears* f = fp8_experts(ctx)) {  // each linear's input and weight gradients together
    f->grouped_backward(ctx.W.experts_fc2, S.fc2_in_t, dy, groups, dact_, ctx.grad(ctx.W.experts_fc2),
                        ctx.accumulate_grads);
    activation_backward(S.fc1_out + first_row * F1_, dact_ + first_row * F_, dfc1_ + first_row * F1_, rows, F_,
                        ctx.stream, rows_end);
    f->grouped_backward(ctx.W.experts_fc1, S.fc1_in_t, dfc1_, groups, dx, ctx.grad(ctx.W.experts_fc1),
                        ctx.accumulate_grads);
    return;
  }
  kc::grouped_gemm_nn(dy, P + ctx.W.experts_fc2, dact_, groups, H_, F_, ctx.stream);
  adapter_backward(ctx, ctx.W.experts_fc2_lora, S.act_out + first_row * F_, dy + first_row * H_, dact_ + first_row * F_,
                   rows, F_, H_);
  activation_backward(S.fc1_out + first_row * F1_, dact_ + first_row * F_, dfc1_ + first_row * F1_, rows, F_,
                      ctx.stream, rows_end);
  kc::grouped_gemm_nn(dfc1_, P + ctx.W.experts_fc1, dx, groups, F1_, H_, ctx.stream);
  adapter_backward(ctx, ctx.W.experts_fc1_lora, in + first_row * H_, dfc1_ + first_row * F1_, dx + first_row * H_,
                   rows, H_, F1_);
}

void CudaMoeLayers::adapter_forward(const Context& ctx, const LoraOffsets& p, const bf16* x, bf16* y, int64_t rows,
                                    int64_t in, int64_t out) const {
  if (!p.on() || rows == 0) return;
  const int64_t r = cfg_.lora->dim;
  const bf16 *A = ctx.params + p.a, *B = ctx.params + p.b;
  ctx.gemm.matmul_rm(x, false, A, true, lora_z_, false, rows, r, in, cfg_.lora->scale(), 0.0f, 1, ctx.stream);
  ctx.gemm.matmul_rm(lora_z_, false, B, true, y, false, rows, out, r, 1.0f, 1.0f, 1, ctx.stream);
}

void CudaMoeLayers::adapter_backward(const Context& ctx, const LoraOffsets& p, const bf16* x, const bf16* dy,
                                     bf16* dx, int64_t rows, int64_t in, int64_t out) const {
  if (!p.on() || rows == 0) return;
  const int64_t r = cfg_.lora->dim;
  const float scale = cfg_.lora->scale();
  const bf16 *A = ctx.params + p.a, *B = ctx.params + p.b;
  float *dA = ctx.grad(p.a), *dB = ctx.grad(p.b);
  if (!dA || !dB) throw Error("CudaMoeLayers: a LoRA adapter without its gradients");
  // z = scale x A^T again (cheaper than keeping it: dim is small); dB += dy^T z; dz = scale dy B;
  // dA += dz^T x; dx += dz A.
  ctx.gemm.matmul_rm(x, false, A, true, lora_z_, false, rows, r, in, scale, 0.0f, 1, ctx.stream);
  ctx.gemm.matmul_rm(dy, true, lora_z_, false, dB, true, out, r, rows, 1.0f, 1.0f, 1, ctx.stream);
  ctx.gemm.matmul_rm(dy, false, B, false, lora_dz_, false, rows, r, out, scale, 0.0f, 1, ctx.stream);
  ctx.gemm.matmul_rm(lora_dz_, true, x, false, dA, true, r, in, rows, 1.0f, 1.0f, 1, ctx.stream);
  ctx.gemm.matmul_rm(lora_dz_, false, A, false, dx, false, rows, in, r, 1.0f, 1.0f, 1, ctx.stream);
}

CudaFp8Linears* CudaMoeLayers::fp8_experts(const Context& ctx) const {
  if (!ctx.fp8 || !ctx.fp8->runs_experts(ctx.W.experts_fc1)) return nullptr;
  if (ep_ || gather_)
    throw Error("CudaMoeLayers: FP8 experts under expert parallelism or the all-gather dispatcher are not built");
  return ctx.fp8;
}

void CudaMoeLayers::shared_expert_forward(const Saved& S, const Context& ctx, const bf16* x, int64_t T) {
  if (Fs_ == 0) return;
  const bf16* P = ctx.params;
  if (ctx.fp8 && ctx.fp8->runs(ctx.W.shared_fc1)) {  // the shared expert's Linears in FP8
    ctx.fp8->forward(ctx.W.shared_fc1, x, nullptr, S.shared_u, T);
    activation_forward(S.shared_u, S.shared_g, T, Fs_, ctx.stream);
    ctx.fp8->forward(ctx.W.shared_fc2, S.shared_g, nullptr, shared_out_, T);
    phases_.mark(kShared, ctx.stream);
    return;
  }
  ctx.gemm.linear_forward(x, P + ctx.W.shared_fc1, nullptr, S.shared_u, T, H_, Fs1_, ctx.stream);
  adapter_forward(ctx, ctx.W.shared_fc1_lora, x, S.shared_u, T, H_, Fs1_);
  activation_forward(S.shared_u, S.shared_g, T, Fs_, ctx.stream);
  ctx.gemm.linear_forward(S.shared_g, P + ctx.W.shared_fc2, nullptr, shared_out_, T, Fs_, H_, ctx.stream);
  adapter_forward(ctx, ctx.W.shared_fc2_lora, S.shared_g, shared_out_, T, Fs_, H_);
  phases_.mark(kShared, ctx.stream);
}

void CudaMoeLayers::shared_expert_backward(const Saved& S, const Context& ctx, const bf16* x, const bf16* dy,
                                           int64_t T) {
  if (Fs_ == 0) return;
  const bf16* P = ctx.params;
  cudaStream_t st = ctx.stream;
  if (ctx.fp8 && ctx.fp8->runs(ctx.W.shared_fc1)) {
    ctx.fp8->backward(ctx.W.shared_fc2, S.shared_g, dy, dshared_g_, ctx.grad(ctx.W.shared_fc2), ctx.accumulate_grads, T);
    activation_backward(S.shared_u, dshared_g_, dshared_u_, T, Fs_, st);
    ctx.fp8->backward(ctx.W.shared_fc1, x, dshared_u_, dshared_, ctx.grad(ctx.W.shared_fc1), ctx.accumulate_grads, T);
    phases_.mark(kShared, st);
    return;
  }
  ctx.gemm.linear_backward_input(dy, P + ctx.W.shared_fc2, dshared_g_, T, Fs_, H_, st);
  if (float* g = ctx.grad(ctx.W.shared_fc2))
    ctx.gemm.linear_backward_weight(dy, S.shared_g, g, T, Fs_, H_, st, ctx.accumulate_grads);
  adapter_backward(ctx, ctx.W.shared_fc2_lora, S.shared_g, dy, dshared_g_, T, Fs_, H_);
  activation_backward(S.shared_u, dshared_g_, dshared_u_, T, Fs_, st);
  ctx.gemm.linear_backward_input(dshared_u_, P + ctx.W.shared_fc1, dshared_, T, H_, Fs1_, st);
  if (float* g = ctx.grad(ctx.W.shared_fc1))
    ctx.gemm.linear_backward_weight(dshared_u_, x, g, T, H_, Fs1_, st, ctx.accumulate_grads);
  adapter_backward(ctx, ctx.W.shared_fc1_lora, x, dshared_u_, dshared_, T, H_, Fs1_);
  phases_.mark(kShared, st);
}

void CudaMoeLayers::router_backward(const Saved& S, const Context& ctx, const bf16* x, bf16* dx, int64_t T,
                                    float aux_scale) {
  cudaStream_t st = ctx.stream;
  kc::moe_router_backward(S.logits, S.topk_idx, dprobs_, S.lse, S.stats, T, router_, losses_, aux_scale, dlogits_, st);
  ctx.gemm.linear_backward_input(dlogits_, ctx.params + ctx.W.router_w, dx, T, H_, E_, st);
  if (float* g = ctx.grad(ctx.W.router_w))
    ctx.gemm.linear_backward_weight(dlogits_, x, g, T, H_, E_, st, ctx.accumulate_grads);
  phases_.mark(kRouter, st);
}

// Tried and dropped (fifteenth session): these two GEMMs on a second stream, joined at the end of
// the layer's backward, so that the permutation's, the norms' and the attention's backward ran
// beside them: the flagship's step at 8 micro-batches of 8 x 4096 went 563.4 -> 569.8 ms (one call).
void CudaMoeLayers::experts_backward_weights(const Saved& S, const Context& ctx, const bf16* in, const bf16* dy,
                                             const kc::RowGroups& groups) const {
  if (fp8_experts(ctx)) return;  // (computed with the input gradients: experts_backward_input)
  float *fc2 = ctx.grad(ctx.W.experts_fc2), *fc1 = ctx.grad(ctx.W.experts_fc1);
  if (fc2) kc::grouped_gemm_wgrad(dy, S.act_out, fc2, groups, H_, F_, ctx.accumulate_grads, ctx.stream);
  if (fc1) kc::grouped_gemm_wgrad(dfc1_, in, fc1, groups, F1_, H_, ctx.accumulate_grads, ctx.stream);
}

void CudaMoeLayers::exchange_counts(Saved& S, cudaStream_t stream) {
  ep_->all_gather_device(S.dispatch_counts(), S.ep_counts, static_cast<size_t>(E_), dist::DeviceType::I32, stream);
  LAOYAO_CUDA_CHECK(cudaMemcpyAsync(host_counts_.ptr, S.ep_counts, host_counts_.bytes, cudaMemcpyDeviceToHost, stream));
  kc::stream_wait(stream, "the MoE layer's token counts (expert parallelism)");
  const int32_t* c = host_counts_.as<int32_t>();
  S.send_elems.assign(static_cast<size_t>(P_), 0);
  S.recv_elems.assign(static_cast<size_t>(P_), 0);
  S.source_rows.assign(static_cast<size_t>(P_), 0);
  S.source_first.assign(static_cast<size_t>(P_), 0);
  S.local_rows = 0;
  S.own_first_sent = 0;
  for (int64_t r = 0; r < P_; ++r) {
    S.source_first[static_cast<size_t>(r)] = S.local_rows;
    for (int64_t e = r * El_; e < (r + 1) * El_; ++e) {
      S.send_elems[static_cast<size_t>(r)] += static_cast<size_t>(c[me_ * E_ + e] * H_);  // my rows for r's experts
      if (r < me_) S.own_first_sent += c[me_ * E_ + e];
      const int64_t in = c[r * E_ + me_ * El_ + (e - r * El_)];  // r's rows for mine
      S.recv_elems[static_cast<size_t>(r)] += static_cast<size_t>(in * H_);
      S.source_rows[static_cast<size_t>(r)] += in;
      S.local_rows += in;
    }
  }
  min_rows_ = min_rows_ < 0 ? S.local_rows : std::min(min_rows_, S.local_rows);
  max_rows_ = std::max(max_rows_, S.local_rows);
  phases_.mark(kCounts, stream);
}

void CudaMoeLayers::fork_comm(cudaStream_t stream) {
  LAOYAO_CUDA_CHECK(cudaEventRecord(comm_start_, stream));
  LAOYAO_CUDA_CHECK(cudaStreamWaitEvent(comm_, comm_start_, 0));
}

void CudaMoeLayers::start_dispatch(const Saved& S, const bf16* rows, bf16* local, cudaStream_t stream) {
  fork_comm(stream);
  ep_->all_to_all_device(rows, S.send_elems.data(), local, S.recv_elems.data(), dist::DeviceType::BF16, comm_, false);
}

void CudaMoeLayers::start_combine(const Saved& S, const bf16* local, bf16* rows, cudaStream_t stream) {
  fork_comm(stream);
  ep_->all_to_all_device(local, S.recv_elems.data(), rows, S.send_elems.data(), dist::DeviceType::BF16, comm_, false);
}

void CudaMoeLayers::wait_exchange(cudaStream_t stream) {
  LAOYAO_CUDA_CHECK(cudaEventRecord(comm_done_, comm_));
  LAOYAO_CUDA_CHECK(cudaStreamWaitEvent(stream, comm_done_, 0));
  phases_.mark(kExchange, stream);
}

void CudaMoeLayers::copy_load(const int32_t* counts, int64_t slot, cudaStream_t stream) {
  LAOYAO_CUDA_CHECK(cudaMemcpyAsync(load_host_.as<int32_t>() + slot * E_, counts, sizeof(int32_t) * E_,
                                    cudaMemcpyDeviceToHost, stream));
  load_stream_ = stream;
}

void CudaMoeLayers::report_phases() {
  const std::vector<double> ms = phases_.take();
  if (!phases_.enabled()) return;
  // The busiest expert's tokens over the mean, the largest of the layers' and their average.
  double worst = 0, mean_ratio = 0;
  int64_t layers = 0;
  if (load_stream_) {
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(load_stream_));
    const int32_t* c = load_host_.as<int32_t>();
    for (size_t s = 0; s < saved_layers_.size(); ++s, c += E_) {
      int64_t total = 0, most = 0;
      for (int64_t e = 0; e < E_; ++e) total += c[e], most = std::max<int64_t>(most, c[e]);
      if (total == 0) continue;
      const double ratio = double(most) * double(E_) / double(total);
      worst = std::max(worst, ratio), mean_ratio += ratio, ++layers;
    }
    if (layers > 0) mean_ratio /= double(layers);
    load_stream_ = nullptr;
  }
  std::fprintf(stderr,
               "laoyao: MoE phases (ms): router %.2f | permutation %.2f | count exchange %.2f | all-to-all %.2f | "
               "experts %.2f | shared experts %.2f | expert rows here per layer %lld..%lld | busiest expert / mean "
               "%.2f (layers' average %.2f)\n",
               ms[kRouter], ms[kPermute], ms[kCounts], ms[kExchange], ms[kExperts], ms[kShared],
               static_cast<long long>(min_rows_), static_cast<long long>(max_rows_), worst, mean_ratio);
  min_rows_ = max_rows_ = -1;
}

void CudaMoeLayers::forward(int64_t l, const Context& ctx, const bf16* x, bf16* y, int64_t T, Pass pass,
                            const uint64_t* random_logits_key, const bf16* residual) {
  const bool count_losses = pass == Pass::Training;
  Saved& S = saved_layers_.at(static_cast<size_t>(slot_.at(static_cast<size_t>(l))));
  const GptLayerOffsets& W = ctx.W;
  const bf16* P = ctx.params;
  cudaStream_t st = ctx.stream;
  const int64_t N = T * k_;
  phases_.begin(st);
  if (gather_) gather_tokens(x, T, st);  // beside the router
  // Router: fp32 logits (as --moe-router-dtype fp32; at bf16 precision with it unset, as Megatron's
  // bf16 router linear), the fused top-k and the per-expert counts.
  ctx.gemm.matmul_rm(x, false, P + W.router_w, true, S.logits, true, T, E_, H_, 1.0f, 0.0f, 1, st);
  if (cfg_.moe.force_load_balancing) {
    if (!random_logits_key) throw Error("CudaMoeLayers: --moe-router-force-load-balancing needs the logits' key");
    kc::moe_random_logits(S.logits, T * E_, random_logits_key, st);
  }
  if (cfg_.moe.router_bf16) kc::round_to_bf16_inplace(S.logits, T * E_, st);
  const float* bias = nullptr;
  if (cfg_.moe.expert_bias) {
    if (!ctx.main || ctx.W.expert_bias < 0) throw Error("CudaMoeLayers: the expert bias needs the fp32 parameters");
    bias = ctx.main + ctx.W.expert_bias;
  }
  kc::moe_router_forward(S.logits, T, router_, S.topk_idx, S.probs, S.scores, S.lse, S.counts, st, bias, S.aux_idx,
                         S.aux_counts);
  if (cfg_.moe.router_bf16) kc::round_to_bf16_inplace(S.probs, T * k_, st);  // Megatron's probs.type_as(logits)
  if (count_losses && phases_.recording(st)) copy_load(S.counts, slot_[static_cast<size_t>(l)], st);
  if (bias && count_losses)  // a training forward's tokens count for the bias update
    kc::moe_accumulate_load(S.counts, expert_load_.as<int32_t>() + slot_[static_cast<size_t>(l)] * E_, E_, st);
  const int32_t* aux_counts = S.aux_counts ? S.aux_counts : S.counts;
  // global_aux_loss (training forwards and their recomputations): a training forward's aux tokens
  // per expert, summed over the data-parallel ranks, join the step's running mean.
  const float* global_mean = nullptr;
  if (losses_.global_aux_coeff > 0 && pass != Pass::Evaluation) {
    const size_t slot = static_cast<size_t>(slot_[static_cast<size_t>(l)]);
    if (count_losses) {
      const int32_t* counts = aux_counts;
      if (dp_) {  // summed in a copy: the routing still needs this rank's counts
        LAOYAO_CUDA_CHECK(
            cudaMemcpyAsync(global_counts_, aux_counts, sizeof(int32_t) * E_, cudaMemcpyDeviceToDevice, st));
        dp_->all_reduce_device(global_counts_, static_cast<size_t>(E_), dist::DeviceType::I32, st);
        counts = global_counts_;
      }
      kc::moe_global_counts_accumulate(counts, global_running_ + slot * E_, global_mean_ + slot * E_, E_,
                                       ++global_steps_[slot], st);
    }
    global_mean = global_mean_ + slot * E_;
  }
  if (losses_.aux_coeff > 0 || losses_.seq_aux_coeff > 0 || losses_.z_coeff > 0 || global_mean)
    kc::moe_aux_losses_forward(S.scores, S.lse, S.aux_idx ? S.aux_idx : S.topk_idx, aux_counts, T, router_, losses_,
                               S.stats, count_losses ? train_sums_ : discard_sums_, st, global_mean);
  if (S.share_idx)  // whole experts under TP: this rank's share's pairs only
    kc::moe_share_choices(S.topk_idx, T, losses_.seq_length, k_, E_, shares_.rank, shares_.ranks, S.share_idx,
                          S.share_counts, st);
  phases_.mark(kRouter, st);
  const auto& f = cfg_.moe.capacity_factor;
  if (gather_ && !f) return gathered_forward(S, ctx, x, y, T, residual);
  // Dispatch, the experts (grouped by the device-side offsets), combine with the shared expert.
  // Token dropping ranks every pair of each share (a permutation of them all); dropped pairs keep
  // their rows but weigh nothing. Whole experts under TP then dispatch their share's pairs.
  if (f || !S.share_idx)
    kc::moe_permutation(S.topk_idx, S.counts, T, E_, k_, S.offsets, S.sorted_token, S.permuted_row, perm_scratch_, st);
  if (f) {
    const int64_t share_tokens = T / shares_.ranks;
    kc::moe_capacity_drop(S.topk_idx, S.offsets, S.sorted_token, S.permuted_row, S.probs, T, losses_.seq_length, k_,
                          kernels::cpu::moe_expert_capacity(share_tokens, E_, k_, *f), cfg_.moe.drop_by_position,
                          S.kept, permuted_probs_, st, shares_.ranks);
  }
  if (S.share_idx)
    kc::moe_permutation(S.share_idx, S.share_counts, T, E_, k_, S.offsets, S.sorted_token, S.permuted_row,
                        perm_scratch_, st);
  if (gather_) return gathered_forward(S, ctx, x, y, T, residual);  // the dropped pairs' probs are 0 now
  bf16* permuted_x = ep_ ? permuted_x_ : S.permuted_x;
  // Only a share's pairs: their rows end at offsets[E] (on the device), N bounding them.
  const int32_t* rows_end = S.share_idx ? S.offsets + E_ : nullptr;
  kc::moe_permute_forward(x, S.sorted_token, permuted_x, N, H_, st, rows_end);
  phases_.mark(kPermute, st);
  if (ep_) {  // the rows travel to their experts' ranks and back; this rank's own and the shared expert run meanwhile
    exchange_counts(S, st);
    kc::moe_ep_source_offsets(S.ep_counts, P_, E_, me_, S.local_offsets, st);
    start_dispatch(S, permuted_x_, S.local_x, st);
    copy_own_rows(S, permuted_x_, S.local_x, st);  // and the experts start on them
    experts_forward(S, ctx, S.local_x, source_groups(S, me_, me_ + 1), local_y_);
    phases_.mark(kExperts, st);
  } else {
    experts_forward(S, ctx, permuted_x, expert_groups(S, N), S.expert_out, rows_end);
    phases_.mark(kExperts, st);
  }
  shared_expert_forward(S, ctx, x, T);
  if (ep_) {  // the other ranks' rows
    wait_exchange(st);
    experts_forward(S, ctx, S.local_x, source_groups(S, 0, me_), local_y_);
    experts_forward(S, ctx, S.local_x, source_groups(S, me_ + 1, P_), local_y_);
    phases_.mark(kExperts, st);
    start_combine(S, local_y_, S.expert_out, st);
    copy_own_rows_back(S, local_y_, S.expert_out, st);
    wait_exchange(st);
  }
  kc::moe_unpermute_forward(S.expert_out, S.permuted_row, S.probs, Fs_ > 0 ? shared_out_ : nullptr, y, T, k_, H_, st,
                            residual);
  phases_.mark(kPermute, st);
}

void CudaMoeLayers::backward(int64_t l, const Context& ctx, const bf16* x, const bf16* dy, bf16* dx, int64_t T,
                             float aux_scale) {
  const Saved& S = saved_layers_.at(static_cast<size_t>(slot_.at(static_cast<size_t>(l))));
  cudaStream_t st = ctx.stream;
  const int64_t N = T * k_;
  phases_.begin(st);
  if (gather_) return gathered_backward(S, ctx, x, dy, dx, T, aux_scale);
  // Combine: the experts' output gradients and the probabilities'.
  kc::moe_unpermute_backward(S.expert_out, S.permuted_row, S.probs, dy, dexpert_, dprobs_, T, k_, H_, st);
  if (cfg_.moe.capacity_factor) kc::moe_mask_dropped(dprobs_, S.kept, N, st);
  phases_.mark(kPermute, st);
  // Under expert parallelism the output gradients travel to the experts' ranks while the router's
  // and the shared expert's backward run.
  if (ep_) {
    start_dispatch(S, dexpert_, local_y_, st);
    copy_own_rows(S, dexpert_, local_y_, st);
  }
  router_backward(S, ctx, x, dx, T, aux_scale);
  shared_expert_backward(S, ctx, x, dy, T);
  if (Fs_ > 0) kc::add_inplace(dx, dshared_, T * H_, st);
  // Experts, fc2 then fc1. Under expert parallelism the input gradients go back while the weight
  // gradients are computed.
  const kc::RowGroups groups = expert_groups(S, N);
  if (ep_) {  // this rank's own rows first, while the others' arrive
    experts_backward_input(S, ctx, S.local_x, local_y_, source_groups(S, me_, me_ + 1), local_dx_);
    phases_.mark(kExperts, st);
    wait_exchange(st);
    experts_backward_input(S, ctx, S.local_x, local_y_, source_groups(S, 0, me_), local_dx_);
    experts_backward_input(S, ctx, S.local_x, local_y_, source_groups(S, me_ + 1, P_), local_dx_);
    phases_.mark(kExperts, st);
    start_combine(S, local_dx_, dpermuted_, st);
    copy_own_rows_back(S, local_dx_, dpermuted_, st);
    experts_backward_weights(S, ctx, S.local_x, local_y_, groups);
    phases_.mark(kExperts, st);
    wait_exchange(st);
  } else {
    experts_backward_input(S, ctx, S.permuted_x, dexpert_, groups, dpermuted_, S.share_idx ? S.offsets + E_ : nullptr);
    experts_backward_weights(S, ctx, S.permuted_x, dexpert_, groups);
    phases_.mark(kExperts, st);
  }
  // The routed experts' part: each token's k rows summed into dx.
  kc::moe_permute_backward(dpermuted_, S.permuted_row, dx, T, k_, H_, true, st);
  phases_.mark(kPermute, st);
}

void CudaMoeLayers::update_expert_bias(float* main, const GptParameterLayout& layout, dist::ProcessGroup* dp,
                                       cudaStream_t stream) {
  if (!cfg_.moe.expert_bias) return;
  int32_t* load = expert_load_.as<int32_t>();
  if (dp && dp->size() > 1)
    dp->all_reduce_device(load, expert_load_.bytes / sizeof(int32_t), dist::DeviceType::I32, stream);
  for (int64_t l = 0; l < cfg_.layer_count(); ++l) {
    const int64_t slot = slot_[static_cast<size_t>(l)];
    if (slot < 0) continue;
    kc::moe_update_expert_bias(load + slot * E_, main + layout.layers[static_cast<size_t>(l)].expert_bias, E_,
                               static_cast<float>(cfg_.moe.bias_update_rate), stream);
  }
}

void CudaMoeLayers::set_data_parallel_group(dist::ProcessGroup* dp) {
  dp_ = dp && dp->size() > 1 ? dp : nullptr;
  losses_.data_parallel_size = dp_ ? dp_->size() : 1;
}

void CudaMoeLayers::set_context_parallel_group(dist::ProcessGroup* cp) {
  const int64_t size = cp ? cp->size() : 1;
  if (size != losses_.context_parallel_size)
    throw Error("CudaMoeLayers: a context-parallel group of " + std::to_string(size) + " ranks for layers set for " +
                std::to_string(losses_.context_parallel_size));
  if (size > 1)
    losses_.sum_over_context_parallel = [cp](float* counts, int64_t n, cudaStream_t stream) {
      cp->all_reduce_device(counts, static_cast<size_t>(n), dist::DeviceType::F32, stream);
    };
}

void CudaMoeLayers::reset_global_aux(cudaStream_t stream) {
  if (!global_running_) return;
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(global_running_, 0, sizeof(double) * global_steps_.size() * E_, stream));
  std::fill(global_steps_.begin(), global_steps_.end(), 0);
}

GptModel::MoeLosses CudaMoeLayers::take_losses(cudaStream_t stream) {
  report_phases();
  float host[4];
  LAOYAO_CUDA_CHECK(cudaMemcpyAsync(host, train_sums_, sizeof host, cudaMemcpyDeviceToHost, stream));
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(train_sums_, 0, sizeof host, stream));
  kc::stream_wait(stream, "the step (its MoE losses)");
  GptModel::MoeLosses out;
  if (losses_.aux_coeff > 0) out.aux = host[0] / losses_.aux_coeff;
  if (losses_.seq_aux_coeff > 0) out.seq_aux = host[1] / losses_.seq_aux_coeff;
  // (a context-parallel rank's z-loss: its coefficient divided by the CP size, as the CPU's)
  if (losses_.z_coeff > 0) out.z = host[2] / (losses_.z_coeff / static_cast<double>(losses_.context_parallel_size));
  if (losses_.global_aux_coeff > 0) out.global_aux = host[3] / losses_.global_aux_coeff;
  return out;
}

}  // namespace laoyao::model
