// Megatron-Core's MoELayer on the GPU (dropless), for CudaGptModel's MoE layers: the router's GEMM
// and fused top-k, the load-balancing and z losses, the permutation, the routed experts as grouped
// GEMMs, the combine with the shared expert's output added. The same function as the CPU reference
// (kernels/cpu/moe.hpp's moe_layer_forward/backward) with bf16 activations and fp32 router math.
// Without expert parallelism there is no host synchronisation: the per-expert counts stay on the
// device.
//
// Expert parallelism (an EP group of P GPU ranks, model/gpt_ep.hpp): Megatron-Core's all-to-all
// token dispatcher. Each rank routes its tokens over all E experts; the counts are all-gathered
// and read on the host (the all-to-all's sizes: one synchronisation per layer and direction, as
// Megatron's dispatcher has), the rows for each rank's experts go there over NCCL, its El = E / P
// experts run on them in the order they arrive (source-major groups, moe_ep.hpp: no reorder), and
// the outputs go back. The backward sends the output gradients the same way and the input
// gradients back. A rank's own rows do not travel: the experts start on them (and on its own
// output gradients) while the other ranks' are on the way. The CPU stage
// (model/moe_expert_parallel.hpp) is the reference for the order of the rows.
// With --moe-token-dispatcher-type allgather (Megatron's default) the step has no host
// synchronisation (moe_gather_dispatch_cuda.cpp): every rank all-gathers the group's tokens, choices
// and probabilities, sorts the pairs of its own experts expert-major on the device, runs its experts
// on them and combines its share of every token; a reduce-scatter sums the shares back to the
// tokens' ranks. Each token crosses once per rank, not once per chosen expert.
//
// Whole experts under tensor parallelism (--expert-tensor-parallel-size 1, Megatron's "parallel
// folding"; the share given to the constructor): every TP rank routes the whole gathered sequence,
// as with split experts (the same losses), and only the pairs of its own sequence-parallel share go
// to the experts (its own, and under EP the group's, which is then the TP group); the other pairs
// get no row, so their outputs and probability gradients here are zero. The layer's output is this
// rank's share's rows, whole, plus the shared expert's partial sums: the reduce-scatter after the
// layer gives each rank its rows. model/moe_share_stage.hpp is the CPU reference.
//
// PEFT (LoRA, linear_fc1 / linear_fc2 targets, one rank's experts): the routed experts' shared
// adapter pair over every row of the grouped GEMMs and the shared expert's own pair; the frozen
// router and experts run no weight-gradient GEMM. Context parallelism: each rank routes its own
// tokens, the aux losses' tokens per expert summed over the CP group (set_context_parallel_group).
//
// One object serves all MoE layers of a model. It owns what each layer keeps for its backward
// (router logits and choices, the permutation, the experts' activations and outputs) and the
// scratch the layers share (the permuted input, which the backward permutes again rather than keep,
// and the backward's gradients). Sized once for up to max_tokens tokens a micro-batch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/runtime_options.hpp"
#include "dist/process_group.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm_cublaslt.hpp"
#include "kernels/cuda/grouped_gemm.hpp"
#include "kernels/cuda/moe.hpp"
#include "model/gpt_config.hpp"
#include "model/gpt_layout.hpp"
#include "model/gpt_model.hpp"
#include "model/cuda/fp8_linears_cuda.hpp"
#include "model/cuda/stream_timeline.hpp"

namespace laoyao::model {

// Under tensor parallelism (sequence parallel) each TP rank's share of every sequence (rank of
// ranks; {0, 1}: one rank): token dropping ranks the pairs within each share, as Megatron's
// router sees only its rank's share; with whole_experts (expert TP size 1) only this rank's
// share's pairs go to its experts.
struct MoeSequenceShares {
  int64_t rank = 0, ranks = 1;
  bool whole_experts = false;
};

class CudaMoeLayers {
 public:
  using bf16 = __nv_bfloat16;
  // Throws UsageError naming what the GPU path cannot do (more than kMoeMaxExperts experts, widths
  // that are not multiples of 8).
  // ep: the expert-parallel group (null or one rank: every expert here); cfg is this rank's config
  // (moe.expert_parallel = the group's size, its parameter table holding its experts only).
  // shares: under TP, this rank's share of each sequence (MoeSequenceShares).
  CudaMoeLayers(const GptConfig& cfg, int64_t max_tokens, int64_t seq_length, dist::ProcessGroup* ep = nullptr,
                MoeSequenceShares shares = {});
  CudaMoeLayers(const CudaMoeLayers&) = delete;
  CudaMoeLayers& operator=(const CudaMoeLayers&) = delete;

