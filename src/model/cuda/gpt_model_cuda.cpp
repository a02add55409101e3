#include "model/cuda/gpt_model_cuda.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/runtime_options.hpp"
#include "core/rng.hpp"
#include "kernels/cuda/attention_flash.hpp"
#include "kernels/cuda/bias_gelu.hpp"
#include "kernels/cuda/cross_entropy.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/moe.hpp"
#include "kernels/cuda/optimizer.hpp"
#include "kernels/cuda/qk_norm.hpp"
#include "kernels/cuda/rope.hpp"
#include "kernels/cuda/stream_wait.hpp"
#include "kernels/cuda/swiglu.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/cuda/carver.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_tp.hpp"

namespace laoyao::model {

namespace kc = laoyao::kernels::cuda;

std::string cuda_unsupported_features(const GptConfig& c) {
  std::vector<std::string> missing;
  if (!c.bf16) missing.push_back("fp32 training (without --bf16: the CUDA backend trains in bf16)");
  if (c.fp32_residual_connection) missing.push_back("an fp32 residual stream (--fp32-residual-connection)");
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
    bool aligned = c.hidden % 8 == 0 && c.hidden <= 4096;
    if (aligned && c.num_layers > 0 && c.heads > 0 && c.query_groups > 0 && c.heads % c.query_groups == 0) {
      const GptParameterLayout layout = build_gpt_parameters(c);
      aligned = layout.final_w % 8 == 0;
      for (const auto& L : layout.layers) aligned = aligned && L.ln1_w % 8 == 0 && L.ln2_w % 8 == 0;
    }
    if (!aligned) missing.push_back("RMSNorm with a hidden size that is not a multiple of 8 up to 4096 (or parameter "
                                    "sizes that leave a norm weight off 16-byte alignment)");
  }
  std::string out;
  for (const auto& m : missing) out += (out.empty() ? "" : ", ") + m;
  return out;
}

namespace {

int64_t group_size(const dist::ProcessGroup* g) { return g && g->size() > 1 ? g->size() : 1; }

// The parameters whose names start with `prefix`, as contiguous ranges of the table appended to
// `out` (neighbours merged, never into a range already there: that is another group's); without
// the routed experts when `skip_experts` (expert parallelism reduces them over another group).
void append_ranges(const ParameterTable& table, const std::string& prefix, bool skip_experts,
                   std::vector<CudaGptModel::Range>& out) {
  const size_t begin = out.size();
  for (const auto& p : table.specs) {
    if (p.name.rfind(prefix, 0) != 0 || (skip_experts && is_routed_expert(p.name))) continue;
    if (out.size() > begin && out.back().offset + out.back().count == p.offset)
      out.back().count += p.numel;
    else
      out.push_back({p.offset, p.numel});
  }
}

}  // namespace

