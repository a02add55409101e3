// Multi-token prediction's per-layer inputs, prepared on the host for any backend's model
// (Megatron-Core's roll_tensor and process_mtp_loss): layer k's ids, positions, labels and loss
// mask are the micro-batch's rolled left k + 1 times, each sequence on its own, zeros shifted in;
// its loss is the masked mean of its per-token losses.
#pragma once
#include <cstdint>
#include <vector>

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
// The masked mean of the layer's losses (a mask with nothing in it: 0).
double mtp_masked_mean(const MtpLayerInputs& in);
// dloss = weight x mask / the mask's sum: the gradient of weight x the masked mean.
void set_mtp_loss_weights(MtpLayerInputs& in, double weight);

}  // namespace laoyao::model
