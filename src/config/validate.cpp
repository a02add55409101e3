#include "config/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "config/fields.hpp"
#include "config/mlm_args.hpp"
#include "data/gpt_dataset_budget.hpp"
#include "core/error.hpp"
#include "core/text.hpp"

namespace laoyao::config {

std::string display_name(const std::string& path, FrontEnd fe) {
  if (fe == FrontEnd::MegatronLM) {
    std::string flag = mlm_flag_for_path(path);
    if (!flag.empty()) return flag;
  }
  return path;
}

data::BatchRampup batch_rampup(const ConfigContainer& c, const Derived& d) {
  data::BatchRampup r;
  const auto& t = c.train;
  if (t.rampup_batch_size.size() == 3)
    r.start = t.rampup_batch_size[0], r.increment = t.rampup_batch_size[1], r.samples = t.rampup_batch_size[2];
  r.global_batch_size = t.global_batch_size.value_or(0);
  r.micro_times_dp = t.micro_batch_size.value_or(1) * d.data_parallel_size;
  r.decrease_if_needed = t.decrease_batch_size_if_needed;
  return r;
}

int64_t padded_vocab_size(int64_t vocab, int64_t divisor, int64_t tp) {
  int64_t m = divisor * tp;
  if (m <= 0) return vocab;
  return (vocab + m - 1) / m * m;
}

std::vector<std::string> mixed_precision_presets() {
  return {"bf16_mixed",
          "fp16_mixed",
          "bf16_with_fp8_delayed_scaling_mixed",
          "fp16_with_fp8_delayed_scaling_mixed",
          "bf16_with_mxfp8_mixed",
          "fp16_with_mxfp8_mixed",
          "bf16_with_fp8_current_scaling_mixed",
          "fp16_with_fp8_current_scaling_mixed",
          "bf16_with_fp8_subchannel_scaling_mixed",
          "fp16_with_fp8_subchannel_scaling_mixed",
          "nanov2_bf16_with_fp8_current_scaling_mixed",
          "bf16_with_nvfp4_mixed"};
}

namespace {

// The kernels hold a dimension in a 32-bit int (GEMM sizes, token ids, attention's positions and
// heads), so a larger one can never be built; capping them also keeps every product of a few of
// them (parameter counts, tokens) inside 64 bits.
constexpr int64_t kMaxDimension = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxCount = std::numeric_limits<int64_t>::max();

// a x b x ..., or nullopt where the product leaves int64 (all factors are positive).
OptInt checked_product(std::initializer_list<int64_t> factors) {
  int64_t out = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(out, f, &out)) return std::nullopt;
  return out;
}

// The first NaN or infinity in a value (lists and mappings searched too), or nullptr.
const double* non_finite(const Value& v) {
  if (v.kind == Value::Kind::Float) return std::isfinite(v.f) ? nullptr : &v.f;
  for (const auto& e : v.list)
    if (const double* bad = non_finite(e)) return bad;
  for (const auto& e : v.map)
    if (const double* bad = non_finite(e.second)) return bad;
  return nullptr;
}

}  // namespace

// NaN fails every comparison, so a NaN would slip past the rules or make an unrelated one fail:
// no float setting may be NaN or infinite. Only clip_grad may be +inf (no clipping, the norm still
// computed, as torch's clip_grad_norm_ with max_norm inf).
std::optional<double> forbidden_non_finite(const std::string& path, const Value& v) {
  const double* bad = non_finite(v);
  if (!bad || (path == "optimizer.clip_grad" && *bad > 0)) return std::nullopt;
  return *bad;
}

namespace {

// A sample count as Python prints it: 16000 for a whole number, 8.4 otherwise.
std::string number(double v) {
  if (v == std::floor(v) && std::abs(v) < 9e15) return std::to_string(static_cast<int64_t>(v));
  return format_double(v);
}

struct Checker {
  ConfigContainer& c;
  const ValidateOptions& opt;
  Validated& out;

  std::string n(const std::string& path) const { return display_name(path, opt.front_end); }
  bool mlm() const { return opt.front_end == FrontEnd::MegatronLM; }
  [[noreturn]] void fail(const std::string& msg) const { throw UsageError(msg); }
  void positive(const std::string& path, int64_t v) const {
    if (v <= 0) fail(n(path) + " must be a positive integer, got " + std::to_string(v));
  }
  void dimension(const std::string& path, int64_t v) const {
    if (v > kMaxDimension)
      fail(n(path) + " (" + std::to_string(v) + ") is too large: at most " + std::to_string(kMaxDimension) +
           " (laoyao's kernels take 32-bit sizes)");
  }
  // A length in iterations as samples (x the global batch size), refused before it wraps around.
  int64_t samples_of(const std::string& path, int64_t iters, int64_t gbs) const {
    const OptInt samples = checked_product({iters, gbs});
    if (!samples)
      fail(n(path) + " (" + std::to_string(iters) + ") is too large: " + n(path) + " x " +
           n("train.global_batch_size") + " (" + std::to_string(gbs) + ") overflows a 64-bit count of samples");
    return *samples;
  }

  // Checked once, before any rule reads the numbers (forbidden_non_finite says why).
  void finite_numbers() {
    for (auto& f : fields_of(c)) {
      if (f.derived) continue;
      if (const auto bad = forbidden_non_finite(f.path, f.get()))
        fail(n(f.path) + " must be a finite number, got " + format_double(*bad));
    }
  }

  // Megatron-LM's validate_args asserts not (args.fp16 and args.bf16); Bridge's mixed precision
  // copies both switches onto the model (and optimizer), so either front end meets it here.
  void one_half_precision() {
    auto refuse_both = [&](bool bf16, bool fp16, const std::string& section) {
      if (bf16 && fp16)
        fail("cannot specify both fp16 and bf16: " + n(section + ".fp16") + " and " + n(section + ".bf16") +
             " are both true; choose one");
    };
    refuse_both(c.model.bf16, c.model.fp16, "model");
    refuse_both(c.optimizer.bf16, c.optimizer.fp16, "optimizer");
  }