CudaGptModel::CudaGptModel(const GptConfig& cfg, int64_t max_b, int64_t s, dist::ProcessGroup* tp,
                           dist::ProcessGroup* ep, dist::ProcessGroup* same_experts)
    : cfg_(cfg),
      lc_(tp_local_config(cfg, group_size(tp))),
      tp_(tp),
      tp_size_(group_size(tp)),
      tp_rank_(group_size(tp) > 1 ? tp->rank() : 0),
      ep_(group_size(ep) > 1 ? ep : nullptr),
      sp_(group_size(tp) > 1 && cfg.sequence_parallel),
      folded_(cfg.moe.num_experts > 0 && group_size(tp) > 1 && !cfg.moe.experts_split_by_tp()),
      layout_(build_gpt_parameters(lc_)),
      max_b_(max_b),
      s_(s) {
  {
    GptConfig checked = lc_;  // split over the group given, whatever the config says
    checked.moe.tensor_parallel = std::max(checked.moe.tensor_parallel, tp_size_);
    const std::string missing = cuda_unsupported_features(checked);
    if (!missing.empty()) throw UsageError("the CUDA backend cannot train this model yet: " + missing +
                                           " (the CPU backend can: set LAOYAO_DEVICE=cpu)");
  }
  if (max_b <= 0 || s <= 0) throw Error("CudaGptModel: empty micro-batch shape");
  if (sp_ && s % tp_size_ != 0)
    throw UsageError("sequence parallelism splits each sequence over the tensor-parallel ranks: the sequence "
                     "length (" + std::to_string(s) + ") must be divisible by the tensor-parallel size (" +
                     std::to_string(tp_size_) + ")");
  if (cfg.positions != Positions::None && s > cfg.max_positions)
    throw Error("CudaGptModel: sequence length " + std::to_string(s) + " exceeds the " +
                std::to_string(cfg.max_positions) + " positions of the position table");
  LAOYAO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (cfg.positions == Positions::Rope) {  // the CPU's table (Llama 3 scaling and all), uploaded once
    kernels::cpu::RopeParams rp;
    rp.rotary_base = cfg.rotary_base;
    rp.rotary_percent = cfg.rotary_percent;
    rp.rope_scaling = cfg.rope_scaling;
    rp.rope_scaling_factor = cfg.rope_scaling_factor;
    rp.seq_len_interpolation_factor = cfg.seq_len_interpolation_factor;
    const kernels::cpu::RopeTable table = kernels::cpu::rope_table(cfg.kv_channels, cfg.max_positions, rp);
    std::vector<float> cos_sin = table.cos;
    cos_sin.insert(cos_sin.end(), table.sin.begin(), table.sin.end());
    rope_table_ = kc::DeviceBuffer(sizeof(float) * cos_sin.size());
    rope_table_.upload(cos_sin.data(), rope_table_.bytes);
    rope_ = {rope_table_.as<float>(), rope_table_.as<float>() + table.cos.size(), table.rot_dim, table.max_positions};
    // With QK layernorm the rotation joins the norm's pass where the pack kernels serve the table.
    rope_in_qk_norm_ = lc_.qk_layernorm && kc::rope_packable(rope_);
  }
  const int64_t N = num_parameters();
  main_ = kc::DeviceBuffer(sizeof(float) * N);
  grads_ = kc::DeviceBuffer(sizeof(float) * N);
  params_ = kc::DeviceBuffer(sizeof(bf16) * N);
  loss_acc_ = kc::DeviceBuffer(2 * sizeof(double));
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(loss_acc_.ptr, 0, loss_acc_.bytes, stream_));
  zero_bias_ = kc::DeviceBuffer(sizeof(bf16) * lc_.ffn);
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(zero_bias_.ptr, 0, zero_bias_.bytes, stream_));  // bf16 zero is all-zero bits

  // (A config and group of different EP sizes are refused by the MoE layers below.) Whole experts
  // under TP with EP: of the TP and EP groups one holds the other (cuda_unsupported_features), the
  // only sum (counts: the EP group's first TP group counts the rest of the model, or the TP
  // group's first EP group its experts). With EP groups inside a TP group the ranks holding the
  // same experts share TP groups: finalize_grads sums their experts over same_experts, as it does
  // over the TP group without EP.
  if (folded_ && ep_) {
    split_groups_.push_back(ep_->size() >= tp_size_ ? ep_ : tp_);
    if (ep_->size() < tp_size_) {
      if (group_size(same_experts) % (tp_size_ / ep_->size()) != 0)  // (one rank for none)
        throw Error("CudaGptModel: whole experts with expert-parallel groups of " + std::to_string(ep_->size()) +
                    " ranks inside a tensor-parallel group of " + std::to_string(tp_size_) +
                    " need the group of the ranks holding the same experts (a multiple of " +
                    std::to_string(tp_size_ / ep_->size()) + " ranks)");
      same_experts_ = same_experts;
    }
  } else {
    if (tensor_parallel()) split_groups_.push_back(tp_);
    if (ep_) split_groups_.push_back(ep_);
  }
  if (!split_groups_.empty() || layout_.table.has_buffers()) {
    counted_ = kc::DeviceBuffer(static_cast<size_t>(N));
    std::vector<ByteRun> flags;  // zeros elsewhere: the tables' alignment gaps too
    for (const auto& p : layout_.table.specs)
      if (counts(p, true)) flags.push_back({p.offset, p.numel, 1});
    kc::upload_byte_runs(counted_.as<uint8_t>(), N, flags);
  }

  const auto& c = lc_;
  // Tr: rows of the residual stream (the rank's share of each sequence under SP), T: all tokens.
  const int64_t T = max_b * s, Tr = sp_ ? T / tp_size_ : T, h = c.hidden, HD = c.heads * c.kv_channels;
  const kc::AttentionShape shape{max_b, s, c.heads, c.query_groups, c.kv_channels,
                                 1.0f / std::sqrt(static_cast<float>(c.kv_channels))};
  init_attention(shape);
  // The module tree over the CUDA backend runs the model where the backend serves it; it carves
  // its own activations and scratch (the layers' and the backward's below are then not needed).
  use_tree_ = cuda_backend_unsupported(lc_, tp_size_).empty() && !phases_.enabled();
  const int64_t own = use_tree_ ? 0 : 1;
  const bool flash = attention_ == AttentionPath::Flash, fused = attention_ != AttentionPath::Unfused;
  // The unfused path keeps s x s probabilities per layer; the fused paths keep only the lse.
  const int64_t heads_elems = fused ? 0 : kc::attention_heads_elems(shape);
  const int64_t probs_elems = fused ? 0 : kc::attention_probs_elems(shape);
  const int64_t lse_elems = max_b * c.heads * s;
  const bool attn_drop = c.attention_dropout > 0 && !fused;
  const int64_t wide = std::max({c.qkv_width(), c.fc1_width(), HD, h});
  emb_scratch_bytes_ = std::max(kc::embedding_backward_scratch_bytes(T, c.vocab),
                                kc::embedding_backward_scratch_bytes(T, std::max<int64_t>(c.max_positions, 1)));
  const size_t reduce_floats = std::max(
      {kc::bias_grad_scratch_floats(T, wide), kc::layernorm_backward_scratch_floats(T, h),
       size_t(kc::kReduceBlocks) * 2,
       c.qk_layernorm ? kc::qk_rmsnorm_backward_scratch_floats(T, c.heads, c.query_groups, c.kv_channels) : 0});

  // Full activation recomputation: the layers it covers share a pool of one chunk's activations,
  // and each chunk keeps only its input (chunk_start_/chunk_end_ say which layers, -1 for none).
  chunk_start_.assign(static_cast<size_t>(c.num_layers), -1);
  chunk_end_.assign(static_cast<size_t>(c.num_layers), -1);
  int64_t pool_layers = 0;
  if (c.recompute != Recompute::None && c.recompute_num_layers > 0) {
    const bool block = c.recompute == Recompute::Block;
    const int64_t n = c.recompute_num_layers, covered = block ? std::min(n, c.num_layers) : c.num_layers;
    const int64_t chunk = block ? 1 : n;
    for (int64_t l = 0; l < covered; ++l) {
      chunk_start_[l] = l / chunk * chunk;
      chunk_end_[l] = std::min(chunk_start_[l] + chunk, covered) - 1;
    }
    pool_layers = covered > 0 ? std::min(chunk, covered) : 0;
  }
  // An MoE layer keeps its MLP's activations in moe_ instead of u and g.
  bool any_dense = false;
  for (int64_t l = 0; l < c.num_layers; ++l) any_dense = any_dense || !c.is_moe_layer(l);
  auto carve_layer = [&](Carver& a, LayerActs& L, bool dense_mlp) {
    L.x_in = a.take<bf16>(Tr * h);
    L.ln1 = a.take<bf16>(T * h);
    L.ln1_mean = a.take<float>(Tr);
    L.ln1_rstd = a.take<float>(Tr);
    L.qkv = a.take<bf16>(T * c.qkv_width());
    // QK layernorm writes its output beside qkv (its backward reads the un-normalised values);
    // without it RoPE and attention work on qkv itself.
    L.qkv_attn = c.qk_layernorm ? a.take<bf16>(T * c.qkv_width()) : L.qkv;
    L.qk_rstd = c.qk_layernorm ? a.take<float>(T * (c.heads + c.query_groups)) : nullptr;
    L.attn.q = a.take<bf16>(heads_elems);
    L.attn.k = a.take<bf16>(heads_elems);
    L.attn.v = a.take<bf16>(heads_elems);
    L.attn.probs = a.take<bf16>(probs_elems);
    L.attn.probs_dropped = attn_drop ? a.take<bf16>(probs_elems) : nullptr;
    L.lse = fused ? a.take<float>(lse_elems) : nullptr;
    L.ctx = a.take<bf16>(T * HD);
    L.x_mid = a.take<bf16>(Tr * h);
    L.ln2 = a.take<bf16>(T * h);
    L.ln2_mean = a.take<float>(Tr);
    L.ln2_rstd = a.take<float>(Tr);
    L.u = a.take<bf16>(dense_mlp ? T * c.fc1_width() : 0);
    L.g = a.take<bf16>(dense_mlp ? T * c.ffn : 0);
  };

  auto carve = [&](Carver& a) {
    layers_.assign(static_cast<size_t>(c.num_layers), LayerActs{});
    emb_out_ = a.take<bf16>(own * (T * h));
    std::vector<LayerActs> pool(static_cast<size_t>(own * pool_layers));
    for (auto& P : pool) carve_layer(a, P, any_dense);
    for (int64_t l = 0; l < own * c.num_layers; ++l) {
      LayerActs& L = layers_[l];
      if (chunk_start_[l] < 0) {
        carve_layer(a, L, !c.is_moe_layer(l));
      } else {
        L = pool[static_cast<size_t>(l - chunk_start_[l])];
        if (l == chunk_start_[l]) L.x_in = a.take<bf16>(Tr * h);  // the chunk's input, kept
      }
    }
    x_final_ = a.take<bf16>(own * (Tr * h));
    xf_ = a.take<bf16>(own * (T * h));
    xf_mean_ = a.take<float>(own * Tr);
    xf_rstd_ = a.take<float>(own * Tr);
    logits_ = a.take<bf16>(own * (T * c.vocab));
    losses_ = a.take<float>(T);
    lse_ = a.take<float>(own * T);
    branch_ = a.take<bf16>(own * (T * h));
    attn_scratch_.scores = a.take<float>(own * probs_elems);
    attn_scratch_.heads = a.take<bf16>(own * heads_elems);
    attn_scratch_.dq = a.take<bf16>(own * heads_elems);
    attn_scratch_.dk = a.take<bf16>(own * heads_elems);
    attn_scratch_.dv = a.take<bf16>(own * heads_elems);
    delta_ = flash ? a.take<float>(own * lse_elems) : nullptr;
    dx_ = a.take<bf16>(own * (T * h));
    dbranch_ = a.take<bf16>(own * (T * h));
    dnorm_ = a.take<bf16>(own * (T * h));
    dtmp_ = a.take<bf16>(own * (T * h));
    dwide_ = a.take<bf16>(own * (T * wide));
    dsplit_ = a.take<bf16>(own * (qkv_rows_ == kc::QkvRows::Split ? T * c.qkv_width() : 0));
    dg_ = a.take<bf16>(own * (T * c.ffn));
    dctx_ = a.take<bf16>(own * (T * HD));
    reduce_scratch_ = a.take<float>(own * static_cast<int64_t>(reduce_floats));
    sp_local_ = a.take<bf16>(sp_ ? Tr * h : 0);
    sp_staging_ = a.take<bf16>(sp_ && max_b > 1 ? T * h : 0);
    ce_stats_ = a.take<float>(tensor_parallel() ? 2 * T : 0);
    ce_gathered_ = a.take<float>(tensor_parallel() ? 2 * T * tp_size_ : 0);
    emb_scratch_ = a.take<char>(own * static_cast<int64_t>(emb_scratch_bytes_));
    tokens_ = a.take<int64_t>(T);
    labels_ = a.take<int64_t>(T);
    positions_ = a.take<int64_t>(T);
    key_start_ = c.document_attention ? a.take<int32_t>(T) : nullptr;
    mask_ = a.take<float>(T);
    dloss_ = a.take<float>(T);
    logit_keys_ = a.take<uint64_t>(c.num_layers);  // staged with the inputs: last, inside their span
  };
  if (c.moe.num_experts > 0) {
    // Under TP (with SP) the layers see the whole sequence and hold their share of every expert
    // (under EP too: of every expert of this EP rank; the EP group gathers the ranks' sequences).
    // Under TP: token dropping within each rank's share of the sequence; whole experts take only
    // this rank's share's pairs.
    MoeSequenceShares shares;
    if (tensor_parallel()) shares = {tp_rank_, tp_size_, folded_};
    moe_ = std::make_unique<CudaMoeLayers>(c, T, s, ep_, shares);
  }
  Carver measure;
  carve(measure);
  acts_ = kc::DeviceBuffer(measure.used);
  Carver real{static_cast<char*>(acts_.ptr), 0};
  carve(real);
  inputs_bytes_ =
      static_cast<size_t>(reinterpret_cast<char*>(logit_keys_ + c.num_layers) - reinterpret_cast<char*>(tokens_));
  for (int i = 0; i < 2; ++i) {
    staging_[i] = kc::PinnedHostBuffer(inputs_bytes_);
    LAOYAO_CUDA_CHECK(cudaEventCreateWithFlags(&staged_[i], cudaEventDisableTiming));
  }
  // The ranges --overlap-grad-reduce reduces during the backward: the head (the final norm, and the
  // output layer unless it is the word embedding, which the backward writes last), then the layers.
  auto group = [&](const std::string& prefix) {
    const size_t begin = sync_ranges_.size();
    append_ranges(layout_.table, prefix, ep_ != nullptr, sync_ranges_);
    return std::make_pair(begin, sync_ranges_.size());
  };
  const size_t head_begin = sync_ranges_.size();
  group("decoder.final_layernorm.");
  if (layout_.output_w != layout_.word_emb) group("output_layer.");
  head_ranges_.push_back({head_begin, sync_ranges_.size()});
  for (int64_t l = 0; l < lc_.num_layers; ++l) layer_ranges_.push_back(group("decoder.layers." + std::to_string(l) + "."));

  // What finalize_grads sums over the tensor-parallel group: the QK norms serve every head, each
  // rank's heads gave a part; under SP each rank's rows gave a part of every norm's gradient; an
  // MoE router's gradient comes from each rank's share of the experts' outputs.
  if (tensor_parallel()) {
    auto sum = [&](int64_t off, int64_t n) {
      if (off >= 0) tp_summed_.push_back({off, n});
    };
    const int64_t D = lc_.kv_channels;
    for (const auto& L : layout_.layers) {
      sum(L.q_norm, D), sum(L.k_norm, D);
      sum(L.router_w, lc_.moe.num_experts * h);  // every rank routes the whole sequence, its share's part
      if (sp_) sum(L.ln1_w, h), sum(L.ln1_b, h), sum(L.ln2_w, h), sum(L.ln2_b, h);
    }
    if (sp_) sum(layout_.final_w, h), sum(layout_.final_b, h);
    // Whole experts without EP: each rank's experts saw its share's rows, summed over the TP group
    // (with EP groups of whole TP groups they saw every share's: the trainer's reduction sums them).
    if (folded_ && !ep_) same_experts_ = tp_;
  }
  if (same_experts_)
    for (const auto& p : layout_.table.specs)
      if (is_routed_expert(p.name)) same_experts_summed_.push_back({p.offset, p.numel});

  // NCCL calls can be captured too, but the tensor-parallel step is not yet checked that way; the
  // expert-parallel step with the all-to-all dispatcher reads the token counts on the host inside
  // the step (the all-gather dispatcher's does not, moe_->graph_safe()); global_aux_loss's running
  // counts give each forward its own kernel argument; a graph's replay is not timed by
  // LAOYAO_MODEL_PHASES.
  const RuntimeOptions& options = runtime_options();
  graphs_enabled_ = options.cuda_graphs && !tensor_parallel() &&
                    (!ep_ || (moe_ && moe_->graph_safe())) && !(cfg.moe.global_aux_loss_coeff > 0) &&
                    !phases_.enabled();
  gelu_epilogue_ = lc_.activation == Activation::GeluTanh && lc_.ffn % 8 == 0 && options.gelu_epilogue;
  bias_grad_in_norm_ = options.bias_grad_in_norm && !(lc_.hidden_dropout > 0) && !sp_;

  // The gradients a step's first backward writes with its GEMMs, and the ranges it zeroes first.
  writers_ = gradient_writers(layout_);
  zero_grads();
  if (use_tree_) {
    CudaBackendState state;
    state.stream = stream_;
    state.gemm = &gemm_;
    state.params = params();
    state.grads = main_grads();
    state.writers = &writers_;
    state.rope = rope_;
    state.rope_in_qk_norm = rope_in_qk_norm_;
    state.qkv_rows = qkv_rows_;
    state.attention = attention_;
    state.cudnn = cudnn_attention_.get();
    state.gelu_epilogue = gelu_epilogue_;
    // (bf16 weights: an offset that is a multiple of 8 elements is 16-byte aligned.)
    bool aligned = lc_.hidden % 8 == 0 && lc_.hidden <= 4096;
    auto check = [&](int64_t off) { aligned = aligned && (off < 0 || off % 8 == 0); };
    for (const GptLayerOffsets& L : layout_.layers) check(L.ln1_w), check(L.ln1_b), check(L.ln2_w), check(L.ln2_b);
    check(layout_.final_w), check(layout_.final_b);
    state.norms_add_in_place = aligned;
    state.bias_grad_in_norm = bias_grad_in_norm_;
    backend_ = std::make_unique<CudaBackend>(lc_, state, max_b, s);
    tree_ = std::make_unique<mcore::GPTModel>(cfg_, lc_, layout_, mcore::TensorParallel{}, *backend_,
                                              /*recompute=*/true);
    tree_->allocate(max_b, s);  // once: a captured step replays these addresses; smaller batches use a prefix
    tree_->set_backward_hook([this](int64_t layer) {
      if (!grads_ready_) return;
      if (layer < 0)
        for (const auto& r : head_ranges_) report_grads_ready(r);
      else
        report_grads_ready(layer_ranges_[static_cast<size_t>(layer)]);
    });
  }
}