  // The operands of one layer's call: its parameter offsets, the bf16 parameters and fp32 main
  // gradients, the GEMM object and stream of the model; main: the fp32 main parameters, for the
  // router's expert_bias (a buffer kept in fp32, as Megatron's). accumulate_grads false (the step's
  // first backward): the weight-gradient GEMMs of the router, the experts and the shared expert
  // write their gradients instead of adding to them (CudaGptModel zeroes only the others).
  // trainable_offset: grads holds the parameters from that table offset on (PEFT's frozen base
  // before it has no gradient, and its weight-gradient GEMMs do not run).
  struct Context {
    const GptLayerOffsets& W;
    const bf16* params;
    float* grads;
    kernels::cuda::CublasLtGemm& gemm;
    cudaStream_t stream;
    const float* main = nullptr;
    bool accumulate_grads = true;
    int64_t trainable_offset = 0;
    // The backend's FP8 linears (null: none): where they run the layer's routed experts and shared
    // expert, those GEMMs are FP8 (one rank's experts, the one-exchange dispatcher).
    CudaFp8Linears* fp8 = nullptr;
    // The fp32 gradient of the parameter at table offset off; null when it has none.
    float* grad(int64_t off) const {
      return grads && off >= 0 && off >= trainable_offset ? grads + (off - trainable_offset) : nullptr;
    }
  };
  // What a forward is: a training one (its losses count in the training sums, global_aux_loss's
  // running counts take its tokens), the recomputation of one in the backward (the same losses'
  // gradients, nothing counted again), or an evaluation (no global_aux_loss: Megatron applies it in
  // training only).
  enum class Pass { Training, Recompute, Evaluation };
  // y[T, H] = the MoE layer l of x[T, H] (the pre-MLP norm's output), plus `residual` when given
  // (the residual add without dropout, rounded as the separate add would). random_logits_key: the
  // stream of the random logits under --moe-router-force-load-balancing (model/gpt_model.hpp), on the
  // device (one uint64), else unused.
  void forward(int64_t l, const Context& ctx, const bf16* x, bf16* y, int64_t T, Pass pass,
               const uint64_t* random_logits_key = nullptr, const bf16* residual = nullptr);
  // dx[T, H] (overwritten) and the layer's gradients (see Context) from dy[T, H], after forward(l)
  // of the same x. aux_scale: the gradient of each load-balancing / z loss (MoEAuxLossAutoScaler).
  void backward(int64_t l, const Context& ctx, const bf16* x, const bf16* dy, bf16* dx, int64_t T, float aux_scale);

  // The training forwards' losses since the last call, each divided by its coefficient (Megatron's
  // log values), summed over layers and micro-batches; resets the sums. Synchronises the stream.
  GptModel::MoeLosses take_losses(cudaStream_t stream);
  // After a step's micro-batches: aux-loss-free balancing moves each MoE layer's expert_bias (in
  // main, the fp32 main parameters laid out by `layout`) by the tokens its experts got in the
  // training forwards since, summed over dp (the data-parallel group; null: this rank's). Nothing
  // without --moe-router-enable-expert-bias.
  void update_expert_bias(float* main, const GptParameterLayout& layout, dist::ProcessGroup* dp, cudaStream_t stream);
  // global_aux_loss: the data-parallel group its tokens per expert are summed over (null: one
  // rank), before the first forward; and, after a step's micro-batches, its running counts start
  // over (Megatron's reset_global_aux_loss_tracker).
  void set_data_parallel_group(dist::ProcessGroup* dp);
  void reset_global_aux(cudaStream_t stream);
  // Context parallelism (cfg.context_parallel ranks, this rank's T tokens its share of each
  // sequence): the group the aux losses' tokens per expert are summed over, before the first
  // forward (kernels/cuda/moe.hpp's MoeAuxLossSpec).
  void set_context_parallel_group(dist::ProcessGroup* cp);
  ~CudaMoeLayers();
  // For tests: MoE layer l's router logits [T, E] and routing probabilities [T, k] as its last
  // forward left them (device memory).
  const float* saved_logits(int64_t l) const { return saved_layers_.at(size_t(slot_.at(size_t(l)))).logits; }
  const float* saved_probs(int64_t l) const { return saved_layers_.at(size_t(slot_.at(size_t(l)))).probs; }
  // Whether a step may be captured as a CUDA graph: no host synchronisation inside the layers (the
  // all-to-all dispatcher reads its counts on the host).
  bool graph_safe() const { return !ep_ || gather_; }
  size_t device_bytes() const {
    return saved_.bytes + scratch_.bytes + sums_.bytes + expert_load_.bytes + global_.bytes;
  }