  void mixed_precision() {
    const Value& mp = c.mixed_precision;
    if (mp.is_null()) return;
    // MixedPrecisionConfig's defaults, then the preset's or the mapping's values.
    bool bf16 = false, fp16 = false, grad_reduce_in_fp32 = true;
    std::string params_dtype = "fp32";
    // Its FP8 fields (Bridge's defaults differ from Megatron's: tensorwise, no BF16 layers). Its
    // fp8_param follows fp8_param_gather: the dataclass sets fp8_param_gather after fp8_param, and
    // setting either sets the other (a given fp8_param is only checked).
    ModelConfig fp8;
    fp8.fp8_recipe = "tensorwise";
    fp8.num_layers_at_start_in_bf16 = fp8.num_layers_at_end_in_bf16 = 0;
    bool fp8_param_gather = false;
    if (mp.kind == Value::Kind::String) {
      std::string p = mp.s;
      for (auto& ch : p)
        if (ch == '-') ch = '_';
      auto presets = mixed_precision_presets();
      if (std::find(presets.begin(), presets.end(), p) == presets.end()) {
        std::string hint = p == "16_mixed" ? " ('16-mixed' is not a preset: use fp16_mixed)" : did_you_mean(p, presets);
        fail("unknown mixed_precision preset '" + mp.s + "'" + hint + "; presets: " + join(presets, ", "));
      }
      bf16 = starts_with(p, "bf16") || starts_with(p, "nanov2_bf16");
      fp16 = !bf16;
      params_dtype = bf16 ? "bf16" : "fp16";
      grad_reduce_in_fp32 = bf16;
      c.mixed_precision = Value::string(p);
      if (starts_with(p, "nanov2_")) {  // (Nemotron-Nano-v2's preset: block scaling, despite its name)
        fp8.fp8 = "hybrid", fp8.fp8_recipe = "blockwise", fp8.first_last_layers_bf16 = true;
        fp8.num_layers_at_start_in_bf16 = fp8.num_layers_at_end_in_bf16 = 2, fp8_param_gather = true;
      } else if (p.find("fp8_delayed_scaling") != std::string::npos) {
        fp8.fp8 = "hybrid", fp8.fp8_recipe = "delayed", fp8.fp8_amax_history_len = 1024;
        fp8.fp8_amax_compute_algo = "max", fp8_param_gather = true;
      } else if (p.find("fp8_current_scaling") != std::string::npos) {
        fp8.fp8 = "hybrid", fp8.fp8_recipe = "tensorwise", fp8.first_last_layers_bf16 = true;
        fp8.num_layers_at_start_in_bf16 = fp8.num_layers_at_end_in_bf16 = 1, fp8_param_gather = true;
      } else if (p.find("fp8_subchannel_scaling") != std::string::npos) {
        fp8.fp8 = "hybrid", fp8.fp8_recipe = "blockwise";
      } else if (p.find("mxfp8") != std::string::npos) {
        fp8.fp8 = "e4m3", fp8.fp8_recipe = "mxfp8", fp8_param_gather = true;
      }
    } else if (mp.kind == Value::Kind::Map) {
      static const Choices keys = {"bf16",
                                   "fp16",
                                   "params_dtype",
                                   "pipeline_dtype",
                                   "autocast_enabled",
                                   "grad_reduce_in_fp32",
                                   "fp8",
                                   "fp8_recipe",
                                   "fp8_margin",
                                   "fp8_amax_history_len",
                                   "fp8_amax_compute_algo",
                                   "fp8_wgrad",
                                   "fp8_dot_product_attention",
                                   "fp8_multi_head_attention",
                                   "fp8_param",
                                   "fp8_param_gather",
                                   "first_last_layers_bf16",
                                   "num_layers_at_start_in_bf16",
                                   "num_layers_at_end_in_bf16",
                                   "fp4"};
      for (const auto& entry : mp.map) {
        const std::string& k = entry.first;  // not a structured binding: clang 14's lambdas cannot capture one
        const Value& v = entry.second;
        if (std::find(keys.begin(), keys.end(), k) == keys.end())
          fail("unknown mixed_precision field '" + k + "'" + did_you_mean(k, keys) + "; fields: " + join(keys, ", "));
        auto flag = [&](bool& out) {
          if (v.kind != Value::Kind::Bool) fail("mixed_precision." + k + " must be true or false");
          out = v.b;
        };
        auto integer = [&](int64_t& out) {
          if (v.kind != Value::Kind::Int) fail("mixed_precision." + k + " must be an integer");
          out = v.i;
        };
        auto choice = [&](std::string& out, const Choices& accepted) {
          if (v.kind != Value::Kind::String || std::find(accepted.begin(), accepted.end(), v.s) == accepted.end())
            fail("mixed_precision." + k + " must be one of " + join(accepted, ", "));
          out = v.s;
        };
        if (k == "bf16") flag(bf16);
        if (k == "fp16") flag(fp16);
        if (k == "grad_reduce_in_fp32") flag(grad_reduce_in_fp32);
        if (k == "fp8") {
          std::string f;
          if (!v.is_null()) choice(f, {"e4m3", "hybrid"});
          fp8.fp8 = v.is_null() ? OptString{} : OptString{f};
        }
        if (k == "fp8_recipe") choice(fp8.fp8_recipe, {"tensorwise", "delayed", "mxfp8", "blockwise", "custom"});
        if (k == "fp8_margin") integer(fp8.fp8_margin);
        if (k == "fp8_amax_history_len") integer(fp8.fp8_amax_history_len);
        if (k == "fp8_amax_compute_algo") choice(fp8.fp8_amax_compute_algo, {"most_recent", "max"});
        if (k == "fp8_wgrad") flag(fp8.fp8_wgrad);
        if (k == "fp8_dot_product_attention") flag(fp8.fp8_dot_product_attention);
        if (k == "fp8_multi_head_attention") flag(fp8.fp8_multi_head_attention);
        if (k == "fp8_param" && !v.is_null() && v.kind != Value::Kind::Bool)
          fail("mixed_precision.fp8_param must be true, false or null");
        if (k == "fp8_param_gather") flag(fp8_param_gather);
        if (k == "first_last_layers_bf16") flag(fp8.first_last_layers_bf16);
        if (k == "num_layers_at_start_in_bf16") integer(fp8.num_layers_at_start_in_bf16);
        if (k == "num_layers_at_end_in_bf16") integer(fp8.num_layers_at_end_in_bf16);
        if (k == "params_dtype") {
          if (v.kind != Value::Kind::String || (v.s != "fp32" && v.s != "bf16" && v.s != "fp16"))
            fail("mixed_precision.params_dtype must be fp32, bf16 or fp16");
          params_dtype = v.s;
        }
      }
      if (bf16 && fp16)
        fail("cannot specify both fp16 and bf16: mixed_precision.fp16 and mixed_precision.bf16 are both true; "
             "choose one");
    } else {
      fail("mixed_precision must be a preset name (" + join(mixed_precision_presets(), ", ") +
           ") or a mapping of its fields");
    }
    // Bridge's setup copies the same-named fields onto model, optimizer and ddp.
    c.model.bf16 = c.optimizer.bf16 = bf16;
    c.model.fp16 = c.optimizer.fp16 = fp16;
    c.model.params_dtype = c.optimizer.params_dtype = params_dtype;
    c.ddp.grad_reduce_in_fp32 = grad_reduce_in_fp32;
    ModelConfig& m = c.model;
    m.fp8 = fp8.fp8, m.fp8_recipe = fp8.fp8_recipe, m.fp8_margin = fp8.fp8_margin;
    m.fp8_amax_history_len = fp8.fp8_amax_history_len, m.fp8_amax_compute_algo = fp8.fp8_amax_compute_algo;
    m.fp8_wgrad = fp8.fp8_wgrad, m.fp8_param = fp8_param_gather;
    m.fp8_dot_product_attention = fp8.fp8_dot_product_attention;
    m.fp8_multi_head_attention = fp8.fp8_multi_head_attention;
    m.first_last_layers_bf16 = fp8.first_last_layers_bf16;
    m.num_layers_at_start_in_bf16 = fp8.num_layers_at_start_in_bf16;
    m.num_layers_at_end_in_bf16 = fp8.num_layers_at_end_in_bf16;
  }