CudaGptModel::~CudaGptModel() {
  if (stream_) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t e : staged_)
    if (e) (void)cudaEventDestroy(e);
  drop_graphs();
}

void CudaGptModel::drop_graphs() {
  for (auto& [k, exec] : graphs_)
    if (exec) (void)cudaGraphExecDestroy(exec);
  graphs_.clear();
}

size_t CudaGptModel::device_bytes() const {
  return main_.bytes + grads_.bytes + params_.bytes + acts_.bytes + loss_acc_.bytes + zero_bias_.bytes +
         (backend_ ? backend_->device_bytes() : 0) +
         counted_.bytes + (cudnn_attention_ ? static_cast<size_t>(cudnn_attention_->device_bytes()) : 0) +
         (moe_ ? moe_->device_bytes() : 0);
}

// cuDNN's attention over the split rows where they serve: GQA with the QK norm (and RoPE, if any,
// in its pass), the norm writing q, k and v where cuDNN reads them in place (qkv_rows.hpp) and
// reading cuDNN's gradient there, with no gather or scatter of the query heads. A cuDNN without an
// engine for the split strides gets the fused rows instead. Sets qkv_rows_; throws what cuDNN says
// when neither layout has an engine. allow_split: LAOYAO_QKV_SPLIT is not 0 (init_attention reads
// it before any cuDNN call, so a bad value is its own error, not a missing backend).
void CudaGptModel::make_cudnn_attention(const kc::AttentionShape& shape, bool allow_split) {
  const GptConfig& c = lc_;
  const bool split =
      allow_split && c.qk_layernorm && c.heads != c.query_groups && (rope_.rot_dim == 0 || rope_in_qk_norm_);
  if (split) {
    try {
      cudnn_attention_ = std::make_unique<kc::CudnnAttention>(shape, stream_, kc::QkvRows::Split);
      qkv_rows_ = kc::QkvRows::Split;
      return;
    } catch (const Error& e) {
      std::fprintf(stderr, "note: cuDNN has no engine for the split QKV rows (%s); gathering the query heads\n",
                   e.what());
    }
  }
  cudnn_attention_ = std::make_unique<kc::CudnnAttention>(shape, stream_, kc::QkvRows::Fused);
  qkv_rows_ = kc::QkvRows::Fused;
}