 private:
  struct Saved {  // what layer l keeps from its forward for its backward
    float *logits, *probs, *scores, *lse, *stats;
    int32_t *topk_idx, *counts, *offsets, *sorted_token, *permuted_row;
    int32_t *aux_idx, *aux_counts;  // the aux losses' own top-k (expert bias or groups), else null
    // Whole experts under TP: the choices of this rank's share's pairs (the others -1) and their
    // counts, which the dispatch takes instead of topk_idx and counts; else null.
    int32_t *share_idx, *share_counts;
    const int32_t* dispatch_idx() const { return share_idx ? share_idx : topk_idx; }
    const int32_t* dispatch_counts() const { return share_counts ? share_counts : counts; }
    bf16 *fc1_out, *act_out, *expert_out, *shared_u, *shared_g;
    // Expert parallelism: every rank's counts [P][E], the offsets [P * El + 1] of the rows for this
    // rank's experts in the order they arrive (source-major groups) and those rows, and the
    // exchange's sizes in elements per peer.
    int32_t *ep_counts, *local_offsets;
    uint8_t* kept;  // [T, k] with a capacity factor: the pairs the experts keep
    // The experts' input rows: in token-permuted order (one rank), or as they arrived (expert
    // parallelism: the permuted rows are the exchange's scratch, permuted_x_).
    bf16 *permuted_x, *local_x;
    // FP8 experts: the forward's casts of linear_fc1's and linear_fc2's inputs, transposed ([H][ld]
    // and [F][ld], CudaFp8Linears::expert_ld), which their weight gradients read (Transformer
    // Engine's GroupedLinear keeps its FP8 inputs for the backward); empty without FP8.
    uint8_t *fc1_in_t, *fc2_in_t;
    std::vector<size_t> send_elems, recv_elems;
    int64_t local_rows;
    // Per source rank s: its rows here and the first of them (source-major); this rank's rows for
    // its own experts among the rows it sends (the first of them).
    std::vector<int64_t> source_rows, source_first;
    int64_t own_first_sent = 0;
    // The all-gather dispatcher: the group's probabilities [P * T, k] and each pair's row among this
    // rank's expert rows (-1: another rank's expert); the rows' offsets are local_offsets[El + 1].
    float* probs_g = nullptr;
    int32_t* rows_g = nullptr;
  };
  // The routed experts (this rank's) on the rows of `groups`, rows groups.first.. of every row-indexed
  // buffer: out = fc2(act(fc1(in))), keeping fc1's output and the activation in S. Their backward
  // from dy in two parts, so that an exchange of dx can run beside the second: the input gradient
  // dx, then the weight gradients (reads what the first part left in dfc1_).
  // rows_end (device, optional): the groups' rows end there, groups.rows only bounding them.
  void experts_forward(const Saved& S, const Context& ctx, const bf16* in, const kernels::cuda::RowGroups& groups,
                       bf16* out, const int32_t* rows_end = nullptr) const;
  void experts_backward_input(const Saved& S, const Context& ctx, const bf16* in, const bf16* dy,
                              const kernels::cuda::RowGroups& groups, bf16* dx,
                              const int32_t* rows_end = nullptr) const;
  void experts_backward_weights(const Saved& S, const Context& ctx, const bf16* in, const bf16* dy,
                                const kernels::cuda::RowGroups& groups) const;
  // This layer's expert rows: all of them grouped by expert, or under expert parallelism the ones
  // that came here, grouped by (source, local expert); source_groups: those of sources s0 .. s1-1.
  kernels::cuda::RowGroups expert_groups(const Saved& S, int64_t N) const;
  kernels::cuda::RowGroups source_groups(const Saved& S, int64_t s0, int64_t s1) const;
  // Under expert parallelism, this rank's own rows between the sent order (rows [N, H] grouped by
  // global expert) and the source-major one (local), on `stream`.
  void copy_own_rows(const Saved& S, const bf16* rows, bf16* local, cudaStream_t stream) const;
  void copy_own_rows_back(const Saved& S, const bf16* local, bf16* rows, cudaStream_t stream) const;
  // Expert parallelism: every rank's counts of layer S's routing, all-gathered and read on the
  // host (waits for the stream), then the exchange's sizes.
  void exchange_counts(Saved& S, cudaStream_t stream);
  // The all-to-alls, on comm_ once `stream` has reached this point; `stream` waits for them at
  // wait_exchange(): dispatch sends rows [N, H] (grouped by global expert) to the other experts'
  // ranks, into local [local_rows, H] (source-major); combine sends local back into rows. This
  // rank's own rows are left to copy_own_rows(_back).
  void start_dispatch(const Saved& S, const bf16* rows, bf16* local, cudaStream_t stream);
  void start_combine(const Saved& S, const bf16* local, bf16* rows, cudaStream_t stream);
  // `stream` waits for everything enqueued on comm_ so far.
  void wait_exchange(cudaStream_t stream);
  // comm_ joins `stream` here: what is enqueued on comm_ next runs after the stream's work so far.
  void fork_comm(cudaStream_t stream);
  // The all-gather dispatcher (moe_gather_dispatch_cuda.cpp). gather_tokens: x's all-gather, begun on
  // comm_ beside the router; gathered_forward: the rest of the layer after the router (y and
  // residual as forward's); gathered_backward: the whole backward.
  void gather_tokens(const bf16* x, int64_t T, cudaStream_t stream);
  void gathered_forward(Saved& S, const Context& ctx, const bf16* x, bf16* y, int64_t T, const bf16* residual);
  void gathered_backward(const Saved& S, const Context& ctx, const bf16* x, const bf16* dy, bf16* dx, int64_t T,
                         float aux_scale);
  // The routed experts' rows here under the all-gather dispatcher: El groups, expert-major, their
  // count on the device only (local_offsets[El]); the group's pairs (P * T * k) bound it.
  kernels::cuda::RowGroups gathered_groups(const Saved& S, int64_t T) const;
  // PEFT (model/gpt_layout.hpp's LoraOffsets; none when !p.on()): y[rows, out] += scale (x A^T) B^T,
  // the pair A [dim, in], B [out, dim] shared by every row (Bridge's share_expert_adapters on the
  // routed experts; the shared expert's own pair). The backward from the linear's output gradient
  // dy: the pair's gradients added to, dx[rows, in] += scale (dy B) A. Both use lora_z_ / lora_dz_.
  void adapter_forward(const Context& ctx, const LoraOffsets& p, const bf16* x, bf16* y, int64_t rows, int64_t in,
                       int64_t out) const;
  void adapter_backward(const Context& ctx, const LoraOffsets& p, const bf16* x, const bf16* dy, bf16* dx,
                        int64_t rows, int64_t in, int64_t out) const;
  // The shared expert (none when Fs_ == 0): its output into shared_out_; its backward's weight
  // gradients, and its input gradient into dshared_.
  // The FP8 linears when they run this layer's routed experts, else null.
  CudaFp8Linears* fp8_experts(const Context& ctx) const;
  void shared_expert_forward(const Saved& S, const Context& ctx, const bf16* x, int64_t T);
  void shared_expert_backward(const Saved& S, const Context& ctx, const bf16* x, const bf16* dy, int64_t T);
  // The router's backward from dprobs_ and the losses' gradients: its weight gradient, and dx
  // (overwritten) its part of the input gradient.
  void router_backward(const Saved& S, const Context& ctx, const bf16* x, bf16* dx, int64_t T, float aux_scale);
  // LAOYAO_MOE_PHASES=1: this step's MoE time by phase, rows per rank and the experts' balance, on
  // stderr; copy_load keeps a layer's tokens per expert (slot: its MoE layer) for that.
  enum Phase { kRouter, kPermute, kCounts, kExchange, kExperts, kShared, kPhases };
  void report_phases();
  void copy_load(const int32_t* counts, int64_t slot, cudaStream_t stream);
  // The routed or the shared experts' MLP activation and its backward over `rows` rows of width F.
  void activation_forward(const bf16* u, bf16* g, int64_t rows, int64_t F, cudaStream_t stream,
                          const int32_t* rows_end = nullptr) const;
  void activation_backward(const bf16* u, const bf16* dg, bf16* du, int64_t rows, int64_t F, cudaStream_t stream,
                           const int32_t* rows_end = nullptr) const;

