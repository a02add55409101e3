// From a validated ConfigContainer to the plain structs the model, optimizer and data layers
// take. The lower layers know no config; this is the one place that maps between them.
#pragma once
#include "config/config_container.hpp"
#include "config/validate.hpp"
#include "model/gpt_config.hpp"
#include "optim/param_scheduler.hpp"
#include "train/flops.hpp"

namespace laoyao::train {

// A file-based tokenizer (GPT-2 BPE, Hugging Face, SentencePiece) is read when the run starts:
// its vocabulary size and EOD id fix the padded vocabulary (apply_vocab_rule). Nothing to do for
// the NullTokenizer, which validate() resolved. UsageError naming a missing or bad file.
void load_tokenizer_vocab(config::ConfigContainer& c, config::Derived& d, config::FrontEnd fe);

model::GptConfig model_config(const config::ConfigContainer& c, const config::Derived& d);
// The MoE part of model_config (model.num_moe_experts > 0; g: the dense part): UsageError naming
// a setting laoyao's MoE layers do not support yet.
model::MoeConfig moe_config(const config::ConfigContainer& c, const model::GptConfig& g);
optim::ParamSchedule param_schedule(const config::ConfigContainer& c);
FlopShape flop_shape(const config::ConfigContainer& c, const config::Derived& d);

}  // namespace laoyao::train