void CudaGptModel::init_attention(const kc::AttentionShape& shape) {
  const GptConfig& c = lc_;
  const std::string D = std::to_string(c.kv_channels);
  // LAOYAO_QKV_SPLIT=0 keeps cuDNN on the fused rows (to measure the split rows' difference).
  const bool allow_split = runtime_options().qkv_split;
  if (c.document_attention && c.attention_backend == AttentionBackend::Fused)
    throw UsageError("--attention-backend fused: cuDNN's fused attention is built here for whole sequences, not for "
                     "the documents of a packed sequence (--reset-attention-mask); use --attention-backend flash, "
                     "unfused or auto");
  switch (c.attention_backend) {
    case AttentionBackend::Unfused:
      attention_ = AttentionPath::Unfused;
      return;
    case AttentionBackend::Flash:
      if (!kc::attention_flash_supports(shape))
        throw UsageError("--attention-backend flash: the flash kernels support head dims 64 and 128, not " + D +
                         " (--attention-backend fused or unfused)");
      attention_ = AttentionPath::Flash;
      return;
    case AttentionBackend::Fused:
      if (c.attention_dropout > 0)
        throw UsageError("--attention-backend fused: cuDNN's fused attention draws its own dropout masks, which "
                         "cannot match the CPU backend's; with --attention-dropout " + std::to_string(c.attention_dropout) +
                         " use --attention-backend flash, unfused or auto");
      if (!kc::CudnnAttention::supports(shape))
        throw UsageError("--attention-backend fused: cuDNN's fused attention takes head dims that are multiples of 8 "
                         "up to 128, not " + D + " (--attention-backend unfused works for any)");
      make_cudnn_attention(shape, allow_split);
      attention_ = AttentionPath::Cudnn;
      return;
    case AttentionBackend::Auto:  // cuDNN's unless dropout or documents need ours
      if (c.attention_dropout == 0 && !c.document_attention && kc::CudnnAttention::supports(shape)) {
        try {
          make_cudnn_attention(shape, allow_split);
          attention_ = AttentionPath::Cudnn;
          return;
        } catch (const Error& e) {  // an older cuDNN, say: our own kernels serve instead
          std::fprintf(stderr, "note: cuDNN's fused attention is not available (%s); using laoyao's kernels\n",
                       e.what());
        }
      }
      attention_ = kc::attention_flash_supports(shape) ? AttentionPath::Flash : AttentionPath::Unfused;
      return;
  }
}

const char* CudaGptModel::attention_path() const {
  switch (attention_) {
    case AttentionPath::Cudnn: return "cudnn";
    case AttentionPath::Flash: return "flash";
    case AttentionPath::Unfused: break;
  }
  return "unfused";
}

void CudaGptModel::upload_weights(const float* host) { upload_weights(host, 0, num_parameters()); }

void CudaGptModel::upload_weights(const float* host, int64_t offset, int64_t count) {
  if (offset < 0 || count < 0 || offset + count > num_parameters())
    throw Error("CudaGptModel::upload_weights: " + std::to_string(count) + " weights at " + std::to_string(offset) +
                " of " + std::to_string(num_parameters()));
  LAOYAO_CUDA_CHECK(cudaMemcpyAsync(main_params() + offset, host, sizeof(float) * static_cast<size_t>(count),
                                    cudaMemcpyHostToDevice, stream_));
  kc::cast_to_bf16(main_params() + offset, params() + offset, count, stream_);
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaGptModel::download_weights(float* host) const {
  kc::stream_wait(stream_, "the step before the weights are read");
  main_.download(host, sizeof(float) * num_parameters());
}

void CudaGptModel::download_grads(float* host) const {
  kc::stream_wait(stream_, "the step before the gradients are read");
  if (fresh_grads_)  // zeroed lazily, not yet written
    std::fill(host, host + num_parameters(), 0.0f);
  else
    grads_.download(host, sizeof(float) * num_parameters());
}

void CudaGptModel::zero_grads() { fresh_grads_ = true; }

void CudaGptModel::zero_grads_now() {
  if (!fresh_grads_) return;
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(grads_.ptr, 0, grads_.bytes, stream_));
  fresh_grads_ = false;
}

bool CudaGptModel::accumulates(int64_t w) const {
  return !writing_grads_ || !std::binary_search(writers_.gemm_written.begin(), writers_.gemm_written.end(), w);
}

kc::DropoutSpec CudaGptModel::dropout(double p, uint64_t seed, const std::string& stream) const {
  kc::DropoutSpec d;
  if (!key_.training || p <= 0) return d;
  d.key = rng_stream_key(seed, stream);
  d.p = p;
  d.keep_scale = static_cast<float>(1.0 / (1.0 - p));  // as the CPU model's mask value
  return d;
}

kc::DropoutSpec CudaGptModel::hidden_dropout(const std::string& stream) const {
  const kc::DropoutSpec d = dropout(lc_.hidden_dropout, key_.seed, stream);
  // Sequence parallelism: this rank's positions of each sequence of the whole [b, s, h] mask.
  return sp_ ? kc::sliced(d, static_cast<uint64_t>(s_ * lc_.hidden), tp_rank_, tp_size_) : d;
}

bool CudaGptModel::counts(const ParamSpec& p, bool across_ep) const {
  if (p.buffer) return false;
  const bool routed = is_routed_expert(p.name);
  if (folded_ && ep_) {
    // Whole experts under TP with EP (split_groups_ is the larger of the two groups). EP groups of
    // whole TP groups: every rank of the EP group holds its own experts; the rest is counted by the
    // group's first TP group (EP ranks 0 .. TP - 1) by the TP rule. EP groups inside a TP group:
    // the rest by the TP rule, the experts by the TP group's first EP group (TP ranks 0 .. EP - 1).
    const bool tp_share = tp_rank_ == 0 || tp_split_of(p.name, cfg_) != TpSplit::Replicated;
    if (ep_->size() < tp_size_) return routed ? tp_rank_ < ep_->size() : tp_share;
    if (routed) return true;
    return tp_share && (!across_ep || ep_->rank() < tp_size_);
  }
  const bool tp_share = tp_rank_ == 0 || tp_split_of(p.name, cfg_) != TpSplit::Replicated;
  const bool ep_share = !across_ep || !ep_ || ep_->rank() == 0 || routed;
  return tp_share && ep_share;
}

kc::DropoutSpec CudaGptModel::attention_dropout(const std::string& stream) const {
  const kc::DropoutSpec d = dropout(lc_.attention_dropout, key_.seed, stream);
  // Tensor parallelism: this rank's heads of each sequence of the whole [b, heads, s, s] mask.
  return kc::sliced(d, static_cast<uint64_t>(cfg_.heads * s_ * s_), tp_rank_, tp_size_);
}

CudaMoeLayers::Context CudaGptModel::moe_context(const GptLayerOffsets& W) {
  // The routed experts (every local one), router and shared expert are all GEMM-written (writers_).
  return {W, params(), main_grads(), gemm_, stream_, main_params(), !writing_grads_};
}

void CudaGptModel::set_moe_aux_loss_scale(float scale) {
  if (scale == moe_aux_loss_scale_) return;
  moe_aux_loss_scale_ = scale;
  drop_graphs();  // their router backwards hold the old scale
}

void CudaGptModel::finish_moe_step(dist::ProcessGroup* dp) {
  if (!moe_) return;
  moe_->update_expert_bias(main_params(), layout_, dp, stream_);
  moe_->reset_global_aux(stream_);
}

void CudaGptModel::set_data_parallel_group(dist::ProcessGroup* dp) {
  if (moe_) moe_->set_data_parallel_group(dp);
}

GptModel::MoeLosses CudaGptModel::take_moe_losses() { return moe_ ? moe_->take_losses(stream_) : GptModel::MoeLosses{}; }

void CudaGptModel::tp_all_reduce(bf16* x, int64_t n) {
  tp_->all_reduce_device(x, static_cast<size_t>(n), dist::DeviceType::BF16, stream_);
}

// Under sequence parallelism a rank's rows are b runs of s/tp (tokens are batch-major), while the
// collectives put the ranks' blocks one after another: with b > 1 the rows go through sp_staging_,
// rearranged by strided copies.
void CudaGptModel::sp_gather(const bf16* local, bf16* full) {
  const int64_t h = lc_.hidden, run = s_ / tp_size_ * h, n = b_ * run;
  if (b_ == 1) return tp_->all_gather_device(local, full, static_cast<size_t>(n), dist::DeviceType::BF16, stream_);
  tp_->all_gather_device(local, sp_staging_, static_cast<size_t>(n), dist::DeviceType::BF16, stream_);
  for (int64_t r = 0; r < tp_size_; ++r)
    LAOYAO_CUDA_CHECK(cudaMemcpy2DAsync(full + r * run, sizeof(bf16) * s_ * h, sp_staging_ + r * n, sizeof(bf16) * run,
                                        sizeof(bf16) * run, b_, cudaMemcpyDeviceToDevice, stream_));
}

