// A model's rotary table (Positions::Rope): Megatron-Core's RotaryEmbedding with Llama 3 scaling or
// linear interpolation, or its YarnRotaryEmbedding; the same fp32 table on every backend (the CUDA
// backend uploads it).
#pragma once
#include "kernels/cpu/ops.hpp"
#include "model/gpt_config.hpp"

namespace laoyao::model {

kernels::cpu::RopeTable rotary_table(const GptConfig& c);

}  // namespace laoyao::model
