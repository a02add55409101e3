// The CUDA backend of the model's ops (model/cuda/cuda_backend.hpp).
#include "model/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/runtime_options.hpp"
#include "kernels/cuda/attention_flash.hpp"
#include "kernels/cuda/bias_gelu.hpp"
#include "kernels/cuda/cross_entropy.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/mla.hpp"
#include "kernels/cuda/moe.hpp"
#include "kernels/cuda/qk_norm.hpp"
#include "kernels/cuda/swiglu.hpp"
#include "model/cuda/carver.hpp"

namespace laoyao::model {

namespace kc = kernels::cuda;

bool norms_add_in_place(const GptConfig& c, const GptParameterLayout& layout) {
  bool aligned = c.hidden % 8 == 0 && c.hidden <= 4096;
  auto check = [&](int64_t off) { aligned = aligned && (off < 0 || off % 8 == 0); };  // bf16: 8 elements, 16 bytes
  for (const GptLayerOffsets& L : layout.layers) check(L.ln1_w), check(L.ln1_b), check(L.ln2_w), check(L.ln2_b);
  check(layout.final_w), check(layout.final_b);
  return aligned;
}

std::string cuda_unsupported_features(const GptConfig& c) {
  std::vector<std::string> missing;
  if (!c.bf16) missing.push_back("fp32 training (without --bf16: the CUDA backend trains in bf16)");
  if (c.fp32_residual_connection) missing.push_back("an fp32 residual stream (--fp32-residual-connection)");
  if (c.lora && c.moe.expert_bias)  // (its update reads fp32 main weights, which PEFT's frozen base has not)
    missing.push_back("LoRA on a Mixture-of-Experts model with the router's expert bias "
                      "(--moe-router-enable-expert-bias)");
  if (c.mla) {  // its attention is cuDNN's over separate q, k, v (no dropout masks of ours, no documents)
    const MlaSpec& m = *c.mla;
    if (c.attention_dropout > 0)
      missing.push_back("multi-latent attention with attention dropout (its GPU attention is cuDNN's, whose dropout "
                        "masks cannot match the CPU's)");
    if (c.document_attention) missing.push_back("multi-latent attention over documents (--reset-attention-mask)");
    auto head_dim_fits = [](int64_t d) { return d % 8 == 0 && d <= 256; };
    if (!head_dim_fits(m.q_head_dim()) || !head_dim_fits(m.v_head_dim))
      missing.push_back("multi-latent attention with head dims (qk_head_dim + qk_pos_emb_head_dim " +
                        std::to_string(m.q_head_dim()) + ", v_head_dim " + std::to_string(m.v_head_dim) +
                        ") that are not multiples of 8 up to 256");
    if (c.norm == Norm::RMSNorm && m.latent_norms) {  // the RMSNorm kernels' 16-byte rows
      bool fits = m.kv_lora_rank % 8 == 0 && m.kv_lora_rank <= 4096 && m.q_lora_rank % 8 == 0 && m.q_lora_rank <= 4096;
      if (fits && c.num_layers > 0 && c.heads > 0)
        for (const GptLayerOffsets& L : build_gpt_parameters(c).layers)
          fits = fits && (L.q_ln_w < 0 || L.q_ln_w % 8 == 0) && (L.kv_ln_w < 0 || L.kv_ln_w % 8 == 0);
      if (!fits)
        missing.push_back("multi-latent attention with latent ranks (q_lora_rank " + std::to_string(m.q_lora_rank) +
                          ", kv_lora_rank " + std::to_string(m.kv_lora_rank) +
                          ") that are not multiples of 8 up to 4096");
    }
  }
  if (c.context_parallel > 1) {  // (kernels/cuda/attention_cudnn_cp.hpp; the rest trains on CPU ranks)
    const std::string cp = "context parallelism (model.context_parallel_size " + std::to_string(c.context_parallel) +
                           ") with ";
    if (c.mla) missing.push_back(cp + "multi-latent attention");
    // (MoE layers: each rank routes its own tokens, the aux losses' counts summed over the CP ranks;
    // an expert-parallel group is the engine's, over the flattened data- and context-parallel ranks)
    if (c.moe.num_experts > 0 && c.moe.force_load_balancing)
      missing.push_back(cp + "--moe-router-force-load-balancing");
    if (c.mtp_num_layers > 0) missing.push_back(cp + "multi-token prediction");
    if (c.fp8) missing.push_back(cp + "FP8 (model.fp8: checked on CPU ranks only)");
    if (c.document_attention) missing.push_back(cp + "documents or packed sequences");
    if (c.hidden_dropout > 0 || c.attention_dropout > 0)
      missing.push_back(cp + "dropout (model.hidden_dropout, model.attention_dropout)");
  }
  if (c.fp8 && c.fp8->recipe == Fp8ScalingRecipe::Blockwise && c.moe.num_experts > 0)
    missing.push_back("FP8 block scaling (model.fp8_recipe blockwise) with Mixture of Experts (the experts' FP8 "
                      "grouped GEMMs take per-tensor scales)");
  if (c.fp8 && c.moe.num_experts > 0 && c.moe.expert_parallel > 1)
    missing.push_back("FP8 experts under expert parallelism (model.expert_model_parallel_size " +
                      std::to_string(c.moe.expert_parallel) + ": checked on CPU ranks only)");
  if (c.moe.num_experts > kc::kMoeMaxExperts)  // the router holds a token's scores in one warp
    missing.push_back("Mixture of Experts with more than " + std::to_string(kc::kMoeMaxExperts) + " experts");
  // Whole experts under TP: the expert-parallel group, folded across the TP ranks, must be whole TP
  // groups or lie inside one (the norms then sum over the larger of the two groups alone).
  const int64_t ep = c.moe.expert_parallel, tp = c.moe.tensor_parallel;
  if (c.moe.num_experts > 0 && tp > 1 && !c.moe.experts_split_by_tp() && ep > 1 && ep % tp != 0 && tp % ep != 0)
    missing.push_back("Mixture of Experts with whole experts under tensor parallelism (--expert-tensor-parallel-size "
                      "1) and an expert-parallel size (" + std::to_string(ep) + ") that is neither a multiple nor "
                      "a divisor of the tensor-parallel size (" + std::to_string(tp) + ")");
  // The QK-norm kernels hold one head per lane group in 16-byte packs (kernels/cuda/qk_norm.hpp).
  if (c.qk_layernorm && (c.kv_channels % 8 != 0 || c.kv_channels > 256))
    missing.push_back("QK layernorm with a head dim (kv_channels " + std::to_string(c.kv_channels) +
                      ") that is not a multiple of 8 up to 256");
  if (c.norm == Norm::RMSNorm) {
    // The RMSNorm kernels read 16-byte rows: the width and every norm weight's offset must allow it.
    const bool shaped = c.num_layers > 0 && c.heads > 0 && c.query_groups > 0 && c.heads % c.query_groups == 0;
    const bool aligned =
        shaped ? norms_add_in_place(c, build_gpt_parameters(c)) : c.hidden % 8 == 0 && c.hidden <= 4096;
    if (!aligned) missing.push_back("RMSNorm with a hidden size that is not a multiple of 8 up to 4096 (or parameter "
                                    "sizes that leave a norm weight off 16-byte alignment)");
  }
  std::string out;
  for (const auto& m : missing) out += (out.empty() ? "" : ", ") + m;
  return out;
}

CudaBackend::CudaBackend(const GptConfig& local, const CudaBackendState& state, int64_t max_b, int64_t s)
    : lc_(local), st_(state), phases_(runtime_options().model_phases, 2 * kPhaseKinds) {
  if (st_.tp_size > 1 && !st_.tp) throw Error("CudaBackend: tensor parallelism without its group");
  if (local.moe.num_experts > 0 && !(st_.moe && st_.layout && st_.logit_keys))
    throw Error("CudaBackend: an MoE model needs its MoE layers, its layout and the logit keys");
  const GptConfig& c = lc_;
  const int64_t T = max_b * s, h = c.hidden, HD = c.heads * c.kv_channels, L = c.layer_count();
  const int64_t wide = std::max({c.qkv_width(), c.fc1_width(), HD, h});
  // The norms' widths: the hidden size, and multi-latent attention's latents.
  const int64_t norm_width = c.mla ? std::max({h, c.mla->q_lora_rank, c.mla->kv_lora_rank}) : h;
  const kc::AttentionShape shape = attention_shape({max_b, s, T, T, nullptr});
  const bool fused = st_.attention != CudaAttentionPath::Unfused;
  const int64_t heads_elems = fused ? 0 : kc::attention_heads_elems(shape);
  const int64_t probs_elems = fused ? 0 : kc::attention_probs_elems(shape);
  const int64_t lse_elems = max_b * c.heads * s;
  emb_scratch_bytes_ = std::max(kc::embedding_backward_scratch_bytes(T, c.vocab),
                                kc::embedding_backward_scratch_bytes(T, std::max<int64_t>(c.max_positions, 1)));
  const size_t reduce_floats =
      std::max({kc::bias_grad_scratch_floats(T, wide), kc::layernorm_backward_scratch_floats(T, norm_width),
                c.qk_layernorm ? kc::qk_rmsnorm_backward_scratch_floats(T, c.heads, c.query_groups, c.kv_channels)
                               : size_t{0}});
  lse_.assign(static_cast<size_t>(L), nullptr);
  unfused_.assign(static_cast<size_t>(L), kc::UnfusedAttentionBuffers{});
  ctx_.assign(static_cast<size_t>(L), nullptr);
  bf16* zeros = nullptr;
  auto carve = [&](Carver& a) {
    branch_ = a.take<bf16>(c.hidden_dropout > 0 || c.fp8 ? T * h : 0);
    dtmp_ = a.take<bf16>(st_.norms_add_in_place ? 0 : T * h);
    pos_ = a.take<bf16>(c.positions == Positions::LearnedAbsolute ? T * h : 0);
    dg_ = a.take<bf16>(st_.gelu_epilogue ? 0 : T * c.ffn);
    dsplit_ = a.take<bf16>(st_.qkv_rows == kc::QkvRows::Split ? T * c.qkv_width() : 0);
    zeros = a.take<bf16>(c.ffn);
    sp_staging_ = a.take<bf16>(st_.sequence_parallel && st_.tp_size > 1 && max_b > 1 ? T * h : 0);
    ce_gathered_ = a.take<float>(st_.tp_size > 1 ? 2 * T * st_.tp_size : 0);
    reduce_scratch_ = a.take<float>(static_cast<int64_t>(reduce_floats));
    emb_scratch_ = a.take<char>(static_cast<int64_t>(emb_scratch_bytes_));
    delta_ = a.take<float>(st_.attention == CudaAttentionPath::Flash ? lse_elems : 0);
    unfused_scratch_.scores = a.take<float>(probs_elems);
    unfused_scratch_.heads = a.take<bf16>(heads_elems);
    unfused_scratch_.dq = a.take<bf16>(heads_elems);
    unfused_scratch_.dk = a.take<bf16>(heads_elems);
    unfused_scratch_.dv = a.take<bf16>(heads_elems);
    const bool attn_drop = c.attention_dropout > 0 && !fused;
    for (int64_t l = 0; l < L; ++l) {
      lse_[l] = a.take<float>(fused ? lse_elems : 0);
      kc::UnfusedAttentionBuffers& u = unfused_[l];
      u.q = a.take<bf16>(heads_elems);
      u.k = a.take<bf16>(heads_elems);
      u.v = a.take<bf16>(heads_elems);
      u.probs = a.take<bf16>(probs_elems);
      u.probs_dropped = attn_drop ? a.take<bf16>(probs_elems) : nullptr;
    }
  };
  Carver measure;
  carve(measure);
  scratch_ = kc::DeviceBuffer(measure.used);
  Carver real{static_cast<char*>(scratch_.ptr), 0};
  carve(real);
  zero_bias_ = zeros;
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(zeros, 0, sizeof(bf16) * static_cast<size_t>(c.ffn), st_.stream));
  if (c.fp8) {
    if (!st_.layout) throw Error("CudaBackend: FP8 linear layers need the parameter layout");
    if (st_.gelu_epilogue) throw Error("CudaBackend: FP8 GEMMs take no GeLU epilogue (the model turns it off)");
    // (the experts' rows: every token's top-k, one rank's experts: FP8 is refused under EP)
    fp8_ = std::make_unique<CudaFp8Linears>(c, *st_.layout, T, c.moe.num_experts > 0 ? T * c.moe.topk : 0, st_.stream,
                                            st_.gemm);
  }
}