void CudaGptModel::sp_reduce_scatter(const bf16* full, bf16* local) {
  const int64_t h = lc_.hidden, run = s_ / tp_size_ * h, n = b_ * run;
  if (b_ == 1)
    return tp_->reduce_scatter_device(full, local, static_cast<size_t>(n), dist::DeviceType::BF16, stream_);
  for (int64_t r = 0; r < tp_size_; ++r)
    LAOYAO_CUDA_CHECK(cudaMemcpy2DAsync(sp_staging_ + r * n, sizeof(bf16) * run, full + r * run, sizeof(bf16) * s_ * h,
                                        sizeof(bf16) * run, b_, cudaMemcpyDeviceToDevice, stream_));
  tp_->reduce_scatter_device(sp_staging_, local, static_cast<size_t>(n), dist::DeviceType::BF16, stream_);
}

void CudaGptModel::sp_slice(const bf16* full, bf16* local) {
  const int64_t h = lc_.hidden, run = s_ / tp_size_ * h;
  LAOYAO_CUDA_CHECK(cudaMemcpy2DAsync(local, sizeof(bf16) * run, full + tp_rank_ * run, sizeof(bf16) * s_ * h,
                                      sizeof(bf16) * run, b_, cudaMemcpyDeviceToDevice, stream_));
}

void CudaGptModel::row_parallel_residual(const bf16* x, int64_t w, int64_t b, int64_t K, const bf16* residual,
                                         bf16* out, const kc::DropoutSpec& drop, Phase gemm) {
  const int64_t h = lc_.hidden;
  // Each rank's partial product over its input columns, rank 0's with the (replicated) bias, so the
  // group's sum holds it once.
  linear_forward(x, w, tp_rank_ == 0 ? b : -1, branch_, K, h);
  phase(gemm);
  sum_partial_residual(residual, out, drop);
}

void CudaGptModel::sum_partial_residual(const bf16* residual, bf16* out, const kc::DropoutSpec& drop) {
  const int64_t h = lc_.hidden;
  const bf16* sum = branch_;
  if (sp_) {
    sp_reduce_scatter(branch_, sp_local_);
    sum = sp_local_;
  } else {
    tp_all_reduce(branch_, b_ * s_ * h);
  }
  phase(kCommunication);
  kc::residual_dropout_add(sum, residual, out, rows_ * h, drop, stream_);
  phase(kResidual);
}

CudaGptModel::bf16* CudaGptModel::sum_input_grad() {
  if (!tensor_parallel()) return dnorm_;
  bf16* sum = dnorm_;
  if (sp_) {
    sp_reduce_scatter(dnorm_, sp_local_);
    sum = sp_local_;
  } else {
    tp_all_reduce(dnorm_, b_ * s_ * lc_.hidden);
  }
  phase(kCommunication);
  return sum;
}

void CudaGptModel::finalize_grads() {
  zero_grads_now();  // a step without a backward
  for (const auto& r : tp_summed_)
    tp_->all_reduce_device(G(r.offset), static_cast<size_t>(r.count), dist::DeviceType::F32, stream_);
  for (const auto& r : same_experts_summed_)
    same_experts_->all_reduce_device(G(r.offset), static_cast<size_t>(r.count), dist::DeviceType::F32, stream_);
}

void CudaGptModel::linear_forward(const bf16* x, int64_t w, int64_t b, bf16* y, int64_t K, int64_t N,
                                  const bf16* residual) {
  gemm_.linear_forward(x, P(w), P(b), y, b_ * s_, K, N, stream_, residual);
}

void CudaGptModel::linear_backward(const bf16* x, int64_t w, int64_t b, const bf16* dy, bf16* dx, int64_t K,
                                   int64_t N) {
  const int64_t T = b_ * s_;
  gemm_.linear_backward_input(dy, P(w), dx, T, K, N, stream_);
  gemm_.linear_backward_weight(dy, x, G(w), T, K, N, stream_, accumulates(w));
  if (b >= 0) kc::bias_grad(dy, G(b), reduce_scratch_, T, N, stream_);
}

void CudaGptModel::norm_forward(const bf16* x, int64_t w, int64_t b, bf16* y, float* mean, float* rstd) {
  const auto& c = lc_;
  if (c.norm == Norm::RMSNorm)
    kc::rmsnorm_forward(x, P(w), y, rstd, rows_, c.hidden, c.norm_eps, c.zero_centered_gamma, stream_);
  else
    kc::layernorm_forward(x, P(w), P(b), y, mean, rstd, rows_, c.hidden, c.norm_eps, c.zero_centered_gamma, stream_);
}

void CudaGptModel::layernorm_backward(const bf16* dy, const bf16* x, int64_t w, int64_t b, const float* mean,
                                      const float* rstd, bf16* dx, bool accumulate, float* dx_colsum) {
  const auto& c = lc_;
  if (c.norm == Norm::RMSNorm)
    kc::rmsnorm_backward(dy, x, P(w), rstd, dx, G(w), reduce_scratch_, rows_, c.hidden, c.zero_centered_gamma,
                         stream_, accumulate, dx_colsum);
  else
    kc::layernorm_backward(dy, x, P(w), mean, rstd, dx, G(w), G(b), reduce_scratch_, rows_, c.hidden,
                           c.zero_centered_gamma, stream_, accumulate, dx_colsum);
}

void CudaGptModel::layernorm_backward_into_residual(const bf16* dy, const bf16* x, int64_t w, int64_t b,
                                                    const float* mean, const float* rstd, float* dx_colsum) {
  const int64_t h = lc_.hidden;
  auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // The fused form needs layernorm.hpp's accumulate_dx conditions (the activations are 256-byte
  // aligned with rows of h elements; the norm weights sit at their table offsets).
  if (h % 8 == 0 && h <= 4096 && aligned16(P(w)) && (b < 0 || aligned16(P(b)))) {
    layernorm_backward(dy, x, w, b, mean, rstd, dx_, true, dx_colsum);
  } else {
    layernorm_backward(dy, x, w, b, mean, rstd, dtmp_);
    kc::add_inplace(dx_, dtmp_, rows_ * h, stream_);
    if (dx_colsum) kc::bias_grad(dx_, dx_colsum, reduce_scratch_, rows_, h, stream_);
  }
}

float* CudaGptModel::proj_bias_in_norm(int64_t l) {
  return bias_grad_in_norm_ ? G(layout_.layers[static_cast<size_t>(l)].proj_b) : nullptr;
}

float* CudaGptModel::fc2_bias_in_norm(int64_t l) {
  return bias_grad_in_norm_ && l >= 0 && !lc_.is_moe_layer(l) ? G(layout_.layers[static_cast<size_t>(l)].fc2_b)
                                                                : nullptr;
}

