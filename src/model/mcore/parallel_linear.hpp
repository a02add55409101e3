// What Megatron-Core's tensor-parallel layers do around a module's math, over a backend's ops: the
// row-parallel linear's reduction and the bias-dropout-add after it, a column-parallel layer's
// input gradient summed over the group, a norm whose output the parallel layers read whole, and the
// hidden dropout's masks sliced under sequence parallelism. Internal to model/mcore.
#pragma once
#include <string>

#include "model/mcore/gpt_model.hpp"

namespace laoyao::model::mcore {

// The name of layer `layer`'s dropout site `what` ("dropout.layer3.attention"): its masks' stream.
std::string dropout_site(int64_t layer, const char* what);

// This rank's heads of the whole model's attention dropout mask of layer `layer`.
DropoutSpec attention_dropout(const ModuleContext& m, const Step& st, int64_t layer);

// Context parallelism: d over [b, s, width] rows of this rank's chunks, as the whole sequences' mask.
DropoutSpec context_parallel_rows(const DropoutSpec& d, const Step& st, int64_t width);

// The hidden dropout of `site` on this rank's rows (its share of every sequence under sequence
// parallelism: the whole model's mask, sliced).
DropoutSpec hidden_dropout(const ModuleContext& m, const Step& st, const std::string& site);

// out = residual + dropout(the group's sum of w.branch + b): a row-parallel output (or an MoE
// layer's partial sums) reduced (all-reduce, or reduce-scatter into this rank's rows), then the
// bias, dropout and residual; without tensor parallelism w.branch is already whole.
void reduce_bias_dropout_add(const ModuleContext& m, const Step& st, int64_t b, Act residual, Act out,
                             const DropoutSpec& drop, Scratch& w);
// A RowParallelLinear (linear_proj, linear_fc2: x holds this rank's K input columns) and the
// bias-dropout-add after it: out = residual + dropout(sum over the group of x @ w^T, + b).
void row_parallel_bias_dropout_add(const ModuleContext& m, const Step& st, Act x, int64_t w, int64_t b, int64_t K,
                                   Act residual, Act out, const DropoutSpec& drop, Scratch& s);
// The gradient at a branch's output (whole rows) from the residual stream's gradient dout (this
// rank's rows): through the dropout (if any), all-gathered under sequence parallelism. In s.dbranch,
// or without either dout itself (the caller only reads it before adding to dout).
Act branch_output_grad(const ModuleContext& m, const Step& st, Act dout, const DropoutSpec& drop, Scratch& s);
// A column-parallel layer's input gradient s.dnorm (this rank's part, all T rows) summed over the
// group; returns where the sum is (this rank's rows under sequence parallelism).
Act sum_input_grad(const ModuleContext& m, const Step& st, Scratch& s);
// A norm on this rank's rows of x whose output y the parallel layers read whole (all-gathered
// under sequence parallelism).
void norm_whole_sequence(const ModuleContext& m, const Step& st, Act x, int64_t w, int64_t b, Act y, float* mean,
                         float* rstd, Scratch& s);

}  // namespace laoyao::model::mcore
