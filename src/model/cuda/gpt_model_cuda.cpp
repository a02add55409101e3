#include "model/cuda/gpt_model_cuda.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/safetensors.hpp"
#include "core/runtime_options.hpp"
#include "kernels/cuda/attention_flash.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/optimizer.hpp"
#include "kernels/cuda/rope.hpp"
#include "kernels/cuda/stream_wait.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/cuda/carver.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_tp.hpp"
#include "model/rotary.hpp"

namespace laoyao::model {

namespace kc = laoyao::kernels::cuda;

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

kc::CpCollectives cp_collectives(dist::ProcessGroup* group, cudaStream_t stream, bool ring) {
  using bf16 = __nv_bfloat16;
  kc::CpCollectives comm;
  comm.all_gather = [group, stream](const bf16* send, bf16* recv, size_t n) {
    group->all_gather_device(send, recv, n, dist::DeviceType::BF16, stream);
  };
  comm.reduce_scatter = [group, stream](const bf16* send, bf16* recv, size_t n) {
    group->reduce_scatter_device(send, recv, n, dist::DeviceType::BF16, stream);
  };
  if (ring) {  // an all-to-all whose only counts are the next rank's (send) and the previous one's (receive)
    const size_t size = static_cast<size_t>(group->size()), rank = static_cast<size_t>(group->rank());
    const size_t next = (rank + 1) % size, previous = (rank + size - 1) % size;
    // The counts, made once: a step's exchanges only set the two that move.
    auto counts = std::make_shared<std::pair<std::vector<size_t>, std::vector<size_t>>>(std::vector<size_t>(size, 0),
                                                                                       std::vector<size_t>(size, 0));
    comm.ring = [group, counts, next, previous](const bf16* send, bf16* recv, size_t n, cudaStream_t on) {
      auto& [sends, recvs] = *counts;
      sends[next] = n, recvs[previous] = n;
      group->all_to_all_device(send, sends.data(), recv, recvs.data(), dist::DeviceType::BF16, on, false);
    };
  }
  return comm;
}

CudaGptModel::CudaGptModel(const GptConfig& cfg, int64_t max_b, int64_t s, dist::ProcessGroup* tp,
                           dist::ProcessGroup* ep, dist::ProcessGroup* same_experts, dist::ProcessGroup* cp)
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
  cp_ = group_size(cp) > 1 ? cp : nullptr;
  if (group_size(cp) != std::max<int64_t>(cfg.context_parallel, 1))
    throw Error("CudaGptModel: a context-parallel group of " + std::to_string(group_size(cp)) +
                " ranks for a model configured for " + std::to_string(cfg.context_parallel));
  // A rank's two chunks of each sequence; cuDNN reads each chunk's statistics 16-byte aligned.
  if (cp_ && s % 8 != 0)
    throw UsageError("context parallelism on the GPU: a rank's " + std::to_string(s) + " tokens of each sequence "
                     "(the sequence length divided by the context-parallel size) must be a multiple of 8");
  if (sp_ && s % tp_size_ != 0)
    throw UsageError("sequence parallelism splits each sequence over the tensor-parallel ranks: the sequence "
                     "length (" + std::to_string(s) + ") must be divisible by the tensor-parallel size (" +
                     std::to_string(tp_size_) + ")");
  if (cfg.positions != Positions::None && s > cfg.max_positions)
    throw Error("CudaGptModel: sequence length " + std::to_string(s) + " exceeds the " +
                std::to_string(cfg.max_positions) + " positions of the position table");
  LAOYAO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (cfg.positions == Positions::Rope) {  // the CPU's table (Llama 3 scaling, YaRN and all), uploaded once
    const kernels::cpu::RopeTable table = rotary_table(cfg);
    std::vector<float> cos_sin = table.cos;
    cos_sin.insert(cos_sin.end(), table.sin.begin(), table.sin.end());
    int64_t positions = table.max_positions;
    if (cp_) {  // the table in this rank's token order: local token t rotates by its place's angles
      const int64_t half = table.rot_dim / 2, cp_rank = cp_->rank(), cp_size = cp_->size();
      if (s * cp_size > table.max_positions)
        throw Error("CudaGptModel: sequence length " + std::to_string(s * cp_size) + " exceeds the " +
                    std::to_string(table.max_positions) + " positions of the rotary table");
      cos_sin.assign(static_cast<size_t>(2 * s * half), 0.0f);
      for (int64_t t = 0; t < s; ++t) {
        const size_t from = static_cast<size_t>(cp_place(t, s, cp_rank, cp_size) * half), to = static_cast<size_t>(t * half);
        std::copy_n(table.cos.begin() + from, half, cos_sin.begin() + to);
        std::copy_n(table.sin.begin() + from, half, cos_sin.begin() + s * half + to);
      }
      positions = s;
    }
    rope_table_ = kc::DeviceBuffer(sizeof(float) * cos_sin.size());
    rope_table_.upload(cos_sin.data(), rope_table_.bytes);
    rope_ = {rope_table_.as<float>(), rope_table_.as<float>() + cos_sin.size() / 2, table.rot_dim, positions};
    // With QK layernorm the rotation joins the norm's pass where the pack kernels serve the table.
    rope_in_qk_norm_ = lc_.qk_layernorm && kc::rope_packable(rope_);
  }
  const int64_t N = num_parameters();
  // PEFT's frozen base keeps its bf16 weights alone: no fp32 main copy, no gradients (an 8B base
  // would hold 32 GB of main weights that never change).
  main_ = kc::DeviceBuffer(sizeof(float) * num_trainable());
  grads_ = kc::DeviceBuffer(sizeof(float) * num_trainable());
  params_ = kc::DeviceBuffer(sizeof(bf16) * N);
  loss_acc_ = kc::DeviceBuffer(2 * sizeof(double));
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(loss_acc_.ptr, 0, loss_acc_.bytes, stream_));

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
  const int64_t T = max_b * s, h = c.hidden;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.kv_channels));
  init_attention({max_b, s, c.heads, c.query_groups, c.kv_channels, scale});
  if (cp_) {
    if (attention_ != AttentionPath::Cudnn)
      throw UsageError("context parallelism on the GPU runs its attention through cuDNN's fused attention "
                       "(--attention-backend fused or auto), not " + std::string(attention_path()));
    cp_attention_ = std::make_unique<kc::CudnnCpAttention>(*cudnn_attention_, cp_->rank(), cp_->size(), stream_,
                                                            cp_collectives(cp_, stream_, c.cp_ring));
  }
  // The activations are the module tree's (carved from backend_'s arena); here the per-token losses
  // and the micro-batch's inputs, one span staged by one copy.
  auto carve = [&](Carver& a) {
    losses_ = a.take<float>(T);
    tokens_ = a.take<int64_t>(T);
    labels_ = a.take<int64_t>(T);
    positions_ = a.take<int64_t>(T);
    key_start_ = c.document_attention ? a.take<int32_t>(T) : nullptr;
    const bool doc_list = c.document_attention && attention_ == AttentionPath::Cudnn;
    doc_start_ = doc_list ? a.take<int64_t>(kc::documents_bucket(T) + 1) : nullptr;
    doc_length_ = doc_list ? a.take<int32_t>(kc::documents_bucket(T)) : nullptr;
    mask_ = a.take<float>(T);
    dloss_ = a.take<float>(T);
    mtp_.assign(static_cast<size_t>(c.mtp_num_layers), MtpBuffers{});
    for (MtpBuffers& m : mtp_) {
      m.tokens = a.take<int64_t>(T), m.positions = a.take<int64_t>(T), m.labels = a.take<int64_t>(T);
      m.mask = a.take<float>(T), m.dloss = a.take<float>(T);
    }
    logit_keys_ = a.take<uint64_t>(c.layer_count());  // staged with the inputs: last, inside their span
    for (MtpBuffers& m : mtp_) m.losses = a.take<float>(T);
    mtp_acc_ = a.take<double>(c.mtp_num_layers);
  };
  if (c.moe.num_experts > 0) {
    // Under TP (with SP) the layers see the whole sequence and hold their share of every expert
    // (under EP too: of every expert of this EP rank; the EP group gathers the ranks' sequences).
    // Under TP: token dropping within each rank's share of the sequence; whole experts take only
    // this rank's share's pairs.
    MoeSequenceShares shares;
    if (tensor_parallel()) shares = {tp_rank_, tp_size_, folded_};
    moe_ = std::make_unique<CudaMoeLayers>(c, T, s, ep_, shares);
    moe_->set_context_parallel_group(cp_);
  }
  Carver measure;
  carve(measure);
  acts_ = kc::DeviceBuffer(measure.used);
  Carver real{static_cast<char*>(acts_.ptr), 0};
  carve(real);
  inputs_bytes_ =
      static_cast<size_t>(reinterpret_cast<char*>(logit_keys_ + c.layer_count()) - reinterpret_cast<char*>(tokens_));
  mtp_host_.resize(mtp_.size());
  if (!mtp_.empty())
    LAOYAO_CUDA_CHECK(cudaMemsetAsync(mtp_acc_, 0, sizeof(double) * mtp_.size(), stream_));
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
  // (PEFT's few adapter gradients are reduced after the backward, whole.)
  if (!layout_.table.has_frozen()) {
    const size_t head_begin = sync_ranges_.size();
    group("decoder.final_layernorm.");
    if (layout_.output_w != layout_.word_emb) group("output_layer.");
    group("mtp.");  // (multi-token prediction's layers: their backward runs before the decoder's)
    head_ranges_.push_back({head_begin, sync_ranges_.size()});
    for (int64_t l = 0; l < lc_.num_layers; ++l)
      layer_ranges_.push_back(group("decoder.layers." + std::to_string(l) + "."));
  }

  // What finalize_grads sums over the tensor-parallel group: the QK norms serve every head, each
  // rank's heads gave a part; under SP each rank's rows gave a part of every norm's gradient; an
  // MoE router's gradient comes from each rank's share of the experts' outputs.
  if (tensor_parallel()) {
    auto sum = [&](int64_t off, int64_t n) {  // (PEFT's frozen base has no gradient to sum)
      if (off >= 0 && off >= layout_.table.trainable_offset) tp_summed_.push_back({off, n});
    };
    const int64_t D = lc_.kv_channels;
    for (const auto& L : layout_.layers) {
      sum(L.q_norm, D), sum(L.k_norm, D);
      sum(L.router_w, lc_.moe.num_experts * h);  // every rank routes the whole sequence, its share's part
      if (sp_) sum(L.ln1_w, h), sum(L.ln1_b, h), sum(L.ln2_w, h), sum(L.ln2_b, h);
    }
    if (sp_) sum(layout_.final_w, h), sum(layout_.final_b, h);
    for (const MtpOffsets& M : layout_.mtp)  // (their final norms see each rank's rows, as the decoder's)
      if (sp_) sum(M.final_w, h), sum(M.final_b, h);
    for (const auto& [off, n] : tp_partial_grads(layout_)) sum(off, n);
    // Whole experts without EP: each rank's experts saw its share's rows, summed over the TP group
    // (with EP groups of whole TP groups they saw every share's: the trainer's reduction sums them).
    if (folded_ && !ep_) same_experts_ = tp_;
  }
  if (same_experts_)
    for (const auto& p : layout_.table.specs)
      if (is_routed_expert(p.name) && p.offset >= layout_.table.trainable_offset)
        same_experts_summed_.push_back({p.offset, p.numel});

  // NCCL calls can be captured too, but the tensor-parallel step is not yet checked that way; the
  // expert-parallel step with the all-to-all dispatcher reads the token counts on the host inside
  // the step (the all-gather dispatcher's does not, moe_->graph_safe()); global_aux_loss's running
  // counts give each forward its own kernel argument; a graph's replay is not timed by
  // LAOYAO_MODEL_PHASES.
  const RuntimeOptions& options = runtime_options();
  graphs_enabled_ = options.cuda_graphs && !tensor_parallel() && !cp_ &&
                    (!ep_ || (moe_ && moe_->graph_safe())) && !(cfg.moe.global_aux_loss_coeff > 0) &&
                    !options.model_phases;
  // (FP8's GEMMs take no GeLU epilogue: an FP8 model runs the bias-GeLU kernels.)
  gelu_epilogue_ = lc_.activation == Activation::GeluTanh && lc_.ffn % 8 == 0 && options.gelu_epilogue && !lc_.fp8;
  bias_grad_in_norm_ = options.bias_grad_in_norm && !(lc_.hidden_dropout > 0) && !sp_ && !layout_.table.has_frozen();

  // The gradients a step's first backward writes with its GEMMs, and the ranges it zeroes first.
  writers_ = gradient_writers(layout_);
  zero_grads();
  {
    CudaBackendState state;
    state.stream = stream_;
    state.gemm = &gemm_;
    state.params = params();
    state.grads = main_grads();
    state.trainable_offset = layout_.table.trainable_offset;
    state.main = main_params();  // (MoE runs have no frozen base: table offsets)
    state.layout = &layout_;
    state.writers = &writers_;
    state.moe = moe_.get();
    state.logit_keys = logit_keys_;
    state.tp = tensor_parallel() ? tp_ : nullptr;
    state.tp_rank = tp_rank_, state.tp_size = tp_size_;
    state.sequence_parallel = sp_;
    state.rope = rope_;
    state.rope_in_qk_norm = rope_in_qk_norm_;
    state.qkv_rows = qkv_rows_;
    state.attention = attention_;
    state.cudnn = cudnn_attention_.get();
    state.cudnn_cp = cp_attention_.get();
    state.gelu_epilogue = gelu_epilogue_;
    state.norms_add_in_place = norms_add_in_place(lc_, layout_);
    state.bias_grad_in_norm = bias_grad_in_norm_;
    backend_ = std::make_unique<CudaBackend>(lc_, state, max_b, s);
    tree_ = std::make_unique<mcore::GPTModel>(cfg_, lc_, layout_, mcore::TensorParallel{tp_rank_, tp_size_, sp_},
                                              *backend_, /*recompute=*/true);
    tree_->allocate(max_b, s);  // once: a captured step replays these addresses; smaller batches use a prefix
    tree_->set_backward_hook([this](int64_t layer) {
      if (!grads_ready_ || layer_ranges_.empty()) return;
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
  return main_.bytes + grads_.bytes + params_.bytes + acts_.bytes + loss_acc_.bytes +
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
      cudnn_attention_ =
          std::make_unique<kc::CudnnAttention>(shape, stream_, kc::QkvRows::Split, c.document_attention);
      qkv_rows_ = kc::QkvRows::Split;
      return;
    } catch (const Error& e) {
      std::fprintf(stderr, "note: cuDNN has no engine for the split QKV rows (%s); gathering the query heads\n",
                   e.what());
    }
  }
  cudnn_attention_ = std::make_unique<kc::CudnnAttention>(shape, stream_, kc::QkvRows::Fused, c.document_attention);
  qkv_rows_ = kc::QkvRows::Fused;
}