size_t CudaBackend::device_bytes() const {
  return arena_.bytes + scratch_.bytes + (fp8_ ? fp8_->device_bytes() : 0);
}

void* CudaBackend::reserve_activations(size_t bytes) {
  if (bytes > arena_.bytes) arena_ = kc::DeviceBuffer(bytes);
  return arena_.ptr;
}

bool CudaBackend::accumulates(int64_t w) const {
  const std::vector<int64_t>& written = st_.writers->gemm_written;
  return !writing_grads_ || !std::binary_search(written.begin(), written.end(), w);
}

kc::AttentionShape CudaBackend::attention_shape(const BatchShape& batch) const {
  const int64_t D = lc_.kv_channels;
  return {batch.b, batch.s, lc_.heads, lc_.query_groups, D, 1.0f / std::sqrt(static_cast<float>(D)), batch.key_start};
}

CudaBackend::bf16* CudaBackend::attention_grad(Act dqkv) const {
  return st_.qkv_rows == kc::QkvRows::Split ? dsplit_ : B(dqkv);
}

kc::CudnnCpAttention& CudaBackend::cp_attention(const BatchShape& batch) const {
  if (!st_.cudnn_cp || batch.cp_places || batch.key_start)
    throw Error("CudaBackend: a context-parallel micro-batch (" + std::to_string(batch.cp_size) + " ranks" +
                (batch.key_start ? ", with documents" : "") + ") for a model built without its attention");
  return *st_.cudnn_cp;
}