  GptConfig cfg_;
  kernels::cuda::MoeRouterSpec router_;
  kernels::cuda::MoeAuxLossSpec losses_;
  int64_t E_, k_, H_, F_, F1_, Fs_, Fs1_;  // experts, top-k, hidden, expert ffn (fc1 rows), shared (fc1 rows)
  dist::ProcessGroup* ep_ = nullptr;       // the expert-parallel group (null: EP = 1)
  bool gather_ = false;                    // EP with the all-gather dispatcher (no host synchronisation)
  int64_t P_ = 1, me_ = 0, El_ = 0;        // its size, this rank's place, experts per rank
  MoeSequenceShares shares_;                 // under TP: this rank's share of each sequence
  std::vector<int64_t> slot_;              // layer -> index into saved (-1: dense layer)
  std::vector<Saved> saved_layers_;
  kernels::cuda::DeviceBuffer saved_, scratch_, sums_, zero_bias_;
  kernels::cuda::DeviceBuffer expert_load_;  // [MoE layers][E] tokens since the last bias update
  // global_aux_loss: per MoE layer the running sums [E] (double), their mean [E] (float), then one
  // [E] int32 staging row for a forward's counts summed over dp_; the training forwards per layer
  // since the last reset (host: the count is a kernel argument, so such steps run eagerly).
  kernels::cuda::DeviceBuffer global_;
  double* global_running_ = nullptr;
  float* global_mean_ = nullptr;
  int32_t* global_counts_ = nullptr;
  std::vector<int64_t> global_steps_;
  dist::ProcessGroup* dp_ = nullptr;
  // Shared scratch.
  bf16 *permuted_x_ = nullptr, *shared_out_ = nullptr, *dexpert_ = nullptr, *dact_ = nullptr, *dfc1_ = nullptr,
       *dpermuted_ = nullptr, *dlogits_ = nullptr, *dshared_ = nullptr, *dshared_g_ = nullptr,
       *dshared_u_ = nullptr;
  float* dprobs_ = nullptr;
  float* permuted_probs_ = nullptr;  // token dropping's scratch [N]
  // PEFT's adapters: the low-rank rows z = scale x A^T and their gradient, [N, dim] each (null: no
  // adapter on the MoE layers' linears).
  bf16 *lora_z_ = nullptr, *lora_dz_ = nullptr;
  void* perm_scratch_ = nullptr;
  // Expert parallelism: this rank's experts' output (the backward: output gradient) and input
  // gradient (source-major), and the host copy of the counts.
  bf16 *local_y_ = nullptr, *local_dx_ = nullptr;
  // The all-gather dispatcher's scratch: the group's tokens [P * T, H] (the backward: their output
  // gradients), this rank's share of every token's output [P * T, H] (the backward: of its input
  // gradient), the reduce-scatter's result [T, H]; the group's choices [P * T, k] as gathered and
  // as local ids, the local rows' tokens [P * T * k], the local experts' counts [El], the gathered
  // pairs' probability gradients [P * T, k].
  bf16 *gathered_ = nullptr, *partial_ = nullptr, *reduced_ = nullptr;
  int32_t *idx_g_ = nullptr, *idx_l_ = nullptr, *sorted_l_ = nullptr, *counts_l_ = nullptr;
  float* dprobs_g_ = nullptr;
  kernels::cuda::PinnedHostBuffer host_counts_;
  // The all-to-alls' stream (high priority: the backward's run beside the router's, the shared
  // expert's and the weight-gradient GEMMs) and its events.
  cudaStream_t comm_ = nullptr;
  cudaEvent_t comm_start_ = nullptr, comm_done_ = nullptr;
  StreamTimeline phases_{runtime_options().moe_phases, kPhases};
  int64_t min_rows_ = -1, max_rows_ = -1;  // this step's fewest and most rows of a layer's experts here
  // With the phases on: each MoE layer's tokens per expert (this rank's routing, all E experts) in
  // its last timed training forward, copied on load_stream_ (null: nothing copied since the last
  // report) beside the phases' events; reported as the busiest expert's load against the mean.
  kernels::cuda::PinnedHostBuffer load_host_;
  cudaStream_t load_stream_ = nullptr;
  float* train_sums_ = nullptr;    // [4] aux, seq_aux, z, global_aux (coefficients in) since the last take_losses
  float* discard_sums_ = nullptr;  // [4] where the losses of forwards that do not count go
};

}  // namespace laoyao::model