void CudaGptModel::forward(const MicroBatch& mb, const float* loss_mask, const DropoutKey& key, const float* dloss) {
  const auto& c = lc_;
  if (mb.s != s_ || mb.b <= 0 || mb.b > max_b_)
    throw Error("CudaGptModel: micro-batch of " + std::to_string(mb.b) + "x" + std::to_string(mb.s) +
                " tokens, built for up to " + std::to_string(max_b_) + "x" + std::to_string(s_));
  b_ = mb.b;
  rows_ = sp_ ? b_ * s_ / tp_size_ : b_ * s_;
  key_ = key;
  const int64_t T = b_ * s_;
  if (tensor_parallel()) check_token_ids(mb.tokens, T, cfg_.vocab, "CudaGptModel");
  // Stage every input of the micro-batch in a pinned slot laid out as the device span, then one copy.
  const int slot = next_slot_;
  next_slot_ ^= 1;
  kc::event_wait(staged_[slot], "the input copy of two micro-batches back");  // before this slot is rewritten
  char* host = staging_[slot].as<char>();
  auto stage = [&](const void* dev, const void* src, size_t bytes) {
    std::memcpy(host + (static_cast<const char*>(dev) - reinterpret_cast<const char*>(tokens_)), src, bytes);
  };
  const size_t ids = sizeof(int64_t) * T;
  stage(tokens_, mb.tokens, ids);
  stage(labels_, mb.labels, ids);
  if (layout_.pos_emb >= 0) {
    if (!mb.positions) throw Error("CudaGptModel: learned positions need position ids");
    stage(positions_, mb.positions, ids);
  }
  if (c.document_attention) {
    if (!mb.key_start) throw Error("CudaGptModel: built for documents (--reset-attention-mask), given no key_start");
    check_key_start(mb);
    stage(key_start_, mb.key_start, sizeof(int32_t) * T);
  } else if (mb.key_start) {
    throw Error("CudaGptModel: a micro-batch with documents (key_start) for a model built without "
                "document_attention");
  }
  stage(mask_, loss_mask, sizeof(float) * T);
  if (dloss) stage(dloss_, dloss, sizeof(float) * T);
  if (c.moe.force_load_balancing)  // each MoE layer's random logits stream, read by the kernel on the device
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const uint64_t k = random_logits_key(key, l);
      stage(logit_keys_ + l, &k, sizeof k);
    }
  LAOYAO_CUDA_CHECK(cudaMemcpyAsync(tokens_, host, inputs_bytes_, cudaMemcpyHostToDevice, stream_));
  LAOYAO_CUDA_CHECK(cudaEventRecord(staged_[slot], stream_));
  have_grad_logits_ = dloss != nullptr;
  backward_done_ = false;

  // A step without dropout is the same kernels with the same arguments every time: from the second
  // call of a shape on, it is one CUDA graph launch (forward, and backward when training) instead of
  // a hundred-odd kernel launches. The first call runs eagerly (cuBLASLt plans, kernel attributes).
  const bool dropout_now = key.training && (c.hidden_dropout > 0 || c.attention_dropout > 0);
  if (graphs_enabled_ && !dropout_now && !grads_ready_) {
    const auto graph_key = std::make_tuple(b_, dloss != nullptr, dloss != nullptr && fresh_grads_);
    auto it = graphs_.find(graph_key);
    if (it == graphs_.end()) {
      enqueue_forward(dloss != nullptr);
      if (dloss) enqueue_backward();
      graphs_.emplace(graph_key, nullptr);  // warmed up: the next call captures
    } else {
      if (!it->second) it->second = capture([&] {
        enqueue_forward(dloss != nullptr);
        if (dloss) enqueue_backward();
      });
      LAOYAO_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
      if (dloss) fresh_grads_ = false;  // as enqueue_backward() does: the replay wrote them
    }
    backward_done_ = dloss != nullptr;
    return;
  }
  enqueue_forward(dloss != nullptr);
}

cudaGraphExec_t CudaGptModel::capture(const std::function<void()>& enqueue) {
  cudaGraph_t graph = nullptr;
  LAOYAO_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    (void)cudaStreamEndCapture(stream_, &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    throw;
  }
  LAOYAO_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t st = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  LAOYAO_CUDA_CHECK(st);
  return exec;
}

mcore::Step CudaGptModel::tree_step(bool train_step) const {
  mcore::Step st;
  const int64_t T = b_ * s_;
  st.batch = {b_, s_, T, rows_, lc_.document_attention ? key_start_ : nullptr};
  st.tokens = tokens_;
  st.labels = labels_;
  st.positions = layout_.pos_emb >= 0 ? positions_ : nullptr;
  st.seed = key_.seed;
  st.call = key_.call;
  st.training = key_.training;
  st.train_step = train_step;
  return st;
}

void CudaGptModel::enqueue_tree_forward(bool with_loss_grad) {
  training_forward_ = with_loss_grad;
  tree_->forward(tree_step(with_loss_grad), losses_, with_loss_grad ? dloss_ : nullptr);
  kc::masked_loss_sum(losses_, mask_, b_ * s_, loss_acc_.as<double>(), stream_);
}

void CudaGptModel::enqueue_tree_backward() {
  begin_backward();
  backend_->set_writing_grads(writing_grads_);
  tree_->backward(tree_step(true), dloss_, moe_aux_loss_scale_);
  backend_->set_writing_grads(false);
  writing_grads_ = false;
}

void CudaGptModel::begin_backward() {
  // The step's first backward: the weight-gradient GEMMs write, everything else starts at zero.
  writing_grads_ = fresh_grads_;
  fresh_grads_ = false;
  if (writing_grads_)
    for (const GradientWriters::Range& r : writers_.zeroed)
      LAOYAO_CUDA_CHECK(cudaMemsetAsync(G(r.offset), 0, sizeof(float) * static_cast<size_t>(r.count), stream_));
}

void CudaGptModel::enqueue_forward(bool with_loss_grad) {
  if (use_tree_) return enqueue_tree_forward(with_loss_grad);
  const auto& c = lc_;
  const DropoutKey& key = key_;
  training_forward_ = with_loss_grad;
  const int64_t T = b_ * s_, h = c.hidden;
  const std::string call = std::to_string(key.call);
  backward_phase_ = false;
  phases_.begin(stream_);

  // Embedding (word + position), then embedding dropout, into layer 0's input.
  bf16* x = layers_.empty() ? x_final_ : layers_[0].x_in;
  const auto emb_drop = dropout(c.hidden_dropout, key.seed, "dropout.embedding." + call);
  const int64_t* pos_ids = layout_.pos_emb >= 0 ? positions_ : nullptr;
  if (!tensor_parallel()) {
    kc::embedding_forward(tokens_, P(layout_.word_emb), pos_ids, P(layout_.pos_emb), emb_drop.p > 0 ? emb_out_ : x, T,
                          h, c.vocab, c.max_positions, stream_);
    if (emb_drop.p > 0) kc::dropout_apply(emb_out_, x, T * h, emb_drop, stream_);
  } else {
    // Vocabulary-parallel: each rank looks up its rows (zeros for the others' ids), rank 0 adds the
    // positions, and the group's sum is the embedding; then the whole model's dropout mask, and
    // under sequence parallelism this rank's share of each sequence.
    bf16* e = emb_drop.p > 0 || sp_ ? emb_out_ : x;
    kc::embedding_forward(tokens_, P(layout_.word_emb), tp_rank_ == 0 ? pos_ids : nullptr, P(layout_.pos_emb), e, T, h,
                          c.vocab, c.max_positions, stream_, tp_rank_ * c.vocab);
    tp_all_reduce(e, T * h);
    if (emb_drop.p > 0) kc::dropout_apply(e, sp_ ? e : x, T * h, emb_drop, stream_);
    if (sp_) sp_slice(e, x);
  }
  phase(kEmbedding);

  for (int64_t l = 0; l < c.num_layers; ++l) enqueue_layer_forward(l);
  norm_forward(x_final_, layout_.final_w, layout_.final_b, sp_ ? sp_local_ : xf_, xf_mean_, xf_rstd_);
  phase(kNorms);
  if (sp_) sp_gather(sp_local_, xf_), phase(kCommunication);
  linear_forward(xf_, layout_.output_w, -1, logits_, h, c.vocab);
  if (tensor_parallel()) {
    // Vocabulary-parallel cross entropy: every rank gets every token's loss from the shards' lse
    // and target logits; the gradient over this rank's columns goes in place of its logits.
    const int64_t v0 = tp_rank_ * c.vocab;
    kc::cross_entropy_shard_stats(logits_, labels_, ce_stats_, T, c.vocab, v0, stream_);
    tp_->all_gather_device(ce_stats_, ce_gathered_, static_cast<size_t>(2 * T), dist::DeviceType::F32, stream_);
    kc::cross_entropy_combine_shards(ce_gathered_, labels_, losses_, lse_, T, cfg_.vocab, static_cast<int>(tp_size_),
                                     stream_);
    if (with_loss_grad) kc::cross_entropy_backward(logits_, labels_, lse_, dloss_, T, c.vocab, stream_, v0);
  } else if (with_loss_grad) {
    kc::cross_entropy_forward_backward(logits_, labels_, dloss_, losses_, lse_, T, c.vocab, stream_);
  } else {
    kc::cross_entropy_forward(logits_, labels_, losses_, lse_, T, c.vocab, stream_);
  }
  kc::masked_loss_sum(losses_, mask_, T, loss_acc_.as<double>(), stream_);
  phase(kHead);
}

