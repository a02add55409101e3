#include "config/mlm_args.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>

#include "config/fields.hpp"
#include "config/validate.hpp"
#include "core/error.hpp"
#include "core/text.hpp"

namespace laoyao::config {
namespace {

// What a flag does. Value: one argument stored in `path`. Multi: one or more arguments (a list).
// True/False: a store_true/store_false switch of the bool at `path`. NoOp: accepted, changes
// nothing in laoyao (the note says why). Refuse: a Megatron-LM flag laoyao does not support yet.
enum class Kind { Value, Multi, True, False, NoOp, Refuse };

// Flags whose effect Megatron-LM decides only after all flags are read (validate_args).
struct Pending {
  bool group_query_attention = false;
  std::optional<std::string> num_query_groups;
  bool swiglu = false;
  bool bias_gelu_fusion = true;
  bool bias_swiglu_fusion = true;
  bool bf16 = false, fp16 = false;  // --bf16, --fp16: both is validate_args' conflict
};

struct State {
  ConfigContainer cfg;
  std::vector<Field> fields = fields_of(cfg);
  Pending pending;
  std::string flag;  // the flag being applied, for messages

  void set(const std::string& path, const Value& v, const std::string& text) {
    Field* f = find_field(fields, path);
    if (!f) throw Error("internal: flag " + flag + " maps to unknown field " + path);
    // Here the flag the user typed is known (--layernorm-epsilon, not its alias --norm-epsilon).
    if (const auto bad = forbidden_non_finite(path, v))
      throw UsageError(flag + " must be a finite number, got " + format_double(*bad));
    try {
      f->set(v);
    } catch (const UsageError& e) {
      std::string want = f->type;
      if (ends_with(want, " or null")) want.resize(want.size() - 8);
      std::string msg = "bad value '" + text + "' for " + flag + ": expected " + want;
      if (!f->choices.empty()) msg = "bad value '" + text + "' for " + flag + ": choose from " + join(f->choices, ", ") +
                                     did_you_mean(text, f->choices);
      throw UsageError(msg);
    }
  }
  void set_text(const std::string& path, const std::string& text) {
    // argparse hands a flag its text: a choice spelled like YAML's null ("none", as
    // --moe-router-load-balancing-type none) is that string.
    const Field* f = find_field(fields, path);
    if (f && std::find(f->choices.begin(), f->choices.end(), text) != f->choices.end())
      return set(path, Value::string(text), text);
    set(path, parse_scalar(text), text);
  }
};

using Apply = void (*)(State&, const std::vector<std::string>&);

struct FlagSpec {
  const char* name;
  Kind kind;
  const char* path = nullptr;  // the field it sets (Value/Multi/True/False), or nullptr with `apply`
  const char* note = nullptr;  // NoOp/Refuse: why
  Apply apply = nullptr;
};

// --moe-layer-freq takes an int or a Python list expression such as "([0]+[1]*26)" or
// "([1]*3+[0]*1)*3"; Megatron eval()s it. We evaluate that small grammar: lists of ints,
// '+' concatenation, '*' repetition, parentheses.
// The list is one entry per layer: its length and nesting are bounded far above any model's, so
// "[1]*999999999999" or a million parentheses is a message, not an exhausted memory or stack.
struct ListExpr {
  static constexpr size_t kMaxEntries = 100000;
  static constexpr int kMaxDepth = 64;
  std::string t;
  size_t p = 0;
  int depth = 0;
  [[noreturn]] void fail() {
    throw UsageError("bad value '" + shorten(t, 80) +
                     "' for --moe-layer-freq: expected an integer or a list expression such as \"([0]+[1]*26)\"");
  }
  [[noreturn]] void too_large() {
    throw UsageError("bad value for --moe-layer-freq: the list expression has more than " +
                     std::to_string(kMaxEntries) + " entries or " + std::to_string(kMaxDepth) +
                     " levels of parentheses (it lists one 0/1 per layer)");
  }
  void grown(size_t size) {
    if (size > kMaxEntries) too_large();
  }
  void ws() { while (p < t.size() && t[p] == ' ') ++p; }
  int64_t number() {
    ws();
    size_t s = p;
    while (p < t.size() && std::isdigit(static_cast<unsigned char>(t[p]))) ++p;
    if (s == p) fail();
    int64_t v = 0;
    if (std::from_chars(t.data() + s, t.data() + p, v).ec != std::errc()) too_large();
    return v;
  }
  std::vector<int64_t> atom() {
    ws();
    if (p < t.size() && t[p] == '(') {
      ++p;
      if (++depth > kMaxDepth) too_large();
      auto v = sum();
      --depth;
      ws();
      if (p >= t.size() || t[p] != ')') fail();
      ++p;
      return v;
    }
    if (p >= t.size() || t[p] != '[') fail();
    ++p;
    std::vector<int64_t> v;
    ws();
    if (p < t.size() && t[p] == ']') return ++p, v;
    while (true) {
      v.push_back(number());
      grown(v.size());
      ws();
      if (p < t.size() && t[p] == ',') { ++p; continue; }
      if (p < t.size() && t[p] == ']') { ++p; break; }
      fail();
    }
    return v;
  }
  std::vector<int64_t> product() {
    auto v = atom();
    while (true) {
      ws();
      if (p >= t.size() || t[p] != '*') return v;
      ++p;
      int64_t n = number();
      if (v.empty() || n == 0) {  // (no loop: "[]*10**12" would spin)
        v.clear();
        continue;
      }
      if (static_cast<size_t>(n) > kMaxEntries / v.size()) too_large();
      std::vector<int64_t> r;
      for (int64_t k = 0; k < n; ++k) r.insert(r.end(), v.begin(), v.end());
      v = std::move(r);
    }
  }
  std::vector<int64_t> sum() {
    auto v = product();
    while (true) {
      ws();
      if (p >= t.size() || t[p] != '+') return v;
      ++p;
      auto w = product();
      v.insert(v.end(), w.begin(), w.end());
      grown(v.size());
    }
  }
};

const std::vector<FlagSpec>& flag_table() {
  static const std::vector<FlagSpec> table = {
      // ---- model shape and layer math
      {"--num-layers", Kind::Value, "model.num_layers"},
      {"--hidden-size", Kind::Value, "model.hidden_size"},
      {"--ffn-hidden-size", Kind::Value, "model.ffn_hidden_size"},
      {"--num-attention-heads", Kind::Value, "model.num_attention_heads"},
      {"--kv-channels", Kind::Value, "model.kv_channels"},
      {"--group-query-attention", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) { s.pending.group_query_attention = true; }},
      {"--num-query-groups", Kind::Value, nullptr, nullptr,
       [](State& s, const std::vector<std::string>& v) { s.pending.num_query_groups = v[0]; }},
      {"--seq-length", Kind::Value, nullptr, nullptr,
       [](State& s, const std::vector<std::string>& v) {
         s.set_text("model.seq_length", v[0]);
         s.set_text("dataset.seq_length", v[0]);
       }},
      {"--max-position-embeddings", Kind::Value, "model.max_position_embeddings"},
      {"--position-embedding-type", Kind::Value, "model.position_embedding_type"},
      {"--rope-type", Kind::Value, "model.rope_type"},
      {"--cp-comm-type", Kind::Value, "model.cp_comm_type"},
      {"--hierarchical-context-parallel-sizes", Kind::Refuse, nullptr,
       "hierarchical context parallelism (a2a+p2p) is not implemented"},
      {"--use-rotary-position-embeddings", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) { s.set_text("model.position_embedding_type", "rope"); }},
      {"--no-position-embedding", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) { s.set_text("model.position_embedding_type", "none"); }},
      {"--rotary-base", Kind::Value, "model.rotary_base"},
      {"--rotary-percent", Kind::Value, "model.rotary_percent"},
      {"--rotary-seq-len-interpolation-factor", Kind::Value, "model.seq_len_interpolation_factor"},
      {"--use-rope-scaling", Kind::True, "model.rope_scaling"},
      {"--rope-scaling-factor", Kind::Value, "model.rope_scaling_factor"},
      {"--normalization", Kind::Value, "model.normalization"},
      {"--norm-epsilon", Kind::Value, "model.layernorm_epsilon"},
      {"--layernorm-epsilon", Kind::Value, "model.layernorm_epsilon"},
      {"--apply-layernorm-1p", Kind::True, "model.layernorm_zero_centered_gamma"},
      {"--qk-layernorm", Kind::True, "model.qk_layernorm"},
      {"--swiglu", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) {
         s.pending.swiglu = true;
         s.set("model.gated_linear_unit", Value::boolean(true), "");
         s.set_text("model.activation_func", "silu");
       }},
      {"--squared-relu", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) { s.set_text("model.activation_func", "squared_relu"); }},
      {"--disable-bias-linear", Kind::False, "model.add_bias_linear"},
      {"--add-qkv-bias", Kind::True, "model.add_qkv_bias"},
      {"--untie-embeddings-and-output-weights", Kind::False, "model.share_embeddings_and_output_weights"},
      {"--make-vocab-size-divisible-by", Kind::Value, "model.make_vocab_size_divisible_by"},
      {"--hidden-dropout", Kind::Value, "model.hidden_dropout"},
      {"--attention-dropout", Kind::Value, "model.attention_dropout"},
      {"--init-method-std", Kind::Value, "model.init_method_std"},
      {"--embedding-init-method-std", Kind::Value, "model.embedding_init_method_std"},
      {"--apply-query-key-layer-scaling", Kind::True, "model.apply_query_key_layer_scaling"},
      {"--attention-softmax-in-fp32", Kind::True, "model.attention_softmax_in_fp32"},
      {"--fp32-residual-connection", Kind::True, "model.fp32_residual_connection"},
      {"--calculate-per-token-loss", Kind::True, "model.calculate_per_token_loss"},
      {"--fp16-lm-cross-entropy", Kind::True, "model.fp16_lm_cross_entropy"},
      {"--deterministic-mode", Kind::True, "model.deterministic_mode"},
      // ---- fusions (bias_gelu_fusion decides tanh- vs erf-GeLU, see megatron-lm.md §3.6)
      {"--no-bias-gelu-fusion", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) { s.pending.bias_gelu_fusion = false; }},
      {"--no-bias-swiglu-fusion", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) { s.pending.bias_swiglu_fusion = false; }},
      {"--no-bias-dropout-fusion", Kind::False, "model.bias_dropout_fusion"},
      {"--no-masked-softmax-fusion", Kind::False, "model.masked_softmax_fusion"},
      {"--no-persist-layer-norm", Kind::False, "model.persist_layer_norm"},
      {"--no-gradient-accumulation-fusion", Kind::False, "model.gradient_accumulation_fusion"},
      {"--no-rope-fusion", Kind::False, "model.apply_rope_fusion"},
      {"--cross-entropy-loss-fusion", Kind::True, "model.cross_entropy_loss_fusion"},
      {"--cross-entropy-fusion-impl", Kind::Value, "model.cross_entropy_fusion_impl"},
      {"--attention-backend", Kind::Value, "model.attention_backend"},
      {"--transformer-impl", Kind::Value, "model.transformer_impl"},
      {"--use-flash-attn", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) { s.set_text("model.attention_backend", "flash"); }},
      // ---- Mixture of Experts
      {"--num-experts", Kind::Value, "model.num_moe_experts"},
      {"--moe-ffn-hidden-size", Kind::Value, "model.moe_ffn_hidden_size"},
      {"--moe-router-topk", Kind::Value, "model.moe_router_topk"},
      {"--moe-layer-freq", Kind::Value, nullptr, nullptr,
       [](State& s, const std::vector<std::string>& v) {
         Value x = parse_scalar(v[0]);
         if (x.kind == Value::Kind::Int) return s.set("model.moe_layer_freq", x, v[0]);
         ListExpr e{v[0]};
         auto list = e.sum();
         e.ws();
         if (e.p != e.t.size()) e.fail();
         std::vector<Value> items;
         for (auto i : list) items.push_back(Value::integer(i));
         s.set("model.moe_layer_freq", Value::make_list(std::move(items)), v[0]);
       }},
      // nargs='+': one value stays a value, several make a list (the types stay strings: "none" too).
      {"--moe-router-load-balancing-type", Kind::Multi, nullptr, nullptr,
       [](State& s, const std::vector<std::string>& v) {
         std::vector<Value> items;
         for (const auto& x : v) items.push_back(Value::string(x));
         s.set("model.moe_router_load_balancing_type", v.size() == 1 ? items[0] : Value::make_list(std::move(items)),
               join(v, " "));
       }},
      {"--moe-aux-loss-coeff", Kind::Multi, nullptr, nullptr,
       [](State& s, const std::vector<std::string>& v) {
         std::vector<Value> items;
         for (const auto& x : v) items.push_back(parse_scalar(x));
         s.set("model.moe_aux_loss_coeff", v.size() == 1 ? items[0] : Value::make_list(std::move(items)), join(v, " "));
       }},
      {"--moe-z-loss-coeff", Kind::Value, "model.moe_z_loss_coeff"},
      {"--moe-router-score-function", Kind::Value, "model.moe_router_score_function"},
      {"--moe-router-pre-softmax", Kind::True, "model.moe_router_pre_softmax"},
      {"--moe-router-topk-scaling-factor", Kind::Value, "model.moe_router_topk_scaling_factor"},
      {"--moe-router-dtype", Kind::Value, "model.moe_router_dtype"},
      {"--moe-router-enable-expert-bias", Kind::True, "model.moe_router_enable_expert_bias"},
      {"--moe-router-force-load-balancing", Kind::True, "model.moe_router_force_load_balancing"},
      {"--moe-router-bias-update-rate", Kind::Value, "model.moe_router_bias_update_rate"},
      {"--moe-router-num-groups", Kind::Value, "model.moe_router_num_groups"},
      {"--moe-router-group-topk", Kind::Value, "model.moe_router_group_topk"},
      {"--moe-shared-expert-intermediate-size", Kind::Value, "model.moe_shared_expert_intermediate_size"},
      {"--moe-shared-expert-overlap", Kind::True, "model.moe_shared_expert_overlap"},
      {"--moe-expert-capacity-factor", Kind::Value, "model.moe_expert_capacity_factor"},
      {"--moe-token-drop-policy", Kind::Value, "model.moe_token_drop_policy"},
      {"--moe-pad-expert-input-to-capacity", Kind::True, "model.moe_pad_expert_input_to_capacity"},
      {"--moe-grouped-gemm", Kind::True, "model.moe_grouped_gemm"},
      {"--moe-token-dispatcher-type", Kind::Value, "model.moe_token_dispatcher_type"},
      {"--moe-permute-fusion", Kind::True, "model.moe_permute_fusion"},
      {"--moe-router-fusion", Kind::True, "model.moe_router_fusion"},
      {"--moe-input-jitter-eps", Kind::Refuse, nullptr, "router input jitter is not implemented"},
      {"--openai-gelu", Kind::Refuse, nullptr, "only Megatron's default bias-GeLU and exact GeLU are implemented"},
      {"--quick-geglu", Kind::Refuse, nullptr, "quick-GeGLU is not implemented"},
      {"--rotary-interleaved", Kind::Refuse, nullptr, "interleaved rotary embeddings are not implemented"},
      {"--init-method-xavier-uniform", Kind::Refuse, nullptr, "Xavier-uniform init is not implemented"},
      {"--grad-reduce-in-bf16", Kind::Refuse, nullptr, "gradients are reduced in fp32"},
      {"--save-retain-interval", Kind::Refuse, nullptr, "checkpoint retention intervals are not implemented"},
      {"--ddp-num-buckets", Kind::Refuse, nullptr, "gradient buckets are not implemented"},
      {"--check-for-large-grads", Kind::Refuse, nullptr, "large-gradient checks are not implemented"},
      {"--moe-per-layer-logging", Kind::Refuse, nullptr, "per-layer MoE logging is not implemented"},
      {"--moe-enable-deepep", Kind::Refuse, nullptr, "the DeepEP dispatcher is not implemented"},
      // ---- multi-latent attention, multi-token prediction
      {"--multi-latent-attention", Kind::True, "model.multi_latent_attention"},
      {"--q-lora-rank", Kind::Value, "model.q_lora_rank"},
      {"--kv-lora-rank", Kind::Value, "model.kv_lora_rank"},
      {"--qk-head-dim", Kind::Value, "model.qk_head_dim"},
      {"--qk-pos-emb-head-dim", Kind::Value, "model.qk_pos_emb_head_dim"},
      {"--v-head-dim", Kind::Value, "model.v_head_dim"},
      {"--rotary-scaling-factor", Kind::Value, "model.rotary_scaling_factor"},
      {"--mscale", Kind::Value, "model.mscale"},
      {"--mscale-all-dim", Kind::Value, "model.mscale_all_dim"},
      {"--yarn-original-max-position-embeddings", Kind::Value, "model.original_max_position_embeddings"},
      {"--yarn-beta-fast", Kind::Value, "model.beta_fast"},
      {"--yarn-beta-slow", Kind::Value, "model.beta_slow"},
      {"--yarn-correction-range-round-to-int", Kind::True, "model.yarn_correction_range_round_to_int"},
      {"--no-yarn-correction-range-round-to-int", Kind::False, "model.yarn_correction_range_round_to_int"},
      {"--mtp-num-layers", Kind::Value, "model.mtp_num_layers"},
      {"--mtp-loss-scaling-factor", Kind::Value, "model.mtp_loss_scaling_factor"},
      // ---- parallelism
      {"--tensor-model-parallel-size", Kind::Value, "model.tensor_model_parallel_size"},
      {"--pipeline-model-parallel-size", Kind::Value, "model.pipeline_model_parallel_size"},
      {"--virtual-pipeline-model-parallel-size", Kind::Value, "model.virtual_pipeline_model_parallel_size"},
      {"--context-parallel-size", Kind::Value, "model.context_parallel_size"},
      {"--expert-model-parallel-size", Kind::Value, "model.expert_model_parallel_size"},
      {"--expert-tensor-parallel-size", Kind::Value, "model.expert_tensor_parallel_size"},
      {"--sequence-parallel", Kind::True, "model.sequence_parallel"},
      {"--num-layers-per-virtual-pipeline-stage", Kind::Refuse, nullptr, "pipeline parallelism is not implemented"},
      {"--pipeline-model-parallel-layout", Kind::Refuse, nullptr, "pipeline parallelism is not implemented"},
      {"--decoder-first-pipeline-num-layers", Kind::Refuse, nullptr, "pipeline parallelism is not implemented"},
      {"--decoder-last-pipeline-num-layers", Kind::Refuse, nullptr, "pipeline parallelism is not implemented"},
      {"--tp-comm-overlap", Kind::Refuse, nullptr, "tensor-parallel communication overlap is not implemented"},
      {"--use-torch-fsdp2", Kind::Refuse, nullptr, "FSDP is not implemented"},
      {"--use-megatron-fsdp", Kind::Refuse, nullptr, "FSDP is not implemented"},
      {"--distributed-backend", Kind::Value, "dist.distributed_backend"},
      {"--distributed-timeout-minutes", Kind::Value, "dist.distributed_timeout_minutes"},
      {"--no-align-grad-reduce", Kind::False, "dist.align_grad_reduce"},
      {"--disable-gloo-process-groups", Kind::False, "dist.use_gloo_process_groups"},
      {"--use-sharp", Kind::True, "dist.use_sharp"},
      {"--use-tp-pp-dp-mapping", Kind::True, "dist.use_tp_pp_dp_mapping"},
      {"--local-rank", Kind::Value, nullptr, "set by old launchers; laoyao reads LOCAL_RANK from the environment",
       [](State&, const std::vector<std::string>&) {}},
      // ---- training loop and batches
      {"--micro-batch-size", Kind::Value, "train.micro_batch_size"},
      {"--global-batch-size", Kind::Value, "train.global_batch_size"},
      {"--rampup-batch-size", Kind::Multi, "train.rampup_batch_size"},
      {"--decrease-batch-size-if-needed", Kind::True, "train.decrease_batch_size_if_needed"},
      {"--train-iters", Kind::Value, "train.train_iters"},
      {"--train-samples", Kind::Value, "train.train_samples"},
      {"--exit-interval", Kind::Value, "train.exit_interval"},
      {"--exit-duration-in-mins", Kind::Value, "train.exit_duration_in_mins"},
      {"--exit-signal-handler", Kind::True, "train.exit_signal_handler"},
      {"--manual-gc", Kind::True, "train.manual_gc"},
      {"--manual-gc-interval", Kind::Value, "train.manual_gc_interval"},
      {"--no-manual-gc-eval", Kind::False, "train.manual_gc_eval"},
      {"--empty-unused-memory-level", Kind::Value, "train.empty_unused_memory_level"},
      {"--check-weight-hash-across-dp-replicas-interval", Kind::Value,
       "train.check_weight_hash_across_dp_replicas_interval"},
      {"--iterations-to-skip", Kind::Multi, "train.iterations_to_skip"},
      {"--skip-train", Kind::True, "validation.skip_train"},
      {"--eval-iters", Kind::Value, "validation.eval_iters"},
      {"--eval-interval", Kind::Value, "validation.eval_interval"},
      {"--full-validation", Kind::True, "validation.full_validation"},
      {"--multiple-validation-sets", Kind::True, "validation.multiple_validation_sets"},
      {"--recompute-granularity", Kind::Value, "model.recompute_granularity"},
      {"--recompute-method", Kind::Value, "model.recompute_method"},
      {"--recompute-num-layers", Kind::Value, "model.recompute_num_layers"},
      {"--recompute-activations", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) { s.set_text("model.recompute_granularity", "selective"); }},
      // ---- optimizer, schedule, precision
      {"--optimizer", Kind::Value, "optimizer.optimizer"},
      {"--lr", Kind::Value, "optimizer.lr"},
      {"--min-lr", Kind::Value, "optimizer.min_lr"},
      {"--decoupled-lr", Kind::Value, "optimizer.decoupled_lr"},
      {"--decoupled-min-lr", Kind::Value, "optimizer.decoupled_min_lr"},
      {"--weight-decay", Kind::Value, "optimizer.weight_decay"},
      {"--apply-wd-to-qk-layernorm", Kind::True, "optimizer.apply_wd_to_qk_layernorm"},
      // Deprecated in Megatron-LM: validate_args turns its one accepted value into
      // --apply-wd-to-qk-layernorm and raises on any other (qwen3_next included).
      {"--no-weight-decay-cond-type", Kind::Value, nullptr, nullptr,
       [](State& s, const std::vector<std::string>& v) {
         if (v[0] != "apply_wd_to_qk_layernorm")
           throw UsageError("Invalid no_weight_decay_cond_type: " + v[0] +
                            " (--no-weight-decay-cond-type is deprecated; accepted: apply_wd_to_qk_layernorm, as "
                            "--apply-wd-to-qk-layernorm)");
         s.set("optimizer.apply_wd_to_qk_layernorm", Value::boolean(true), v[0]);
       }},
      {"--start-weight-decay", Kind::Value, "scheduler.start_weight_decay"},
      {"--end-weight-decay", Kind::Value, "scheduler.end_weight_decay"},
      {"--weight-decay-incr-style", Kind::Value, "scheduler.weight_decay_incr_style"},
      {"--adam-beta1", Kind::Value, "optimizer.adam_beta1"},
      {"--adam-beta2", Kind::Value, "optimizer.adam_beta2"},
      {"--adam-eps", Kind::Value, "optimizer.adam_eps"},
      {"--sgd-momentum", Kind::Value, "optimizer.sgd_momentum"},
      {"--clip-grad", Kind::Value, "optimizer.clip_grad"},
      {"--use-distributed-optimizer", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) {
         s.set("ddp.use_distributed_optimizer", Value::boolean(true), "");
         s.set("optimizer.use_distributed_optimizer", Value::boolean(true), "");
       }},
      {"--overlap-grad-reduce", Kind::True, "ddp.overlap_grad_reduce"},
      {"--overlap-param-gather", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) {
         s.set("ddp.overlap_param_gather", Value::boolean(true), "");
         s.set("optimizer.overlap_param_gather", Value::boolean(true), "");
       }},
      {"--align-param-gather", Kind::True, "ddp.align_param_gather"},
      {"--ddp-bucket-size", Kind::Value, "ddp.bucket_size"},
      {"--ddp-average-in-collective", Kind::True, "ddp.average_in_collective"},
      {"--data-parallel-sharding-strategy", Kind::Value, "ddp.data_parallel_sharding_strategy"},
      {"--accumulate-allreduce-grads-in-fp32", Kind::True, "ddp.grad_reduce_in_fp32"},
      {"--no-check-for-nan-in-loss-and-grad", Kind::False, "ddp.check_for_nan_in_grad"},
      {"--use-precision-aware-optimizer", Kind::True, "optimizer.use_precision_aware_optimizer"},
      {"--main-grads-dtype", Kind::Value, "optimizer.main_grads_dtype"},
      {"--main-params-dtype", Kind::Value, "optimizer.main_params_dtype"},
      {"--exp-avg-dtype", Kind::Value, "optimizer.exp_avg_dtype"},
      {"--exp-avg-sq-dtype", Kind::Value, "optimizer.exp_avg_sq_dtype"},
      {"--loss-scale", Kind::Value, "optimizer.loss_scale"},
      {"--initial-loss-scale", Kind::Value, "optimizer.initial_loss_scale"},
      {"--min-loss-scale", Kind::Value, "optimizer.min_loss_scale"},
      {"--loss-scale-window", Kind::Value, "optimizer.loss_scale_window"},
      {"--hysteresis", Kind::Value, "optimizer.hysteresis"},
      {"--lr-decay-style", Kind::Value, "scheduler.lr_decay_style"},
      {"--lr-decay-iters", Kind::Value, "scheduler.lr_decay_iters"},
      {"--lr-decay-samples", Kind::Value, "scheduler.lr_decay_samples"},
      {"--lr-warmup-iters", Kind::Value, "scheduler.lr_warmup_iters"},
      {"--lr-warmup-samples", Kind::Value, "scheduler.lr_warmup_samples"},
      {"--lr-warmup-fraction", Kind::Value, "scheduler.lr_warmup_fraction"},
      {"--lr-warmup-init", Kind::Value, "scheduler.lr_warmup_init"},
      {"--lr-wsd-decay-style", Kind::Value, "scheduler.lr_wsd_decay_style"},
      {"--lr-wsd-decay-iters", Kind::Value, "scheduler.lr_wsd_decay_iters"},
      {"--lr-wsd-decay-samples", Kind::Value, "scheduler.lr_wsd_decay_samples"},
      {"--override-opt_param-scheduler", Kind::True, "scheduler.override_opt_param_scheduler"},
      {"--use-checkpoint-opt_param-scheduler", Kind::True, "scheduler.use_checkpoint_opt_param_scheduler"},
      {"--bf16", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) {
         s.pending.bf16 = true;
         s.set_text("mixed_precision", "bf16_mixed");
       }},
      {"--fp16", Kind::True, nullptr, nullptr,
       [](State& s, const std::vector<std::string>&) {
         s.pending.fp16 = true;
         s.set_text("mixed_precision", "fp16_mixed");
       }},
      {"--fp8-format", Kind::Value, "model.fp8"},
      {"--fp8-recipe", Kind::Value, "model.fp8_recipe"},
      {"--fp8-margin", Kind::Value, "model.fp8_margin"},
      {"--fp8-amax-history-len", Kind::Value, "model.fp8_amax_history_len"},
      {"--fp8-amax-compute-algo", Kind::Value, "model.fp8_amax_compute_algo"},
      {"--fp8-param-gather", Kind::True, "model.fp8_param"},
      {"--no-fp8-wgrad", Kind::False, "model.fp8_wgrad"},
      {"--disable-fp8-wgrad", Kind::False, "model.fp8_wgrad"},
      {"--fp8-interval", Kind::NoOp, nullptr,
       "deprecated in Megatron-LM: Transformer Engine 1.8 and later update the scales every pass"},
      {"--first-last-layers-bf16", Kind::True, "model.first_last_layers_bf16"},
      {"--num-layers-at-start-in-bf16", Kind::Value, "model.num_layers_at_start_in_bf16"},
      {"--num-layers-at-end-in-bf16", Kind::Value, "model.num_layers_at_end_in_bf16"},
      {"--fp4-format", Kind::Refuse, nullptr, "FP4 training is not implemented"},
      // ---- data
      {"--mock-data", Kind::True, "dataset.mock"},
      {"--data-path", Kind::Multi, "dataset.data_path"},
      {"--split", Kind::Value, "dataset.split"},
      {"--train-data-path", Kind::Multi, "dataset.train_data_path"},
      {"--valid-data-path", Kind::Multi, "dataset.valid_data_path"},
      {"--test-data-path", Kind::Multi, "dataset.test_data_path"},
      {"--data-cache-path", Kind::Value, "dataset.path_to_cache"},
      {"--no-mmap-bin-files", Kind::False, "dataset.mmap_bin_files"},
      {"--num-workers", Kind::Value, "dataset.num_workers"},
      {"--dataloader-type", Kind::Value, "dataset.dataloader_type"},
      {"--num-dataset-builder-threads", Kind::Value, "dataset.num_dataset_builder_threads"},
      {"--reset-position-ids", Kind::True, "dataset.reset_position_ids"},
      {"--reset-attention-mask", Kind::True, "dataset.reset_attention_mask"},
      {"--eod-mask-loss", Kind::True, "dataset.eod_mask_loss"},
      {"--no-create-attention-mask-in-dataloader", Kind::True, "dataset.skip_getting_attention_mask_from_dataset"},
      {"--data-args-path", Kind::Refuse, nullptr, "reading data paths from a file is not implemented; use --data-path"},
      {"--per-split-data-args-path", Kind::Refuse, nullptr,
       "reading data paths from a file is not implemented; use --train-data-path/--valid-data-path/--test-data-path"},
      {"--sft", Kind::True, "dataset.sft"},
      {"--sft-tokenizer-prompt-format", Kind::Value, "tokenizer.tokenizer_prompt_format"},
      // ---- tokenizer
      {"--tokenizer-type", Kind::Value, "tokenizer.tokenizer_type"},
      {"--tokenizer-model", Kind::Value, "tokenizer.tokenizer_model"},
      {"--vocab-file", Kind::Value, "tokenizer.vocab_file"},
      {"--merge-file", Kind::Value, "tokenizer.merge_file"},
      {"--vocab-size", Kind::Value, "tokenizer.vocab_size"},
      {"--vocab-extra-ids", Kind::Value, "tokenizer.vocab_extra_ids"},
      {"--tiktoken-num-special-tokens", Kind::Value, "tokenizer.tiktoken_num_special_tokens"},
      {"--null-tokenizer-eod-id", Kind::Refuse, nullptr, "the NullTokenizer's EOD is always vocab_size - 1"},
      // ---- logging
      {"--log-interval", Kind::Value, "logger.log_interval"},
      {"--log-params-norm", Kind::True, "logger.log_params_norm"},
      {"--log-throughput", Kind::True, "logger.log_throughput"},
      {"--log-progress", Kind::True, "logger.log_progress"},
      {"--timing-log-level", Kind::Value, "logger.timing_log_level"},
      {"--timing-log-option", Kind::Value, "logger.timing_log_option"},
      {"--tensorboard-dir", Kind::Value, "logger.tensorboard_dir"},
      {"--tensorboard-log-interval", Kind::Value, "logger.tensorboard_log_interval"},
      {"--tensorboard-queue-size", Kind::Value, "logger.tensorboard_queue_size"},
      {"--log-timers-to-tensorboard", Kind::True, "logger.log_timers_to_tensorboard"},
      {"--no-log-loss-scale-to-tensorboard", Kind::False, "logger.log_loss_scale_to_tensorboard"},
      {"--log-validation-ppl-to-tensorboard", Kind::True, "logger.log_validation_ppl_to_tensorboard"},
      {"--log-memory-to-tensorboard", Kind::True, "logger.log_memory_to_tensorboard"},
      {"--log-memory-interval", Kind::Value, "logger.log_memory_interval"},
      {"--log-num-zeros-in-grad", Kind::True, "logger.log_num_zeros_in_grad"},
      {"--log-world-size-to-tensorboard", Kind::True, "logger.log_world_size_to_tensorboard"},
      {"--wandb-project", Kind::Value, "logger.wandb_project"},
      {"--wandb-exp-name", Kind::Value, "logger.wandb_exp_name"},
      {"--wandb-save-dir", Kind::Value, "logger.wandb_save_dir"},
      {"--wandb-entity", Kind::Value, "logger.wandb_entity"},
      {"--logging-level", Kind::Value, "logger.logging_level"},
      {"--log-energy", Kind::True, "logger.log_energy"},
      // ---- checkpoints
      {"--save", Kind::Value, "checkpoint.save"},
      {"--save-interval", Kind::Value, "checkpoint.save_interval"},
      {"--load", Kind::Value, "checkpoint.load"},
      {"--no-save-optim", Kind::False, "checkpoint.save_optim"},
      {"--no-save-rng", Kind::False, "checkpoint.save_rng"},
      {"--no-load-optim", Kind::False, "checkpoint.load_optim"},
      {"--no-load-rng", Kind::False, "checkpoint.load_rng"},
      {"--load-main-params-from-ckpt", Kind::True, "checkpoint.load_main_params_from_ckpt"},
      {"--finetune", Kind::True, "checkpoint.finetune"},
      {"--pretrained-checkpoint", Kind::Value, "checkpoint.pretrained_checkpoint"},
      {"--ckpt-step", Kind::Value, "checkpoint.ckpt_step"},
      {"--use-checkpoint-args", Kind::True, "checkpoint.use_checkpoint_args"},
      {"--exit-on-missing-checkpoint", Kind::True, "checkpoint.exit_on_missing_checkpoint"},
      {"--ckpt-format", Kind::Value, "checkpoint.ckpt_format"},
      {"--no-ckpt-fully-parallel-save", Kind::False, "checkpoint.fully_parallel_save"},
      {"--ckpt-fully-parallel-load", Kind::True, "checkpoint.fully_parallel_load"},
      {"--async-save", Kind::True, "checkpoint.async_save"},
      {"--use-persistent-ckpt-worker", Kind::True, "checkpoint.use_persistent_ckpt_worker"},
      {"--dist-ckpt-strictness", Kind::Value, "checkpoint.dist_ckpt_strictness"},
      {"--auto-detect-ckpt-format", Kind::True, "checkpoint.auto_detect_ckpt_format"},
      {"--save-params-interval", Kind::Refuse, nullptr, "per-iteration parameter dumps are not implemented yet"},
      {"--save-wgrads-interval", Kind::Refuse, nullptr, "per-iteration gradient dumps are not implemented yet"},
      {"--non-persistent-save-interval", Kind::Refuse, nullptr, "non-persistent checkpoints are not implemented"},
      // ---- RNG
      {"--seed", Kind::Value, "rng.seed"},
      {"--data-parallel-random-init", Kind::True, "rng.data_parallel_random_init"},
      {"--te-rng-tracker", Kind::True, "rng.te_rng_tracker"},
      {"--inference-rng-tracker", Kind::True, "rng.inference_rng_tracker"},
      // ---- profiling
      {"--profile", Kind::True, "profiling.use_nsys_profiler"},
      {"--use-pytorch-profiler", Kind::Refuse, nullptr, "there is no PyTorch profiler in laoyao; use --profile (nsys)"},
      {"--profile-step-start", Kind::Value, "profiling.profile_step_start"},
      {"--profile-step-end", Kind::Value, "profiling.profile_step_end"},
      {"--profile-ranks", Kind::Multi, "profiling.profile_ranks"},
      {"--record-memory-history", Kind::True, "profiling.record_memory_history"},
      {"--memory-snapshot-path", Kind::Value, "profiling.memory_snapshot_path"},
      // ---- accepted without effect
      {"--use-mcore-models", Kind::NoOp, nullptr, "deprecated in Megatron-LM: Megatron-Core models are the only ones"},
      {"--use-cpu-initialization", Kind::NoOp, nullptr,
       "laoyao draws initial weights from its own generator on every backend"},
      {"--no-async-tensor-model-parallel-allreduce", Kind::NoOp, nullptr, "deprecated in Megatron-LM"},
      {"--enable-experimental", Kind::NoOp, nullptr, "no experimental features are gated by it in laoyao"},
      {"--use-legacy-models", Kind::Refuse, nullptr, "only Megatron-Core models exist in laoyao"},
      {"--spec", Kind::Refuse, nullptr, "layer specs are Python import paths; laoyao builds its layers from the config"},
      {"--yaml-cfg", Kind::Refuse, nullptr, "use `laoyao run-recipe --config-file` for YAML configs"},
      {"--hybrid-layer-pattern", Kind::Refuse, nullptr, "hybrid Mamba models are not implemented"},
      {"--hybrid-override-pattern", Kind::Refuse, nullptr, "hybrid Mamba models are not implemented"},
      {"--window-size", Kind::Refuse, nullptr, "sliding-window attention is not implemented"},
      {"--cuda-graph-impl", Kind::Refuse, nullptr, "laoyao decides on CUDA graphs itself"},
      {"--heterogeneous-layers-config-path", Kind::Refuse, nullptr, "heterogeneous layers are not implemented"},
      {"--rerun-mode", Kind::Refuse, nullptr, "the rerun state machine is not implemented"},
      {"--inprocess-restart", Kind::Refuse, nullptr, "in-process restart is not implemented"},
  };
  return table;
}

