// CudaMoeLayers under expert parallelism with the all-gather token dispatcher
// (--moe-token-dispatcher-type allgather, Megatron's default; moe_layers_cuda.hpp). Megatron's
// MoEAllGatherTokenDispatcher, on the device end to end:
//   forward: every rank's tokens, choices and probabilities are all-gathered over the EP group; this
//     rank keeps the pairs of its own experts (moe_ep_local_choices), sorts them expert-major
//     (moe_permutation over its El experts: one GEMM group an expert, as on one GPU) and runs its
//     experts; its share of every token's output (the probability-weighted sum over its experts)
//     is reduce-scattered, which sums the ranks' shares into each token's own rank.
//   backward: the output gradients are all-gathered, the combine's and the experts' backward run on
//     this rank's pairs, and the input gradients' and the probabilities' shares are
//     reduce-scattered back (another rank's pair has probability gradient 0 here, so the sum is its
//     owner's value).
// Nothing waits for the host: the rows here are counted on the device, the host sizing every launch
// by the bound P * T * k. Each token crosses the group once a direction, where the all-to-all
// dispatcher sends one row per chosen expert on another rank (about k (P - 1) / P of them).
// The router, its losses and the shared expert are the rank's own tokens', as with one GPU.
#include <algorithm>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/moe.hpp"
#include "kernels/cuda/moe_ep.hpp"
#include "model/cuda/moe_layers_cuda.hpp"

namespace laoyao::model {

namespace kc = laoyao::kernels::cuda;

kc::RowGroups CudaMoeLayers::gathered_groups(const Saved& S, int64_t T) const {
  return {S.local_offsets, El_, El_, P_ * T * k_, 0};
}

void CudaMoeLayers::gather_tokens(const bf16* x, int64_t T, cudaStream_t stream) {
  fork_comm(stream);
  ep_->all_gather_device(x, gathered_, static_cast<size_t>(T * H_), dist::DeviceType::BF16, comm_);
}

void CudaMoeLayers::gathered_forward(Saved& S, const Context& ctx, const bf16* x, bf16* y, int64_t T,
                                     const bf16* residual) {
  cudaStream_t st = ctx.stream;
  const int64_t Tg = P_ * T, pairs = Tg * k_;
  // The group's choices and probabilities, after its tokens (gather_tokens) on comm_.
  fork_comm(st);
  ep_->all_gather_device(S.dispatch_idx(), idx_g_, static_cast<size_t>(T * k_), dist::DeviceType::I32, comm_);
  ep_->all_gather_device(S.probs, S.probs_g, static_cast<size_t>(T * k_), dist::DeviceType::F32, comm_);
  wait_exchange(st);
  // This rank's pairs, expert-major, and its experts on them.
  const int32_t* rows_end = S.local_offsets + El_;
  kc::moe_ep_local_choices(idx_g_, pairs, me_ * El_, El_, idx_l_, counts_l_, st);
  kc::moe_permutation(idx_l_, counts_l_, Tg, El_, k_, S.local_offsets, sorted_l_, S.rows_g, perm_scratch_, st);
  kc::moe_permute_forward(gathered_, sorted_l_, S.local_x, pairs, H_, st, rows_end);
  phases_.mark(kPermute, st);
  experts_forward(S, ctx, S.local_x, gathered_groups(S, T), S.expert_out, rows_end);
  phases_.mark(kExperts, st);
  // This rank's share of every token's output, summed over the group into the tokens' ranks while
  // the shared expert runs.
  kc::moe_unpermute_forward(S.expert_out, S.rows_g, S.probs_g, nullptr, partial_, Tg, k_, H_, st);
  fork_comm(st);
  ep_->reduce_scatter_device(partial_, reduced_, static_cast<size_t>(T * H_), dist::DeviceType::BF16, comm_);
  phases_.mark(kPermute, st);
  shared_expert_forward(S, ctx, x, T);
  wait_exchange(st);
  if (Fs_ > 0) kc::add_inplace(reduced_, shared_out_, T * H_, st);
  if (residual)
    kc::residual_dropout_add(reduced_, residual, y, T * H_, kc::DropoutSpec{}, st);
  else
    LAOYAO_CUDA_CHECK(cudaMemcpyAsync(y, reduced_, sizeof(bf16) * static_cast<size_t>(T * H_),
                                      cudaMemcpyDeviceToDevice, st));
  phases_.mark(kPermute, st);
}

void CudaMoeLayers::gathered_backward(const Saved& S, const Context& ctx, const bf16* x, const bf16* dy, bf16* dx,
                                      int64_t T, float aux_scale) {
  cudaStream_t st = ctx.stream;
  const int64_t Tg = P_ * T;
  const int32_t* rows_end = S.local_offsets + El_;
  const kc::RowGroups groups = gathered_groups(S, T);
  // The group's output gradients; the shared expert's backward meanwhile.
  fork_comm(st);
  ep_->all_gather_device(dy, gathered_, static_cast<size_t>(T * H_), dist::DeviceType::BF16, comm_);
  shared_expert_backward(S, ctx, x, dy, T);
  wait_exchange(st);
  // The combine's backward on this rank's pairs; their probabilities' gradients go home while the
  // experts' input gradients are computed.
  kc::moe_unpermute_backward(S.expert_out, S.rows_g, S.probs_g, gathered_, local_y_, dprobs_g_, Tg, k_, H_, st);
  fork_comm(st);
  ep_->reduce_scatter_device(dprobs_g_, dprobs_, static_cast<size_t>(T * k_), dist::DeviceType::F32, comm_);
  phases_.mark(kPermute, st);
  experts_backward_input(S, ctx, S.local_x, local_y_, groups, local_dx_, rows_end);
  phases_.mark(kExperts, st);
  wait_exchange(st);
  if (cfg_.moe.capacity_factor) kc::moe_mask_dropped(dprobs_, S.kept, T * k_, st);
  // This rank's share of every token's input gradient, summed into the tokens' ranks while the
  // router's backward and the experts' weight gradients run.
  kc::moe_permute_backward(local_dx_, S.rows_g, partial_, Tg, k_, H_, false, st);
  fork_comm(st);
  ep_->reduce_scatter_device(partial_, reduced_, static_cast<size_t>(T * H_), dist::DeviceType::BF16, comm_);
  phases_.mark(kPermute, st);
  router_backward(S, ctx, x, dx, T, aux_scale);
  if (Fs_ > 0) kc::add_inplace(dx, dshared_, T * H_, st);
  experts_backward_weights(S, ctx, S.local_x, local_y_, groups);
  phases_.mark(kExperts, st);
  wait_exchange(st);
  kc::add_inplace(dx, reduced_, T * H_, st);
  phases_.mark(kPermute, st);
}

}  // namespace laoyao::model
