// Field lists of the config sections, in the order Bridge declares them. Keep each list in step
// with the members in config_container.hpp (tests/config checks the YAML has every section).
#pragma once

namespace laoyao::config {

template <class V> void ModelConfig::visit(V& v) {
  v.field("num_layers", num_layers);
  v.field("hidden_size", hidden_size);
  v.field("num_attention_heads", num_attention_heads);
  v.field("ffn_hidden_size", ffn_hidden_size);
  v.field("kv_channels", kv_channels);
  v.field("num_query_groups", num_query_groups);
  v.field("seq_length", seq_length);
  v.field("max_position_embeddings", max_position_embeddings);
  v.field("vocab_size", vocab_size);
  v.field("make_vocab_size_divisible_by", make_vocab_size_divisible_by);
  v.field("should_pad_vocab", should_pad_vocab);
  v.field("share_embeddings_and_output_weights", share_embeddings_and_output_weights);
  v.field("normalization", normalization, Choices{"LayerNorm", "RMSNorm"});
  v.field("layernorm_epsilon", layernorm_epsilon);
  v.field("layernorm_zero_centered_gamma", layernorm_zero_centered_gamma);
  v.field("qk_layernorm", qk_layernorm);
  v.field("add_bias_linear", add_bias_linear);
  v.field("add_qkv_bias", add_qkv_bias);
  v.field("gated_linear_unit", gated_linear_unit);
  v.field("activation_func", activation_func, Choices{"gelu", "silu", "relu", "squared_relu", "quick_gelu", "fast_gelu"});
  v.field("hidden_dropout", hidden_dropout);
  v.field("attention_dropout", attention_dropout);
  v.field("init_method_std", init_method_std);
  v.field("embedding_init_method_std", embedding_init_method_std);
  v.field("apply_query_key_layer_scaling", apply_query_key_layer_scaling);
  v.field("attention_softmax_in_fp32", attention_softmax_in_fp32);
  v.field("fp32_residual_connection", fp32_residual_connection);
  v.field("calculate_per_token_loss", calculate_per_token_loss);
  v.field("fp16_lm_cross_entropy", fp16_lm_cross_entropy);
  v.field("parallel_output", parallel_output);
  v.field("position_embedding_type", position_embedding_type, Choices{"learned_absolute", "rope", "yarn", "mrope", "relative", "none"});
  v.field("rope_type", rope_type, Choices{"rope", "yarn"});
  v.field("cp_comm_type", cp_comm_type, Choices{"p2p", "all_gather", "a2a", "a2a+p2p"});
  v.field("rotary_base", rotary_base);
  v.field("rotary_percent", rotary_percent);
  v.field("rope_scaling", rope_scaling);
  v.field("rope_scaling_factor", rope_scaling_factor);
  v.field("seq_len_interpolation_factor", seq_len_interpolation_factor);
  v.field("bias_activation_fusion", bias_activation_fusion);
  v.field("bias_dropout_fusion", bias_dropout_fusion);
  v.field("masked_softmax_fusion", masked_softmax_fusion);
  v.field("persist_layer_norm", persist_layer_norm);
  v.field("gradient_accumulation_fusion", gradient_accumulation_fusion);
  v.field("apply_rope_fusion", apply_rope_fusion);
  v.field("cross_entropy_loss_fusion", cross_entropy_loss_fusion);
  v.field("cross_entropy_fusion_impl", cross_entropy_fusion_impl, Choices{"native", "te"});
  v.field("attention_backend", attention_backend, Choices{"auto", "flash", "fused", "unfused", "local"});
  v.field("transformer_impl", transformer_impl, Choices{"local", "transformer_engine", "inference_optimized"});
  v.field("deterministic_mode", deterministic_mode);
  v.field("tensor_model_parallel_size", tensor_model_parallel_size);
  v.field("pipeline_model_parallel_size", pipeline_model_parallel_size);
  v.field("virtual_pipeline_model_parallel_size", virtual_pipeline_model_parallel_size);
  v.field("context_parallel_size", context_parallel_size);
  v.field("expert_model_parallel_size", expert_model_parallel_size);
  v.field("expert_tensor_parallel_size", expert_tensor_parallel_size);
  v.field("sequence_parallel", sequence_parallel);
  v.field("recompute_granularity", recompute_granularity, Choices{"full", "selective"});
  v.field("recompute_method", recompute_method, Choices{"uniform", "block"});
  v.field("recompute_num_layers", recompute_num_layers);
  v.field("bf16", bf16);
  v.field("fp16", fp16);
  v.field("params_dtype", params_dtype, Choices{"fp32", "bf16", "fp16"});
  v.field("fp8", fp8, Choices{"e4m3", "hybrid"});
  v.field("fp8_recipe", fp8_recipe, Choices{"tensorwise", "delayed", "mxfp8", "blockwise", "custom"});
  v.field("fp8_margin", fp8_margin);
  v.field("fp8_amax_history_len", fp8_amax_history_len);
  v.field("fp8_amax_compute_algo", fp8_amax_compute_algo, Choices{"most_recent", "max"});
  v.field("fp8_wgrad", fp8_wgrad);
  v.field("fp8_param", fp8_param);
  v.field("fp8_dot_product_attention", fp8_dot_product_attention);
  v.field("fp8_multi_head_attention", fp8_multi_head_attention);
  v.field("first_last_layers_bf16", first_last_layers_bf16);
  v.field("num_layers_at_start_in_bf16", num_layers_at_start_in_bf16);
  v.field("num_layers_at_end_in_bf16", num_layers_at_end_in_bf16);
  v.field("num_moe_experts", num_moe_experts);
  v.field("moe_ffn_hidden_size", moe_ffn_hidden_size);
  v.field("moe_router_topk", moe_router_topk);
  v.field("moe_layer_freq", moe_layer_freq);
  v.field("moe_router_load_balancing_type", moe_router_load_balancing_type);  // checked by train/run_setup
  v.field("moe_aux_loss_coeff", moe_aux_loss_coeff);
  v.field("moe_z_loss_coeff", moe_z_loss_coeff);
  v.field("moe_router_score_function", moe_router_score_function, Choices{"softmax", "sigmoid", "sqrtsoftplus"});
  v.field("moe_router_pre_softmax", moe_router_pre_softmax);
  v.field("moe_router_topk_scaling_factor", moe_router_topk_scaling_factor);
  v.field("moe_router_dtype", moe_router_dtype, Choices{"fp32", "fp64"});
  v.field("moe_router_enable_expert_bias", moe_router_enable_expert_bias);
  v.field("moe_router_force_load_balancing", moe_router_force_load_balancing);
  v.field("moe_router_bias_update_rate", moe_router_bias_update_rate);
  v.field("moe_router_num_groups", moe_router_num_groups);
  v.field("moe_router_group_topk", moe_router_group_topk);
  v.field("moe_shared_expert_intermediate_size", moe_shared_expert_intermediate_size);
  v.field("moe_shared_expert_overlap", moe_shared_expert_overlap);
  v.field("moe_expert_capacity_factor", moe_expert_capacity_factor);
  v.field("moe_token_drop_policy", moe_token_drop_policy, Choices{"probs", "position"});
  v.field("moe_pad_expert_input_to_capacity", moe_pad_expert_input_to_capacity);
  v.field("moe_grouped_gemm", moe_grouped_gemm);
  v.field("moe_token_dispatcher_type", moe_token_dispatcher_type, Choices{"allgather", "alltoall", "flex"});
  v.field("moe_permute_fusion", moe_permute_fusion);
  v.field("moe_router_fusion", moe_router_fusion);
  v.field("multi_latent_attention", multi_latent_attention);
  v.field("q_lora_rank", q_lora_rank);
  v.field("kv_lora_rank", kv_lora_rank);
  v.field("qk_head_dim", qk_head_dim);
  v.field("qk_pos_emb_head_dim", qk_pos_emb_head_dim);
  v.field("v_head_dim", v_head_dim);
  v.field("rotary_scaling_factor", rotary_scaling_factor);
  v.field("mscale", mscale);
  v.field("mscale_all_dim", mscale_all_dim);
  v.field("original_max_position_embeddings", original_max_position_embeddings);
  v.field("beta_fast", beta_fast);
  v.field("beta_slow", beta_slow);
  v.field("yarn_correction_range_round_to_int", yarn_correction_range_round_to_int);
  v.field("mtp_num_layers", mtp_num_layers);
  v.field("mtp_loss_scaling_factor", mtp_loss_scaling_factor);
}

template <class V> void TrainConfig::visit(V& v) {
  v.field("micro_batch_size", micro_batch_size);
  v.field("global_batch_size", global_batch_size);
  v.field("train_iters", train_iters);
  v.field("train_samples", train_samples);
  v.field("rampup_batch_size", rampup_batch_size);
  v.field("decrease_batch_size_if_needed", decrease_batch_size_if_needed);
  v.field("empty_unused_memory_level", empty_unused_memory_level);
  v.field("exit_interval", exit_interval);
  v.field("exit_duration_in_mins", exit_duration_in_mins);
  v.field("exit_signal_handler", exit_signal_handler);
  v.field("manual_gc", manual_gc);
  v.field("manual_gc_interval", manual_gc_interval);
  v.field("manual_gc_eval", manual_gc_eval);
  v.field("check_weight_hash_across_dp_replicas_interval", check_weight_hash_across_dp_replicas_interval);
  v.field("train_sync_interval", train_sync_interval);
  v.field("iterations_to_skip", iterations_to_skip);
  v.field("check_optimizer_step_success", check_optimizer_step_success);
  v.field("skip_sync_grad_norm_across_mp", skip_sync_grad_norm_across_mp);
  v.field("eval_iters", eval_iters);
  v.field("eval_interval", eval_interval);
  v.field("skip_train", skip_train);
}

template <class V> void ValidationConfig::visit(V& v) {
  v.field("eval_iters", eval_iters);
  v.field("eval_interval", eval_interval);
  v.field("start_eval_at_iter", start_eval_at_iter);
  v.field("eval_global_batch_size", eval_global_batch_size);
  v.field("eval_micro_batch_size", eval_micro_batch_size);
  v.field("skip_train", skip_train);
  v.field("full_validation", full_validation);
  v.field("multiple_validation_sets", multiple_validation_sets);
}

template <class V> void OptimizerConfig::visit(V& v) {
  v.field("optimizer", optimizer, Choices{"adam", "sgd"});
  v.field("lr", lr);
  v.field("min_lr", min_lr);
  v.field("decoupled_lr", decoupled_lr);
  v.field("decoupled_min_lr", decoupled_min_lr);
  v.field("weight_decay", weight_decay);
  v.field("apply_wd_to_qk_layernorm", apply_wd_to_qk_layernorm);
  v.field("adam_beta1", adam_beta1);
  v.field("adam_beta2", adam_beta2);
  v.field("adam_eps", adam_eps);
  v.field("sgd_momentum", sgd_momentum);
  v.field("clip_grad", clip_grad);
  v.field("decoupled_weight_decay", decoupled_weight_decay);
  v.field("bf16", bf16);
  v.field("fp16", fp16);
  v.field("params_dtype", params_dtype, Choices{"fp32", "bf16", "fp16"});
  v.field("use_distributed_optimizer", use_distributed_optimizer);
  v.field("overlap_param_gather", overlap_param_gather);
  v.field("use_precision_aware_optimizer", use_precision_aware_optimizer);
  v.field("main_grads_dtype", main_grads_dtype, Choices{"fp32", "bf16"});
  v.field("main_params_dtype", main_params_dtype, Choices{"fp32", "fp16"});
  v.field("exp_avg_dtype", exp_avg_dtype, Choices{"fp32", "fp16", "bf16", "fp8"});
  v.field("exp_avg_sq_dtype", exp_avg_sq_dtype, Choices{"fp32", "fp16", "bf16", "fp8"});
  v.field("loss_scale", loss_scale);
  v.field("initial_loss_scale", initial_loss_scale);
  v.field("min_loss_scale", min_loss_scale);
  v.field("loss_scale_window", loss_scale_window);
  v.field("hysteresis", hysteresis);
}

template <class V> void SchedulerConfig::visit(V& v) {
  v.field("lr_decay_style", lr_decay_style, Choices{"constant", "linear", "cosine", "inverse-square-root", "WSD"});
  v.field("lr_decay_iters", lr_decay_iters);
  v.field("lr_decay_samples", lr_decay_samples);
  v.field("lr_warmup_iters", lr_warmup_iters);
  v.field("lr_warmup_samples", lr_warmup_samples);
  v.field("lr_warmup_fraction", lr_warmup_fraction);
  v.field("lr_warmup_init", lr_warmup_init);
  v.field("lr_wsd_decay_style", lr_wsd_decay_style, Choices{"exponential", "linear", "cosine", "minus_sqrt"});
  v.field("lr_wsd_decay_iters", lr_wsd_decay_iters);
  v.field("lr_wsd_decay_samples", lr_wsd_decay_samples);
  v.field("start_weight_decay", start_weight_decay);
  v.field("end_weight_decay", end_weight_decay);
  v.field("weight_decay_incr_style", weight_decay_incr_style, Choices{"constant", "linear", "cosine"});
  v.field("override_opt_param_scheduler", override_opt_param_scheduler);
  v.field("use_checkpoint_opt_param_scheduler", use_checkpoint_opt_param_scheduler);
  v.field("no_weight_decay_cond_type", no_weight_decay_cond_type);
  v.field("max_steps", max_steps);
  v.derived("lr_warmup_steps", lr_warmup_steps);
  v.derived("lr_decay_steps", lr_decay_steps);
  v.derived("wd_incr_steps", wd_incr_steps);
  v.derived("wsd_decay_steps", wsd_decay_steps);
}

template <class V> void DatasetConfig::visit(V& v) {
  v.field("seq_length", seq_length);
  v.field("random_seed", random_seed);
  v.field("blend", blend);
  v.field("blend_per_split", blend_per_split);
  v.field("data_path", data_path);
  v.field("train_data_path", train_data_path);
  v.field("valid_data_path", valid_data_path);
  v.field("test_data_path", test_data_path);
  v.field("split", split);
  v.field("mock", mock);
  v.field("path_to_cache", path_to_cache);
  v.field("mmap_bin_files", mmap_bin_files);
  v.field("num_dataset_builder_threads", num_dataset_builder_threads);
  v.field("reset_position_ids", reset_position_ids);
  v.field("reset_attention_mask", reset_attention_mask);
  v.field("eod_mask_loss", eod_mask_loss);
  v.field("skip_getting_attention_mask_from_dataset", skip_getting_attention_mask_from_dataset);
  v.field("dataloader_type", dataloader_type, Choices{"single", "cyclic", "batch", "external"});
  v.field("num_workers", num_workers);
  v.field("data_sharding", data_sharding);
  v.field("pin_memory", pin_memory);
  v.field("drop_last", drop_last);
  v.field("persistent_workers", persistent_workers);
  v.field("dataset_root", dataset_root);
  v.field("dataset_name", dataset_name);
  v.field("packed_sequence", packed_sequence);
  v.field("pad_seq_to_mult", pad_seq_to_mult);
  v.field("preprocessing", preprocessing);
  v.field("sft", sft);
}

template <class V> void TokenizerConfig::visit(V& v) {
  v.field("tokenizer_type", tokenizer_type);
  v.field("tokenizer_model", tokenizer_model);
  v.field("vocab_size", vocab_size);
  v.field("vocab_file", vocab_file);
  v.field("merge_file", merge_file);
  v.field("vocab_extra_ids", vocab_extra_ids);
  v.field("special_tokens", special_tokens);
  v.field("chat_template", chat_template);
  v.field("chat_template_path", chat_template_path);
  v.field("tokenizer_prompt_format", tokenizer_prompt_format);
  v.field("tiktoken_num_special_tokens", tiktoken_num_special_tokens);
  v.field("make_vocab_size_divisible_by", make_vocab_size_divisible_by);
  v.field("use_tokenizer_vocab_size", use_tokenizer_vocab_size);
  v.field("null_vocab_includes_eod", null_vocab_includes_eod);
}

template <class V> void LoggerConfig::visit(V& v) {
  v.field("log_interval", log_interval);
  v.field("log_params_norm", log_params_norm);
  v.field("log_throughput", log_throughput);
  v.field("log_throughput_to_tensorboard", log_throughput_to_tensorboard);
  v.field("throughput_window_size", throughput_window_size);
  v.field("log_progress", log_progress);
  v.field("timing_log_level", timing_log_level);
  v.field("timing_log_option", timing_log_option, Choices{"max", "minmax", "all"});
  v.field("tensorboard_dir", tensorboard_dir);
  v.field("tensorboard_log_interval", tensorboard_log_interval);
  v.field("tensorboard_queue_size", tensorboard_queue_size);
  v.field("log_timers_to_tensorboard", log_timers_to_tensorboard);
  v.field("log_loss_scale_to_tensorboard", log_loss_scale_to_tensorboard);
  v.field("log_validation_ppl_to_tensorboard", log_validation_ppl_to_tensorboard);
  v.field("log_memory_to_tensorboard", log_memory_to_tensorboard);
  v.field("log_memory_interval", log_memory_interval);
  v.field("log_l2_norm_grad_to_tensorboard", log_l2_norm_grad_to_tensorboard);
  v.field("log_num_zeros_in_grad", log_num_zeros_in_grad);
  v.field("log_world_size_to_tensorboard", log_world_size_to_tensorboard);
  v.field("wandb_project", wandb_project);
  v.field("wandb_exp_name", wandb_exp_name);
  v.field("wandb_save_dir", wandb_save_dir);
  v.field("wandb_entity", wandb_entity);
  v.field("logging_level", logging_level);
  v.field("filter_warnings", filter_warnings);
  v.field("log_energy", log_energy);
  v.field("save_config_filepath", save_config_filepath);
  v.field("skip_train_metrics_log", skip_train_metrics_log);
}

template <class V> void CheckpointConfig::visit(V& v) {
  v.field("save", save);
  v.field("save_interval", save_interval);
  v.field("most_recent_k", most_recent_k);
  v.field("save_optim", save_optim);
  v.field("save_rng", save_rng);
  v.field("load", load);
  v.field("load_optim", load_optim);
  v.field("load_rng", load_rng);
  v.field("load_main_params_from_ckpt", load_main_params_from_ckpt);
  v.field("finetune", finetune);
  v.field("pretrained_checkpoint", pretrained_checkpoint);
  v.field("ckpt_step", ckpt_step);
  v.field("exit_on_missing_checkpoint", exit_on_missing_checkpoint);
  v.field("ckpt_format", ckpt_format, Choices{"torch_dist", "zarr", "fsdp_dtensor", "torch"});
  v.field("fully_parallel_save", fully_parallel_save);
  v.field("fully_parallel_load", fully_parallel_load);
  v.field("async_save", async_save);
  v.field("use_persistent_ckpt_worker", use_persistent_ckpt_worker);
  v.field("dist_ckpt_strictness", dist_ckpt_strictness);
  v.field("save_tokenizer_assets", save_tokenizer_assets);
  v.field("use_checkpoint_args", use_checkpoint_args);
  v.field("auto_detect_ckpt_format", auto_detect_ckpt_format);
}

template <class V> void RngConfig::visit(V& v) {
  v.field("seed", seed);
  v.field("te_rng_tracker", te_rng_tracker);
  v.field("inference_rng_tracker", inference_rng_tracker);
  v.field("data_parallel_random_init", data_parallel_random_init);
}

template <class V> void DdpConfig::visit(V& v) {
  v.field("grad_reduce_in_fp32", grad_reduce_in_fp32);
  v.field("overlap_grad_reduce", overlap_grad_reduce);
  v.field("overlap_param_gather", overlap_param_gather);
  v.field("align_param_gather", align_param_gather);
  v.field("use_distributed_optimizer", use_distributed_optimizer);
  v.field("check_for_nan_in_grad", check_for_nan_in_grad);
  v.field("bucket_size", bucket_size);
  v.field("average_in_collective", average_in_collective);
  v.field("data_parallel_sharding_strategy", data_parallel_sharding_strategy, Choices{"no_shard", "optim", "optim_grads", "optim_grads_params"});
  v.field("use_megatron_fsdp", use_megatron_fsdp);
}

template <class V> void DistConfig::visit(V& v) {
  v.field("distributed_backend", distributed_backend, Choices{"nccl", "gloo"});
  v.field("distributed_timeout_minutes", distributed_timeout_minutes);
  v.field("align_grad_reduce", align_grad_reduce);
  v.field("use_gloo_process_groups", use_gloo_process_groups);
  v.field("use_sharp", use_sharp);
  v.field("use_tp_pp_dp_mapping", use_tp_pp_dp_mapping);
  v.field("lazy_mpu_init", lazy_mpu_init);
  v.field("use_torch_fsdp2", use_torch_fsdp2);
  v.field("external_gpu_device_mapping", external_gpu_device_mapping);
}

template <class V> void ProfilingConfig::visit(V& v) {
  v.field("use_nsys_profiler", use_nsys_profiler);
  v.field("use_pytorch_profiler", use_pytorch_profiler);
  v.field("profile_step_start", profile_step_start);
  v.field("profile_step_end", profile_step_end);
  v.field("profile_ranks", profile_ranks);
  v.field("record_memory_history", record_memory_history);
  v.field("memory_snapshot_path", memory_snapshot_path);
  v.field("record_shapes", record_shapes);
  v.field("nvtx_ranges", nvtx_ranges);
}

template <class V> void PeftConfig::visit(V& v) {
  v.field("scheme", scheme, Choices{"lora", "dora"});
  v.field("target_modules", target_modules);
  v.field("dim", dim);
  v.field("alpha", alpha);
  v.field("dropout", dropout);
  v.field("dropout_position", dropout_position, Choices{"pre", "post"});
  v.field("lora_A_init_method", lora_A_init_method);
  v.field("lora_B_init_method", lora_B_init_method);
}

template <class V> void ConfigContainer::visit(V& v) {
  v.section("rng", rng);
  v.section("train", train);
  v.section("model", model);
  v.section("optimizer", optimizer);
  v.section("ddp", ddp);
  v.section("scheduler", scheduler);
  v.section("dataset", dataset);
  v.section("logger", logger);
  v.section("tokenizer", tokenizer);
  v.section("checkpoint", checkpoint);
  v.section("dist", dist);
  v.section("profiling", profiling);
  v.section("peft", peft);
  v.section("validation", validation);
  v.field("mixed_precision", mixed_precision);
  v.field("env_vars", env_vars);
}

}  // namespace laoyao::config
