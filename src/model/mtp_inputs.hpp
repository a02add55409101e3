// Multi-token prediction's per-layer inputs, prepared on the host for any backend's model
// (Megatron-Core's roll_tensor and process_mtp_loss): layer k's ids, positions, labels and loss
// mask are the micro-batch's rolled left k + 1 times, each sequence on its own, zeros shifted in;
// its loss is the masked mean of its per-token losses.
#pragma once
#include <cstdint>
#include <vector>

#include "model/backend.hpp"  // (cp_place)

namespace laoyao::model {

struct MtpLayerInputs {
  std::vector<int64_t> tokens, positions, labels;
  std::vector<float> mask;
  std::vector<float> losses;  // [b*s], filled by the forward
  std::vector<float> dloss;   // [b*s], the losses' weights for the backward
};

// Layer k's rolled inputs of b sequences of s tokens (positions or mask null: zeros, all ones).
void roll_mtp_inputs(MtpLayerInputs& out, int64_t b, int64_t s, const int64_t* tokens, const int64_t* positions,
                     const int64_t* labels, const float* mask, int64_t k);
// Under context parallelism (this rank holding chunks cp_rank and 2 cp_size - 1 - cp_rank of each
// sequence's 2 cp_size, s tokens of its s * cp_size; backend.hpp's cp_place): layer k's inputs at
// the rank's tokens: the whole sequences' (`whole`: b sequences of s * cp_size, gathered by the
// caller; mask empty: all ones) rolled, then the rank's chunks taken. Megatron's roll_tensor rolls
// each chunk and trades the boundary tokens with the neighbouring ranks, which gives the same values.
void roll_mtp_inputs_cp(MtpLayerInputs& out, const MtpLayerInputs& whole, int64_t b, int64_t s, int64_t cp_rank,
                        int64_t cp_size, int64_t k);

// The masked mean of the layer's losses (a mask with nothing in it: 0).
double mtp_masked_mean(const MtpLayerInputs& in);
// dloss = weight x mask / the mask's sum: the gradient of weight x the masked mean.
void set_mtp_loss_weights(MtpLayerInputs& in, double weight);

// How a step weighs and logs these losses (Megatron's MTPLossAutoScaler and MTPLossLoggingHelper):
// logged, each training micro-batch's masked mean times per_microbatch (1 / num_microbatches); its
// gradient, mtp_loss_scaling_factor / mtp_num_layers of that mean times per_microbatch, or with a
// per-token loss (--calculate-per-token-loss) of the masked sum times the micro-batch's loss tokens
// over the layer's (process_mtp_loss; the trainer divides every gradient by the step's tokens).
struct MtpLossScale {
  double per_microbatch = 1.0;
  bool per_token = false;
};
// The weight set_mtp_loss_weights takes for each of num_layers layers (mtp_loss_scaling_factor /
// num_layers of the scaled mean or sum); tokens: the micro-batch's loss tokens (its mask's sum before
// rolling).
double mtp_loss_weight(const MtpLossScale& scale, double scaling_factor, int64_t num_layers, double tokens);
// The micro-batch's loss tokens (mask null: all T).
double mtp_tokens(const float* mask, int64_t T);

}  // namespace laoyao::model
