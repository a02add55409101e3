// ConfigContainer: one typed configuration for a run, with Megatron-Bridge's sections and field
// paths (model.*, train.*, optimizer.*, ...). Both front ends (Megatron-LM flags, Bridge recipes
// with overrides) fill one of these; validate() (validate.hpp) then resolves and checks it.
//
// Every section lists its fields in visit(); generic code (YAML, overrides, diffs) walks them.
// Defaults are those of Megatron-Bridge's dataclasses at HEAD (shared/reference/megatron-bridge.md
// §3), i.e. MCore's TransformerConfig/OptimizerConfig/... defaults where Bridge keeps them.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/value.hpp"

namespace laoyao::config {

using OptInt = std::optional<int64_t>;
using OptFloat = std::optional<double>;
using OptString = std::optional<std::string>;
using Strings = std::vector<std::string>;
using Choices = std::vector<std::string>;

// GPTModelProvider = MCore TransformerConfig + GPT extras (reference: bridge §3.1, MLM §2, §9).
struct ModelConfig {
  // shape
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  OptInt ffn_hidden_size;  // null -> 4*hidden_size
  OptInt kv_channels;      // null -> hidden_size / num_attention_heads
  OptInt num_query_groups; // null -> num_attention_heads (MHA)
  int64_t seq_length = 1024;
  OptInt max_position_embeddings;  // size of the learned position table; null -> seq_length
  OptInt vocab_size;               // null -> the tokenizer's vocabulary, padded
  int64_t make_vocab_size_divisible_by = 128;
  bool should_pad_vocab = false;
  bool share_embeddings_and_output_weights = true;
  // layer math
  std::string normalization = "LayerNorm";
  double layernorm_epsilon = 1e-5;
  bool layernorm_zero_centered_gamma = false;
  bool qk_layernorm = false;
  bool add_bias_linear = true;
  bool add_qkv_bias = false;
  bool gated_linear_unit = false;
  std::string activation_func = "gelu";
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double init_method_std = 0.02;
  OptFloat embedding_init_method_std;
  bool apply_query_key_layer_scaling = false;
  bool attention_softmax_in_fp32 = false;
  bool fp32_residual_connection = false;
  bool calculate_per_token_loss = false;
  bool fp16_lm_cross_entropy = false;
  bool parallel_output = true;
  // positions
  std::string position_embedding_type = "learned_absolute";
  // Megatron's cp_comm_type: how context-parallel ranks meet the sequence's keys and values. The
  // CPU backend gathers them whole either way (the same numbers as the ring).
  std::string cp_comm_type = "p2p";
  // Multi-latent attention's RoPE (Megatron-LM's --rope-type): rope or yarn; unset, MLA takes yarn
  // (MLATransformerConfig's default), and yarn positions yarn.
  OptString rope_type;
  double rotary_base = 10000;
  double rotary_percent = 1.0;
  bool rope_scaling = false;
  double rope_scaling_factor = 1.0;
  OptFloat seq_len_interpolation_factor;
  // fusions and kernels (numerically relevant: bias_activation_fusion selects tanh-GeLU)
  bool bias_activation_fusion = false;
  bool bias_dropout_fusion = false;
  bool masked_softmax_fusion = true;
  bool persist_layer_norm = false;
  bool gradient_accumulation_fusion = true;
  bool apply_rope_fusion = false;
  bool cross_entropy_loss_fusion = true;
  std::string cross_entropy_fusion_impl = "native";
  std::string attention_backend = "auto";
  std::string transformer_impl = "transformer_engine";
  bool deterministic_mode = false;
  // parallelism
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  OptInt virtual_pipeline_model_parallel_size;
  int64_t context_parallel_size = 1;
  int64_t expert_model_parallel_size = 1;
  OptInt expert_tensor_parallel_size;
  bool sequence_parallel = false;
  // activation recomputation
  OptString recompute_granularity;
  OptString recompute_method;
  OptInt recompute_num_layers;
  // precision (set by the mixed_precision preset)
  bool bf16 = false;
  bool fp16 = false;
  std::string params_dtype = "fp32";
  // FP8 linear layers (TransformerConfig's fields and Megatron's defaults; Megatron-LM's --fp8-*
  // flags, or mixed_precision's values, which replace them all; docs/reference/fp8-facts.md §1, §6)
  OptString fp8;                      // e4m3 or hybrid; null: off
  std::string fp8_recipe = "delayed";  // delayed, tensorwise, blockwise (mxfp8, custom: refused)
  int64_t fp8_margin = 0;
  int64_t fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";
  bool fp8_wgrad = true;  // (Transformer Engine 2 drops it: the weight gradient's GEMM is FP8 either way)
  bool fp8_param = false;  // --fp8-param-gather
  bool fp8_dot_product_attention = false;
  bool fp8_multi_head_attention = false;
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 1;
  int64_t num_layers_at_end_in_bf16 = 1;
  // Mixture of Experts (MLM §9.1)
  OptInt num_moe_experts;
  OptInt moe_ffn_hidden_size;
  int64_t moe_router_topk = 2;
  Value moe_layer_freq = Value::integer(1);  // int N or a list of 0/1 per layer
  // A type (aux_loss, seq_aux_loss, global_aux_loss, none) and its coefficient, or lists of both,
  // paired by position (Megatron's nargs='+' flags).
  Value moe_router_load_balancing_type = Value::string("aux_loss");
  Value moe_aux_loss_coeff = Value::real(0.0);
  OptFloat moe_z_loss_coeff;
  std::string moe_router_score_function = "softmax";
  bool moe_router_pre_softmax = false;
  OptFloat moe_router_topk_scaling_factor;
  OptString moe_router_dtype;
  bool moe_router_enable_expert_bias = false;
  bool moe_router_force_load_balancing = false;  // benchmarks: random router logits (Megatron's flag)
  double moe_router_bias_update_rate = 1e-3;
  OptInt moe_router_num_groups;
  OptInt moe_router_group_topk;
  OptInt moe_shared_expert_intermediate_size;
  bool moe_shared_expert_overlap = false;
  OptFloat moe_expert_capacity_factor;
  std::string moe_token_drop_policy = "probs";
  bool moe_pad_expert_input_to_capacity = false;
  bool moe_grouped_gemm = false;
  std::string moe_token_dispatcher_type = "allgather";
  bool moe_permute_fusion = false;
  bool moe_router_fusion = false;
  // Multi-latent attention (DeepSeek-V2)
  bool multi_latent_attention = false;
  OptInt q_lora_rank = 512;
  int64_t kv_lora_rank = 512;
  int64_t qk_head_dim = 128;
  int64_t qk_pos_emb_head_dim = 64;
  int64_t v_head_dim = 128;
  double rotary_scaling_factor = 40.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  // YaRN's correction range rounded to whole dims (Megatron-LM's --[no-]yarn-correction-range-round-to-int)
  bool yarn_correction_range_round_to_int = true;
  // Multi-token prediction
  OptInt mtp_num_layers;
  double mtp_loss_scaling_factor = 0.1;

