// Megatron-Core's GPTModel on a GPU rank, with Megatron's --bf16 numerics: the rank's state on its
// device (bf16 weights, fp32 main parameters and fp32 gradient accumulation (main_grad), at the
// same offsets as the CPU model's, model/gpt_layout.hpp), and the module tree written once
// (model/mcore) run over the CUDA backend (model/cuda/cuda_backend.hpp) for each micro-batch. This
// class is what a step needs around the tree: the micro-batch's inputs staged in one copy, CUDA
// graphs of dropout-free steps, the step's first backward writing its GEMMs' gradients instead of
// zeroing them first, the --overlap-grad-reduce hook, finalize_grads, the MoE losses. One stream,
// no host synchronisation inside forward/backward; the same dropout masks as the CPU model (drawn
// per element from the same streams).
//
// Everything is allocated once, in the constructor, for micro-batches of up to max_b sequences of
// s tokens: the step itself allocates nothing.
//
// Supported so far: LayerNorm or RMSNorm, tanh-GeLU (Megatron's fused bias-GeLU), erf-GeLU (F.gelu)
// or SwiGLU, learned absolute or rotary positions (Llama 3 scaling included), QK layernorm with
// RMSNorm (Qwen3; head dims that are multiples of 8 up to 256), tied or untied output layer, biases
// on or off, MHA or GQA, hidden and attention dropout; cuDNN's fused attention, our flash kernels (head dims 64, 128)
// or the unfused path, by --attention-backend (gpt_config.hpp); Mixture-of-Experts layers
// (model/cuda/moe_layers_cuda.hpp; expert-parallel over GPU ranks, with or without tensor
// parallelism); FP8 linear layers (model/cuda/fp8_linears_cuda.hpp; the weights cast again on a
// step's first micro-batch, MicroBatch::is_first_microbatch).
// cuda_unsupported_features() (model/cuda/cuda_backend.hpp) names what is not (QK-norm head dims and RMSNorm widths its kernels
// cannot pack).
//
// Tensor parallelism (a group of several GPU ranks, NCCL): each rank holds Megatron-Core's shards
// (model/gpt_tp.hpp: its heads, ffn columns and vocabulary rows), as the CPU model does, and sums
// over the group where Megatron-Core's layers do: the row-parallel outputs and the column-parallel
// input gradients (bf16 all-reduce), the embedding (vocabulary-parallel), the cross entropy
// (each shard's lse and target logit, all-gathered). With sequence parallelism the norms, dropout
// and residual adds run on the rank's share of every sequence, between an all-gather and a
// reduce-scatter. Dropout masks are the whole model's, sliced, so any TP size draws the masks of
// one rank. Steps under TP run eagerly (no CUDA graphs yet).
//
// Context parallelism (a group of CP ranks): each rank holds every weight and its two chunks of each
// sequence (Megatron's split); the rotary table is uploaded in the rank's token order, so every
// kernel's position t % s is the token's place; attention meets the whole sequences' keys through
// kernels/cuda/attention_cudnn_cp.hpp (cuDNN only; --cp-comm-type p2p's ring or all_gather); MoE
// layers route each rank's tokens, their aux losses counting the CP group's; the gradients stay
// this rank's share, summed over the dp_cp group by the trainer. No dropout or documents so far
// (cuda_unsupported_features names the rest); steps under CP run eagerly.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/runtime_options.hpp"
#include "dist/process_group.hpp"
#include "kernels/cuda/attention_cudnn.hpp"
#include "kernels/cuda/attention_cudnn_cp.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"
#include "kernels/cuda/rope.hpp"
#include "model/gpt_config.hpp"
#include "model/gpt_layout.hpp"
#include "model/gpt_model.hpp"
#include "model/cuda/cuda_backend.hpp"
#include "model/cuda/moe_layers_cuda.hpp"
#include "model/mcore/gpt_model.hpp"

