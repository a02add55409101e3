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

// --reset-attention-mask's documents, as Megatron's attention treats them. The dataloader builds the
// mask (unless dataset.skip_getting_attention_mask_from_dataset), but only the local attention
// applies it, and only through its unfused softmax: Transformer Engine's attention takes the causal
// mask type and ignores the mask (Megatron-LM issue #2357), and Megatron-Core's fused causal
// softmax (ScaledUpperTriangMaskedSoftmax: bf16/fp16 with masked_softmax_fusion, 16 < s <= 4096,
// s % 4 == 0, micro-batch x heads per TP rank a multiple of its batches per block) ignores it too.
// Judged at the training micro-batch size (an evaluation micro-batch of another size follows it).
struct DocumentMask {
  bool applied = false;  // attention stays inside each document
  std::string ignored;   // the flag is on but Megatron's attention ignores the mask: why (else empty)
};
DocumentMask document_mask(const config::ConfigContainer& c);
// The MoE part of model_config (model.num_moe_experts > 0; g: the dense part): UsageError naming
// a setting laoyao's MoE layers do not support yet.
model::MoeConfig moe_config(const config::ConfigContainer& c, const model::GptConfig& g);
// --moe-layer-freq as one flag per layer (an int N: layer l is MoE iff l % N == 0; or one 0/1 per
// layer); UsageError naming it when malformed.
std::vector<bool> moe_layer_pattern(const config::ModelConfig& m);
optim::ParamSchedule param_schedule(const config::ConfigContainer& c);
FlopShape flop_shape(const config::ConfigContainer& c, const config::Derived& d);

}  // namespace laoyao::train