  template <class V> void visit(V& v);
};

struct TrainConfig {
  OptInt micro_batch_size;
  OptInt global_batch_size;
  OptInt train_iters;
  OptInt train_samples;
  std::vector<int64_t> rampup_batch_size;  // [start, increment, samples] or empty
  bool decrease_batch_size_if_needed = false;
  int64_t empty_unused_memory_level = 0;
  OptInt exit_interval;
  OptInt exit_duration_in_mins;
  bool exit_signal_handler = false;
  bool manual_gc = false;
  int64_t manual_gc_interval = 0;
  bool manual_gc_eval = true;
  OptInt check_weight_hash_across_dp_replicas_interval;
  OptInt train_sync_interval;
  std::vector<int64_t> iterations_to_skip;
  bool check_optimizer_step_success = true;
  bool skip_sync_grad_norm_across_mp = false;
  // Deprecated at Bridge HEAD: copied into validation.* by validate() with a warning.
  OptInt eval_iters;
  OptInt eval_interval;
  std::optional<bool> skip_train;

  template <class V> void visit(V& v);
};

struct ValidationConfig {
  int64_t eval_iters = 100;
  OptInt eval_interval;  // null -> no evaluation during training
  OptInt start_eval_at_iter;
  OptInt eval_global_batch_size;
  OptInt eval_micro_batch_size;
  bool skip_train = false;
  bool full_validation = false;
  bool multiple_validation_sets = false;