  void model_shape() {
    auto& m = c.model;
    positive("model.num_layers", m.num_layers);
    positive("model.hidden_size", m.hidden_size);
    positive("model.num_attention_heads", m.num_attention_heads);
    dimension("model.num_layers", m.num_layers);
    dimension("model.hidden_size", m.hidden_size);
    dimension("model.num_attention_heads", m.num_attention_heads);
    if (m.kv_channels) dimension("model.kv_channels", *m.kv_channels);
    if (m.ffn_hidden_size) dimension("model.ffn_hidden_size", *m.ffn_hidden_size);
    if (m.num_query_groups) dimension("model.num_query_groups", *m.num_query_groups);
    if (m.num_moe_experts) dimension("model.num_moe_experts", *m.num_moe_experts);
    if (m.moe_ffn_hidden_size) dimension("model.moe_ffn_hidden_size", *m.moe_ffn_hidden_size);
    if (m.moe_shared_expert_intermediate_size)
      dimension("model.moe_shared_expert_intermediate_size", *m.moe_shared_expert_intermediate_size);
    dimension("model.moe_router_topk", m.moe_router_topk);
    dimension("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by);
    if (m.vocab_size) dimension("model.vocab_size", *m.vocab_size);
    if (!m.kv_channels) {
      if (m.hidden_size % m.num_attention_heads != 0)
        fail(n("model.hidden_size") + " (" + std::to_string(m.hidden_size) + ") must be divisible by " +
             n("model.num_attention_heads") + " (" + std::to_string(m.num_attention_heads) + ") unless " +
             n("model.kv_channels") + " is set");
      m.kv_channels = m.hidden_size / m.num_attention_heads;
    }
    positive("model.kv_channels", *m.kv_channels);
    if (!m.ffn_hidden_size) {
      if (4 * m.hidden_size > kMaxDimension)
        fail(n("model.ffn_hidden_size") + " defaults to 4 x " + n("model.hidden_size") + " (" +
             std::to_string(4 * m.hidden_size) + "), too large: at most " + std::to_string(kMaxDimension) +
             " (laoyao's kernels take 32-bit sizes)");
      m.ffn_hidden_size = 4 * m.hidden_size;
    }
    positive("model.ffn_hidden_size", *m.ffn_hidden_size);
    if (!m.num_query_groups) m.num_query_groups = m.num_attention_heads;
    positive("model.num_query_groups", *m.num_query_groups);
    if (m.num_attention_heads % *m.num_query_groups != 0)
      fail(n("model.num_attention_heads") + " (" + std::to_string(m.num_attention_heads) +
           ") must be divisible by " + n("model.num_query_groups") + " (" + std::to_string(*m.num_query_groups) + ")");
    if (m.num_moe_experts && *m.num_moe_experts == 0) m.num_moe_experts.reset();  // MLM: 0 -> None
    if (m.num_moe_experts && !m.moe_ffn_hidden_size) m.moe_ffn_hidden_size = m.ffn_hidden_size;
    if (m.hidden_dropout < 0 || m.hidden_dropout >= 1) fail(n("model.hidden_dropout") + " must be in [0, 1)");
    if (m.attention_dropout < 0 || m.attention_dropout >= 1) fail(n("model.attention_dropout") + " must be in [0, 1)");
    if (m.layernorm_epsilon <= 0) fail(n("model.layernorm_epsilon") + " must be > 0");
    if (m.init_method_std <= 0) fail(n("model.init_method_std") + " must be > 0");
  }

  void seq_length() {
    auto& m = c.model;
    auto& d = c.dataset;
    if (!d.seq_length) fail(n("dataset.seq_length") + " must be set");
    positive("dataset.seq_length", *d.seq_length);
    dimension("dataset.seq_length", *d.seq_length);
    if (m.seq_length != *d.seq_length)
      fail("Please ensure sequence length configuration in model config and dataset config match.\n"
           "Sequence length in model config: " + std::to_string(m.seq_length) +
           ", Sequence length in dataset config: " + std::to_string(*d.seq_length));
    if (m.max_position_embeddings) dimension("model.max_position_embeddings", *m.max_position_embeddings);
    if (m.max_position_embeddings && *m.max_position_embeddings < m.seq_length)
      fail(n("model.max_position_embeddings") + " (" + std::to_string(*m.max_position_embeddings) +
           ") must be >= " + n("model.seq_length") + " (" + std::to_string(m.seq_length) + ")");
    if (m.context_parallel_size > 1 && m.seq_length % (2 * m.context_parallel_size) != 0)
      fail(n("model.seq_length") + " (" + std::to_string(m.seq_length) + ") must be divisible by 2 x " +
           n("model.context_parallel_size") + " (" + std::to_string(2 * m.context_parallel_size) + ")");
    // Bridge's ConfigContainer.validate: a CP rank can hold no answer token of a micro-batch, whose
    // per-rank mean would then be 0/0 and whose other ranks' means would be weighed wrongly.
    if (m.context_parallel_size > 1 && d.dataset_root && (!m.calculate_per_token_loss || c.ddp.average_in_collective))
      fail("When finetuning with CP>1, " + n("model.calculate_per_token_loss") + " must be true and " +
           n("ddp.average_in_collective") + " false (Megatron-Bridge's rule)");
  }

  void parallelism() {
    auto& m = c.model;
    positive("model.tensor_model_parallel_size", m.tensor_model_parallel_size);
    positive("model.pipeline_model_parallel_size", m.pipeline_model_parallel_size);
    positive("model.context_parallel_size", m.context_parallel_size);
    positive("model.expert_model_parallel_size", m.expert_model_parallel_size);
    if (m.expert_tensor_parallel_size) positive("model.expert_tensor_parallel_size", *m.expert_tensor_parallel_size);
    // (Checked: three absurd sizes could wrap around to 0 and divide by it.)
    const OptInt product = checked_product(
        {m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size});
    if (!product || opt.world_size % *product != 0)
      fail("world size (" + std::to_string(opt.world_size) + ") is not divisible by " +
           n("model.tensor_model_parallel_size") + " x " + n("model.pipeline_model_parallel_size") + " x " +
           n("model.context_parallel_size") + " (" + (product ? std::to_string(*product) : "more than 2^63") + ")");
    const int64_t mp = *product;
    out.derived.world_size = opt.world_size;
    out.derived.data_parallel_size = opt.world_size / mp;
    if (m.sequence_parallel && m.tensor_model_parallel_size == 1) {
      m.sequence_parallel = false;
      out.warnings.push_back("sequence parallelism needs tensor parallelism > 1; " + n("model.sequence_parallel") +
                             " turned off");
    }
    if (m.sequence_parallel && m.seq_length % m.tensor_model_parallel_size != 0)
      fail(n("model.seq_length") + " (" + std::to_string(m.seq_length) + ") must be divisible by " +
           n("model.tensor_model_parallel_size") + " (" + std::to_string(m.tensor_model_parallel_size) +
           ") with sequence parallelism: each rank holds its share of every sequence");
    if (m.num_query_groups && *m.num_query_groups % m.tensor_model_parallel_size != 0)
      fail(n("model.num_query_groups") + " (" + std::to_string(*m.num_query_groups) + ") must be divisible by " +
           n("model.tensor_model_parallel_size") + " (" + std::to_string(m.tensor_model_parallel_size) + ")");
    if (m.num_moe_experts && *m.num_moe_experts % m.expert_model_parallel_size != 0)
      fail(n("model.num_moe_experts") + " (" + std::to_string(*m.num_moe_experts) + ") must be divisible by " +
           n("model.expert_model_parallel_size") + " (" + std::to_string(m.expert_model_parallel_size) + ")");
    // Bridge: expert_tensor_parallel_size None -> 1 when EP > 1 (MCore would use TP).
    if (!m.expert_tensor_parallel_size && m.expert_model_parallel_size > 1 && !mlm()) m.expert_tensor_parallel_size = 1;
    if (!m.expert_tensor_parallel_size && m.num_moe_experts) m.expert_tensor_parallel_size = m.tensor_model_parallel_size;
    // Distributed optimizer: Bridge ORs the ddp and optimizer switches (same for param gather).
    if (c.ddp.use_distributed_optimizer != c.optimizer.use_distributed_optimizer) {
      out.warnings.push_back(
          "Distributed optimizer settings were not in sync: ddp.use_distributed_optimizer=" +
          std::string(c.ddp.use_distributed_optimizer ? "True" : "False") + ", optimizer.use_distributed_optimizer=" +
          (c.optimizer.use_distributed_optimizer ? "True" : "False") +
          ". Automatically enabling distributed optimizer for both settings.");
      c.ddp.use_distributed_optimizer = c.optimizer.use_distributed_optimizer = true;
    }
    if (c.ddp.overlap_param_gather != c.optimizer.overlap_param_gather)
      c.ddp.overlap_param_gather = c.optimizer.overlap_param_gather = true;
    // Megatron-Core's DDP sums the gradients of a per-token loss, then divides by the step's tokens.
    if (m.calculate_per_token_loss && c.ddp.average_in_collective)
      fail("Cannot average in collective when calculating per-token loss: " + n("model.calculate_per_token_loss") +
           " needs " + n("ddp.average_in_collective") + " false");
    // Megatron-LM's validate_args (its flag sets two fields, so it is named here).
    if (mlm() && c.ddp.overlap_param_gather) {
      if (!c.ddp.use_distributed_optimizer)
        fail("--overlap-param-gather only supported with distributed optimizer (--use-distributed-optimizer)");
      if (!c.ddp.overlap_grad_reduce) fail("Must use --overlap-param-gather with " + n("ddp.overlap_grad_reduce"));
    }
  }

  void batch() {
    auto& t = c.train;
    if (!t.micro_batch_size) fail(n("train.micro_batch_size") + " must be set");
    positive("train.micro_batch_size", *t.micro_batch_size);
    dimension("train.micro_batch_size", *t.micro_batch_size);
    int64_t dp = out.derived.data_parallel_size;
    if (!t.global_batch_size) t.global_batch_size = *t.micro_batch_size * dp;
    positive("train.global_batch_size", *t.global_batch_size);
    if (*t.global_batch_size % (*t.micro_batch_size * dp) != 0)
      fail(n("train.global_batch_size") + " (" + std::to_string(*t.global_batch_size) +
           ") must be a multiple of " + n("train.micro_batch_size") + " x data-parallel size (" +
           std::to_string(*t.micro_batch_size) + " x " + std::to_string(dp) + ")");
    out.derived.num_microbatches = *t.global_batch_size / (*t.micro_batch_size * dp);
    if (!t.rampup_batch_size.empty() && t.rampup_batch_size.size() != 3)
      fail(n("train.rampup_batch_size") + " takes three integers: start, increment, samples");
    // Exactly one of train_iters / train_samples (num_epochs is not offered).
    if (t.train_iters && t.train_samples)
      fail("set only one of " + n("train.train_iters") + " and " + n("train.train_samples"));
    if (!t.train_iters && !t.train_samples)
      fail("one of " + n("train.train_iters") + " or " + n("train.train_samples") + " must be provided");
    if (t.train_iters) positive("train.train_iters", *t.train_iters);
    // Megatron reads 0 as "off" for the early exits; a negative value is a mistake.
    if (t.exit_interval && *t.exit_interval < 0) fail(n("train.exit_interval") + " must be >= 0 (0 = off)");
    if (t.exit_duration_in_mins && *t.exit_duration_in_mins < 0)
      fail(n("train.exit_duration_in_mins") + " must be >= 0 (0 = off)");
    if (t.train_samples) positive("train.train_samples", *t.train_samples);
    training_budget();
    const data::BatchRampup ramp = batch_rampup(c, out.derived);
    if (ramp.ramps()) {
      // Megatron-LM: "expected no batch-size rampup for iteration-based training".
      if (t.train_iters)
        fail(n("train.rampup_batch_size") + " needs sample-based training (" + n("train.train_samples") +
             " instead of " + n("train.train_iters") + ")");
      if (const std::string p = ramp.problem(); !p.empty()) fail(n("train.rampup_batch_size") + ": " + p);
      if (const int64_t b = data::rampup_indivisible_batch(ramp))
        fail(n("train.rampup_batch_size") + ": the batch size " + std::to_string(b) +
             " on the ramp is not a multiple of " + n("train.micro_batch_size") + " x data-parallel size (" +
             std::to_string(*t.micro_batch_size) + " x " + std::to_string(dp) + "); set " +
             n("train.decrease_batch_size_if_needed") + " to round it down");
    }
    out.derived.train_iters = t.train_iters      ? *t.train_iters
                              : ramp.ramps()   ? data::rampup_train_iters(ramp, *t.train_samples)
                                               : *t.train_samples / *t.global_batch_size;
    if (out.derived.train_iters <= 0)
      fail(n("train.train_samples") + " (" + std::to_string(*t.train_samples) + ") is less than one global batch (" +
           n("train.global_batch_size") + " " + std::to_string(*t.global_batch_size) + "): no iteration to train");
  }

  // The datasets count the tokens a run reads in 64 bits (samples x seq_length) and the scheduler
  // its samples (iterations x global batch size): refuse a length whose count leaves them, before a
  // product wraps around into a negative decay or an index too large.
  void training_budget() {
    const auto& t = c.train;
    const int64_t gbs = *t.global_batch_size, seq = *c.dataset.seq_length;
    const std::string tokens = n("dataset.seq_length") + " (" + std::to_string(seq) + ")";
    if (t.train_iters && !checked_product({*t.train_iters, gbs, seq}))
      fail(n("train.train_iters") + " (" + std::to_string(*t.train_iters) +
           ") is too large: " + n("train.train_iters") + " x " + n("train.global_batch_size") + " (" +
           std::to_string(gbs) + ") x " + tokens + ", the tokens the run reads, overflows a 64-bit integer; at most " +
           std::to_string(kMaxCount / gbs / seq) + " iterations");
    if (t.train_samples && !checked_product({*t.train_samples, seq}))
      fail(n("train.train_samples") + " (" + std::to_string(*t.train_samples) +
           ") is too large: " + n("train.train_samples") + " x " + tokens +
           ", the tokens the run reads, overflows a 64-bit integer; at most " + std::to_string(kMaxCount / seq) +
           " samples");
  }

  // The validation and test budgets (Megatron's get_train_valid_test_num_samples) in 64 bits.
  void validation_budget(int64_t egbs) {
    const auto& v = c.validation;
    const int64_t evals = v.eval_interval ? out.derived.train_iters / *v.eval_interval + 1 : 1;
    if (!checked_product({evals, v.eval_iters, egbs, *c.dataset.seq_length}))
      fail(n("validation.eval_iters") + " (" + std::to_string(v.eval_iters) +
           ") is too large: " + std::to_string(evals) + " evaluations x " + n("validation.eval_iters") +
           " x the global batch (" + std::to_string(egbs) + ") x " + n("dataset.seq_length") + " (" +
           std::to_string(*c.dataset.seq_length) + "), the tokens validation reads, overflows a 64-bit integer");
  }

  void validation() {
    auto& v = c.validation;
    auto& t = c.train;
    // Bridge HEAD: the deprecated train.eval_* fields are copied into validation.* with a warning.
    if (t.eval_iters) {
      v.eval_iters = *t.eval_iters, t.eval_iters.reset();
      out.warnings.push_back("train.eval_iters is deprecated; use validation.eval_iters");
    }
    if (t.eval_interval) {
      v.eval_interval = *t.eval_interval, t.eval_interval.reset();
      out.warnings.push_back("train.eval_interval is deprecated; use validation.eval_interval");
    }
    if (t.skip_train) {
      v.skip_train = *t.skip_train, t.skip_train.reset();
      out.warnings.push_back("train.skip_train is deprecated; use validation.skip_train");
    }
    if (v.eval_iters < 0) fail(n("validation.eval_iters") + " must be >= 0");
    if (v.eval_interval) positive("validation.eval_interval", *v.eval_interval);
    // (A zero would divide by zero below.)
    if (v.eval_global_batch_size) positive("validation.eval_global_batch_size", *v.eval_global_batch_size);
    if (v.eval_micro_batch_size) positive("validation.eval_micro_batch_size", *v.eval_micro_batch_size);
    if (v.eval_micro_batch_size) dimension("validation.eval_micro_batch_size", *v.eval_micro_batch_size);
    int64_t dp = out.derived.data_parallel_size;
    int64_t egbs = v.eval_global_batch_size.value_or(*t.global_batch_size);
    int64_t embs = v.eval_micro_batch_size.value_or(*t.micro_batch_size);
    if (egbs % (embs * dp) != 0)
      fail(n("validation.eval_global_batch_size") + " (" + std::to_string(egbs) + ") must be a multiple of " +
           n("validation.eval_micro_batch_size") + " x data-parallel size (" + std::to_string(embs) + " x " +
           std::to_string(dp) + ")");
    validation_budget(egbs);
    // Sample budgets: MLM training.py get_train_valid_test_num_samples, as the datasets use them.
    data::SampleBudgetParams bp;
    bp.train_iters = out.derived.train_iters;
    bp.train_samples = t.train_samples.value_or(0);
    bp.global_batch_size = *t.global_batch_size;
    bp.eval_iters = v.eval_iters;
    bp.eval_interval = v.eval_interval.value_or(0);
    bp.eval_global_batch_size = egbs;
    const data::SampleBudget budget = data::train_valid_test_num_samples(bp);
    out.derived.train_samples = budget.train;
    out.derived.valid_samples = budget.valid;
    out.derived.test_samples = budget.test;
  }

  void optimizer() {
    auto& o = c.optimizer;
    if (!o.lr) fail(n("optimizer.lr") + " must be set");
    if (*o.lr < 0) fail(n("optimizer.lr") + " must be >= 0");
    if (!o.min_lr) o.min_lr = 0.0;
    if (*o.min_lr > *o.lr)
      fail(n("optimizer.min_lr") + " (" + format_double(*o.min_lr) + ") must be <= " + n("optimizer.lr") + " (" +
           format_double(*o.lr) + ")");
    if (o.adam_beta1 < 0 || o.adam_beta1 >= 1 || o.adam_beta2 < 0 || o.adam_beta2 >= 1)
      fail(n("optimizer.adam_beta1") + " and " + n("optimizer.adam_beta2") + " must be in [0, 1)");
    if (o.adam_eps <= 0) fail(n("optimizer.adam_eps") + " must be > 0");
    if (o.clip_grad < 0) fail(n("optimizer.clip_grad") + " must be >= 0");
    if (o.weight_decay < 0) fail(n("optimizer.weight_decay") + " must be >= 0");
  }

  void scheduler() {
    auto& s = c.scheduler;
    auto& t = c.train;
    const int64_t gbs = *t.global_batch_size;
    const double wd = c.optimizer.weight_decay;
    const bool constant_wd = s.weight_decay_incr_style == "constant";
    // Megatron-LM's validate_args: the constant style takes --weight-decay (start and end unset; a
    // second validation sees them set to it), the others both ends.
    if (mlm() && constant_wd && ((s.start_weight_decay && *s.start_weight_decay != wd) ||
                                 (s.end_weight_decay && *s.end_weight_decay != wd)))
      fail(n("scheduler.start_weight_decay") + " and " + n("scheduler.end_weight_decay") + " are for " +
           n("scheduler.weight_decay_incr_style") + " linear or cosine; the constant style uses " +
           n("optimizer.weight_decay"));
    if (mlm() && !constant_wd && (!s.start_weight_decay || !s.end_weight_decay))
      fail(n("scheduler.weight_decay_incr_style") + " " + s.weight_decay_incr_style + " needs both " +
           n("scheduler.start_weight_decay") + " and " + n("scheduler.end_weight_decay"));
    if (!s.start_weight_decay) s.start_weight_decay = wd;
    if (!s.end_weight_decay) s.end_weight_decay = wd;
    if (constant_wd && *s.start_weight_decay != *s.end_weight_decay)
      fail(n("scheduler.start_weight_decay") + " and " + n("scheduler.end_weight_decay") +
           " must be equal with the constant weight-decay style");
    // Megatron-Core's OptimizerParamScheduler asserts these.
    if (*s.start_weight_decay < 0 || *s.end_weight_decay < *s.start_weight_decay)
      fail(n("scheduler.end_weight_decay") + " (" + format_double(*s.end_weight_decay) + ") must be >= " +
           n("scheduler.start_weight_decay") + " (" + format_double(*s.start_weight_decay) + ") >= 0");
    if (c.optimizer.lr && s.lr_warmup_init > *c.optimizer.lr)
      fail(n("scheduler.lr_warmup_init") + " (" + format_double(s.lr_warmup_init) + ") must be <= " +
           n("optimizer.lr") + " (" + format_double(*c.optimizer.lr) + ")");
    if (s.override_opt_param_scheduler && s.use_checkpoint_opt_param_scheduler)
      fail("both override and use-checkpoint are set: choose one of " + n("scheduler.override_opt_param_scheduler") +
           " and " + n("scheduler.use_checkpoint_opt_param_scheduler"));
    bool iter_fields = s.lr_decay_iters || s.lr_warmup_iters > 0 || s.lr_wsd_decay_iters;
    bool sample_fields = s.lr_decay_samples || s.lr_warmup_samples > 0 || s.lr_wsd_decay_samples;
    if (iter_fields && sample_fields)
      fail("Cannot mix iteration-based and sample-based scheduler fields: " + n("scheduler.lr_decay_iters") + "/" +
           n("scheduler.lr_warmup_iters") + " with " + n("scheduler.lr_decay_samples") + "/" +
           n("scheduler.lr_warmup_samples"));
    if (s.lr_warmup_fraction && (s.lr_warmup_iters > 0 || s.lr_warmup_samples > 0))
      fail("Can only specify one of " + n("scheduler.lr_warmup_fraction") + " or " + n("scheduler.lr_warmup_iters") +
           " (or " + n("scheduler.lr_warmup_samples") + ")");
    if (t.train_iters) {
      if (sample_fields)
        fail("Use " + n("scheduler.lr_decay_iters") + " / " + n("scheduler.lr_warmup_iters") +
             " for iteration-based training, not the *_samples fields");
      if (s.max_steps) {
        if (*s.max_steps < *t.train_iters)
          fail(n("scheduler.max_steps") + " (" + std::to_string(*s.max_steps) + ") must be >= " +
               n("train.train_iters") + " (" + std::to_string(*t.train_iters) + ")");
        s.lr_decay_iters = s.max_steps;
      } else if (!s.lr_decay_iters) {
        s.lr_decay_iters = t.train_iters;
      }
      // Bridge decays WSD over the whole decay by default; Megatron-LM's scheduler asserts the flag.
      if (s.lr_decay_style == "WSD" && !s.lr_wsd_decay_iters && mlm())
        fail("the WSD learning-rate schedule needs " + n("scheduler.lr_wsd_decay_iters"));
      if (s.lr_decay_style == "WSD" && !s.lr_wsd_decay_iters) s.lr_wsd_decay_iters = s.lr_decay_iters;
      s.lr_decay_steps =
          samples_of(s.max_steps ? "scheduler.max_steps" : "scheduler.lr_decay_iters", *s.lr_decay_iters, gbs);
      s.wd_incr_steps = s.max_steps ? samples_of("scheduler.max_steps", *s.max_steps, gbs)
                                    : samples_of("train.train_iters", *t.train_iters, gbs);
      s.wsd_decay_steps = s.lr_wsd_decay_iters
                              ? OptInt(samples_of("scheduler.lr_wsd_decay_iters", *s.lr_wsd_decay_iters, gbs))
                              : std::nullopt;
      s.lr_warmup_steps = s.lr_warmup_fraction
                              ? *s.lr_warmup_fraction * static_cast<double>(*s.lr_decay_steps)
                              : static_cast<double>(samples_of("scheduler.lr_warmup_iters", s.lr_warmup_iters, gbs));
    } else {
      if (s.lr_decay_iters)
        fail("Use " + n("scheduler.lr_decay_samples") + " for sample-based training, not " +
             n("scheduler.lr_decay_iters"));
      // Megatron-LM asserts these too ("expected sample-based learning rate warmup").
      if (s.lr_warmup_iters > 0)
        fail("Use " + n("scheduler.lr_warmup_samples") + " for sample-based training, not " +
             n("scheduler.lr_warmup_iters"));
      if (s.lr_wsd_decay_iters)
        fail("Use " + n("scheduler.lr_wsd_decay_samples") + " for sample-based training, not " +
             n("scheduler.lr_wsd_decay_iters"));
      if (s.max_steps)
        fail(n("scheduler.max_steps") + " is for iteration-based training (" + n("train.train_iters") +
             "); sample-based training ends at " + n("train.train_samples"));
      if (s.lr_decay_style == "WSD" && !s.lr_wsd_decay_samples)  // MCore asserts wsd_decay_steps
        fail("the WSD learning-rate schedule needs " + n("scheduler.lr_wsd_decay_samples") +
             " in sample-based training");
      s.lr_decay_steps = s.lr_decay_samples.value_or(*t.train_samples);
      s.wd_incr_steps = *t.train_samples;
      s.wsd_decay_steps = s.lr_wsd_decay_samples;
      s.lr_warmup_steps = s.lr_warmup_fraction ? *s.lr_warmup_fraction * static_cast<double>(*s.lr_decay_steps)
                                               : static_cast<double>(s.lr_warmup_samples);
    }
    if (*s.lr_decay_steps <= 0)
      fail("lr_decay_steps must be > 0, got " + std::to_string(*s.lr_decay_steps) +
           ". Please increase train_iters/train_samples or lr_decay_iters/lr_decay_samples (set " +
           n("train.train_iters") + " or " + n("scheduler.lr_decay_iters") + ").");
    if (*s.lr_warmup_steps >= static_cast<double>(*s.lr_decay_steps)) {
      if (mlm())  // Megatron-LM asserts lr_warmup_steps < lr_decay_steps before step 1.
        fail("the warmup (" + number(*s.lr_warmup_steps) + " samples) must be shorter than the decay (" +
             std::to_string(*s.lr_decay_steps) + " samples): lower " + n("scheduler.lr_warmup_iters") +
             " or raise " + n("scheduler.lr_decay_iters") + " / " + n("train.train_iters"));
      out.warnings.push_back("lr_warmup_steps (" + number(*s.lr_warmup_steps) + ") >= lr_decay_steps (" +
                             std::to_string(*s.lr_decay_steps) + "); capping lr_warmup_steps to " +
                             std::to_string(*s.lr_decay_steps - 1) +
                             ". Reduce lr_warmup_iters (or lr_warmup_samples) for short training runs.");
      s.lr_warmup_steps = static_cast<double>(*s.lr_decay_steps - 1);
    }
  }

  void data() {
    auto& d = c.dataset;
    bool has_blend = !d.blend.is_null() || !d.blend_per_split.is_null() || !d.data_path.empty() ||
                     !d.train_data_path.empty() || !d.valid_data_path.empty() || !d.test_data_path.empty();
    if (d.mock.value_or(false) && has_blend)
      fail("mock data was requested together with data paths; choose one (" + n("dataset.mock") + " or " +
           n("dataset.data_path") + ")");
    if (!d.mock) {
      d.mock = !has_blend && !d.dataset_name && !d.dataset_root;
      if (*d.mock) out.notes.push_back("Let mock = True, as both blend and blend_per_split are None");
    }
    if (!*d.mock && !has_blend && !d.dataset_name && !d.dataset_root)
      fail("no training data: set " + n("dataset.data_path") + " (a Megatron .bin/.idx prefix) or use mock data (" +
           n("dataset.mock") + ")");
    if (*d.mock && d.split != std::string("1,1,1")) {
      out.notes.push_back("Let split = 1,1,1, an arbitrarily even split, as mock is True");
      d.split = "1,1,1";
    }
    const bool per_split = !d.train_data_path.empty() || !d.valid_data_path.empty() || !d.test_data_path.empty() ||
                           !d.blend_per_split.is_null();
    if (per_split && d.split && !*d.mock)
      fail(n("dataset.split") + " cannot be combined with per-split data paths (" + n("dataset.train_data_path") +
           ", ...): each split reads all of its own files");
    if (!*d.mock && !d.split && (!d.data_path.empty() || !d.blend.is_null())) d.split = "969, 30, 1";
    if (d.num_workers < 0) fail(n("dataset.num_workers") + " must be >= 0");
    if (d.sft) sft_data();
  }

  // Megatron-LM's --sft (data/mlm_sft_dataset.hpp): what its SFTDataset and SFTTokenizer assert.
  void sft_data() {
    auto& d = c.dataset;
    const std::string sft = n("dataset.sft");
    const bool per_split = !d.train_data_path.empty() || !d.valid_data_path.empty() || !d.test_data_path.empty();
    if (*d.mock || d.dataset_root || !d.blend.is_null() || !d.blend_per_split.is_null() || (d.data_path.empty() == !per_split))
      fail(sft + " reads JSONL files of {\"messages\": [...]} rows: give them as " + n("dataset.data_path") +
           " (one file, or weights and files, split by " + n("dataset.split") + ") or as per-split paths (" +
           n("dataset.train_data_path") + ", " + n("dataset.valid_data_path") + ", " + n("dataset.test_data_path") +
           "), not both; Bridge's blend and mock data are not built for SFT");
    if (!c.tokenizer.tokenizer_type || *c.tokenizer.tokenizer_type != "SFTTokenizer")
      fail(sft + " tokenizes conversations through Megatron-LM's SFTTokenizer: set " + n("tokenizer.tokenizer_type") +
           " SFTTokenizer (and " + n("tokenizer.tokenizer_model") + " to a Hugging Face tokenizer)");
    if (d.reset_position_ids || d.reset_attention_mask)
      fail(sft + " packs conversations with their own positions and attention (Megatron-LM's SFTDataset asserts "
           "reset_position_ids and reset_attention_mask off)");
    if (!d.skip_getting_attention_mask_from_dataset)
      fail(sft + ": Megatron-LM's SFTDataset asserts that the dataloader creates no attention mask; add "
           "--no-create-attention-mask-in-dataloader (" + n("dataset.skip_getting_attention_mask_from_dataset") + ")");
  }

  void tokenizer() {
    auto& k = c.tokenizer;
    if (!k.tokenizer_type) fail(n("tokenizer.tokenizer_type") + " must be set");
    static const Choices types = {"NullTokenizer",        "GPT2BPETokenizer",      "HuggingFaceTokenizer",
                                  "SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer",
                                  "TikTokenizer",          "MultimodalTokenizer",   "BertWordPieceLowerCase",
                                  "BertWordPieceCase",     "SFTTokenizer"};
    bool known = false;
    for (auto& t : types) known = known || t == *k.tokenizer_type;
    if (!known)
      fail("unknown " + n("tokenizer.tokenizer_type") + " '" + *k.tokenizer_type + "'" +
           did_you_mean(*k.tokenizer_type, types) + "; choose from " + join(types, ", "));
    if (*k.tokenizer_type == "NullTokenizer") {
      if (!k.vocab_size) fail(n("tokenizer.vocab_size") + " must be set for the NullTokenizer");
      positive("tokenizer.vocab_size", *k.vocab_size);
      dimension("tokenizer.vocab_size", *k.vocab_size);
      int64_t v = k.null_vocab_includes_eod ? *k.vocab_size : *k.vocab_size + 1;
      out.derived.tokenizer_vocab_size = v;
      out.derived.eod_id = v - 1;
    } else {
      auto need = [&](const OptString& f, const std::string& path) {
        if (!f) fail(n(path) + " must be set for the " + *k.tokenizer_type);
      };
      if (*k.tokenizer_type == "GPT2BPETokenizer") {
        need(k.vocab_file, "tokenizer.vocab_file");
        need(k.merge_file, "tokenizer.merge_file");
      } else if (*k.tokenizer_type != "BertWordPieceLowerCase" && *k.tokenizer_type != "BertWordPieceCase") {
        need(k.tokenizer_model, "tokenizer.tokenizer_model");
      }
      out.notes.push_back("the vocabulary size of the " + *k.tokenizer_type +
                          " is read from its files when the run starts");
      return;
    }
    apply_vocab_rule(c, out.derived, out.derived.tokenizer_vocab_size, out.derived.eod_id, opt.front_end);
    if (out.derived.padded_vocab_size > kMaxDimension)
      fail("the vocabulary padded to a multiple of " + n("model.make_vocab_size_divisible_by") + " (" +
           std::to_string(out.derived.padded_vocab_size) + ") is too large: at most " + std::to_string(kMaxDimension) +
           " (token ids are 32-bit); lower " + n("tokenizer.vocab_size"));
  }

  void checkpoint() {
    auto& k = c.checkpoint;
    if (k.save && mlm() && !k.save_interval)
      fail("--save needs a positive --save-interval (Megatron-LM asserts it)");
    if (k.save_interval && *k.save_interval <= 0) fail(n("checkpoint.save_interval") + " must be > 0");
  }

  void logger() {
    positive("logger.log_interval", c.logger.log_interval);
    if (c.logger.log_memory_interval) {
      positive("logger.log_memory_interval", *c.logger.log_memory_interval);
      if (mlm() && *c.logger.log_memory_interval % c.logger.log_interval != 0)  // Megatron-LM asserts it
        fail("--log-memory-interval (" + std::to_string(*c.logger.log_memory_interval) +
             ") must be a multiple of --log-interval (" + std::to_string(c.logger.log_interval) + ")");
    }
    const int64_t level = c.logger.timing_log_level, lowest = mlm() ? 0 : -1;  // Bridge's -1: no timers
    if (level < lowest || level > 2)
      fail(n("logger.timing_log_level") + " must be " + (mlm() ? "0, 1 or 2" : "-1, 0, 1 or 2") + ", got " +
           std::to_string(level));
    if (level >= 1)
      out.notes.push_back(
          "laoyao: timers at level " + std::to_string(level) +
          ": forward-backward, embedding-grads-all-reduce, all-grads-sync, optimizer-copy-to-main-grad, "
          "optimizer-inner-step, optimizer" +
          (level >= 2 ? ", batch-generator" : "") +
          "; not optimizer-copy-main-to-model-params or params-all-gather (the update writes the bf16 weights" +
          (level >= 2 ? "; nor forward-compute, backward-compute: one graph runs a micro-batch's forward and backward"
                      : "") +
          ")");
    if (c.logger.log_throughput_to_tensorboard)  // Bridge's rolling window of iterations
      positive("logger.throughput_window_size", c.logger.throughput_window_size);
  }

  void run() {
    if (opt.world_size <= 0) fail("world size must be positive");
    if (c.rng.seed <= 0) fail(n("rng.seed") + " must be > 0, got " + std::to_string(c.rng.seed));
    finite_numbers();
    mixed_precision();
    one_half_precision();
    model_shape();
    seq_length();
    parallelism();
    batch();
    validation();
    optimizer();
    scheduler();
    data();
    tokenizer();
    checkpoint();
    logger();
  }
};

}  // namespace

void apply_vocab_rule(ConfigContainer& c, Derived& d, int64_t tokenizer_vocab, int64_t eod, FrontEnd fe) {
  auto& m = c.model;
  d.tokenizer_vocab_size = tokenizer_vocab;
  d.eod_id = eod;
  // Bridge's _validate_and_set_vocab_size (MLM always pads the tokenizer's vocabulary): the
  // tokenizer's size, padded to a multiple of make_vocab_size_divisible_by x TP, unless the model
  // names a vocabulary of its own (used as is; smaller than the tokenizer's is an error).
  if (!m.vocab_size || c.tokenizer.use_tokenizer_vocab_size) {
    m.vocab_size = tokenizer_vocab;
    m.should_pad_vocab = true;
  } else if (*m.vocab_size < tokenizer_vocab) {
    throw UsageError(display_name("model.vocab_size", fe) + " (" + std::to_string(*m.vocab_size) +
                     ") is smaller than the tokenizer's vocabulary (" + std::to_string(tokenizer_vocab) + ")");
  }
  d.padded_vocab_size = m.should_pad_vocab
                            ? padded_vocab_size(*m.vocab_size, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size)
                            : *m.vocab_size;
}

Validated validate(ConfigContainer& c, const ValidateOptions& opt) {
  Validated out;
  Checker{c, opt, out}.run();
  return out;
}

}  // namespace laoyao::config