bool is_flag_token(const std::string& t) {
  if (!starts_with(t, "-") || t.size() < 2) return false;
  // argparse treats "-1" or "-1e-3" as a value when no flag looks like a negative number.
  return !(std::isdigit(static_cast<unsigned char>(t[1])) || t[1] == '.');
}

const FlagSpec* find_spec(const std::string& name) {
  for (const auto& f : flag_table())
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace

ConfigContainer mlm_default_config() {
  ConfigContainer c;
  // Megatron-LM CLI defaults that differ from the dataclass defaults (megatron-lm.md §2.2).
  c.model.bias_activation_fusion = true;  // --no-bias-gelu-fusion unset -> tanh GeLU
  c.model.bias_dropout_fusion = true;
  c.model.masked_softmax_fusion = true;
  c.model.persist_layer_norm = true;
  c.model.gradient_accumulation_fusion = true;
  c.model.apply_rope_fusion = true;
  c.model.cross_entropy_loss_fusion = false;
  c.model.transformer_impl = "transformer_engine";
  c.tokenizer.tokenizer_type = "GPT2BPETokenizer";  // pretrain_gpt.py's args_defaults
  c.tokenizer.null_vocab_includes_eod = true;       // NullTokenizer since 2026-04-22
  c.optimizer.min_lr = 0.0;
  c.model.rope_scaling_factor = 8.0;  // --rope-scaling-factor's default
  c.model.rotary_scaling_factor = 1.0;  // --rotary-scaling-factor's (Bridge's MLA config has 40)
  c.model.q_lora_rank.reset();         // --q-lora-rank's None and --kv-lora-rank's 32 (Bridge's: 512, 512)
  c.model.kv_lora_rank = 32;
  c.profiling.memory_snapshot_path = "snapshot.pickle";
  c.dataset.dataloader_type = "single";
  c.dataset.skip_getting_attention_mask_from_dataset = false;  // mask created in the dataloader
  c.ddp.check_for_nan_in_grad = true;  // --check-for-nan-in-loss-and-grad is on by default
  return c;
}

ConfigContainer parse_mlm_args(const std::vector<std::string>& args) {
  State s;
  s.cfg = mlm_default_config();
  s.fields = fields_of(s.cfg);
  std::vector<std::string> names = mlm_flag_names();
  for (size_t k = 0; k < args.size(); ++k) {
    std::string tok = args[k];
    if (!starts_with(tok, "--"))
      throw UsageError("unexpected argument '" + tok + "': Megatron-LM flags start with --");
    std::string name = tok, inline_value;
    bool has_inline = false;
    if (auto eq = tok.find('='); eq != std::string::npos) {
      name = tok.substr(0, eq), inline_value = tok.substr(eq + 1), has_inline = true;
    }
    const FlagSpec* spec = find_spec(name);
    if (!spec) throw UsageError("unrecognized argument " + name + did_you_mean(name, names));
    s.flag = name;
    if (spec->kind == Kind::Refuse)
      throw UsageError(name + " is a Megatron-LM flag that laoyao does not support yet: " + spec->note);
    std::vector<std::string> values;
    bool takes_values = spec->kind == Kind::Value || spec->kind == Kind::Multi;
    if (spec->kind == Kind::True || spec->kind == Kind::False || spec->kind == Kind::NoOp) {
      if (has_inline) throw UsageError("argument " + name + ": ignored explicit argument '" + inline_value + "'");
    } else if (takes_values) {
      if (has_inline) {
        values.push_back(inline_value);
      } else {
        while (k + 1 < args.size() && !is_flag_token(args[k + 1])) {
          values.push_back(args[++k]);
          if (spec->kind == Kind::Value) break;
        }
      }
      if (values.empty())
        throw UsageError("argument " + name + ": expected " +
                         std::string(spec->kind == Kind::Multi ? "one or more arguments" : "one argument"));
    }
    if (spec->apply) {
      spec->apply(s, values);
      continue;
    }
    switch (spec->kind) {
      case Kind::Value: s.set_text(spec->path, values[0]); break;
      case Kind::Multi: {
        std::vector<Value> items;
        for (auto& v : values) items.push_back(parse_scalar(v));
        s.set(spec->path, Value::make_list(std::move(items)), join(values, " "));
        break;
      }
      case Kind::True: s.set(spec->path, Value::boolean(true), ""); break;
      case Kind::False: s.set(spec->path, Value::boolean(false), ""); break;
      case Kind::NoOp: break;
      case Kind::Refuse: break;
    }
  }
  // Megatron-LM's validate_args: decisions that depend on several flags.
  if (s.pending.bf16 && s.pending.fp16)  // its assert, ahead of anything a half precision would change
    throw UsageError("cannot specify both fp16 and bf16: --fp16 and --bf16 are exclusive; choose one");
  auto& m = s.cfg.model;
  if (s.pending.group_query_attention && s.pending.num_query_groups) {
    s.flag = "--num-query-groups";
    s.set_text("model.num_query_groups", *s.pending.num_query_groups);
  } else if (s.pending.group_query_attention) {
    m.num_query_groups = 1;  // argparse default of --num-query-groups
  }
  if (s.pending.swiglu && !m.ffn_hidden_size && m.hidden_size > 0)
    m.ffn_hidden_size = static_cast<int64_t>(4.0 * static_cast<double>(m.hidden_size) * 2.0 / 3.0 / 64.0) * 64;
  m.bias_activation_fusion = s.pending.swiglu ? s.pending.bias_swiglu_fusion : s.pending.bias_gelu_fusion;
  if (m.add_bias_linear) m.add_qkv_bias = true;  // validate_args forces it
  if ((m.fp8 || m.fp8_param) && s.cfg.mixed_precision.kind == Value::Kind::String) {
    // The FP8 flags are the model's fields; --bf16's preset would replace them with
    // MixedPrecisionConfig's defaults, so the precision becomes the mapping of both.
    const bool bf16 = s.cfg.mixed_precision.s == "bf16_mixed";
    s.cfg.mixed_precision = Value::make_map({
        {"bf16", Value::boolean(bf16)},
        {"fp16", Value::boolean(!bf16)},
        {"params_dtype", Value::string(bf16 ? "bf16" : "fp16")},
        {"grad_reduce_in_fp32", Value::boolean(bf16)},
        {"fp8", m.fp8 ? Value::string(*m.fp8) : Value::null()},
        {"fp8_recipe", Value::string(m.fp8_recipe)},
        {"fp8_margin", Value::integer(m.fp8_margin)},
        {"fp8_amax_history_len", Value::integer(m.fp8_amax_history_len)},
        {"fp8_amax_compute_algo", Value::string(m.fp8_amax_compute_algo)},
        {"fp8_wgrad", Value::boolean(m.fp8_wgrad)},
        {"fp8_param_gather", Value::boolean(m.fp8_param)},
        {"first_last_layers_bf16", Value::boolean(m.first_last_layers_bf16)},
        {"num_layers_at_start_in_bf16", Value::integer(m.num_layers_at_start_in_bf16)},
        {"num_layers_at_end_in_bf16", Value::integer(m.num_layers_at_end_in_bf16)},
    });
  }
  s.cfg.dataset.random_seed = s.cfg.rng.seed;    // GPTDataset's random_seed is --seed
  return s.cfg;
}

std::string mlm_flag_for_path(const std::string& path) {
  for (const auto& f : flag_table())
    if (f.path && path == f.path && (f.kind == Kind::Value || f.kind == Kind::Multi)) return f.name;
  for (const auto& f : flag_table())
    if (f.path && path == f.path) return f.name;
  static const std::map<std::string, std::string> custom = {
      {"model.seq_length", "--seq-length"},         {"dataset.seq_length", "--seq-length"},
      {"model.num_query_groups", "--num-query-groups"}, {"optimizer.use_distributed_optimizer", "--use-distributed-optimizer"},
      {"ddp.use_distributed_optimizer", "--use-distributed-optimizer"}, {"mixed_precision", "--bf16/--fp16"},
  };
  auto it = custom.find(path);
  return it == custom.end() ? std::string() : it->second;
}

std::vector<std::string> mlm_flag_names() {
  std::vector<std::string> out;
  for (const auto& f : flag_table()) out.emplace_back(f.name);
  return out;
}

}  // namespace laoyao::config