  template <class V> void visit(V& v);
};

struct OptimizerConfig {
  std::string optimizer = "adam";  // AdamW: decoupled weight decay
  OptFloat lr;
  OptFloat min_lr;
  OptFloat decoupled_lr;
  OptFloat decoupled_min_lr;
  double weight_decay = 0.01;
  // Megatron-Core's apply_wd_to_qk_layernorm (Qwen3-Next): q/k layernorm weights take weight decay,
  // an exception to "no decay for 1-D parameters and biases".
  bool apply_wd_to_qk_layernorm = false;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double sgd_momentum = 0.9;
  double clip_grad = 1.0;
  bool decoupled_weight_decay = true;
  bool bf16 = false;
  bool fp16 = false;
  std::string params_dtype = "fp32";
  bool use_distributed_optimizer = false;
  bool overlap_param_gather = false;
  bool use_precision_aware_optimizer = false;
  std::string main_grads_dtype = "fp32";
  std::string main_params_dtype = "fp32";
  std::string exp_avg_dtype = "fp32";
  std::string exp_avg_sq_dtype = "fp32";
  OptFloat loss_scale;
  double initial_loss_scale = 4294967296.0;
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;

  template <class V> void visit(V& v);
};

struct SchedulerConfig {
  std::string lr_decay_style = "linear";
  OptInt lr_decay_iters;
  OptInt lr_decay_samples;
  int64_t lr_warmup_iters = 0;
  int64_t lr_warmup_samples = 0;
  OptFloat lr_warmup_fraction;
  double lr_warmup_init = 0.0;
  std::string lr_wsd_decay_style = "exponential";
  OptInt lr_wsd_decay_iters;
  OptInt lr_wsd_decay_samples;
  OptFloat start_weight_decay;  // null -> optimizer.weight_decay
  OptFloat end_weight_decay;    // null -> optimizer.weight_decay
  std::string weight_decay_incr_style = "constant";
  bool override_opt_param_scheduler = false;
  bool use_checkpoint_opt_param_scheduler = false;
  OptString no_weight_decay_cond_type;
  OptInt max_steps;
  // Derived by validate(), in samples (Bridge's _calculate_scheduler_steps); not settable.
  OptFloat lr_warmup_steps;  // a float, as in Bridge/MCore: lr_warmup_fraction * lr_decay_steps
  OptInt lr_decay_steps;
  OptInt wd_incr_steps;
  OptInt wsd_decay_steps;