namespace laoyao::model {

// CudnnCpAttention's exchanges over a context-parallel group on `stream` (ring: p2p's ring too).
kernels::cuda::CpCollectives cp_collectives(dist::ProcessGroup* group, cudaStream_t stream, bool ring);

class CudaGptModel {
 public:
  using bf16 = __nv_bfloat16;
  // Uses the current device. Throws laoyao::Error (naming the feature) for an unsupported config.
  // tp: the tensor-parallel group (GPU ranks: make_gpu_process_group; nullptr or one rank: the
  // whole model here).
  // ep: the expert-parallel group of an MoE model (cfg.moe.expert_parallel ranks; the table then
  // holds this rank's experts only, model/gpt_ep.hpp). With both, each rank holds its TP share of
  // its EP rank's experts (Megatron's expert tensor parallelism = TP).
  // Whole experts under TP (expert TP size 1): the EP group, if any, is folded across the TP
  // ranks, EP consecutive ranks. EP a multiple of TP (each EP group whole TP groups): the ranks
  // holding the same experts lie across the data-parallel ranks, whose expert reduction is the
  // trainer's (GptModel::expert_dp_group). EP a divisor of TP (EP groups inside a TP group):
  // same_experts is the group of the ranks holding this rank's experts (GptModel::
  // folded_expert_dp_group), over which finalize_grads sums their gradients.
  // cp: the context-parallel group (nullptr or one rank: none); s is then this rank's tokens of a
  // sequence (its two chunks, kernels/cuda/attention_cudnn_cp.hpp), and the micro-batches are its
  // chunks (train/data_pipeline.hpp context_parallel_chunks).
  CudaGptModel(const GptConfig& cfg, int64_t max_b, int64_t s, dist::ProcessGroup* tp = nullptr,
               dist::ProcessGroup* ep = nullptr, dist::ProcessGroup* same_experts = nullptr,
               dist::ProcessGroup* cp = nullptr);
  ~CudaGptModel();
  CudaGptModel(const CudaGptModel&) = delete;
  CudaGptModel& operator=(const CudaGptModel&) = delete;

  const GptConfig& config() const { return cfg_; }
  // This rank's shapes (heads, query groups, ffn and vocabulary divided by the TP size).
  const GptConfig& local_config() const { return lc_; }
  dist::ProcessGroup* tp_group() const { return tp_size_ > 1 ? tp_ : nullptr; }
  // The groups the model is split over (tensor parallelism, then expert parallelism; none when
  // whole; with whole experts under TP and EP the larger of the two, which holds the other): the
  // model's norms and zero counts are each rank's counted_flags() parameters summed over the
  // first, then the second.
  const std::vector<dist::ProcessGroup*>& split_groups() const { return split_groups_; }
  // Whether this rank counts parameter p in the model's norms and zero counts: among its
  // tensor-parallel group a split tensor everywhere and a replicated one on TP rank 0; with
  // across_ep among its expert-parallel group too, a rank's experts everywhere and the rest on EP
  // rank 0 (whole experts under TP: on the EP group's first TP group, or with EP groups inside a
  // TP group the experts on its first EP group); a buffer (a router's expert_bias) nowhere.
  bool counts(const ParamSpec& p, bool across_ep) const;
  // One flag per parameter, counts(p, true); nullptr when whole and without buffers.
  const uint8_t* counted_flags() const { return counted_.bytes ? counted_.as<uint8_t>() : nullptr; }
  // After a step's micro-batches: sums over the tensor-parallel group the gradients each rank
  // holds only a part of (the QK-norm weights, which serve every head; with sequence parallelism
  // the norms' weights and biases), and whole experts' over the ranks holding the same experts
  // where the trainer does not (without EP, or with EP groups inside a TP group). Enqueued on
  // stream(); nothing to do without TP.
  void finalize_grads();
  // Gradients reduced while the backward runs (--overlap-grad-reduce): with a hook set, backward()
  // reports each range [offset, offset + count) of main_grads() once this micro-batch's backward has
  // finished writing it, on stream() in order (the final norm and an untied output layer first,
  // then each transformer layer, last to first); the hook enqueues what it likes after them. The
  // ranges are grad_sync_ranges(); the rest (the embeddings) is final when backward() returns.
  // Under expert parallelism the routed experts are left out of the ranges (another group's).
  // Steps with a hook run eagerly (no CUDA graph).
  using GradsReady = std::function<void(int64_t offset, int64_t count)>;
  void set_grads_ready_hook(GradsReady hook) { grads_ready_ = std::move(hook); }
  struct Range {
    int64_t offset, count;
  };
  const std::vector<Range>& grad_sync_ranges() const { return sync_ranges_; }
  const ParameterTable& table() const { return layout_.table; }
  int64_t num_parameters() const { return layout_.table.total; }
  // The trained parameters: all of them, or PEFT's adapters after the frozen base (the gradients'
  // size; they start at the table's trainable_offset).
  int64_t num_trainable() const { return layout_.table.trainable(); }
  cudaStream_t stream() const { return stream_; }