// One transformer layer's forward from layers_[l].x_in; the forward pass, and the backward when it
// recomputes a chunk of layers (full recomputation: same kernels, same dropout keys, same bits).
void CudaGptModel::enqueue_layer_forward(int64_t l) {
  const auto& c = lc_;
  const DropoutKey& key = key_;
  const int64_t T = b_ * s_, h = c.hidden, D = c.kv_channels;
  const std::string call = std::to_string(key.call);
  const kc::AttentionShape shape{b_, s_, c.heads, c.query_groups, D, 1.0f / std::sqrt(static_cast<float>(D)),
                                 key_start_};
  const GptLayerOffsets& W = layout_.layers[l];
  LayerActs& a = layers_[l];
  bf16* x_out = l + 1 < c.num_layers ? layers_[l + 1].x_in : x_final_;
  const std::string site = "dropout.layer" + std::to_string(l) + ".";
  // Under sequence parallelism a norm runs on this rank's rows, and its output is all-gathered.
  norm_forward(a.x_in, W.ln1_w, W.ln1_b, sp_ ? sp_local_ : a.ln1, a.ln1_mean, a.ln1_rstd);
  phase(kNorms);
  if (sp_) sp_gather(sp_local_, a.ln1), phase(kCommunication);
  linear_forward(a.ln1, W.qkv_w, W.qkv_b, a.qkv, h, c.qkv_width());
  phase(kAttentionGemms);
  // QK layernorm (Qwen3): q and k heads RMS-normalised into qkv_attn (v copied), before RoPE (in
  // the same pass when rope_in_qk_norm_).
  if (c.qk_layernorm)
    kc::qk_rmsnorm_forward(a.qkv, P(W.q_norm), P(W.k_norm), a.qkv_attn, a.qk_rstd, T, c.heads, c.query_groups, D,
                           c.norm_eps, c.zero_centered_gamma, stream_, rope_in_qk_norm_ ? &rope_ : nullptr, s_,
                           qkv_rows_);
  // RoPE rotates q and k of qkv_attn in place: nothing later needs them unrotated (the QKV GEMM's
  // backward reads ln1, the QK norm's backward the un-normalised qkv, attention's backward the
  // rotated values).
  if (rope_.rot_dim > 0 && !rope_in_qk_norm_)
    kc::rope_forward_qkv(a.qkv_attn, rope_, b_, s_, c.heads, c.query_groups, D, stream_);
  phase(kQkNormRope);
  const auto attn_drop = attention_dropout(site + "probs." + call);
  if (attention_ == AttentionPath::Cudnn)
    cudnn_attention_->forward(a.qkv_attn, a.ctx, a.lse, b_);
  else if (attention_ == AttentionPath::Flash)
    kc::attention_flash_forward(a.qkv_attn, a.ctx, a.lse, shape, attn_drop, stream_);
  else
    kc::attention_unfused_forward(gemm_, a.qkv_attn, a.ctx, a.attn, attn_scratch_, shape, attn_drop, stream_);
  phase(kAttention);
  // The branch and the residual: one GEMM (beta = 1) without dropout, else dropout then the add.
  const auto drop1 = hidden_dropout(site + "attention." + call);
  if (tensor_parallel()) {
    row_parallel_residual(a.ctx, W.proj_w, W.proj_b, c.heads * D, a.x_in, a.x_mid, drop1, kAttentionGemms);
  } else if (drop1.p > 0) {
    linear_forward(a.ctx, W.proj_w, W.proj_b, branch_, c.heads * D, h);
    kc::residual_dropout_add(branch_, a.x_in, a.x_mid, T * h, drop1, stream_);
  } else {
    linear_forward(a.ctx, W.proj_w, W.proj_b, a.x_mid, c.heads * D, h, a.x_in);
  }
  phase(kAttentionGemms);
  norm_forward(a.x_mid, W.ln2_w, W.ln2_b, sp_ ? sp_local_ : a.ln2, a.ln2_mean, a.ln2_rstd);
  phase(kNorms);
  if (sp_) sp_gather(sp_local_, a.ln2), phase(kCommunication);
  if (c.is_moe_layer(l)) {  // Megatron-Core's MoELayer in place of the MLP
    using Pass = CudaMoeLayers::Pass;
    const Pass pass = !training_forward_ ? Pass::Evaluation : recomputing_ ? Pass::Recompute : Pass::Training;
    const kc::DropoutSpec drop = hidden_dropout(site + "mlp." + call);
    if (tensor_parallel()) {  // this rank's share of every expert's output, summed into its rows
      moe_->forward(l, moe_context(W), a.ln2, branch_, T, pass, logit_keys_ + l);
      phase(kMoe);
      sum_partial_residual(a.x_mid, x_out, drop);
    } else if (drop.p > 0) {
      moe_->forward(l, moe_context(W), a.ln2, branch_, T, pass, logit_keys_ + l);
      phase(kMoe);
      kc::residual_dropout_add(branch_, a.x_mid, x_out, T * h, drop, stream_);
      phase(kResidual);
    } else {  // the residual add inside the MoE layer's combine
      moe_->forward(l, moe_context(W), a.ln2, x_out, T, pass, logit_keys_ + l, a.x_mid);
      phase(kMoe);
    }
    return;
  }
  if (c.activation == Activation::SwiGLU) {
    linear_forward(a.ln2, W.fc1_w, W.fc1_b, a.u, h, 2 * c.ffn);
    phase(kMlpGemms);
    kc::swiglu_forward(a.u, a.g, T, c.ffn, stream_);
  } else if (gelu_epilogue_) {  // u = fc1's output with its bias, g = gelu(u), in one GEMM
    gemm_.linear_forward_gelu(a.ln2, P(W.fc1_w), P(W.fc1_b), a.g, a.u, T, h, c.ffn, stream_);
    phase(kMlpGemms);
  } else if (c.activation == Activation::GeluErf) {  // F.gelu(fc1(x)): the linear adds its bias
    linear_forward(a.ln2, W.fc1_w, W.fc1_b, a.u, h, c.ffn);
    phase(kMlpGemms);
    kc::bias_gelu_forward(a.u, zero_bias_.as<bf16>(), a.g, T, c.ffn, stream_, true);
  } else {
    // fc1 without its bias; the fused bias-GeLU adds it (Megatron's bias_gelu fusion).
    linear_forward(a.ln2, W.fc1_w, -1, a.u, h, c.ffn);
    phase(kMlpGemms);
    kc::bias_gelu_forward(a.u, W.fc1_b >= 0 ? P(W.fc1_b) : zero_bias_.as<bf16>(), a.g, T, c.ffn, stream_);
  }
  phase(kActivations);
  const auto drop2 = hidden_dropout(site + "mlp." + call);
  if (tensor_parallel()) {
    row_parallel_residual(a.g, W.fc2_w, W.fc2_b, c.ffn, a.x_mid, x_out, drop2, kMlpGemms);
  } else if (drop2.p > 0) {
    linear_forward(a.g, W.fc2_w, W.fc2_b, branch_, c.ffn, h);
    kc::residual_dropout_add(branch_, a.x_mid, x_out, T * h, drop2, stream_);
  } else {
    linear_forward(a.g, W.fc2_w, W.fc2_b, x_out, c.ffn, h, a.x_mid);
  }
  phase(kMlpGemms);
}

void CudaGptModel::backward() {
  if (!have_grad_logits_) throw Error("CudaGptModel::backward without a forward given the loss gradients");
  have_grad_logits_ = false;
  if (!backward_done_) enqueue_backward();  // else the step's graph already ran it
}