// ---- where the time goes (LAOYAO_MODEL_PHASES)

void CudaBackend::begin_phases(bool backward) {
  backward_ = backward;
  phases_.begin(st_.stream);
}

void CudaBackend::phase(Phase p) { phases_.mark(p + (backward_ ? kPhaseKinds : 0), st_.stream); }

CudaBackend::Phase CudaBackend::gemm_phase(int64_t w) const {
  if (!phases_.enabled() || !st_.layout) return kHead;  // (unused)
  for (const GptLayerOffsets& L : st_.layout->layers) {
    if (w == L.qkv_w || w == L.proj_w) return kAttentionGemms;
    if (w == L.fc1_w || w == L.fc2_w) return kMlpGemms;
  }
  return kHead;  // the output layer
}

void CudaBackend::report_phases() {
  const std::vector<double> ms = phases_.take();
  if (!phases_.enabled()) return;
  static const char* names[kPhaseKinds] = {
      "embedding",   "norms",      "attention GEMMs",   "QK norm+RoPE",     "attention",          "MLP GEMMs",
      "activations", "MoE layers", "output layer+loss", "residual/dropout", "TP/SP communication",
      "LoRA adapters"};
  std::string line = "laoyao: model phases (ms, forward / backward):";
  double fwd = 0, bwd = 0;
  for (int p = 0; p < kPhaseKinds; ++p) {
    const double f = ms[static_cast<size_t>(p)], b = ms[static_cast<size_t>(p + kPhaseKinds)];
    fwd += f, bwd += b;
    if (f == 0 && b == 0) continue;
    char part[96];
    std::snprintf(part, sizeof part, " %s %.2f / %.2f |", names[p], f, b);
    line += part;
  }
  char total[64];
  std::snprintf(total, sizeof total, " total %.2f / %.2f", fwd, bwd);
  std::fprintf(stderr, "%s%s\n", line.c_str(), total);
}

// ---- embeddings