  // fp32 main parameters and gradients of the trained parameters (device pointers at table offset -
  // trainable_offset: PEFT's frozen base has its bf16 weights alone), bf16 model parameters (table
  // offsets).
  float* main_params() { return main_.as<float>(); }
  float* main_grads() { return grads_.as<float>(); }
  bf16* params() { return params_.as<bf16>(); }

  // Copies host fp32 weights in as the main parameters and makes the bf16 copy (synchronous): all
  // of them, or `count` of them at `offset` (a model filled a piece at a time). The frozen base's
  // are rounded to bf16 on the way and read back as those bf16 values.
  void upload_weights(const float* host);
  void upload_weights(const float* host, int64_t offset, int64_t count);
  void download_weights(float* host) const;
  void download_weights(float* host, int64_t offset, int64_t count) const;  // (any thread)
  void download_grads(float* host) const;
  // Starts a step's gradients at zero. Lazily: the next backward writes the weight gradients its
  // GEMMs compute (beta 0, so they are neither zeroed nor read first) and zeroes only the others
  // (norms, biases, embeddings) before it; finalize_grads() and download_grads() see zeros when no
  // backward ran.
  void zero_grads();

  // Forward of one micro-batch (b <= max_b sequences of exactly s tokens): per-token losses stay on
  // the device; sum(loss * loss_mask) and sum(loss_mask) are added to the running loss sum. With
  // the per-token loss gradients dloss[b*s] (host; known before the forward: Megatron's mask over
  // the token count), the cross entropy also writes the logits' gradient, ready for backward().
  void forward(const MicroBatch& mb, const float* loss_mask, const DropoutKey& key, const float* dloss = nullptr);
  // Backward of the last forward (which was given dloss), accumulating into main_grads() (the first
  // after zero_grads() writes them).
  void backward();
  // The running (masked loss sum, mask sum) since the last call; synchronises the stream. With
  // `extra` (a device double), *extra_out gets its value in the same wait.
  std::pair<double, double> take_loss_sum(const double* extra = nullptr, double* extra_out = nullptr);
  // Per-token losses of the last forward (synchronises; for tests).
  std::vector<float> download_losses() const;

  // Mixture of Experts: the gradient each load-balancing / z loss gets (Megatron's
  // MoEAuxLossAutoScaler, 1 / num_microbatches), and the training forwards' losses since the last
  // take (as GptModel::take_moe_losses; synchronises the stream).
  void set_moe_aux_loss_scale(float scale);
  GptModel::MoeLosses take_moe_losses();
  // Multi-token prediction: each layer's training forwards' losses since the last take (as
  // GptModel::take_mtp_losses; synchronises the stream); empty without MTP layers.
  std::vector<double> take_mtp_losses();
  void set_mtp_loss_scale(const MtpLossScale& scale);
  // After a step's micro-batches (GptModel::finish_moe_step): aux-loss-free balancing moves the
  // routers' expert biases by the training tokens counted over dp (null: this rank's), and
  // global_aux_loss's running counts start over.
  void finish_moe_step(dist::ProcessGroup* dp);
  // The data-parallel group MoE's global_aux_loss sums its tokens per expert over (null: one rank;
  // GptModel::set_data_parallel_group), before the first step; under FP8 delayed scaling after
  // set_fp8_amax_group, whose group must hold it.
  void set_data_parallel_group(dist::ProcessGroup* dp);
  // FP8 delayed scaling's amax reduction group (GptModel::set_fp8_amax_group; null or one rank:
  // none), before the first step. Its all-reduce runs inside the step, which then runs without
  // CUDA graphs (a captured collective is not checked here).
  void set_fp8_amax_group(dist::ProcessGroup* group);

  // "cudnn", "flash" or "unfused": the attention path in use.
  const char* attention_path() const;
  // How q, k and v reach cuDNN's attention: split rows (GQA with the QK norm) or fused.
  kernels::cuda::QkvRows qkv_rows() const { return qkv_rows_; }
  // The projection's and fc2's bias gradients come from the norms' backward (bias_grad_in_norm_).
  bool bias_grad_in_norm() const { return bias_grad_in_norm_; }
  // Bytes of device memory this model holds.
  size_t device_bytes() const;
  // The FP8 linear layers' state (null without GptConfig::fp8; tests read their scaling).
  const CudaFp8Linears* fp8_linears() const { return backend_->fp8_linears(); }

