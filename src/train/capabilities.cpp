#include "train/capabilities.hpp"

namespace laoyao::train {

std::vector<std::string> missing_features(const config::ConfigContainer& c) {
  std::vector<std::string> out;
  // The engine itself is the first missing piece: the front ends, config and data exist, the
  // model/optimizer/training loop do not yet. Checks for individual features follow, so the
  // message stays specific once the engine lands.
  out.push_back("the training engine (model, optimizer, training loop) is not built yet");
  const auto& m = c.model;
  if (m.num_moe_experts) out.push_back("Mixture-of-Experts layers (model.num_moe_experts)");
  if (m.multi_latent_attention) out.push_back("multi-latent attention (model.multi_latent_attention)");
  if (m.pipeline_model_parallel_size > 1) out.push_back("pipeline parallelism (model.pipeline_model_parallel_size > 1)");
  if (m.context_parallel_size > 1) out.push_back("context parallelism (model.context_parallel_size > 1)");
  if (m.mtp_num_layers) out.push_back("multi-token prediction (model.mtp_num_layers)");
  if (c.peft.scheme) {
    out.push_back("PEFT (" + *c.peft.scheme + ")");
    if (!c.checkpoint.pretrained_checkpoint)
      out.push_back("PEFT requires a pretrained checkpoint path (checkpoint.pretrained_checkpoint)");
  }
  if (c.dataset.dataset_name) out.push_back("fine-tuning datasets (dataset.dataset_name=" + *c.dataset.dataset_name + ")");
  if (c.mixed_precision && c.mixed_precision->find("fp8") != std::string::npos)
    out.push_back("FP8 training (mixed_precision=" + *c.mixed_precision + ")");
  if (c.mixed_precision && c.mixed_precision->find("fp4") != std::string::npos)
    out.push_back("FP4 training (mixed_precision=" + *c.mixed_precision + ")");
  return out;
}

}  // namespace laoyao::train