void CudaBackend::embedding(const int64_t* ids, int64_t table, Act out, int64_t T, int64_t h, tp::Shard vocab,
                            bool accumulate) {
  if (!accumulate) {  // (vocabulary-parallel: this rank's rows, zeros for the others' ids)
    kc::embedding_forward(ids, P(table), nullptr, nullptr, B(out), T, h, vocab.size, 0, st_.stream,
                          st_.tp_size > 1 ? vocab.start : -1);
  } else {  // the learned positions onto the words: bf16(word + position) either way, both being bf16
    kc::embedding_forward(ids, P(table), nullptr, nullptr, pos_, T, h, vocab.size, 0, st_.stream);
    kc::add_inplace(B(out), pos_, T * h, st_.stream);
  }
  phase(kEmbedding);
}

void CudaBackend::embedding_backward(const int64_t* ids, Act dout, int64_t table, int64_t T, int64_t h,
                                     tp::Shard vocab) {
  if (!G(table)) return;  // frozen
  kc::embedding_backward(ids, B(dout), G(table), T, h, vocab.size, emb_scratch_, emb_scratch_bytes_, st_.stream,
                         vocab.start);
  phase(kEmbedding);
}

// ---- linear layers

void CudaBackend::linear(Act x, int64_t w, int64_t b, Act y, int64_t rows, int64_t K, int64_t N) {
  if (fp8_ && fp8_->runs(w))
    fp8_->forward(w, B(x), P(b), B(y), rows);
  else
    st_.gemm->linear_forward(B(x), P(w), P(b), B(y), rows, K, N, st_.stream);
  phase(gemm_phase(w));
}

void CudaBackend::linear_backward(Act x, int64_t w, int64_t b, Act dy, Act dx, int64_t rows, int64_t K, int64_t N) {
  if (fp8_ && fp8_->runs(w)) {
    fp8_->backward(w, B(x), B(dy), B(dx), G(w), accumulates(w), rows);
  } else {
    if (dx.p) st_.gemm->linear_backward_input(B(dy), P(w), B(dx), rows, K, N, st_.stream);
    if (G(w)) st_.gemm->linear_backward_weight(B(dy), B(x), G(w), rows, K, N, st_.stream, accumulates(w));
  }
  if (G(b)) kc::bias_grad(B(dy), G(b), reduce_scratch_, rows, N, st_.stream);
  phase(gemm_phase(w));
}

void CudaBackend::linear_bias_dropout_add(Act x, int64_t w, int64_t b, Act residual, Act out, int64_t rows, int64_t K,
                                          int64_t N, const DropoutSpec& drop) {
  const bool fp8 = fp8_ && fp8_->runs(w);
  if (!(drop.p > 0)) {  // the residual as the GEMM's C
    if (fp8)
      fp8_->forward(w, B(x), P(b), B(out), rows, B(residual));
    else
      st_.gemm->linear_forward(B(x), P(w), P(b), B(out), rows, K, N, st_.stream, B(residual));
    return phase(gemm_phase(w));
  }
  if (fp8)
    fp8_->forward(w, B(x), P(b), branch_, rows);
  else
    st_.gemm->linear_forward(B(x), P(w), P(b), branch_, rows, K, N, st_.stream);
  phase(gemm_phase(w));
  kc::residual_dropout_add(branch_, B(residual), B(out), rows * N, drop, st_.stream);
  phase(kResidual);
}

void CudaBackend::bias_dropout_add(Act x, int64_t b, Act residual, Act out, int64_t rows, int64_t N,
                                   const DropoutSpec& drop) {
  kc::residual_dropout_add(B(x), B(residual), B(out), rows * N, drop, st_.stream, P(b), N);
  phase(kResidual);
}

void CudaBackend::dropout(Act x, Act y, int64_t n, const DropoutSpec& drop) {
  kc::dropout_apply(B(x), B(y), n, drop, st_.stream);  // (p = 0: a copy, or nothing in place)
  phase(kResidual);
}

// ---- norms

void CudaBackend::norm(Act x, int64_t w, int64_t b, Act y, float* mean, float* rstd, int64_t rows, int64_t width) {
  const GptConfig& c = lc_;
  if (c.norm == Norm::RMSNorm)
    kc::rmsnorm_forward(B(x), P(w), B(y), rstd, rows, width, c.norm_eps, c.zero_centered_gamma, st_.stream);
  else
    kc::layernorm_forward(B(x), P(w), P(b), B(y), mean, rstd, rows, width, c.norm_eps, c.zero_centered_gamma,
                          st_.stream);
  phase(kNorms);
}

void CudaBackend::norm_backward(Act dy, Act x, int64_t w, int64_t b, const float* mean, const float* rstd, Act dx,
                                int64_t rows, int64_t width, bool accumulate, int64_t dx_bias) {
  const GptConfig& c = lc_;
  const int64_t h = width;
  if (accumulate && width != c.hidden) throw Error("CudaBackend: an accumulating norm backward of width " +
                                                   std::to_string(width) + " (its scratch holds the hidden size's)");
  if (dx_bias >= 0 && !st_.bias_grad_in_norm) throw Error("CudaBackend: asked to sum a bias gradient in a norm");
  // The kernels add into dx (and sum the bias from what they write) where they can
  // (norms_add_in_place); else the gradient goes to scratch, is added, and the bias read after.
  const bool in_place = !accumulate || st_.norms_add_in_place;
  bf16* out = in_place ? B(dx) : dtmp_;
  const bool add = accumulate && in_place;
  float* colsum = in_place ? G(dx_bias) : nullptr;
  if (c.norm == Norm::RMSNorm)
    kc::rmsnorm_backward(B(dy), B(x), P(w), rstd, out, G(w), reduce_scratch_, rows, h, c.zero_centered_gamma,
                         st_.stream, add, colsum);
  else
    kc::layernorm_backward(B(dy), B(x), P(w), mean, rstd, out, G(w), G(b), reduce_scratch_, rows, h,
                           c.zero_centered_gamma, st_.stream, add, colsum);
  if (!in_place) {
    kc::add_inplace(B(dx), dtmp_, rows * h, st_.stream);
    if (G(dx_bias)) kc::bias_grad(B(dx), G(dx_bias), reduce_scratch_, rows, h, st_.stream);
  }
  phase(kNorms);
}