 private:
  bool tensor_parallel() const { return tp_size_ > 1; }
  float* G(int64_t off) {
    return off >= 0 && off >= layout_.table.trainable_offset ? main_grads() + (off - layout_.table.trainable_offset)
                                                               : nullptr;
  }
  // Picks the attention path for --attention-backend (and builds cuDNN's plans when it is cuDNN);
  // throws UsageError where the backend asked for cannot serve the model.
  void init_attention(const kernels::cuda::AttentionShape& shape);
  void init_mla_attention(kernels::cuda::AttentionShape shape);  // multi-latent attention's (cuDNN's)
  // cuDNN's attention, over split rows where it can (and allow_split).
  void make_cudnn_attention(const kernels::cuda::AttentionShape& shape, bool allow_split);
  // The staged micro-batch as the module tree sees it.
  mcore::Step tree_step(bool train_step) const;
  // Every kernel of the forward (and the backward) of the staged micro-batch, on stream_: the
  // module tree (model/mcore) over backend_.
  void enqueue_forward(bool with_loss_grad);
  void enqueue_backward();
  // A backward's start: the step's first (writing_grads_) zeroes what its GEMMs do not write.
  void begin_backward();
  cudaGraphExec_t capture(const std::function<void()>& enqueue);
  void drop_graphs();
  void zero_grads_now();
  void report_grads_ready(std::pair<size_t, size_t> ranges) const;