void CudaGptModel::init_attention(const kc::AttentionShape& shape) {
  const GptConfig& c = lc_;
  if (c.mla) return init_mla_attention(shape);
  const std::string D = std::to_string(c.kv_channels);
  // LAOYAO_QKV_SPLIT=0 keeps cuDNN on the fused rows (to measure the split rows' difference).
  const bool allow_split = runtime_options().qkv_split;
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
    // cuDNN's unless dropout needs ours, documents (packed sequences) included: a packed fine-tuning
    // step through cuDNN's attention over documents is 1.04-1.06x our flash kernels' on an H100
    // (bench/finetune_bench.py, docs/benchmarks.md).
    case AttentionBackend::Auto:
      if (c.attention_dropout == 0 && kc::CudnnAttention::supports(shape)) {
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

// Multi-latent attention: cuDNN's fused attention over the separate query, key and value that
// mla_prepare writes (query and key heads of qk_head_dim + qk_pos_emb_head_dim values, value heads
// of v_head_dim), the softmax scale MLA's (YaRN's mscale in it). Our flash and unfused kernels take
// one head dim, so cuDNN is the only path (cuda_unsupported_features refused what it cannot take).
void CudaGptModel::init_mla_attention(kc::AttentionShape shape) {
  const GptConfig& c = lc_;
  const MlaSpec& m = *c.mla;
  if (c.attention_backend == AttentionBackend::Flash || c.attention_backend == AttentionBackend::Unfused)
    throw UsageError(std::string("--attention-backend ") +
                     (c.attention_backend == AttentionBackend::Flash ? "flash" : "unfused") +
                     ": multi-latent attention runs on the GPU through cuDNN's fused attention only (its query and "
                     "value head dims differ); use --attention-backend fused or auto");
  shape.G = shape.H;
  shape.D = m.q_head_dim();
  shape.Dv = m.v_head_dim;
  shape.scale = static_cast<float>(m.softmax_scale);
  cudnn_attention_ = std::make_unique<kc::CudnnAttention>(shape, stream_, kc::QkvRows::Separate);
  qkv_rows_ = kc::QkvRows::Separate;
  attention_ = AttentionPath::Cudnn;
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
  const int64_t base = layout_.table.trainable_offset, frozen_end = std::min(offset + count, base);
  if (offset < frozen_end) {  // the frozen base: rounded to bf16 here (as cast_to_bf16 rounds), copied as such
    std::vector<uint16_t> bits(static_cast<size_t>(frozen_end - offset));
#pragma omp parallel for schedule(static) if (bits.size() > (size_t{1} << 20))
    for (int64_t i = 0; i < frozen_end - offset; ++i) bits[static_cast<size_t>(i)] = f32_to_bf16(host[i]);
    LAOYAO_CUDA_CHECK(cudaMemcpyAsync(params() + offset, bits.data(), sizeof(uint16_t) * bits.size(),
                                      cudaMemcpyHostToDevice, stream_));
    LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream_));  // (bits is the host's until then)
  }
  const int64_t from = std::max(offset, base), n = offset + count - from;
  if (n > 0) {
    LAOYAO_CUDA_CHECK(cudaMemcpyAsync(main_params() + (from - base), host + (from - offset),
                                      sizeof(float) * static_cast<size_t>(n), cudaMemcpyHostToDevice, stream_));
    kc::cast_to_bf16(main_params() + (from - base), params() + from, n, stream_);
  }
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaGptModel::download_weights(float* host) const { download_weights(host, 0, num_parameters()); }

void CudaGptModel::download_weights(float* host, int64_t offset, int64_t count) const {
  if (offset < 0 || count < 0 || offset + count > num_parameters())
    throw Error("CudaGptModel::download_weights: " + std::to_string(count) + " weights at " + std::to_string(offset) +
                " of " + std::to_string(num_parameters()));
  kc::stream_wait(stream_, "the step before the weights are read");
  const int64_t base = layout_.table.trainable_offset, frozen_end = std::min(offset + count, base);
  if (offset < frozen_end) {  // the frozen base: its bf16 weights, widened
    std::vector<uint16_t> bits(static_cast<size_t>(frozen_end - offset));
    LAOYAO_CUDA_CHECK(cudaMemcpy(bits.data(), params_.as<bf16>() + offset, sizeof(uint16_t) * bits.size(),
                                 cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < bits.size(); ++i) host[i] = bf16_to_f32(bits[i]);
  }
  const int64_t from = std::max(offset, base), n = offset + count - from;
  if (n > 0)
    LAOYAO_CUDA_CHECK(cudaMemcpy(host + (from - offset), main_.as<float>() + (from - base),
                                 sizeof(float) * static_cast<size_t>(n), cudaMemcpyDeviceToHost));
}

void CudaGptModel::download_grads(float* host) const {
  kc::stream_wait(stream_, "the step before the gradients are read");
  if (fresh_grads_)  // zeroed lazily, not yet written
    std::fill(host, host + num_trainable(), 0.0f);
  else
    grads_.download(host, sizeof(float) * num_trainable());
}

void CudaGptModel::zero_grads() { fresh_grads_ = true; }

void CudaGptModel::zero_grads_now() {
  if (!fresh_grads_) return;
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(grads_.ptr, 0, grads_.bytes, stream_));
  fresh_grads_ = false;
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
  const int64_t reducing = fp8_amax_group_ ? fp8_amax_group_->size() : 1;
  if (lc_.fp8 && lc_.fp8->recipe == Fp8ScalingRecipe::Delayed && dp && dp->size() > reducing)  // (before any step)
    throw Error("CudaGptModel: FP8 delayed scaling over " + std::to_string(dp->size()) + " data-parallel ranks "
                "without an amax reduction group holding them (set_fp8_amax_group first)");
  if (moe_) moe_->set_data_parallel_group(dp);
}

void CudaGptModel::set_fp8_amax_group(dist::ProcessGroup* group) {
  fp8_amax_group_ = group && group->size() > 1 ? group : nullptr;
  backend_->set_fp8_amax_group(fp8_amax_group_);
  if (backend_->fp8_linears() && backend_->fp8_linears()->reduces_amaxes()) {
    graphs_enabled_ = false;
    drop_graphs();
  }
}

GptModel::MoeLosses CudaGptModel::take_moe_losses() { return moe_ ? moe_->take_losses(stream_) : GptModel::MoeLosses{}; }

void CudaGptModel::set_mtp_loss_scale(const MtpLossScale& scale) {
  if (scale.per_microbatch == mtp_scale_.per_microbatch && scale.per_token == mtp_scale_.per_token) return;
  mtp_scale_ = scale;
  drop_graphs();  // their logging kernels hold the old scale
}

std::vector<double> CudaGptModel::take_mtp_losses() {
  std::vector<double> out(mtp_.size());
  if (out.empty()) return out;
  LAOYAO_CUDA_CHECK(cudaMemcpyAsync(out.data(), mtp_acc_, sizeof(double) * out.size(), cudaMemcpyDeviceToHost, stream_));
  LAOYAO_CUDA_CHECK(cudaMemsetAsync(mtp_acc_, 0, sizeof(double) * out.size(), stream_));
  kc::stream_wait(stream_, "the multi-token prediction losses");
  return out;
}

void CudaGptModel::finalize_grads() {
  zero_grads_now();  // a step without a backward
  for (const auto& r : tp_summed_)
    tp_->all_reduce_device(G(r.offset), static_cast<size_t>(r.count), dist::DeviceType::F32, stream_);
  for (const auto& r : same_experts_summed_)
    same_experts_->all_reduce_device(G(r.offset), static_cast<size_t>(r.count), dist::DeviceType::F32, stream_);
}

void CudaGptModel::forward(const MicroBatch& mb, const float* loss_mask, const DropoutKey& key, const float* dloss) {
  const auto& c = lc_;
  if (mb.s != s_ || mb.b <= 0 || mb.b > max_b_)
    throw Error("CudaGptModel: micro-batch of " + std::to_string(mb.b) + "x" + std::to_string(mb.s) +
                " tokens, built for up to " + std::to_string(max_b_) + "x" + std::to_string(s_));
  b_ = mb.b;
  rows_ = sp_ ? b_ * s_ / tp_size_ : b_ * s_;
  key_ = key;
  first_microbatch_ = mb.is_first_microbatch;
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
    if (doc_start_) {
      documents_ = kc::fill_cudnn_documents(mb.key_start, b_, s_, doc_start_host_, doc_length_host_);
      stage(doc_start_, doc_start_host_.data(), sizeof(int64_t) * doc_start_host_.size());
      stage(doc_length_, doc_length_host_.data(), sizeof(int32_t) * doc_length_host_.size());
    }
  } else if (mb.key_start) {
    throw Error("CudaGptModel: a micro-batch with documents (key_start) for a model built without "
                "document_attention");
  }
  stage(mask_, loss_mask, sizeof(float) * T);
  if (dloss) stage(dloss_, dloss, sizeof(float) * T);
  // Multi-token prediction: the micro-batch rolled once more per layer; a training forward's loss
  // weights (GptModel::backward's, model/mtp_inputs.hpp).
  const double mtp_weight = mtp_.empty() ? 0.0
                                          : mtp_loss_weight(mtp_scale_, cfg_.mtp_loss_scaling_factor,
                                                            cfg_.mtp_num_layers, mtp_tokens(loss_mask, T));
  for (size_t k = 0; k < mtp_.size(); ++k) {
    MtpLayerInputs& in = mtp_host_[k];
    roll_mtp_inputs(in, b_, s_, mb.tokens, mb.positions, mb.labels, loss_mask, static_cast<int64_t>(k));
    stage(mtp_[k].tokens, in.tokens.data(), ids);
    stage(mtp_[k].positions, in.positions.data(), ids);
    stage(mtp_[k].labels, in.labels.data(), ids);
    stage(mtp_[k].mask, in.mask.data(), sizeof(float) * T);
    if (dloss) {
      set_mtp_loss_weights(in, mtp_weight);
      stage(mtp_[k].dloss, in.dloss.data(), sizeof(float) * T);
    }
  }
  if (c.moe.force_load_balancing)  // each MoE layer's random logits stream, read by the kernel on the device
    for (int64_t l = 0; l < c.layer_count(); ++l) {
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
  const bool dropout_now =
      key.training && (c.hidden_dropout > 0 || c.attention_dropout > 0 || (c.lora && c.lora->dropout > 0));
  if (graphs_enabled_ && !dropout_now && !grads_ready_) {
    const auto graph_key = std::make_tuple(b_, documents_, dloss != nullptr, dloss != nullptr && fresh_grads_,
                                           lc_.fp8 && first_microbatch_);
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
  if (cp_) st.batch.cp_rank = cp_->rank(), st.batch.cp_size = cp_->size();
  if (doc_start_) st.batch.documents = documents_, st.batch.doc_start = doc_start_, st.batch.doc_length = doc_length_;
  st.tokens = tokens_;
  st.labels = labels_;
  st.positions = layout_.pos_emb >= 0 ? positions_ : nullptr;
  st.seed = key_.seed;
  st.call = key_.call;
  st.training = key_.training;
  st.train_step = train_step;
  st.is_first_microbatch = first_microbatch_;
  for (const MtpBuffers& m : mtp_)
    st.mtp.push_back({m.tokens, m.positions, m.labels, m.losses, train_step ? m.dloss : nullptr});
  return st;
}

void CudaGptModel::enqueue_forward(bool with_loss_grad) {
  backend_->begin_phases(false);
  tree_->forward(tree_step(with_loss_grad), losses_, with_loss_grad ? dloss_ : nullptr);
  kc::masked_loss_sum(losses_, mask_, b_ * s_, loss_acc_.as<double>(), stream_);
  if (with_loss_grad)  // Megatron logs a training forward's MTP losses (GptModel::forward)
    for (size_t k = 0; k < mtp_.size(); ++k)
      kc::masked_mean_accumulate(mtp_[k].losses, mtp_[k].mask, b_ * s_, mtp_scale_.per_microbatch, mtp_acc_ + k,
                                 stream_);
}

void CudaGptModel::enqueue_backward() {
  backend_->begin_phases(true);
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
      LAOYAO_CUDA_CHECK(
          cudaMemsetAsync(main_grads() + r.offset, 0, sizeof(float) * static_cast<size_t>(r.count), stream_));
}

void CudaGptModel::backward() {
  if (!have_grad_logits_) throw Error("CudaGptModel::backward without a forward given the loss gradients");
  have_grad_logits_ = false;
  if (!backward_done_) enqueue_backward();  // else the step's graph already ran it
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
  backend_->report_phases();
  return {host[0], host[1]};
}

std::vector<float> CudaGptModel::download_losses() const {
  std::vector<float> out(static_cast<size_t>(b_ * s_));
  LAOYAO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  LAOYAO_CUDA_CHECK(cudaMemcpy(out.data(), losses_, sizeof(float) * out.size(), cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace laoyao::model