void CudaBackend::copy_columns(Act src, int64_t src_ld, Act dst, int64_t dst_ld, int64_t rows, int64_t cols) {
  const size_t e = sizeof(bf16);
  LAOYAO_CUDA_CHECK(cudaMemcpy2DAsync(dst.p, static_cast<size_t>(dst_ld) * e, src.p, static_cast<size_t>(src_ld) * e,
                                      static_cast<size_t>(cols) * e, static_cast<size_t>(rows),
                                      cudaMemcpyDeviceToDevice, st_.stream));
}

// ---- multi-latent attention: its query, key and value (kernels/cuda/mla.hpp), then cuDNN's fused
// attention over the separate rows (the model built st_.cudnn for them: QkvRows::Separate).

kc::MlaDims CudaBackend::mla_dims(const BatchShape& batch) const {
  if (!lc_.mla) throw Error("CudaBackend: a multi-latent attention op in a model without MLA");
  const MlaSpec& m = *lc_.mla;
  return {batch.b, batch.s, lc_.heads, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim};
}

void CudaBackend::mla_prepare(Act q, Act kv, Act k_pe, int64_t k_pe_ld, Act query, Act key, Act value,
                              const BatchShape& batch) {
  kc::mla_prepare_forward(B(q), B(kv), B(k_pe), k_pe_ld, st_.rope, B(query), B(key), B(value), mla_dims(batch),
                          st_.stream);
  phase(kQkNormRope);
}

void CudaBackend::mla_prepare_backward(Act dquery, Act dkey, Act dvalue, Act dq, Act dkv, Act dk_pe, int64_t dk_pe_ld,
                                       const BatchShape& batch) {
  kc::mla_prepare_backward(B(dquery), B(dkey), B(dvalue), st_.rope, B(dq), B(dkv), B(dk_pe), dk_pe_ld,
                           mla_dims(batch), st_.stream);
  phase(kQkNormRope);
}

void CudaBackend::check_separate_attention(int64_t dqk, int64_t dv, float scale, const DropoutSpec& drop) const {
  if (st_.attention != CudaAttentionPath::Cudnn || !st_.cudnn)
    throw Error("CudaBackend: attention on separate query, key and value runs through cuDNN only");
  const kc::AttentionShape& a = st_.cudnn->shape();
  if (a.D != dqk || a.dv() != dv || a.scale != scale)
    throw Error("CudaBackend: separate attention with head dims " + std::to_string(dqk) + "/" + std::to_string(dv) +
                " and scale " + std::to_string(scale) + ", but cuDNN's plans were built for " + std::to_string(a.D) +
                "/" + std::to_string(a.dv()) + " and " + std::to_string(a.scale));
  if (drop.p > 0) throw Error("CudaBackend: cuDNN's attention takes no attention dropout");
}

void CudaBackend::separate_core_attention(int64_t layer, Act q, Act k, Act v, Act ctx, int64_t dqk, int64_t dv,
                                          float scale, const BatchShape& batch, const DropoutSpec& drop) {
  check_separate_attention(dqk, dv, scale, drop);
  const size_t l = static_cast<size_t>(layer);
  ctx_[l] = B(ctx);
  st_.cudnn->forward(B(q), B(k), B(v), B(ctx), lse_[l], batch.b);
  phase(kAttention);
}

void CudaBackend::separate_core_attention_backward(int64_t layer, Act q, Act k, Act v, Act dctx, Act dquery, Act dkey,
                                                   Act dvalue, int64_t dqk, int64_t dv, float scale,
                                                   const BatchShape& batch, const DropoutSpec& drop) {
  check_separate_attention(dqk, dv, scale, drop);
  const size_t l = static_cast<size_t>(layer);
  st_.cudnn->backward(B(q), B(k), B(v), ctx_[l], B(dctx), lse_[l], B(dquery), B(dkey), B(dvalue), batch.b);
  phase(kAttention);
}

// ---- the MLP

void CudaBackend::mlp_fc1(Act x, int64_t fc1_w, int64_t fc1_b, Act u, Act g, int64_t rows, int64_t ffn) {
  const GptConfig& c = lc_;
  if (st_.gelu_epilogue) {  // u = fc1's output with its bias, g = gelu(u), in one GEMM
    st_.gemm->linear_forward_gelu(B(x), P(fc1_w), P(fc1_b), B(g), B(u), rows, c.hidden, ffn, st_.stream);
    return phase(kMlpGemms);
  }
  if (fp8_ && fp8_->runs(fc1_w))
    fp8_->forward(fc1_w, B(x), P(fc1_b), B(u), rows);
  else
    st_.gemm->linear_forward(B(x), P(fc1_w), P(fc1_b), B(u), rows, c.hidden, c.fc1_rows(ffn), st_.stream);
  phase(kMlpGemms);
  mlp_activation(u, g, rows, ffn);
}