  GptConfig cfg_, lc_;  // the model, and this rank's part of it
  dist::ProcessGroup* tp_ = nullptr;
  int64_t tp_size_ = 1, tp_rank_ = 0;
  dist::ProcessGroup* ep_ = nullptr;  // expert parallelism over several ranks, or null
  std::vector<dist::ProcessGroup*> split_groups_;  // TP (when several ranks), then EP (when there is one)
  bool sp_ = false;  // sequence parallelism
  bool folded_ = false;  // whole routed experts under TP (expert TP size 1)
  GptParameterLayout layout_;
  int64_t max_b_, s_, b_ = 0;  // b_: sequences in the last forward
  int64_t rows_ = 0;           // rows of the residual stream on this rank: b_ * s_, or its share under SP
  cudaStream_t stream_ = nullptr;
  kernels::cuda::CublasLtGemm gemm_;
  kernels::cuda::DeviceBuffer main_, grads_, params_;
  kernels::cuda::DeviceBuffer acts_;      // the losses and the inputs, carved below
  kernels::cuda::DeviceBuffer loss_acc_;  // 2 doubles
  kernels::cuda::DeviceBuffer rope_table_;  // cos then sin, [max_positions, rot_dim / 2] each
  kernels::cuda::RopeDeviceTable rope_;     // rot_dim 0: no rotary embeddings
  bool rope_in_qk_norm_ = false;            // the QK norm applies RoPE in its pass (rope_pack.cuh)
  // How the QK norm hands q, k and v to cuDNN: fused as the QKV GEMM writes them, or split for
  // cuDNN's GQA.
  kernels::cuda::QkvRows qkv_rows_ = kernels::cuda::QkvRows::Fused;
  float* losses_ = nullptr;
  using AttentionPath = CudaAttentionPath;
  AttentionPath attention_ = AttentionPath::Unfused;
  std::unique_ptr<kernels::cuda::CudnnAttention> cudnn_attention_;  // its plans and workspace
  // Context parallelism: the group, and the attention over the whole sequences' keys.
  dist::ProcessGroup* cp_ = nullptr;
  dist::ProcessGroup* fp8_amax_group_ = nullptr;  // FP8 delayed scaling's amax reduction, or null
  std::unique_ptr<kernels::cuda::CudnnCpAttention> cp_attention_;
  kernels::cuda::DeviceBuffer counted_;
  std::vector<Range> tp_summed_;  // the gradients finalize_grads sums over the TP group
  // Whole experts whose other holders share this rank's TP group (without EP: the TP group; with
  // EP groups inside a TP group: the constructor's same_experts), and the experts' gradients
  // finalize_grads sums over them.
  dist::ProcessGroup* same_experts_ = nullptr;
  std::vector<Range> same_experts_summed_;
  // The micro-batch inputs, one contiguous device span (tokens, labels, positions, key_start, mask, dloss)
  // filled by one copy from one of two pinned host slots; a slot is rewritten only once the copy
  // from it (two micro-batches back) has run, so the host never waits on the current step.
  int64_t *tokens_ = nullptr, *labels_ = nullptr, *positions_ = nullptr;
  int32_t* key_start_ = nullptr;  // with document_attention: each query's first key, else null
  // With document_attention through cuDNN: the micro-batch's documents as a list (documents_: its
  // bucket, kernels/cuda/attention_cudnn.hpp), their first tokens and lengths (capacity: the
  // bucket of T documents), built on the host from key_start.
  int64_t* doc_start_ = nullptr;
  int32_t* doc_length_ = nullptr;
  int64_t documents_ = 0;
  std::vector<int64_t> doc_start_host_;
  std::vector<int32_t> doc_length_host_;
  float *mask_ = nullptr, *dloss_ = nullptr;
  // Multi-token prediction layer k's inputs (model/mtp_inputs.hpp: rolled on the host, staged with
  // the micro-batch's), its per-token losses, and the sum of its training forwards' masked means
  // (scaled as the main loss) that take_mtp_losses() reads.
  struct MtpBuffers {
    int64_t *tokens = nullptr, *positions = nullptr, *labels = nullptr;
    float *mask = nullptr, *dloss = nullptr, *losses = nullptr;
  };
  std::vector<MtpBuffers> mtp_;
  std::vector<MtpLayerInputs> mtp_host_;
  double* mtp_acc_ = nullptr;  // [mtp_num_layers]
  MtpLossScale mtp_scale_;
  // [layer_count] --moe-router-force-load-balancing's streams of this micro-batch (MTP layers' too)
  uint64_t* logit_keys_ = nullptr;
  size_t inputs_bytes_ = 0;
  kernels::cuda::PinnedHostBuffer staging_[2];
  cudaEvent_t staged_[2] = {nullptr, nullptr};
  int next_slot_ = 0;
  DropoutKey key_{};
  bool have_grad_logits_ = false;
  bool backward_done_ = false;  // the forward's graph ran the backward too
  // CUDA graphs of dropout-free steps, by (sequences, with backward); null: warmed up, not captured.
  // LAOYAO_CUDA_GRAPHS=0 turns them off.
  bool graphs_enabled_ = true;
  // GeLU MLPs: fc1's GEMM applies the GeLU and keeps its input (cuBLASLt's GELU_AUX epilogue), fc2's
  // input-gradient GEMM applies its derivative (DGELU); LAOYAO_GELU_EPILOGUE=0 runs our fused
  // bias-GeLU kernels instead.
  bool gelu_epilogue_ = false;
  // The projection's and fc2's bias gradients are the column sums of the residual stream's gradient
  // (no hidden dropout, whole rows: no sequence parallelism), which the norms' backward kernels sum
  // as they write it, instead of bias_grad reading it again. LAOYAO_BIAS_GRAD_IN_NORM=0 reads again.
  bool bias_grad_in_norm_ = false;
  // Keyed by (sequences, documents bucket, with backward, the backward writes the gradients: the
  // step's first, FP8 weights cast again: the first micro-batch of a step or evaluation).
  std::map<std::tuple<int64_t, int64_t, bool, bool, bool>, cudaGraphExec_t> graphs_;
  bool first_microbatch_ = true;  // the staged micro-batch's MicroBatch::is_first_microbatch
  // zero_grads() was called and no backward has run since; writing_grads_: the backward being
  // enqueued is that first one. writers_: model/gpt_layout.hpp's gradient_writers, the parameters
  // whose gradients the GEMMs write and the ranges a writing backward zeroes first.
  bool fresh_grads_ = true, writing_grads_ = false;
  GradientWriters writers_;
  // Mixture of Experts: the MoE layers' kernels and buffers (null for a dense model).
  std::unique_ptr<CudaMoeLayers> moe_;
  float moe_aux_loss_scale_ = 1.0f;
  // The model written once (model/mcore) over the CUDA backend, which runs its ops on the state
  // above (declared last: built last, destroyed first).
  std::unique_ptr<CudaBackend> backend_;
  std::unique_ptr<mcore::GPTModel> tree_;
  // --overlap-grad-reduce: the hook, and the parameter ranges it is given: the head's (final norm,
  // untied output layer) then each layer's, as index ranges into sync_ranges_.
  GradsReady grads_ready_;
  std::vector<Range> sync_ranges_;
  std::vector<std::pair<size_t, size_t>> head_ranges_;   // [begin, end) into sync_ranges_
  std::vector<std::pair<size_t, size_t>> layer_ranges_;  // per layer
};

}  // namespace laoyao::model