  template <class V> void visit(V& v);
};

struct DatasetConfig {
  OptInt seq_length;
  int64_t random_seed = 1234;
  Value blend;            // [[prefix, ...], [weight, ...] or null] or null
  Value blend_per_split;  // [blend_train, blend_valid, blend_test] or null
  std::vector<std::string> data_path;  // MLM --data-path form: [w1] p1 [w2 p2 ...]
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  OptString split;
  std::optional<bool> mock;  // null -> true when no blend, blend_per_split or data_path is given
  OptString path_to_cache;
  bool mmap_bin_files = true;
  int64_t num_dataset_builder_threads = 1;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  bool skip_getting_attention_mask_from_dataset = true;
  OptString dataloader_type;
  int64_t num_workers = 2;
  bool data_sharding = true;
  bool pin_memory = true;
  bool drop_last = true;
  bool persistent_workers = true;
  // Fine-tuning datasets (SFT/PEFT recipes): null for pretraining. dataset_root: the folder of
  // training.jsonl / validation.jsonl / test.jsonl (Bridge's GPTSFTDatasetConfig.dataset_root);
  // dataset_name: the hub dataset a recipe names (nothing is downloaded: dataset_root gives it).
  OptString dataset_root;
  OptString dataset_name;
  bool packed_sequence = false;
  int64_t pad_seq_to_mult = 1;
  // Megatron-LM's own SFT (pretrain_gpt.py --sft): data_path is a JSONL file of {"messages": [...]}
  // rows, SFTDataset's packed conversations (data/mlm_sft_dataset.hpp). laoyao's field for the flag.
  bool sft = false;
  // Bridge's GPTSFTDatasetConfig.preprocessing: null (prompt-completion rows {"input", "output"}
  // with separator " ", as Bridge resolves it for a dataset_root), or a mapping whose _target_
  // names ChatSFTPreprocessingConfig (loss_mode) or PromptCompletionSFTPreprocessingConfig (its
  // fields); checked where the datasets are built.
  Value preprocessing;

  template <class V> void visit(V& v);
};

struct TokenizerConfig {
  OptString tokenizer_type;
  OptString tokenizer_model;
  OptInt vocab_size;
  OptString vocab_file;
  OptString merge_file;
  int64_t vocab_extra_ids = 0;
  std::vector<std::string> special_tokens;
  OptString chat_template;
  OptString chat_template_path;  // Bridge: a file holding the chat template (not with chat_template)
  // Bridge's tokenizer_prompt_format (Megatron-LM's --sft-tokenizer-prompt-format): the
  // SFTTokenizer's prompt format, nemotron-h-aligned when unset.
  OptString tokenizer_prompt_format;
  int64_t tiktoken_num_special_tokens = 1000;
  int64_t make_vocab_size_divisible_by = 1;
  bool use_tokenizer_vocab_size = false;
  // laoyao: NullTokenizer(V) semantics. true = Megatron-LM since 2026-04-22 (vocab V, EOD V-1);
  // false = the MCore that Megatron-Bridge pins (vocab V+1, EOD V). Front ends set their own.
  bool null_vocab_includes_eod = false;

  template <class V> void visit(V& v);
};

struct LoggerConfig {
  int64_t log_interval = 100;
  bool log_params_norm = false;
  bool log_throughput = false;
  bool log_throughput_to_tensorboard = false;  // Bridge's throughput/* scalars
  int64_t throughput_window_size = 100;
  bool log_progress = false;
  int64_t timing_log_level = 0;
  std::string timing_log_option = "minmax";
  OptString tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  int64_t tensorboard_queue_size = 1000;
  bool log_timers_to_tensorboard = false;
  bool log_loss_scale_to_tensorboard = true;
  bool log_validation_ppl_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  OptInt log_memory_interval;  // the memory line also at log lines that are multiples of it
  bool log_l2_norm_grad_to_tensorboard = false;
  bool log_num_zeros_in_grad = false;
  bool log_world_size_to_tensorboard = false;
  OptString wandb_project;
  OptString wandb_exp_name;
  OptString wandb_save_dir;
  OptString wandb_entity;
  OptString logging_level;
  bool filter_warnings = true;
  bool log_energy = false;
  OptString save_config_filepath;
  bool skip_train_metrics_log = false;

  template <class V> void visit(V& v);
};

struct CheckpointConfig {
  OptString save;
  OptInt save_interval;
  int64_t most_recent_k = -1;
  bool save_optim = true;
  bool save_rng = true;
  OptString load;
  bool load_optim = true;
  bool load_rng = true;
  bool load_main_params_from_ckpt = false;
  bool finetune = false;
  OptString pretrained_checkpoint;
  OptInt ckpt_step;
  bool exit_on_missing_checkpoint = false;
  std::string ckpt_format = "torch_dist";
  bool fully_parallel_save = true;
  bool fully_parallel_load = false;
  bool async_save = false;
  bool use_persistent_ckpt_worker = true;
  std::string dist_ckpt_strictness = "assume_ok_unexpected";
  bool save_tokenizer_assets = true;
  bool use_checkpoint_args = false;
  bool auto_detect_ckpt_format = false;