void CudaGptModel::enqueue_backward() {
  if (use_tree_) return enqueue_tree_backward();
  const auto& c = lc_;
  const int64_t T = b_ * s_, h = c.hidden, D = c.kv_channels;
  const std::string call = std::to_string(key_.call);
  // dx_ is the residual stream's gradient (rows_ rows); a row-parallel layer's output gradient is the
  // whole sequence's (all-gathered under SP), a column-parallel layer's input gradient is summed
  // over the group (sum_input_grad).
  auto whole_rows = [&](bf16* d) -> bf16* {
    if (!sp_) return d;
    sp_gather(d, dtmp_);
    return dtmp_;
  };

  backward_phase_ = true;
  phases_.begin(stream_);
  begin_backward();
  // The logits buffer holds the logits' gradient (written by the forward's cross entropy).
  linear_backward(xf_, layout_.output_w, -1, logits_, dnorm_, h, c.vocab);
  phase(kHead);
  layernorm_backward(sum_input_grad(), x_final_, layout_.final_w, layout_.final_b, xf_mean_, xf_rstd_, dx_, false,
                     fc2_bias_in_norm(c.num_layers - 1));
  phase(kNorms);
  for (const auto& r : head_ranges_) report_grads_ready(r);

  const kc::AttentionShape shape{b_, s_, c.heads, c.query_groups, D, 1.0f / std::sqrt(static_cast<float>(D)),
                                 key_start_};
  for (int64_t l = c.num_layers - 1; l >= 0; --l) {
    // Full recomputation: entering a chunk from its end, rebuild its layers' activations first.
    if (chunk_end_[l] == l) {
      recomputing_ = true;  // the MoE losses were counted by the forward
      for (int64_t j = chunk_start_[l]; j <= l; ++j) enqueue_layer_forward(j);
      recomputing_ = false;
    }
    const GptLayerOffsets& W = layout_.layers[l];
    LayerActs& a = layers_[l];
    const std::string site = "dropout.layer" + std::to_string(l) + ".";
    // MLP block: dx holds d(x_out), which the residual passes to x_mid unchanged.
    const auto drop2 = hidden_dropout(site + "mlp." + call);
    bf16* dbranch = dx_;
    if (drop2.p > 0) kc::dropout_apply(dx_, dbranch_, rows_ * h, drop2, stream_), dbranch = dbranch_;
    phase(kResidual);
    if (sp_) dbranch = whole_rows(dbranch), phase(kCommunication);
    if (c.is_moe_layer(l)) {
      // Under TP each rank's router gradient is a part (its experts' share), the losses' included:
      // finalize_grads sums them; dnorm_ is a part too, summed like the MLP's.
      moe_->backward(l, moe_context(W), a.ln2, dbranch, dnorm_, T,
                     moe_aux_loss_scale_ / static_cast<float>(tp_size_));
      phase(kMoe);
    } else if (gelu_epilogue_) {  // d(fc1 output) = (dbranch @ fc2_w) * gelu'(u) in one GEMM
      gemm_.linear_backward_input_dgelu(dbranch, P(W.fc2_w), a.u, dwide_, T, c.ffn, h, stream_);
      gemm_.linear_backward_weight(dbranch, a.g, G(W.fc2_w), T, c.ffn, h, stream_, accumulates(W.fc2_w));
      if (W.fc2_b >= 0 && !fc2_bias_in_norm(l)) kc::bias_grad(dbranch, G(W.fc2_b), reduce_scratch_, T, h, stream_);
      phase(kMlpGemms);
    } else {
      linear_backward(a.g, W.fc2_w, fc2_bias_in_norm(l) ? -1 : W.fc2_b, dbranch, dg_, c.ffn, h);
      phase(kMlpGemms);
      if (c.activation == Activation::SwiGLU)
        kc::swiglu_backward(a.u, dg_, dwide_, T, c.ffn, stream_);
      else if (c.activation == Activation::GeluErf)  // u holds fc1's bias already
        kc::bias_gelu_backward(dg_, a.u, zero_bias_.as<bf16>(), dwide_, T, c.ffn, stream_, true);
      else
        kc::bias_gelu_backward(dg_, a.u, W.fc1_b >= 0 ? P(W.fc1_b) : zero_bias_.as<bf16>(), dwide_, T, c.ffn,
                               stream_);
      phase(kActivations);
    }
    if (!c.is_moe_layer(l)) {
      linear_backward(a.ln2, W.fc1_w, W.fc1_b, dwide_, dnorm_, h, c.fc1_width());
      phase(kMlpGemms);
    }
    // dx = d(x_mid)
    layernorm_backward_into_residual(sum_input_grad(), a.x_mid, W.ln2_w, W.ln2_b, a.ln2_mean, a.ln2_rstd,
                                     proj_bias_in_norm(l));
    phase(kNorms);
    // Attention block.
    const auto drop1 = hidden_dropout(site + "attention." + call);
    dbranch = dx_;
    if (drop1.p > 0) kc::dropout_apply(dx_, dbranch_, rows_ * h, drop1, stream_), dbranch = dbranch_;
    phase(kResidual);
    if (sp_) dbranch = whole_rows(dbranch), phase(kCommunication);
    linear_backward(a.ctx, W.proj_w, proj_bias_in_norm(l) ? -1 : W.proj_b, dbranch, dctx_, c.heads * D, h);
    phase(kAttentionGemms);
    const auto attn_drop = attention_dropout(site + "probs." + call);
    // Split rows: cuDNN's gradient lands in dsplit_, and the QK norm's backward reads it there.
    const bool split = qkv_rows_ == kc::QkvRows::Split;
    if (attention_ == AttentionPath::Cudnn)
      cudnn_attention_->backward(a.qkv_attn, a.ctx, dctx_, a.lse, split ? dsplit_ : dwide_, b_);
    else if (attention_ == AttentionPath::Flash)
      kc::attention_flash_backward(a.qkv_attn, a.ctx, dctx_, a.lse, delta_, dwide_, shape, attn_drop, stream_);
    else
      kc::attention_unfused_backward(gemm_, dctx_, dwide_, a.attn, attn_scratch_, shape, attn_drop, stream_);
    phase(kAttention);
    if (rope_.rot_dim > 0 && !rope_in_qk_norm_)
      kc::rope_backward_qkv(dwide_, rope_, b_, s_, c.heads, c.query_groups, D, stream_);
    // dwide becomes d(qkv before the norm), in place (from dsplit_ with split rows); TP:
    // finalize_grads sums the norms' part.
    if (c.qk_layernorm)
      kc::qk_rmsnorm_backward(split ? dsplit_ : dwide_, a.qkv, P(W.q_norm), P(W.k_norm), a.qk_rstd, dwide_,
                              G(W.q_norm), G(W.k_norm), reduce_scratch_, T, c.heads, c.query_groups, D,
                              c.zero_centered_gamma, stream_, rope_in_qk_norm_ ? &rope_ : nullptr, s_, qkv_rows_);
    phase(kQkNormRope);
    linear_backward(a.ln1, W.qkv_w, W.qkv_b, dwide_, dnorm_, h, c.qkv_width());
    phase(kAttentionGemms);
    // dx = d(x_in)
    layernorm_backward_into_residual(sum_input_grad(), a.x_in, W.ln1_w, W.ln1_b, a.ln1_mean, a.ln1_rstd,
                                     fc2_bias_in_norm(l - 1));
    phase(kNorms);
    report_grads_ready(layer_ranges_[static_cast<size_t>(l)]);
  }
  // The embedding's gradient: the whole sequence's (the embedding was sliced under SP).
  bf16* demb = whole_rows(dx_);
  kc::dropout_apply(demb, demb, T * h, dropout(c.hidden_dropout, key_.seed, "dropout.embedding." + call), stream_);
  kc::embedding_backward(tokens_, demb, G(layout_.word_emb), T, h, c.vocab, emb_scratch_, emb_scratch_bytes_, stream_,
                         tp_rank_ * c.vocab);
  if (layout_.pos_emb >= 0)
    kc::embedding_backward(positions_, demb, G(layout_.pos_emb), T, h, c.max_positions, emb_scratch_,
                           emb_scratch_bytes_, stream_);
  phase(kEmbedding);
  writing_grads_ = false;
}

void CudaGptModel::report_grads_ready(std::pair<size_t, size_t> ranges) const {
  if (!grads_ready_) return;
  for (size_t i = ranges.first; i < ranges.second; ++i) grads_ready_(sync_ranges_[i].offset, sync_ranges_[i].count);
}

std::pair<double, double> CudaGptModel::take_loss_sum(const double* extra, double* extra_out) {
  double host[2];
  LAOYAO_CUDA_CHECK(cudaMemcpyAsync(host, loss_acc_.ptr, sizeof host, cudaMemcpyDeviceToHost, stream_));
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(loss_acc_.ptr, 0, sizeof host, stream_));
  if (extra) LAOYAO_CUDA_CHECK(cudaMemcpyAsync(extra_out, extra, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  kc::stream_wait(stream_, "the step (its loss)");
  report_phases();
  return {host[0], host[1]};
}

void CudaGptModel::report_phases() {
  const std::vector<double> ms = phases_.take();
  if (!phases_.enabled()) return;
  static const char* names[kPhaseKinds] = {
      "embedding",   "norms",      "attention GEMMs",   "QK norm+RoPE",     "attention",          "MLP GEMMs",
      "activations", "MoE layers", "output layer+loss", "residual/dropout", "TP/SP communication"};
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

std::vector<float> CudaGptModel::download_losses() const {
  std::vector<float> out(static_cast<size_t>(b_ * s_));
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  LAOYAO_CUDA_CHECK(cudaMemcpy(out.data(), losses_, sizeof(float) * out.size(), cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace laoyao::model
