#include "train/capabilities.hpp"

#include <algorithm>

#include "dist/process_group.hpp"

namespace laoyao::train {

std::vector<std::string> missing_features(const config::ConfigContainer& c, int64_t world_size) {
  std::vector<std::string> out;
  const auto& m = c.model;
  // Several ranks: data parallelism of CPU ranks (Gloo); the rest of Megatron's parallelism is not built.
  if (world_size > 1 && !dist::gloo_built())
    out.push_back("more than one rank (world size " + std::to_string(world_size) +
                  "): this build has no Gloo for CPU ranks");
  if (m.pipeline_model_parallel_size > 1) out.push_back("pipeline parallelism (model.pipeline_model_parallel_size > 1)");
  if (m.context_parallel_size > 1) {  // (what GPU ranks add to this: model::cuda_unsupported_features)
    const std::string cp = "context parallelism (model.context_parallel_size " +
                           std::to_string(m.context_parallel_size) + ") with ";
    if (c.dataset.reset_attention_mask) out.push_back(cp + "documents kept apart by --reset-attention-mask");
    if (c.dataset.dataset_root && c.dataset.packed_sequence) {  // (each packed sequence split as the row is)
      if (c.dataset.pad_seq_to_mult % (2 * m.context_parallel_size) != 0)
        out.push_back(cp + "packed sequences not padded to a multiple of 2 x CP (dataset.pad_seq_to_mult " +
                      std::to_string(c.dataset.pad_seq_to_mult) + "; set it to a multiple of " +
                      std::to_string(2 * m.context_parallel_size) + ", as Megatron-Bridge asks)");
      if (m.hidden_dropout > 0 || m.attention_dropout > 0)
        out.push_back(cp + "packed sequences and dropout (model.hidden_dropout, model.attention_dropout)");
      if (m.mtp_num_layers && *m.mtp_num_layers > 0) out.push_back(cp + "packed sequences and multi-token prediction");
    }
    if (m.cp_comm_type != "p2p" && m.cp_comm_type != "all_gather")
      out.push_back(cp + "--cp-comm-type " + m.cp_comm_type + " (accepted: p2p, all_gather)");
  }
  // Mixture of Experts trains data-parallel, expert-parallel, tensor-parallel with its experts
  // split over the same ranks, tensor- and expert-parallel, or tensor-parallel with whole experts
  // shared out over expert-parallel groups folded across the TP ranks (expert TP size 1; GPU ranks
  // with EP 1, a multiple or a divisor of TP only, model::cuda_unsupported_features; model_config
  // names the MoE settings that cannot join tensor parallelism).
  if (m.num_moe_experts && *m.num_moe_experts > 0) {
    const int64_t tp = std::max<int64_t>(m.tensor_model_parallel_size, 1), ep = m.expert_model_parallel_size;
    const int64_t dp = world_size / tp, etp = m.expert_tensor_parallel_size.value_or(tp);
    const bool folded = tp > 1 && etp == 1;
    if (ep > 1 && !folded && dp % ep != 0)
      out.push_back("expert parallelism over " + std::to_string(ep) + " ranks with " + std::to_string(dp) +
                    " data- and context-parallel ranks (model.expert_model_parallel_size must divide the "
                    "data-parallel size times the context-parallel size)");
    if (ep > 1 && folded && world_size % ep != 0)
      out.push_back("expert parallelism over " + std::to_string(ep) + " ranks of a world of " +
                    std::to_string(world_size) + " with whole experts (model.expert_model_parallel_size must divide "
                    "the world size when model.expert_tensor_parallel_size is 1)");
    if (etp != tp && etp != 1)
      out.push_back("an expert tensor-parallel size of " + std::to_string(etp) + " with a tensor-parallel size of " +
                    std::to_string(tp) + " (model.expert_tensor_parallel_size must be 1 or "
                    "model.tensor_model_parallel_size)");
  }
  if (m.position_embedding_type != "learned_absolute" && m.position_embedding_type != "rope" &&
      m.position_embedding_type != "yarn" && m.position_embedding_type != "none")
    out.push_back("position embeddings of type '" + m.position_embedding_type + "' (learned_absolute, rope, yarn, none)");
  if (m.position_embedding_type == "yarn" && m.rope_scaling)
    out.push_back("YaRN positions with Llama 3 rope scaling (model.rope_scaling)");
  if (m.qk_layernorm && m.normalization != "RMSNorm") out.push_back("QK layernorm with LayerNorm (RMSNorm only)");
  if (m.apply_query_key_layer_scaling) out.push_back("query-key layer scaling (model.apply_query_key_layer_scaling)");
  if (m.activation_func != "gelu" && !(m.activation_func == "silu" && m.gated_linear_unit))
    out.push_back("activation '" + m.activation_func + "'" + (m.gated_linear_unit ? " with a gated linear unit" : ""));
  if (m.gated_linear_unit && m.activation_func != "silu") out.push_back("gated linear units other than SwiGLU");
  const auto& o = c.optimizer;
  if (o.optimizer != "adam") out.push_back("the '" + o.optimizer + "' optimizer (only adam, i.e. AdamW, so far)");
  if (!o.decoupled_weight_decay) out.push_back("Adam with L2-coupled weight decay (optimizer.decoupled_weight_decay=false)");
  // The precision-aware optimizer with fp32 states (Bridge's Qwen3 cohort) is the plain AdamW; the
  // lower-precision gradients, main weights and moments it can keep are not built.
  struct StateDtype {
    const char *field, *flag;
    const std::string& dtype;
  };
  for (const StateDtype& d : {StateDtype{"main_grads_dtype", "--main-grads-dtype", o.main_grads_dtype},
                              StateDtype{"main_params_dtype", "--main-params-dtype", o.main_params_dtype},
                              StateDtype{"exp_avg_dtype", "--exp-avg-dtype", o.exp_avg_dtype},
                              StateDtype{"exp_avg_sq_dtype", "--exp-avg-sq-dtype", o.exp_avg_sq_dtype}})
    if (d.dtype != "fp32")
      out.push_back(std::string("optimizer.") + d.field + " " + d.dtype + " (" + d.flag +
                    "): gradients, main weights and Adam moments are kept in fp32 (accepted: fp32)");
  const auto& v = c.validation;
  if (v.skip_train) out.push_back("evaluation-only runs (--skip-train / validation.skip_train)");
  if (v.full_validation) out.push_back("full validation (--full-validation)");
  if (v.multiple_validation_sets) out.push_back("multiple validation sets (--multiple-validation-sets)");
  if (!c.train.iterations_to_skip.empty()) out.push_back("skipping iterations (--iterations-to-skip)");
  if (c.train.check_weight_hash_across_dp_replicas_interval)
    out.push_back("weight-hash checks across data-parallel replicas");
  // Checkpoints are laoyao's safetensors layout in place of torch_dist (docs/configuration.md).
  if (c.checkpoint.ckpt_format != "torch_dist")
    out.push_back("checkpoint format '" + c.checkpoint.ckpt_format + "' (laoyao writes safetensors in place of torch_dist)");
  if (c.scheduler.use_checkpoint_opt_param_scheduler)
    out.push_back("taking the LR schedule from the checkpoint (scheduler.use_checkpoint_opt_param_scheduler)");
  if (c.peft.scheme) {
    if (*c.peft.scheme != "lora") out.push_back("PEFT '" + *c.peft.scheme + "' (peft.scheme; accepted: lora)");
    if (!c.checkpoint.pretrained_checkpoint)
      out.push_back("PEFT requires a pretrained checkpoint path (checkpoint.pretrained_checkpoint)");
    const int64_t dp = world_size / std::max<int64_t>(c.model.tensor_model_parallel_size, 1);
    if (c.ddp.use_distributed_optimizer && dp > 1)
      out.push_back("LoRA with the distributed optimizer over " + std::to_string(dp) +
                    " data-parallel ranks (ddp.use_distributed_optimizer: give false)");
  }
  const auto& ds = c.dataset;
  if (ds.dataset_name && !ds.dataset_root)
    out.push_back("downloading the fine-tuning dataset '" + *ds.dataset_name + "' (nothing is downloaded: give "
                  "dataset.dataset_root=DIR holding training.jsonl and validation.jsonl of {\"input\": ..., "
                  "\"output\": ...} rows, as Megatron-Bridge writes them: docs/fine-tuning.md)");
  if (ds.dataset_root) {
    if (ds.packed_sequence && c.train.micro_batch_size.value_or(1) != 1)
      out.push_back("packed fine-tuning rows with train.micro_batch_size " +
                    std::to_string(*c.train.micro_batch_size) + " (Megatron-Bridge packs one row a micro-batch: 1)");
    if (!c.tokenizer.tokenizer_type || *c.tokenizer.tokenizer_type != "HuggingFaceTokenizer")
      out.push_back("fine-tuning data with tokenizer.tokenizer_type " + c.tokenizer.tokenizer_type.value_or("(none)") +
                    " (accepted: HuggingFaceTokenizer)");
  }
  const config::Value& mp = c.mixed_precision;
  const std::string preset = mp.kind == config::Value::Kind::String ? mp.s : "";
  bool fp4 = preset.find("fp4") != std::string::npos;
  for (const auto& [k, v] : mp.map)
    if (k == "fp4" && !v.is_null()) fp4 = true;
  if (fp4) out.push_back("FP4 training (mixed_precision)");
  // (FP8 linear layers, model_config checking the recipe and the shapes: delayed scaling reduces its
  // amaxes over every rank, CPU or GPU; FP8 with context or expert parallelism on GPUs is refused in
  // model/cuda/cuda_backend.cpp)
  if (c.model.fp16 || preset.rfind("fp16", 0) == 0) out.push_back("fp16 training with loss scaling");
  if (c.optimizer.loss_scale)
    out.push_back("a constant loss scale (--loss-scale / optimizer.loss_scale): bf16 and fp32 runs train unscaled");
  // Settings Megatron honours that would otherwise pass without effect here.
  if (c.scheduler.no_weight_decay_cond_type && *c.scheduler.no_weight_decay_cond_type != "qwen3_next")
    out.push_back("weight-decay condition '" + *c.scheduler.no_weight_decay_cond_type +
                  "' (scheduler.no_weight_decay_cond_type: the default rule, no decay on biases and 1-D weights, "
                  "or qwen3_next, which also decays the q/k layernorm weights)");
  if (c.dataset.dataloader_type && (*c.dataset.dataloader_type == "cyclic" || *c.dataset.dataloader_type == "external"))
    out.push_back("the '" + *c.dataset.dataloader_type + "' data loader (--dataloader-type; accepted: single, batch)");
  if (c.checkpoint.use_checkpoint_args)
    out.push_back("taking the model's arguments from the checkpoint (--use-checkpoint-args): give them on the command line");
  if (!c.checkpoint.load_rng)
    out.push_back("restarting the random state on resume (--no-load-rng): dropout masks follow (seed, iteration, "
                  "micro-batch), as if the state were loaded");
  if (c.logger.log_energy) out.push_back("energy logging (--log-energy)");
  if (c.logger.log_l2_norm_grad_to_tensorboard)
    out.push_back("per-parameter gradient norms in TensorBoard (logger.log_l2_norm_grad_to_tensorboard)");
  if (c.logger.wandb_project && !c.logger.wandb_project->empty())
    out.push_back("Weights & Biases logging (--wandb-project / logger.wandb_project)");
  const auto& pr = c.profiling;
  // --profile (Nsight Systems) runs: cudaProfilerStart/Stop around the profiled iterations (trainer).
  if (pr.use_pytorch_profiler)
    out.push_back("the PyTorch profiler (profiling.use_pytorch_profiler); --profile (profiling.use_nsys_profiler: "
                  "Nsight Systems' capture range) works");
  if (pr.record_memory_history)
    out.push_back("CUDA memory history snapshots (--record-memory-history / profiling.record_memory_history)");
  if (c.ddp.use_megatron_fsdp || c.dist.use_torch_fsdp2) out.push_back("FSDP (ddp.use_megatron_fsdp / dist.use_torch_fsdp2)");
  return out;
}

}  // namespace laoyao::train