  template <class V> void visit(V& v);
};

struct RngConfig {
  int64_t seed = 1234;
  bool te_rng_tracker = false;
  bool inference_rng_tracker = false;
  bool data_parallel_random_init = false;

  template <class V> void visit(V& v);
};

struct DdpConfig {
  bool grad_reduce_in_fp32 = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  bool align_param_gather = false;
  bool use_distributed_optimizer = false;
  bool check_for_nan_in_grad = false;
  OptInt bucket_size;
  bool average_in_collective = false;
  std::string data_parallel_sharding_strategy = "no_shard";
  bool use_megatron_fsdp = false;

  template <class V> void visit(V& v);
};

struct DistConfig {
  std::string distributed_backend = "nccl";
  int64_t distributed_timeout_minutes = 10;
  bool align_grad_reduce = true;
  bool use_gloo_process_groups = true;
  bool use_sharp = false;
  bool use_tp_pp_dp_mapping = false;
  bool lazy_mpu_init = false;
  bool use_torch_fsdp2 = false;
  bool external_gpu_device_mapping = false;

  template <class V> void visit(V& v);
};

struct ProfilingConfig {
  bool use_nsys_profiler = false;
  bool use_pytorch_profiler = false;
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::vector<int64_t> profile_ranks = {0};
  bool record_memory_history = false;
  std::string memory_snapshot_path = "/nemo_run/snapshot.pickle";
  bool record_shapes = false;
  bool nvtx_ranges = false;

  template <class V> void visit(V& v);
};

// Bridge's LoRA/DoRA (src/megatron/bridge/peft/lora.py); scheme null = no PEFT.
struct PeftConfig {
  OptString scheme;
  std::vector<std::string> target_modules = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"};
  int64_t dim = 32;
  double alpha = 32;
  double dropout = 0.0;
  std::string dropout_position = "pre";
  std::string lora_A_init_method = "xavier";
  std::string lora_B_init_method = "zero";

  template <class V> void visit(V& v);
};

struct ConfigContainer {
  RngConfig rng;
  TrainConfig train;
  ModelConfig model;
  OptimizerConfig optimizer;
  DdpConfig ddp;
  SchedulerConfig scheduler;
  DatasetConfig dataset;
  LoggerConfig logger;
  TokenizerConfig tokenizer;
  CheckpointConfig checkpoint;
  DistConfig dist;
  ProfilingConfig profiling;
  PeftConfig peft;
  ValidationConfig validation;
  // Bridge's mixed_precision: a preset name (bf16_mixed, fp16_mixed, ...) or a mapping of
  // MixedPrecisionConfig fields ({bf16: true, params_dtype: bf16, grad_reduce_in_fp32: false}),
  // copied onto model/optimizer/ddp by validate().
  Value mixed_precision;
  std::map<std::string, std::string> env_vars;

  template <class V> void visit(V& v);
};

// Values computed by validate() that are not config fields of their own.
struct Derived {
  int64_t world_size = 1;
  int64_t data_parallel_size = 1;
  int64_t num_microbatches = 1;
  int64_t padded_vocab_size = 0;  // 0: known only once the tokenizer files are read
  int64_t tokenizer_vocab_size = 0;
  int64_t eod_id = -1;
  int64_t train_samples = 0, valid_samples = 0, test_samples = 0;
  // The iterations to train: train.train_iters, or with train.train_samples the whole global
  // batches in it (Megatron-LM's update_train_iters: train_samples // global_batch_size).
  int64_t train_iters = 0;
};

}  // namespace laoyao::config

#include "config/config_container_visit.hpp"