void CudaBackend::mlp_activation(Act u, Act g, int64_t rows, int64_t ffn) {
  const GptConfig& c = lc_;
  if (c.activation == Activation::SwiGLU)
    kc::swiglu_forward(B(u), B(g), rows, ffn, st_.stream);
  else  // u holds the bias already, so the (bias-)GeLU kernel gets zeros for its own
    kc::bias_gelu_forward(B(u), zero_bias_, B(g), rows, ffn, st_.stream, c.activation == Activation::GeluErf);
  phase(kActivations);
}

void CudaBackend::mlp_activation_backward(Act dg, Act u, Act du, int64_t rows, int64_t ffn) {
  const GptConfig& c = lc_;
  if (c.activation == Activation::SwiGLU)
    kc::swiglu_backward(B(u), B(dg), B(du), rows, ffn, st_.stream);
  else
    kc::bias_gelu_backward(B(dg), B(u), zero_bias_, B(du), rows, ffn, st_.stream, c.activation == Activation::GeluErf);
  phase(kActivations);
}

// Row-major products through matmul_rm (C[M, N] = alpha * op(X) op(Y) + beta * C): a LoRA adapter's
// GEMMs are thin (r columns), so they take cuBLASLt's general path.
void CudaBackend::lora_forward(Act x, int64_t lora_a, int64_t lora_b, float scale, Act a, Act y, int64_t rows,
                               int64_t K, int64_t r, int64_t N) {
  st_.gemm->matmul_rm(B(x), false, P(lora_a), true, B(a), false, rows, r, K, scale, 0.0f, 1, st_.stream);
  st_.gemm->matmul_rm(B(a), false, P(lora_b), true, B(y), false, rows, N, r, 1.0f, 1.0f, 1, st_.stream);
  phase(kLora);
}

void CudaBackend::lora_backward(Act x, int64_t lora_a, int64_t lora_b, float scale, Act a, Act dy, Act da, Act dx,
                                int64_t rows, int64_t K, int64_t r, int64_t N, bool accumulate) {
  // a = scale * x A^T: dB += dy^T a; da = scale * dy B; dA += da^T x; dx (+)= da A (after dA: dx may be x).
  st_.gemm->matmul_rm(B(dy), true, B(a), false, G(lora_b), true, N, r, rows, 1.0f, 1.0f, 1, st_.stream);
  st_.gemm->matmul_rm(B(dy), false, P(lora_b), false, B(da), false, rows, r, N, scale, 0.0f, 1, st_.stream);
  st_.gemm->matmul_rm(B(da), true, B(x), false, G(lora_a), true, r, K, rows, 1.0f, 1.0f, 1, st_.stream);
  st_.gemm->matmul_rm(B(da), false, P(lora_a), false, B(dx), false, rows, K, r, 1.0f, accumulate ? 1.0f : 0.0f, 1,
                      st_.stream);
  phase(kLora);
}

void CudaBackend::mlp_fc2_backward(Act dy, Act g, Act u, int64_t fc2_w, int64_t fc2_b, Act du, int64_t rows,
                                   int64_t ffn) {
  const GptConfig& c = lc_;
  const int64_t h = c.hidden;
  const bool fp8 = fp8_ && fp8_->runs(fc2_w);
  if (fp8) {  // both gradients' GEMMs (FP8 models take no GeLU epilogue)
    fp8_->backward(fc2_w, B(g), B(dy), dg_, G(fc2_w), accumulates(fc2_w), rows);
    phase(kMlpGemms);
    mlp_activation_backward(Act{dg_}, u, du, rows, ffn);
  } else if (st_.gelu_epilogue) {  // d(fc1 output) = (dy @ fc2_w) * gelu'(u) in one GEMM
    st_.gemm->linear_backward_input_dgelu(B(dy), P(fc2_w), B(u), B(du), rows, ffn, h, st_.stream);
  } else {
    st_.gemm->linear_backward_input(B(dy), P(fc2_w), dg_, rows, ffn, h, st_.stream);
    phase(kMlpGemms);
    mlp_activation_backward(Act{dg_}, u, du, rows, ffn);
  }
  if (G(fc2_w) && !fp8)
    st_.gemm->linear_backward_weight(B(dy), B(g), G(fc2_w), rows, ffn, h, st_.stream, accumulates(fc2_w));
  if (G(fc2_b)) kc::bias_grad(B(dy), G(fc2_b), reduce_scratch_, rows, h, st_.stream);
  phase(kMlpGemms);
}

// ---- attention

void CudaBackend::qkv_prepare(Act qkv, int64_t q_norm, int64_t k_norm, Act qkv_attn, float* qk_rstd,
                              const BatchShape& batch) {
  const GptConfig& c = lc_;
  // QK layernorm (Qwen3) into qkv_attn, RoPE in the same pass where the pack kernels serve the
  // table, written in the layout cuDNN reads (split rows for GQA).
  if (c.qk_layernorm)
    kc::qk_rmsnorm_forward(B(qkv), P(q_norm), P(k_norm), B(qkv_attn), qk_rstd, batch.T, c.heads, c.query_groups,
                           c.kv_channels, c.norm_eps, c.zero_centered_gamma, st_.stream,
                           st_.rope_in_qk_norm ? &st_.rope : nullptr, batch.s, st_.qkv_rows);
  if (st_.rope.rot_dim > 0 && !st_.rope_in_qk_norm)
    kc::rope_forward_qkv(B(qkv_attn), st_.rope, batch.b, batch.s, c.heads, c.query_groups, c.kv_channels, st_.stream);
  phase(kQkNormRope);
}

