// A GPT model's parameters split over tensor-parallel ranks as Megatron-Core splits them
// (megatron-lm.md §8.1): the word embedding and output layer by vocabulary rows, linear_qkv and
// linear_fc1 (an MoE layer's experts' too) by output rows (query groups are contiguous rows;
// SwiGLU's gate and up halves are split each, a rank holding [its gate rows; its up rows]),
// linear_proj and linear_fc2 by input columns, everything else replicated. A rank's parameter
// table is the model's own at the local shape (tp_local_config); shard/unshard map full tensors to
// a rank's and back, so that weights initialised at full size split identically at any TP size and
// checkpoints hold full tensors.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt_config.hpp"
#include "model/gpt_layout.hpp"
#include "model/parameters.hpp"
#include "model/tensor_box.hpp"

namespace laoyao::model {

enum class TpSplit { Replicated, Rows, Cols, SwigluRows };

// How Megatron-Core splits the parameter called `name` (a GPT model's Megatron-Core name).
TpSplit tp_split_of(const std::string& name, const GptConfig& full);

// The replicated parameters whose gradients each rank computes a part of under tensor parallelism,
// from its share of the layer after them (its heads, output rows or input columns): LoRA's whole
// adapter halves (a column-parallel layer's linear_in, a row-parallel layer's linear_out) and
// multi-latent attention's down projections and latent norms (their outputs feed every head).
// (offset, count) of each in this rank's table, in offset order, for finalize_grads to sum over the
// group.
std::vector<std::pair<int64_t, int64_t>> tp_partial_grads(const GptParameterLayout& local);

// The boxes of a full-shape tensor that TP rank `rank` of `tp` holds under `split`, in the order of
// its data (SwiGLU's: its gate rows, then its up rows).
std::vector<Box> tp_boxes(TpSplit split, const std::vector<int64_t>& full_shape, int64_t rank, int64_t tp);

// A vocabulary shard looks up zeros for another shard's ids, so an id outside every shard would
// pass unseen: an Error naming it (`who`: the model) for any of tokens[0, T) outside [0, vocab).
void check_token_ids(const int64_t* tokens, int64_t T, int64_t vocab, const char* who);

// The per-rank shape of `full`: heads, query groups, ffn (and the experts' ffn) and vocabulary
// divided by tp. A UsageError naming the setting when one does not divide (Megatron refuses those too).
GptConfig tp_local_config(const GptConfig& full, int64_t tp);

// Mixture of Experts under tensor parallelism as laoyao runs it: sequence parallel (Megatron-Core's
// MoELayer refuses training without it), experts split over the same ranks (expert tensor
// parallelism = tensor parallelism; with expert parallelism too, each rank's experts split), no
// token dropping. A UsageError naming what is not met.
void check_moe_tensor_parallel(const GptConfig& c);

// local_w (local table) = rank's shard of full_w (full table); the two tables list the same names.
void tp_shard(const GptConfig& full, const ParameterTable& full_table, const float* full_w,
              const ParameterTable& local_table, float* local_w, int64_t rank, int64_t tp);
// full_w = the tensors put back together from every rank's local buffer (replicated ones: rank 0's).
void tp_unshard(const GptConfig& full, const ParameterTable& full_table, float* full_w,
                const ParameterTable& local_table, const std::vector<const float*>& locals);
// Writes one rank's local buffer into its places of full_w (replicated tensors only when
// `replicated`), leaving the rest: summing every rank's full_w, each zero elsewhere and the
// replicated ones from one rank only, is the all-reduce way to gather the whole model.
void tp_place(const GptConfig& full, const ParameterTable& full_table, float* full_w,
              const ParameterTable& local_table, const float* local_w, int64_t rank, int64_t tp, bool replicated);

}  // namespace laoyao::model
