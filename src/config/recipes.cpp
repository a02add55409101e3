#include "config/recipes.hpp"

#include <filesystem>
#include <map>

#include "core/error.hpp"
#include "core/text.hpp"

namespace laoyao::config {
namespace {

std::string experiments_dir(const std::string& leaf) {
  // Bridge's recipes put outputs under <cwd>/nemo_experiments/default/.
  return (std::filesystem::current_path() / "nemo_experiments" / "default" / leaf).string();
}

const std::map<std::string, std::string> kCommonRecipeEnvVars = {
    {"NCCL_GRAPH_REGISTER", "0"},
    {"NCCL_NVLS_ENABLE", "0"},
    {"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"},
    {"TORCH_NCCL_AVOID_RECORD_STREAMS", "1"},
    {"TORCH_NCCL_HIGH_PRIORITY", "1"},
};

// Bridge's distributed_fused_adam_with_cosine_annealing helper: AdamW, cosine, WD applied
// through the scheduler's constant 0.033 (so optimizer.weight_decay=0.1 is not what trains).
void adam_with_cosine_annealing(ConfigContainer& c, double lr, double min_lr, int64_t warmup, double beta2) {
  c.optimizer.optimizer = "adam";
  c.optimizer.lr = lr;
  c.optimizer.min_lr = min_lr;
  c.optimizer.adam_beta1 = 0.9;
  c.optimizer.adam_beta2 = beta2;
  c.optimizer.adam_eps = 1e-8;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.clip_grad = 1.0;
  c.optimizer.use_distributed_optimizer = true;
  c.scheduler.lr_decay_style = "cosine";
  c.scheduler.lr_warmup_iters = warmup;
  c.scheduler.lr_warmup_init = 0.0;
  c.scheduler.lr_wsd_decay_style = "minus_sqrt";
  c.scheduler.start_weight_decay = 0.033;
  c.scheduler.end_weight_decay = 0.033;
  c.scheduler.weight_decay_incr_style = "constant";
  c.scheduler.override_opt_param_scheduler = true;
}

void output_dirs(ConfigContainer& c, bool load_too) {
  c.checkpoint.save = experiments_dir("checkpoints");
  if (load_too) c.checkpoint.load = c.checkpoint.save;
  c.logger.tensorboard_dir = experiments_dir("tb_logs");
}

// _pretrain_common() (bridge §4.1).
ConfigContainer pretrain_common() {
  ConfigContainer c;
  adam_with_cosine_annealing(c, 3e-4, 3e-5, 500, 0.95);
  c.train.train_iters = 300000;
  c.train.global_batch_size = 32;
  c.train.micro_batch_size = 2;
  c.train.manual_gc = true;
  c.train.manual_gc_interval = 100;
  c.train.manual_gc_eval = true;
  c.validation.eval_interval = 500;
  c.validation.eval_iters = 32;
  c.ddp.check_for_nan_in_grad = true;
  c.ddp.grad_reduce_in_fp32 = true;
  c.ddp.overlap_grad_reduce = true;
  c.ddp.overlap_param_gather = true;
  c.optimizer.overlap_param_gather = true;
  c.ddp.average_in_collective = true;
  c.ddp.data_parallel_sharding_strategy = "optim_grads_params";
  c.ddp.use_distributed_optimizer = true;
  c.dataset.random_seed = 1234;
  c.dataset.seq_length = 4096;
  c.model.seq_length = 4096;
  c.dataset.split = "9999,8,2";
  c.dataset.dataloader_type = "single";
  c.dataset.num_workers = 8;
  c.logger.log_interval = 10;
  c.logger.log_timers_to_tensorboard = true;
  c.tokenizer.tokenizer_type = "HuggingFaceTokenizer";
  c.tokenizer.use_tokenizer_vocab_size = true;
  c.checkpoint.save_interval = 500;
  c.checkpoint.ckpt_format = "torch_dist";
  c.checkpoint.fully_parallel_save = true;
  output_dirs(c, true);
  c.rng.seed = 1234;
  c.mixed_precision = Value::string("bf16_mixed");
  c.env_vars = kCommonRecipeEnvVars;
  return c;
}

// _sft_common() / _peft_common(): packed SQuAD, seed 5678, short runs (bridge §4.1, §4.5).
ConfigContainer finetune_common(bool peft) {
  ConfigContainer c;
  adam_with_cosine_annealing(c, peft ? 1e-4 : 5e-6, 0.0, 50, 0.98);
  c.train.train_iters = 1000;
  c.train.global_batch_size = 128;
  c.train.micro_batch_size = 1;
  c.train.manual_gc = true;
  c.train.manual_gc_interval = 100;
  c.validation.eval_interval = 100;
  c.validation.eval_iters = 32;
  c.ddp.check_for_nan_in_grad = true;
  c.ddp.grad_reduce_in_fp32 = true;
  c.dataset.dataset_name = "squad";
  c.dataset.packed_sequence = true;
  c.dataset.seq_length = 2048;
  c.model.seq_length = 2048;
  c.dataset.random_seed = 5678;
  c.dataset.dataloader_type = "batch";
  c.dataset.num_workers = 1;
  c.logger.log_interval = 1;
  c.tokenizer.tokenizer_type = "HuggingFaceTokenizer";
  c.checkpoint.save_interval = 100;
  output_dirs(c, true);
  c.rng.seed = 5678;
  c.mixed_precision = Value::string("bf16_mixed");
  c.env_vars = kCommonRecipeEnvVars;
  if (peft) c.peft.scheme = "lora";
  return c;
}

void seq(ConfigContainer& c, int64_t s) { c.model.seq_length = s, c.dataset.seq_length = s; }

void null_tokenizer_32000(ConfigContainer& c) {
  c.tokenizer.tokenizer_type = "NullTokenizer";
  c.tokenizer.vocab_size = 32000;
}

// The Llama bridge's fusions, and the pretrain recipes' TE cross entropy (bridge §4.3).
void llama_fusions(ConfigContainer& c, const std::string& ce_impl) {
  auto& m = c.model;
  m.bias_activation_fusion = m.masked_softmax_fusion = m.persist_layer_norm = true;
  m.bias_dropout_fusion = m.apply_rope_fusion = true;
  m.cross_entropy_loss_fusion = true;
  m.cross_entropy_fusion_impl = ce_impl;
  m.transformer_impl = "transformer_engine";
}

void llama_common(ModelConfig& m) {
  m.normalization = "RMSNorm";
  m.layernorm_epsilon = 1e-5;
  m.gated_linear_unit = true;
  m.activation_func = "silu";
  m.position_embedding_type = "rope";
  m.add_bias_linear = false;
  m.add_qkv_bias = false;
  m.hidden_dropout = m.attention_dropout = 0.0;
  m.init_method_std = 0.02;
}

void llama32_1b_model(ModelConfig& m) {
  llama_common(m);
  m.num_layers = 16, m.hidden_size = 2048, m.ffn_hidden_size = 8192;
  m.num_attention_heads = 32, m.num_query_groups = 8, m.kv_channels = 64;
  m.rotary_base = 500000, m.rope_scaling = true, m.rope_scaling_factor = 32.0;
  m.share_embeddings_and_output_weights = true;
}

void llama3_8b_model(ModelConfig& m) {
  llama_common(m);
  m.num_layers = 32, m.hidden_size = 4096, m.ffn_hidden_size = 14336;
  m.num_attention_heads = 32, m.num_query_groups = 8, m.kv_channels = 128;
  m.rotary_base = 500000;
  m.share_embeddings_and_output_weights = false;
}

void qwen3_8b_model(ModelConfig& m) {
  llama_common(m);
  m.layernorm_epsilon = 1e-6;
  m.num_layers = 36, m.hidden_size = 4096, m.ffn_hidden_size = 12288;
  m.num_attention_heads = 32, m.num_query_groups = 8, m.kv_channels = 128;
  m.qk_layernorm = true;
  m.rotary_base = 1000000;
  m.share_embeddings_and_output_weights = false;
}

void dense_pretrain_schedule(ConfigContainer& c) {
  c.train.global_batch_size = 512;
  c.train.micro_batch_size = 1;
  c.train.train_iters = 1168251;
  c.scheduler.lr_warmup_iters = 2000;
  c.validation.eval_interval = 2000;
  c.validation.eval_iters = 32;
  c.checkpoint.save_interval = 500;
  c.ddp.data_parallel_sharding_strategy = "no_shard";
  seq(c, 8192);
  null_tokenizer_32000(c);
}

ConfigContainer vanilla_gpt_pretrain() {
  ConfigContainer c;  // a bare GPTModelProvider: the user sets num_layers/hidden_size/heads
  adam_with_cosine_annealing(c, 3e-4, 3e-5, 500, 0.95);
  c.train.train_iters = 300000;
  c.train.global_batch_size = 32;
  c.train.micro_batch_size = 2;
  c.validation.eval_interval = 500;
  c.validation.eval_iters = 32;
  c.ddp.check_for_nan_in_grad = true;
  c.ddp.grad_reduce_in_fp32 = true;
  c.ddp.use_distributed_optimizer = false;  // optimizer's True wins through the OR rule
  c.dataset.random_seed = 1234;
  seq(c, 1024);
  c.dataset.split = "9999,8,2";
  c.dataset.dataloader_type = "single";
  c.logger.log_interval = 10;
  c.logger.tensorboard_dir = experiments_dir("tb_logs");
  null_tokenizer_32000(c);
  c.checkpoint.save_interval = 500;
  c.checkpoint.save = experiments_dir("checkpoints");  // load stays unset
  c.rng.seed = 1234;
  c.mixed_precision = Value::string("bf16_mixed");
  c.env_vars = kCommonRecipeEnvVars;
  return c;
}

ConfigContainer llama32_1b_pretrain() {
  ConfigContainer c = pretrain_common();
  llama32_1b_model(c.model);
  llama_fusions(c, "te");
  dense_pretrain_schedule(c);
  return c;
}

ConfigContainer llama3_8b_pretrain() {
  ConfigContainer c = pretrain_common();
  llama3_8b_model(c.model);
  llama_fusions(c, "te");
  dense_pretrain_schedule(c);
  c.model.context_parallel_size = 2;
  return c;
}

// HEAD's 16-GPU convergence cohort (bridge §4.4).
ConfigContainer qwen3_8b_pretrain() {
  ConfigContainer c = pretrain_common();
  qwen3_8b_model(c.model);
  llama_fusions(c, "te");
  seq(c, 4096);
  c.train.global_batch_size = 1024;
  c.train.micro_batch_size = 1;
  c.train.train_iters = 100;
  c.scheduler.lr_warmup_iters = 40;
  c.scheduler.lr_decay_iters = 100;
  c.validation.eval_interval = 500;
  c.validation.eval_iters = 32;
  c.checkpoint.save_interval = 50;
  c.checkpoint.load.reset();
  c.tokenizer.tokenizer_model = "Qwen/Qwen3-8B";
  // The cohort's precision: bf16_mixed with gradients reduced in bf16 (a MixedPrecisionConfig, not
  // the preset, which would turn grad_reduce_in_fp32 back on).
  c.mixed_precision = Value::make_map({{"bf16", Value::boolean(true)},
                                       {"params_dtype", Value::string("bf16")},
                                       {"pipeline_dtype", Value::string("bf16")},
                                       {"grad_reduce_in_fp32", Value::boolean(false)}});
  c.optimizer.use_precision_aware_optimizer = true;
  c.ddp.data_parallel_sharding_strategy = "optim_grads_params";
  return c;
}

// v0.5.1's 4-GPU variant: TP4, GBS 32, MBS 2, 300k iterations.
ConfigContainer qwen3_8b_pretrain_4gpu() {
  ConfigContainer c = pretrain_common();
  qwen3_8b_model(c.model);
  llama_fusions(c, "te");
  seq(c, 4096);
  c.model.tensor_model_parallel_size = 4;
  c.train.global_batch_size = 32;
  c.train.micro_batch_size = 2;
  c.train.train_iters = 300000;
  c.scheduler.lr_warmup_iters = 500;
  c.validation.eval_interval = 500;
  c.validation.eval_iters = 32;
  c.checkpoint.save_interval = 500;
  c.tokenizer.tokenizer_model = "Qwen/Qwen3-8B";
  return c;
}

// laoyao's flagship (not a Bridge recipe; #9): a Qwen3-MoE-style model of about 2.2B parameters,
// about 0.6B active: Qwen3's attention (GQA 16/4, head dim 64, QK-norm, RoPE 1e6), every layer MoE
// with 64 SwiGLU experts of 384, top-8, softmax router, aux loss 1e-3; Qwen3's vocabulary size
// (151936) through the NullTokenizer on mock data. The Bridge pretrain recipes' optimizer and
// schedule, at seq 4096.
void moe_2b_model(ModelConfig& m) {
  llama_common(m);
  m.layernorm_epsilon = 1e-6;
  m.num_layers = 24, m.hidden_size = 1024, m.ffn_hidden_size = 3072;
  m.num_attention_heads = 16, m.num_query_groups = 4, m.kv_channels = 64;
  m.qk_layernorm = true;
  m.rotary_base = 1000000;
  m.share_embeddings_and_output_weights = false;
  m.num_moe_experts = 64, m.moe_router_topk = 8, m.moe_ffn_hidden_size = 384;
  m.moe_layer_freq = Value::integer(1);
  m.moe_router_score_function = "softmax";
  m.moe_router_load_balancing_type = Value::string("aux_loss");
  m.moe_aux_loss_coeff = Value::real(1e-3);
  m.moe_router_dtype = "fp32";
  m.moe_grouped_gemm = true;
  m.moe_token_dispatcher_type = "alltoall";
}

ConfigContainer moe_2b_pretrain() {
  ConfigContainer c = pretrain_common();
  moe_2b_model(c.model);
  llama_fusions(c, "te");
  dense_pretrain_schedule(c);
  seq(c, 4096);
  c.tokenizer.vocab_size = 151936;
  return c;
}

// What Bridge's DeepSeek bridges set on every DeepSeek model: RMSNorm, SwiGLU, no biases, untied,
// no dropout, multi-latent attention with its latent norms (qk_layernorm) and its head dims.
void deepseek_common(ModelConfig& m) {
  m.normalization = "RMSNorm";
  m.layernorm_epsilon = 1e-6;
  m.gated_linear_unit = true;
  m.activation_func = "silu";
  m.add_bias_linear = false;
  m.hidden_dropout = m.attention_dropout = 0.0;
  m.share_embeddings_and_output_weights = false;
  m.qk_layernorm = true;
  m.multi_latent_attention = true;
  m.kv_lora_rank = 512, m.qk_head_dim = 128, m.qk_pos_emb_head_dim = 64, m.v_head_dim = 128;
}

void deepseek_v2_lite_model(ModelConfig& m) {
  deepseek_common(m);
  m.num_layers = 27, m.hidden_size = 2048, m.ffn_hidden_size = 10944;
  m.num_attention_heads = 16, m.num_query_groups = 16;
  m.make_vocab_size_divisible_by = 3200;
  // MLA without q compression; YaRN positions (HF config values, bridge §4.3).
  m.q_lora_rank.reset();
  m.position_embedding_type = "yarn";
  m.rotary_base = 10000;
  m.rotary_scaling_factor = 40.0, m.original_max_position_embeddings = 4096;
  m.beta_fast = 32.0, m.beta_slow = 1.0, m.mscale = 0.707, m.mscale_all_dim = 0.707;
  // MoE: 64 routed experts top-6 + 2 shared (2 x 1408), first layer dense.
  m.num_moe_experts = 64, m.moe_router_topk = 6, m.moe_ffn_hidden_size = 1408;
  m.moe_shared_expert_intermediate_size = 2816;
  std::vector<Value> freq = {Value::integer(0)};
  for (int k = 0; k < 26; ++k) freq.push_back(Value::integer(1));
  m.moe_layer_freq = Value::make_list(std::move(freq));
  m.moe_router_score_function = "softmax";
  m.moe_router_pre_softmax = true;
  m.moe_router_load_balancing_type = Value::string("seq_aux_loss");
  m.moe_aux_loss_coeff = Value::real(1e-3);
  m.moe_router_topk_scaling_factor = 1.0;
  m.moe_router_num_groups = 1, m.moe_router_group_topk = 1;
  m.moe_router_dtype = "fp32";
  m.moe_grouped_gemm = true;
  m.moe_token_dispatcher_type = "alltoall";
  m.moe_shared_expert_overlap = true;
  m.moe_permute_fusion = true;
}

ConfigContainer deepseek_v2_lite_pretrain() {
  ConfigContainer c = pretrain_common();
  deepseek_v2_lite_model(c.model);
  c.model.cross_entropy_loss_fusion = true;  // the four named pretrain recipes use TE's fused CE
  c.model.cross_entropy_fusion_impl = "te";
  seq(c, 4096);
  null_tokenizer_32000(c);
  c.model.expert_model_parallel_size = 8;
  c.model.recompute_granularity = "full";
  c.model.recompute_method = "uniform";
  c.model.recompute_num_layers = 1;
  c.train.global_batch_size = 512;
  c.train.micro_batch_size = 1;
  c.train.train_iters = 1000000;
  c.scheduler.lr_warmup_iters = 2000;
  c.validation.eval_interval = 2000;
  c.validation.eval_iters = 32;
  c.checkpoint.save_interval = 2000;
  c.checkpoint.async_save = false;
  c.ddp.data_parallel_sharding_strategy = "no_shard";
  return c;
}

// DeepSeek-V3 (671B): the model Bridge's recipe builds with AutoBridge from the Hub's
// deepseek-ai/DeepSeek-V3 config.json (DeepSeekV3Bridge: MLA with a q latent, YaRN x40, 3 dense
// layers then 256 routed experts top-8 with one shared, the sigmoid router with its expert bias and
// 8 groups of which 4, scaled 2.5, the sequence-level aux loss at aux_loss_alpha, one MTP layer),
// and the recipe's own settings (deepseek_v3_pretrain_1024gpu_h100_bf16_config).
void deepseek_v3_model(ModelConfig& m) {
  deepseek_common(m);
  m.num_layers = 61, m.hidden_size = 7168, m.ffn_hidden_size = 18432;
  m.num_attention_heads = 128, m.num_query_groups = 128;
  m.make_vocab_size_divisible_by = 1280;
  m.init_method_std = 0.006;
  m.q_lora_rank = 1536;
  m.position_embedding_type = "rope";
  m.rope_type = "yarn";
  m.rotary_base = 10000;
  m.rotary_scaling_factor = 40.0, m.original_max_position_embeddings = 4096;
  m.beta_fast = 32.0, m.beta_slow = 1.0, m.mscale = 1.0, m.mscale_all_dim = 1.0;
  m.num_moe_experts = 256, m.moe_router_topk = 8, m.moe_ffn_hidden_size = 2048;
  m.moe_shared_expert_intermediate_size = 2048;
  std::vector<Value> freq;
  for (int k = 0; k < 61; ++k) freq.push_back(Value::integer(k < 3 ? 0 : 1));
  m.moe_layer_freq = Value::make_list(std::move(freq));
  m.moe_router_score_function = "sigmoid";
  m.moe_router_enable_expert_bias = true;
  m.moe_router_pre_softmax = true;
  m.moe_router_load_balancing_type = Value::string("seq_aux_loss");
  m.moe_aux_loss_coeff = Value::real(1e-3);  // config.json's aux_loss_alpha
  m.moe_router_topk_scaling_factor = 2.5;
  m.moe_router_num_groups = 8, m.moe_router_group_topk = 4;
  m.moe_router_dtype = "fp32";
  m.moe_grouped_gemm = true;
  m.moe_token_dispatcher_type = "alltoall";
  m.moe_shared_expert_overlap = true;
  m.moe_permute_fusion = true;
  m.mtp_num_layers = 1;
  m.mtp_loss_scaling_factor = 0.1;
}

ConfigContainer deepseek_v3_pretrain() {
  ConfigContainer c = pretrain_common();
  deepseek_v3_model(c.model);
  c.model.cross_entropy_loss_fusion = true;
  c.model.cross_entropy_fusion_impl = "te";
  seq(c, 4096);
  null_tokenizer_32000(c);
  c.model.tensor_model_parallel_size = 2;
  c.model.pipeline_model_parallel_size = 16;
  c.model.expert_model_parallel_size = 64;
  c.model.expert_tensor_parallel_size = 1;
  c.model.sequence_parallel = true;
  c.train.global_batch_size = 4096;
  c.train.micro_batch_size = 1;
  c.train.train_iters = 1000000;
  c.train.manual_gc = true;
  c.train.manual_gc_interval = 5;
  c.scheduler.lr_warmup_iters = 2000;
  c.validation.eval_interval = 2000;
  return c;
}

// SFT / PEFT variants (bridge §4.5).
struct FinetuneShape {
  int64_t tp, seq, gbs, iters, warmup;
  OptInt decay;
  int64_t save_interval;
};

ConfigContainer finetune(void (*model)(ModelConfig&), const char* hf_id, bool peft, const FinetuneShape& s) {
  ConfigContainer c = finetune_common(peft);
  model(c.model);
  llama_fusions(c, "native");
  seq(c, s.seq);
  c.model.tensor_model_parallel_size = s.tp;
  c.train.global_batch_size = s.gbs;
  c.train.micro_batch_size = 1;
  c.train.train_iters = s.iters;
  c.scheduler.lr_warmup_iters = s.warmup;
  c.scheduler.lr_decay_iters = s.decay;
  c.validation.eval_interval = 30;
  c.checkpoint.save_interval = s.save_interval;
  c.tokenizer.tokenizer_model = hf_id;
  if (peft) {  // PEFT recipes keep both distributed-optimizer switches off, CE fusion off
    c.optimizer.use_distributed_optimizer = false;
    c.ddp.use_distributed_optimizer = false;
    c.model.cross_entropy_loss_fusion = false;
  }
  return c;
}

const FinetuneShape kLlama32Ft{1, 4096, 8, 1000, 50, std::nullopt, 50};
const FinetuneShape kLlama3Sft{2, 4096, 8, 1000, 50, std::nullopt, 50};
const FinetuneShape kLlama3Peft{1, 4096, 8, 1000, 50, std::nullopt, 50};
const FinetuneShape kQwen3Sft{4, 2048, 32, 100, 10, 100, 100};
const FinetuneShape kQwen3Peft{1, 2048, 32, 100, 10, 100, 100};

ConfigContainer llama32_1b_sft() { return finetune(llama32_1b_model, "meta-llama/Llama-3.2-1B", false, kLlama32Ft); }
ConfigContainer llama32_1b_peft() { return finetune(llama32_1b_model, "meta-llama/Llama-3.2-1B", true, kLlama32Ft); }
ConfigContainer llama3_8b_sft() { return finetune(llama3_8b_model, "meta-llama/Meta-Llama-3-8B", false, kLlama3Sft); }
ConfigContainer llama3_8b_peft() {
  ConfigContainer c = finetune(llama3_8b_model, "meta-llama/Meta-Llama-3-8B", true, kLlama3Peft);
  c.peft.dim = 8, c.peft.alpha = 16;
  return c;
}
ConfigContainer qwen3_8b_sft() {
  ConfigContainer c = finetune(qwen3_8b_model, "Qwen/Qwen3-8B", false, kQwen3Sft);
  c.dataset.random_seed = 1234;
  c.model.cross_entropy_loss_fusion = true;
  return c;
}
ConfigContainer qwen3_8b_peft() {
  ConfigContainer c = finetune(qwen3_8b_model, "Qwen/Qwen3-8B", true, kQwen3Peft);
  c.optimizer.use_distributed_optimizer = true;  // unlike the other PEFT recipes (bridge §4.5)
  c.dataset.random_seed = 1234;
  c.dataset.pad_seq_to_mult = 4;
  c.model.cross_entropy_loss_fusion = true;  // Qwen3 PEFT keeps the (native) CE fusion on
  c.peft.dim = 8, c.peft.alpha = 16, c.peft.dropout = 0.0;
  c.peft.target_modules = {"linear_qkv", "linear_proj"};
  return c;
}

}  // namespace

const std::vector<Recipe>& all_recipes() {
  static const std::vector<Recipe> recipes = {
      {"vanilla_gpt_pretrain_config", {"vanilla_gpt_pretrain_1gpu_h100_bf16_config"}, "pretrain",
       "bare GPT (LayerNorm, GeLU, learned positions) for MLM<->Bridge loss correlation; set the model shape",
       vanilla_gpt_pretrain},
      {"llama32_1b_pretrain_config", {"llama32_1b_pretrain_1gpu_h100_bf16_config"}, "pretrain",
       "Llama 3.2 1B, seq 8192, GBS 512, 1 GPU", llama32_1b_pretrain},
      {"llama3_8b_pretrain_config", {"llama3_8b_pretrain_2gpu_h100_bf16_config"}, "pretrain",
       "Llama 3 8B, seq 8192, GBS 512, CP 2", llama3_8b_pretrain},
      {"qwen3_8b_pretrain_config", {"qwen3_8b_pretrain_16gpu_h100_bf16_config"}, "pretrain",
       "Qwen3 8B (QK-norm), seq 4096, GBS 1024, 100 iterations on 16 GPUs", qwen3_8b_pretrain},
      {"qwen3_8b_pretrain_4gpu_h100_bf16_config", {}, "pretrain",
       "Qwen3 8B, seq 4096, TP 4, GBS 32 (Bridge v0.5.1's default)", qwen3_8b_pretrain_4gpu},
      {"deepseek_v2_lite_pretrain_config", {"deepseek_v2_lite_pretrain_8gpu_h100_bf16_config"}, "pretrain",
       "DeepSeek-V2-Lite: MLA + 64-expert MoE, seq 4096, EP 8", deepseek_v2_lite_pretrain},
      {"deepseek_v3_pretrain_config", {"deepseek_v3_pretrain_1024gpu_h100_bf16_config"}, "pretrain",
       "DeepSeek-V3 671B: MLA + 256-expert MoE + MTP, seq 4096, TP 2 PP 16 EP 64", deepseek_v3_pretrain},
      {"moe_2b_pretrain_config", {}, "pretrain",
       "laoyao's flagship MoE: Qwen3-MoE style, 24 layers, 64 experts top-8, ~2.2B total / ~0.6B active, seq 4096",
       moe_2b_pretrain},
      {"llama32_1b_sft_config", {"llama32_1b_sft_1gpu_h100_bf16_config"}, "sft",
       "Llama 3.2 1B full fine-tune on packed SQuAD", llama32_1b_sft},
      {"llama32_1b_peft_config", {"llama32_1b_peft_1gpu_h100_bf16_config"}, "peft",
       "Llama 3.2 1B LoRA (dim 32) on packed SQuAD", llama32_1b_peft},
      {"llama3_8b_sft_config", {"llama3_8b_sft_2gpu_h100_bf16_config"}, "sft",
       "Llama 3 8B full fine-tune on packed SQuAD, TP 2", llama3_8b_sft},
      {"llama3_8b_peft_config", {"llama3_8b_peft_1gpu_h100_bf16_config"}, "peft",
       "Llama 3 8B LoRA (dim 8, alpha 16) on packed SQuAD", llama3_8b_peft},
      {"qwen3_8b_sft_config", {"qwen3_8b_sft_4gpu_h100_bf16_config"}, "sft",
       "Qwen3 8B full fine-tune on packed SQuAD, TP 4", qwen3_8b_sft},
      {"qwen3_8b_peft_config", {"qwen3_8b_peft_1gpu_h100_bf16_config"}, "peft",
       "Qwen3 8B LoRA (dim 8, alpha 16, qkv+proj) on packed SQuAD", qwen3_8b_peft},
  };
  return recipes;
}

const Recipe& find_recipe(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& r : all_recipes()) {
    if (r.name == name) return r;
    for (const auto& a : r.aliases)
      if (a == name) return r;
    names.push_back(r.name);
    for (const auto& a : r.aliases) names.push_back(a);
  }
  throw UsageError("Recipe '" + name + "' not found" + did_you_mean(name, names) +
                   "; `laoyao recipes` lists them");
}

}  // namespace laoyao::config