void CudaBackend::qkv_prepare_backward(Act dqkv, Act qkv, int64_t q_norm, int64_t k_norm, const float* qk_rstd,
                                       const BatchShape& batch) {
  const GptConfig& c = lc_;
  if (st_.rope.rot_dim > 0 && !st_.rope_in_qk_norm)  // (split rows only come with RoPE in the norm's pass)
    kc::rope_backward_qkv(B(dqkv), st_.rope, batch.b, batch.s, c.heads, c.query_groups, c.kv_channels, st_.stream);
  if (c.qk_layernorm)
    kc::qk_rmsnorm_backward(attention_grad(dqkv), B(qkv), P(q_norm), P(k_norm), qk_rstd, B(dqkv), G(q_norm),
                            G(k_norm), reduce_scratch_, batch.T, c.heads, c.query_groups, c.kv_channels,
                            c.zero_centered_gamma, st_.stream, st_.rope_in_qk_norm ? &st_.rope : nullptr, batch.s,
                            st_.qkv_rows);
  phase(kQkNormRope);
}

namespace {
// The micro-batch's documents as cuDNN's attention takes them (count 0: none).
kc::CudnnDocuments documents_of(const BatchShape& batch) {
  return {batch.documents, batch.doc_start, batch.doc_length};
}
}  // namespace

void CudaBackend::core_attention(int64_t layer, Act qkv_attn, Act ctx, const BatchShape& batch,
                                 const DropoutSpec& drop) {
  const size_t l = static_cast<size_t>(layer);
  const kc::CudnnDocuments docs = documents_of(batch);
  ctx_[l] = B(ctx);
  if (batch.cp_size > 1) {
    cp_attention(batch).forward(B(qkv_attn), B(ctx), lse_[l], batch.b);
    return phase(kAttention);
  }
  switch (st_.attention) {
    case CudaAttentionPath::Cudnn:
      st_.cudnn->forward(B(qkv_attn), B(ctx), lse_[l], batch.b, docs.count ? &docs : nullptr);
      break;
    case CudaAttentionPath::Flash:
      kc::attention_flash_forward(B(qkv_attn), B(ctx), lse_[l], attention_shape(batch), drop, st_.stream);
      break;
    case CudaAttentionPath::Unfused:
      kc::attention_unfused_forward(*st_.gemm, B(qkv_attn), B(ctx), unfused_[l], unfused_scratch_,
                                    attention_shape(batch), drop, st_.stream);
      break;
  }
  phase(kAttention);
}

void CudaBackend::core_attention_backward(int64_t layer, Act qkv_attn, Act dctx, Act dqkv, const BatchShape& batch,
                                          const DropoutSpec& drop) {
  const size_t l = static_cast<size_t>(layer);
  const kc::CudnnDocuments docs = documents_of(batch);
  if (batch.cp_size > 1) {
    cp_attention(batch).backward(B(qkv_attn), ctx_[l], B(dctx), lse_[l], attention_grad(dqkv), batch.b);
    return phase(kAttention);
  }
  switch (st_.attention) {
    case CudaAttentionPath::Cudnn:
      st_.cudnn->backward(B(qkv_attn), ctx_[l], B(dctx), lse_[l], attention_grad(dqkv), batch.b,
                          docs.count ? &docs : nullptr);
      break;
    case CudaAttentionPath::Flash:
      kc::attention_flash_backward(B(qkv_attn), ctx_[l], B(dctx), lse_[l], delta_, B(dqkv), attention_shape(batch),
                                   drop, st_.stream);
      break;
    case CudaAttentionPath::Unfused:
      kc::attention_unfused_backward(*st_.gemm, B(dctx), B(dqkv), unfused_[l], unfused_scratch_,
                                     attention_shape(batch), drop, st_.stream);
      break;
  }
  phase(kAttention);
}

// ---- Mixture of Experts (model/cuda/moe_layers_cuda.hpp)

CudaMoeLayers::Context CudaBackend::moe_context(int64_t layer) const {
  // The router, the routed experts and the shared expert are all GEMM-written (gradient_writers).
  return {st_.layout->layers[static_cast<size_t>(layer)], st_.params, st_.grads, *st_.gemm, st_.stream, st_.main,
          !writing_grads_, st_.trainable_offset, fp8_.get()};
}

void CudaBackend::moe_layer(int64_t layer, Act x, Act y, const BatchShape& batch, MoePass pass, uint64_t,
                            Act residual) {
  using Pass = CudaMoeLayers::Pass;
  const Pass p = pass == MoePass::Training ? Pass::Training : pass == MoePass::Recompute ? Pass::Recompute
                                                                                          : Pass::Evaluation;
  // The random logits' stream is read on the device (st_.logit_keys), the same value as the host's.
  st_.moe->forward(layer, moe_context(layer), B(x), B(y), batch.T, p, st_.logit_keys + layer,
                   residual.p ? B(residual) : nullptr);
  phase(kMoe);
}

void CudaBackend::moe_layer_backward(int64_t layer, Act x, Act dy, Act dx, const BatchShape& batch,
                                     float aux_loss_scale) {
  st_.moe->backward(layer, moe_context(layer), B(x), B(dy), B(dx), batch.T, aux_loss_scale);
  phase(kMoe);
}

// ---- tensor and sequence parallelism

void CudaBackend::tp_all_reduce(Act x, int64_t n) {
  st_.tp->all_reduce_device(x.p, static_cast<size_t>(n), dist::DeviceType::BF16, st_.stream);
  phase(kCommunication);
}

// A rank's rows are b runs of s / tp (tokens are batch-major), while the collectives put the
// ranks' blocks one after another: with b > 1 the rows pass through sp_staging_ by strided copies.
void CudaBackend::sp_gather(Act local, Act full, const BatchShape& batch, int64_t h) {
  const int64_t b = batch.b, s = batch.s, tp = st_.tp_size, run = s / tp * h, n = b * run;
  if (b == 1) {
    st_.tp->all_gather_device(local.p, full.p, static_cast<size_t>(n), dist::DeviceType::BF16, st_.stream);
  } else {
    st_.tp->all_gather_device(local.p, sp_staging_, static_cast<size_t>(n), dist::DeviceType::BF16, st_.stream);
    for (int64_t r = 0; r < tp; ++r)
      LAOYAO_CUDA_CHECK(cudaMemcpy2DAsync(B(full) + r * run, sizeof(bf16) * s * h, sp_staging_ + r * n,
                                          sizeof(bf16) * run, sizeof(bf16) * run, b, cudaMemcpyDeviceToDevice,
                                          st_.stream));
  }
  phase(kCommunication);
}

void CudaBackend::sp_reduce_scatter(Act full, Act local, const BatchShape& batch, int64_t h) {
  const int64_t b = batch.b, s = batch.s, tp = st_.tp_size, run = s / tp * h, n = b * run;
  const void* send = full.p;
  if (b > 1) {
    for (int64_t r = 0; r < tp; ++r)
      LAOYAO_CUDA_CHECK(cudaMemcpy2DAsync(sp_staging_ + r * n, sizeof(bf16) * run, B(full) + r * run,
                                          sizeof(bf16) * s * h, sizeof(bf16) * run, b, cudaMemcpyDeviceToDevice,
                                          st_.stream));
    send = sp_staging_;
  }
  st_.tp->reduce_scatter_device(send, local.p, static_cast<size_t>(n), dist::DeviceType::BF16, st_.stream);
  phase(kCommunication);
}

void CudaBackend::sp_slice(Act full, Act local, const BatchShape& batch, int64_t h) {
  const int64_t s = batch.s, run = s / st_.tp_size * h;
  LAOYAO_CUDA_CHECK(cudaMemcpy2DAsync(local.p, sizeof(bf16) * run, B(full) + st_.tp_rank * run, sizeof(bf16) * s * h,
                                      sizeof(bf16) * run, batch.b, cudaMemcpyDeviceToDevice, st_.stream));
  phase(kCommunication);
}

// ---- the loss

void CudaBackend::cross_entropy(Act logits, const int64_t* labels, float* losses, float* stats, int64_t T,
                                tp::Shard vocab, const float* dloss) {
  if (st_.tp_size > 1) {
    // Vocabulary-parallel: every rank gets every token's loss from the shards' log-sum-exp and
    // target logit; the log-sum-exp (what the backward needs) then replaces this rank's in stats.
    const int tp = static_cast<int>(st_.tp_size);
    kc::cross_entropy_shard_stats(B(logits), labels, stats, T, vocab.size, vocab.start, st_.stream);
    st_.tp->all_gather_device(stats, ce_gathered_, static_cast<size_t>(2 * T), dist::DeviceType::F32, st_.stream);
    kc::cross_entropy_combine_shards(ce_gathered_, labels, losses, stats, T, vocab.size * tp, tp, st_.stream);
    if (dloss) kc::cross_entropy_backward(B(logits), labels, stats, dloss, T, vocab.size, st_.stream, vocab.start);
  } else if (dloss) {  // the training form: the gradient over the logits in the same kernel
    kc::cross_entropy_forward_backward(B(logits), labels, dloss, losses, stats, T, vocab.size, st_.stream);
  } else {
    kc::cross_entropy_forward(B(logits), labels, losses, stats, T, vocab.size, st_.stream);
  }
  phase(kHead);
}

void CudaBackend::cross_entropy_backward(Act logits, const int64_t* labels, const float* stats, const float* dloss,
                                         int64_t T, tp::Shard vocab) {
  kc::cross_entropy_backward(B(logits), labels, stats, dloss, T, vocab.size, st_.stream, vocab.start);
  phase(kHead);
}

// ---- FP8 linear layers (model/cuda/fp8_linears_cuda.hpp)

void CudaBackend::fp8_layer(int64_t layer, Fp8Pass pass) {
  if (fp8_) fp8_->set_layer(lc_.fp8->layer_in_fp8(layer, lc_.num_layers), pass);
}

void CudaBackend::fp8_pass_done(Fp8Pass pass) {
  if (fp8_) fp8_->pass_done(pass);
}

void CudaBackend::fp8_new_weights() {
  if (fp8_) fp8_->new_weights(st_.params);
}

}  // namespace laoyao::model
