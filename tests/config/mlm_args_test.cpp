#include <gtest/gtest.h>

#include "config/front_ends.hpp"
#include "config/mlm_args.hpp"
#include "core/error.hpp"
#include "test_util.hpp"

using namespace laoyao;
using namespace laoyao::config;
using laoyao::config::test::seed_mlm_args;

static std::string usage_error(const std::vector<std::string>& args) {
  try {
    resolve_mlm(args, 1);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

static std::vector<std::string> with(std::vector<std::string> a, std::vector<std::string> extra) {
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(MlmArgs, SeedCommandResolvesWithMegatronLmDefaults) {
  Resolved r = resolve_mlm(seed_mlm_args(), 1);
  auto& c = r.cfg;
  EXPECT_EQ(c.model.num_layers, 2);
  EXPECT_EQ(c.model.hidden_size, 256);
  EXPECT_EQ(*c.model.ffn_hidden_size, 1024);
  EXPECT_EQ(*c.model.kv_channels, 64);
  EXPECT_EQ(*c.model.num_query_groups, 4);
  EXPECT_EQ(c.model.seq_length, 512);
  EXPECT_EQ(*c.dataset.seq_length, 512);
  EXPECT_EQ(*c.model.max_position_embeddings, 512);
  // Numerically relevant Megatron-LM defaults (megatron-lm.md §2.2).
  EXPECT_DOUBLE_EQ(c.model.hidden_dropout, 0.1);
  EXPECT_DOUBLE_EQ(c.model.attention_dropout, 0.1);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(*c.scheduler.start_weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.optimizer.adam_beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.adam_eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optimizer.clip_grad, 1.0);
  EXPECT_EQ(c.scheduler.lr_decay_style, "linear");
  EXPECT_EQ(c.scheduler.lr_warmup_iters, 0);
  EXPECT_TRUE(c.model.bias_activation_fusion) << "tanh GeLU is what Megatron-LM runs by default";
  EXPECT_TRUE(c.model.add_bias_linear);
  EXPECT_TRUE(c.model.add_qkv_bias);
  EXPECT_TRUE(c.model.share_embeddings_and_output_weights);
  EXPECT_FALSE(c.model.attention_softmax_in_fp32);
  EXPECT_EQ(c.mixed_precision.s, "bf16_mixed");
  EXPECT_TRUE(c.model.bf16);
  EXPECT_TRUE(c.ddp.grad_reduce_in_fp32) << "--bf16 turns on fp32 gradient accumulation";
  EXPECT_TRUE(c.ddp.check_for_nan_in_grad);
  EXPECT_FALSE(c.ddp.use_distributed_optimizer);
  EXPECT_TRUE(*c.dataset.mock);
  EXPECT_EQ(*c.dataset.split, "1,1,1");
  EXPECT_EQ(c.dataset.random_seed, 1234);
  EXPECT_EQ(c.logger.log_interval, 1);
  EXPECT_EQ(c.validation.eval_iters, 2);
  // Current NullTokenizer: vocab V, EOD V-1, padded to a multiple of 128 (32000 already is).
  auto& d = r.validated.derived;
  EXPECT_EQ(d.tokenizer_vocab_size, 32000);
  EXPECT_EQ(d.eod_id, 31999);
  EXPECT_EQ(d.padded_vocab_size, 32000);
  EXPECT_EQ(d.num_microbatches, 8);
  EXPECT_EQ(d.train_samples, 320);
  EXPECT_EQ(d.valid_samples, (10 / 10 + 1) * 2 * 32);
  EXPECT_EQ(d.test_samples, 64);
  EXPECT_EQ(*c.scheduler.lr_decay_steps, 320);
  EXPECT_EQ(*c.scheduler.lr_warmup_steps, 0);
}

TEST(MlmArgs, DefaultsWhenFlagsAreAbsent) {
  ConfigContainer c = parse_mlm_args({});
  EXPECT_EQ(c.validation.eval_iters, 100);
  EXPECT_FALSE(c.validation.eval_interval.has_value());
  EXPECT_EQ(c.logger.log_interval, 100);
  EXPECT_EQ(*c.tokenizer.tokenizer_type, "GPT2BPETokenizer");
  EXPECT_EQ(c.model.make_vocab_size_divisible_by, 128);
  EXPECT_EQ(c.rng.seed, 1234);
  EXPECT_DOUBLE_EQ(*c.optimizer.min_lr, 0.0);
  EXPECT_EQ(c.model.position_embedding_type, "learned_absolute");
  EXPECT_EQ(c.model.normalization, "LayerNorm");
  EXPECT_DOUBLE_EQ(c.model.layernorm_epsilon, 1e-5);
  EXPECT_EQ(c.model.transformer_impl, "transformer_engine");
}

TEST(MlmArgs, ArgparseForms) {
  ConfigContainer c = parse_mlm_args({"--num-layers=3", "--num-layers", "5", "--lr=1e-3", "--data-path", "0.3",
                                      "/d/a_text_document", "0.7", "/d/b", "--split", "98,2,0"});
  EXPECT_EQ(c.model.num_layers, 5) << "the last occurrence wins";
  EXPECT_DOUBLE_EQ(*c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.dataset.data_path, (std::vector<std::string>{"0.3", "/d/a_text_document", "0.7", "/d/b"}));
  EXPECT_EQ(*c.dataset.split, "98,2,0");
  ConfigContainer neg = parse_mlm_args({"--lr-warmup-init", "-0.5", "--ckpt-step", "-1"});
  EXPECT_DOUBLE_EQ(neg.scheduler.lr_warmup_init, -0.5) << "a negative number is a value, not a flag";
  // argparse keeps a flag's text: the choice "none" is the string none, not YAML's null.
  ConfigContainer none = parse_mlm_args({"--moe-router-load-balancing-type", "none"});
  EXPECT_EQ(none.model.moe_router_load_balancing_type.kind, Value::Kind::String);
  EXPECT_EQ(none.model.moe_router_load_balancing_type.s, "none");
  // nargs='+': several types and coefficients make lists, paired by position.
  ConfigContainer two = parse_mlm_args({"--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss",
                                        "--moe-aux-loss-coeff", "1e-3", "1e-4"});
  ASSERT_EQ(two.model.moe_router_load_balancing_type.kind, Value::Kind::List);
  ASSERT_EQ(two.model.moe_router_load_balancing_type.list.size(), 2u);
  EXPECT_EQ(two.model.moe_router_load_balancing_type.list[1].s, "seq_aux_loss");
  ASSERT_EQ(two.model.moe_aux_loss_coeff.kind, Value::Kind::List);
  EXPECT_DOUBLE_EQ(two.model.moe_aux_loss_coeff.list[1].f, 1e-4);
}

TEST(MlmArgs, SwitchesAndQuirks) {
  ConfigContainer c = parse_mlm_args({"--swiglu", "--hidden-size", "2048", "--disable-bias-linear",
                                      "--untie-embeddings-and-output-weights", "--group-query-attention",
                                      "--num-query-groups", "8", "--normalization", "RMSNorm",
                                      "--position-embedding-type", "rope", "--use-distributed-optimizer",
                                      "--no-bias-gelu-fusion"});
  EXPECT_TRUE(c.model.gated_linear_unit);
  EXPECT_EQ(c.model.activation_func, "silu");
  EXPECT_EQ(*c.model.ffn_hidden_size, 5440) << "int(4*h*2/3/64)*64";
  EXPECT_FALSE(c.model.add_bias_linear);
  EXPECT_FALSE(c.model.add_qkv_bias);
  EXPECT_FALSE(c.model.share_embeddings_and_output_weights);
  EXPECT_EQ(*c.model.num_query_groups, 8);
  EXPECT_TRUE(c.model.bias_activation_fusion) << "swiglu uses --no-bias-swiglu-fusion, not the gelu switch";
  EXPECT_TRUE(c.ddp.use_distributed_optimizer);
  EXPECT_TRUE(c.optimizer.use_distributed_optimizer);
  ConfigContainer g = parse_mlm_args({"--no-bias-gelu-fusion"});
  EXPECT_FALSE(g.model.bias_activation_fusion) << "exact erf GeLU";
  ConfigContainer q = parse_mlm_args({"--num-query-groups", "2"});
  EXPECT_FALSE(q.model.num_query_groups.has_value()) << "--num-query-groups is ignored without --group-query-attention";
  ConfigContainer m = parse_mlm_args({"--num-experts", "64", "--moe-layer-freq", "([0]+[1]*3)*2"});
  ASSERT_EQ(m.model.moe_layer_freq.kind, Value::Kind::List);
  std::vector<int64_t> freq;
  for (auto& v : m.model.moe_layer_freq.list) freq.push_back(v.i);
  EXPECT_EQ(freq, (std::vector<int64_t>{0, 1, 1, 1, 0, 1, 1, 1}));
}

TEST(MlmArgs, UnknownFlagNamesTheNearestOne) {
  std::string e = usage_error({"--num-layer", "2"});
  EXPECT_NE(e.find("--num-layer"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean --num-layers?"), std::string::npos) << e;
  EXPECT_NE(usage_error({"--hiden-size", "2"}).find("--hidden-size"), std::string::npos);
}

TEST(MlmArgs, BadValuesNameFlagValueAndWhatIsAccepted) {
  std::string e = usage_error(with(seed_mlm_args(), {"--num-layers", "two"}));
  EXPECT_NE(e.find("'two'"), std::string::npos) << e;
  EXPECT_NE(e.find("--num-layers"), std::string::npos) << e;
  EXPECT_NE(e.find("integer"), std::string::npos) << e;
  e = usage_error(with(seed_mlm_args(), {"--lr-decay-style", "cosin"}));
  EXPECT_NE(e.find("choose from constant, linear, cosine"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean cosine?"), std::string::npos) << e;
  e = usage_error({"--num-layers"});
  EXPECT_NE(e.find("expected one argument"), std::string::npos) << e;
  e = usage_error({"--bf16=yes"});
  EXPECT_NE(e.find("ignored explicit argument"), std::string::npos) << e;
  e = usage_error({"stray"});
  EXPECT_NE(e.find("stray"), std::string::npos) << e;
}

TEST(MlmArgs, UnsupportedMegatronFlagsAreRefusedByName) {
  std::string e = usage_error({"--fp4-format", "nvfp4"});
  EXPECT_NE(e.find("--fp4-format"), std::string::npos);
  EXPECT_NE(e.find("does not support"), std::string::npos);
  EXPECT_NE(usage_error({"--spec", "local"}).find("--spec"), std::string::npos);
}

TEST(MlmArgs, ValidationErrorsUseFlagNames) {
  std::string e = usage_error({"--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4",
                               "--seq-length", "64", "--mock-data", "--tokenizer-type", "NullTokenizer",
                               "--vocab-size", "100", "--lr", "1e-3", "--train-iters", "5"});
  EXPECT_NE(e.find("--micro-batch-size"), std::string::npos) << e;
  auto args = seed_mlm_args();
  e = usage_error(with(args, {"--lr-warmup-iters", "20"}));
  EXPECT_NE(e.find("--lr-warmup-iters"), std::string::npos) << "Megatron-LM asserts warmup < decay: " << e;
  e = usage_error(with(args, {"--global-batch-size", "30"}));
  EXPECT_NE(e.find("--global-batch-size (30) must be a multiple of --micro-batch-size"), std::string::npos) << e;
  e = usage_error(with(args, {"--min-lr", "1e-2"}));
  EXPECT_NE(e.find("--min-lr"), std::string::npos) << e;
  e = usage_error(with(args, {"--max-position-embeddings", "256"}));
  EXPECT_NE(e.find("--max-position-embeddings (256) must be >= --seq-length (512)"), std::string::npos) << e;
  e = usage_error(with(args, {"--exit-interval", "-1"}));
  EXPECT_NE(e.find("--exit-interval must be >= 0"), std::string::npos) << e;
  e = usage_error(with(args, {"--save", "/tmp/x"}));
  EXPECT_NE(e.find("--save-interval"), std::string::npos) << e;
  // A parallel size that is not positive is a bad value, named (the expert TP size too).
  e = usage_error(with(args, {"--num-experts", "4", "--expert-tensor-parallel-size", "0"}));
  EXPECT_NE(e.find("--expert-tensor-parallel-size must be a positive integer, got 0"), std::string::npos) << e;
  EXPECT_EQ(usage_error(with(args, {"--num-experts", "4", "--expert-tensor-parallel-size", "1"})), "");
  // --log-memory-interval: a positive number of iterations.
  e = usage_error(with(args, {"--log-memory-interval", "0"}));
  EXPECT_NE(e.find("--log-memory-interval must be a positive integer, got 0"), std::string::npos) << e;
  EXPECT_EQ(usage_error(with(args, {"--log-memory-interval", "50"})), "");
  e = usage_error(with(args, {"--log-interval", "10", "--log-memory-interval", "25"}));
  EXPECT_NE(e.find("--log-memory-interval (25) must be a multiple of --log-interval (10)"), std::string::npos) << e;
  EXPECT_EQ(config::resolve_mlm(with(args, {"--log-memory-interval", "50"}), 1).cfg.logger.log_memory_interval, 50);
  // --timing-log-level and --timing-log-option: Megatron-LM's argparse choices.
  e = usage_error(with(args, {"--timing-log-level", "3"}));
  EXPECT_NE(e.find("--timing-log-level must be 0, 1 or 2, got 3"), std::string::npos) << e;
  e = usage_error(with(args, {"--timing-log-option", "median"}));
  EXPECT_NE(e.find("bad value 'median' for --timing-log-option: choose from max, minmax, all"), std::string::npos) << e;
  EXPECT_EQ(usage_error(with(args, {"--timing-log-level", "2", "--timing-log-option", "all"})), "");
  // Megatron-LM's own refusals (validate_args, the scheduler's assertion).
  e = usage_error(with(args, {"--lr-decay-style", "WSD"}));
  EXPECT_NE(e.find("the WSD learning-rate schedule needs --lr-wsd-decay-iters"), std::string::npos) << e;
  EXPECT_EQ(usage_error(with(args, {"--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "4"})), "");
  e = usage_error(with(args, {"--overlap-param-gather"}));
  EXPECT_NE(e.find("--overlap-param-gather only supported with distributed optimizer (--use-distributed-optimizer)"),
            std::string::npos)
      << e;
  e = usage_error(with(args, {"--overlap-param-gather", "--use-distributed-optimizer"}));
  EXPECT_NE(e.find("Must use --overlap-param-gather with --overlap-grad-reduce"), std::string::npos) << e;
  EXPECT_EQ(usage_error(with(args, {"--overlap-param-gather", "--use-distributed-optimizer", "--overlap-grad-reduce"})),
            "");
  // Weight decay (validate_args: the constant style takes --weight-decay, the others both ends)
  // and Megatron-Core's scheduler assertions (a warmup that starts above the peak, a decreasing
  // weight decay).
  e = usage_error(with(args, {"--start-weight-decay", "0.05", "--end-weight-decay", "0.05"}));
  EXPECT_NE(e.find("the constant style uses --weight-decay"), std::string::npos) << e;
  e = usage_error(with(args, {"--weight-decay-incr-style", "linear"}));
  EXPECT_NE(e.find("--weight-decay-incr-style linear needs both --start-weight-decay and --end-weight-decay"),
            std::string::npos)
      << e;
  EXPECT_EQ(usage_error(with(args, {"--weight-decay-incr-style", "linear", "--start-weight-decay", "0.01",
                                    "--end-weight-decay", "0.1"})),
            "");
  e = usage_error(with(args, {"--weight-decay-incr-style", "cosine", "--start-weight-decay", "0.1",
                              "--end-weight-decay", "0.01"}));
  EXPECT_NE(e.find("--end-weight-decay (0.01) must be >= --start-weight-decay (0.1)"), std::string::npos) << e;
  e = usage_error(with(args, {"--lr-warmup-init", "1"}));
  EXPECT_NE(e.find("--lr-warmup-init (1.0) must be <= --lr (0.0003)"), std::string::npos) << e;
}

// The seed command with --train-iters 10 replaced by --train-samples N (and more).
static std::vector<std::string> sample_based(const std::string& samples, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = seed_mlm_args();
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == "--train-iters") a[i] = "--train-samples", a[i + 1] = samples;
  return with(a, std::move(extra));
}

// --train-samples: Megatron-LM's update_train_iters (the whole global batches in it) and a
// schedule in samples up to train_samples itself.
TEST(MlmArgs, SampleBasedTrainingDerivesItsIterationsAndSchedule) {
  Resolved r = resolve_mlm(sample_based("330", {"--lr-warmup-samples", "64"}), 1);
  EXPECT_FALSE(r.cfg.train.train_iters.has_value()) << "the field stays as given";
  EXPECT_EQ(r.validated.derived.train_iters, 10) << "330 // 32";
  EXPECT_EQ(r.validated.derived.train_samples, 330);
  EXPECT_EQ(r.validated.derived.valid_samples, (10 / 10 + 1) * 2 * 32) << "from the derived iterations";
  EXPECT_EQ(*r.cfg.scheduler.lr_decay_steps, 330);
  EXPECT_EQ(*r.cfg.scheduler.wd_incr_steps, 330);
  EXPECT_EQ(*r.cfg.scheduler.lr_warmup_steps, 64);
  r = resolve_mlm(sample_based("330", {"--lr-decay-samples", "500", "--lr-warmup-fraction", "0.1"}), 1);
  EXPECT_EQ(*r.cfg.scheduler.lr_decay_steps, 500);
  EXPECT_DOUBLE_EQ(*r.cfg.scheduler.lr_warmup_steps, 50.0);
  EXPECT_EQ(resolve_mlm(seed_mlm_args(), 1).validated.derived.train_iters, 10);

  std::string e = usage_error(sample_based("31"));
  EXPECT_NE(e.find("--train-samples (31) is less than one global batch (--global-batch-size 32)"), std::string::npos)
      << e;
  e = usage_error(sample_based("320", {"--lr-warmup-iters", "2"}));
  EXPECT_NE(e.find("Use --lr-warmup-samples for sample-based training, not --lr-warmup-iters"), std::string::npos) << e;
  e = usage_error(sample_based("320", {"--lr-decay-iters", "8"}));
  EXPECT_NE(e.find("--lr-decay-samples"), std::string::npos) << e;
  e = usage_error(with(seed_mlm_args(), {"--train-samples", "320"}));
  EXPECT_NE(e.find("set only one of --train-iters and --train-samples"), std::string::npos) << e;
}

// --rampup-batch-size START INCREMENT SAMPLES: sample-based training only (as Megatron-LM asserts);
// its iterations count the ramp (data/batch_rampup.hpp); bad ramps are named by flag.
TEST(MlmArgs, BatchRampupNeedsSampleBasedTrainingAndAWholeRamp) {
  // 8 -> 32 by 8 over 96 samples (one increment every 32): 8, 8, 8, 8 (32), 16, 16 (64), 24, 24
  // (112 > 96): 8 iterations; 400 samples leave 288 = 9 batches of 32.
  Resolved r = resolve_mlm(sample_based("400", {"--rampup-batch-size", "8", "8", "96"}), 1);
  EXPECT_EQ(r.validated.derived.train_iters, 17);
  EXPECT_EQ(r.validated.derived.train_samples, 400);
  std::string e = usage_error(with(seed_mlm_args(), {"--rampup-batch-size", "8", "8", "96"}));
  EXPECT_NE(e.find("--rampup-batch-size needs sample-based training (--train-samples instead of --train-iters)"),
            std::string::npos)
      << e;
  e = usage_error(sample_based("400", {"--rampup-batch-size", "8", "16", "96"}));
  EXPECT_NE(e.find("--rampup-batch-size: the global batch size minus the start batch size (24) must be a multiple"),
            std::string::npos)
      << e;
  e = usage_error(sample_based("400", {"--rampup-batch-size", "6", "2", "96"}));  // 6 is not whole micro-batches of 4
  EXPECT_NE(e.find("the batch size 6 on the ramp is not a multiple of --micro-batch-size x data-parallel size (4 x 1)"),
            std::string::npos)
      << e;
  EXPECT_EQ(usage_error(sample_based("400", {"--rampup-batch-size", "6", "2", "96", "--decrease-batch-size-if-needed"})),
            "");
}

TEST(MlmArgs, TwoGpuSeedNeedsTwoRanksForTensorParallelism) {
  Resolved r = resolve_mlm(test::seed_mlm_args_tp2(), 2);
  EXPECT_TRUE(r.cfg.model.sequence_parallel);
  EXPECT_EQ(r.validated.derived.data_parallel_size, 1);
  EXPECT_EQ(r.validated.derived.padded_vocab_size, 1024) << "ceil(1024 / (128*2)) * 256";
  std::string e = usage_error(test::seed_mlm_args_tp2());
  EXPECT_NE(e.find("world size (1) is not divisible by --tensor-model-parallel-size"), std::string::npos) << e;
  // With TP=1 Megatron turns sequence parallelism off with a warning.
  Resolved one = resolve_mlm(with(seed_mlm_args(), {"--sequence-parallel"}), 1);
  EXPECT_FALSE(one.cfg.model.sequence_parallel);
  ASSERT_FALSE(one.validated.warnings.empty());
}

TEST(MlmArgs, EveryFlagIsKnownOnce) {
  auto names = mlm_flag_names();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
  EXPECT_GT(names.size(), 200u);
}

static bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// NaN fails every comparison: --weight-decay nan once blamed the constant weight-decay style.
TEST(MlmArgs, NonFiniteNumbersNameTheFlag) {
  for (const char* flag : {"--weight-decay", "--lr", "--min-lr", "--adam-beta1", "--adam-beta2", "--adam-eps",
                           "--init-method-std", "--hidden-dropout", "--attention-dropout", "--norm-epsilon",
                           "--layernorm-epsilon", "--loss-scale", "--initial-loss-scale", "--lr-warmup-init",
                           "--clip-grad", "--moe-aux-loss-coeff", "--rotary-base"}) {
    std::string m = usage_error(with(seed_mlm_args(), {flag, "nan"}));
    EXPECT_TRUE(has(m, std::string(flag) + " must be a finite number, got nan")) << flag << ": " << m;
  }
  std::string m = usage_error(with(seed_mlm_args(), {"--lr", "inf"}));
  EXPECT_TRUE(has(m, "--lr must be a finite number, got inf")) << m;
  m = usage_error(with(seed_mlm_args(), {"--weight-decay=-inf"}));
  EXPECT_TRUE(has(m, "--weight-decay must be a finite number, got -inf")) << m;
  // torch's clip_grad_norm_ with max_norm inf: no clipping, the norm still computed.
  EXPECT_EQ(usage_error(with(seed_mlm_args(), {"--clip-grad", "inf"})), "");
}

// Megatron-LM's arguments.py asserts not (args.fp16 and args.bf16): the conflict, not fp16's
// absence from this build, is what the user hears.
TEST(MlmArgs, Bf16AndFp16TogetherAreAConflict) {
  for (auto extra : {std::vector<std::string>{"--fp16"}, std::vector<std::string>{"--fp16", "--bf16"}}) {
    std::string m = usage_error(with(seed_mlm_args(), extra));  // the seed command has --bf16
    EXPECT_TRUE(has(m, "cannot specify both fp16 and bf16: --fp16 and --bf16")) << m;
  }
}

// 2^63 - 1 iterations x the global batch once wrapped around into "lr_decay_steps must be > 0, got -4".
TEST(MlmArgs, LengthsThatOverflowNameTheFlag) {
  std::string m = usage_error(with(seed_mlm_args(), {"--train-iters", "9223372036854775807"}));
  EXPECT_TRUE(has(m, "--train-iters (9223372036854775807) is too large: --train-iters x --global-batch-size (32) x "
                     "--seq-length (512), the tokens the run reads, overflows a 64-bit integer; at most "
                     "562949953421311 iterations"))
      << m;
  EXPECT_FALSE(has(m, "lr_decay_steps")) << m;
  m = usage_error(with(seed_mlm_args(), {"--lr-decay-iters", "4611686018427387904"}));
  EXPECT_TRUE(has(m, "--lr-decay-iters (4611686018427387904) is too large: --lr-decay-iters x --global-batch-size (32) "
                     "overflows a 64-bit count of samples"))
      << m;
  m = usage_error(with(seed_mlm_args(), {"--lr-warmup-iters", "4611686018427387904"}));
  EXPECT_TRUE(has(m, "--lr-warmup-iters (4611686018427387904) is too large")) << m;
  m = usage_error(with(seed_mlm_args(), {"--eval-iters", "4611686018427387904"}));
  EXPECT_TRUE(has(m, "--eval-iters (4611686018427387904) is too large")) << m;
}

// Sizes no 32-bit kernel can take are refused by validation, before any allocation is tried.
TEST(MlmArgs, DimensionsBeyond32BitsNameTheFlag) {
  for (const char* flag : {"--hidden-size", "--num-layers", "--ffn-hidden-size", "--num-attention-heads",
                           "--kv-channels", "--micro-batch-size", "--vocab-size", "--num-experts",
                           "--moe-ffn-hidden-size", "--make-vocab-size-divisible-by"}) {
    std::string m = usage_error(with(seed_mlm_args(), {flag, "4294967296"}));
    EXPECT_TRUE(has(m, std::string(flag) + " (4294967296) is too large: at most 2147483647")) << flag << ": " << m;
  }
  std::string m = usage_error(with(seed_mlm_args(), {"--vocab-size", "3000000000"}));
  EXPECT_TRUE(has(m, "--vocab-size (3000000000) is too large")) << m;
  m = usage_error(with(seed_mlm_args(), {"--seq-length", "4294967296", "--max-position-embeddings", "4294967296"}));
  EXPECT_TRUE(has(m, "--seq-length (4294967296) is too large")) << m;
  // 2^31 - 1 itself is accepted by validation (the memory check at the start of a run judges it).
  EXPECT_EQ(usage_error(with(seed_mlm_args(), {"--seq-length", "2147483647", "--max-position-embeddings",
                                               "2147483647"})),
            "");
}

// --moe-layer-freq's list expressions are evaluated: their size and nesting are bounded.
TEST(MlmArgs, MoeLayerFreqExpressionsAreBounded) {
  for (const std::string& expr : {std::string("[1]*99999999999999999999"), std::string("[1]*1000000"),
                                  std::string("([1]*1000+[0]*1000)*1000"), std::string(100000, '(') + "[1]"}) {
    std::string m = usage_error(with(seed_mlm_args(), {"--moe-layer-freq", expr}));
    EXPECT_TRUE(has(m, "--moe-layer-freq")) << m.substr(0, 300);
    EXPECT_LT(m.size(), 400u);
  }
  std::string m = usage_error(with(seed_mlm_args(), {"--moe-layer-freq", "[]*99999999999999"}));
  EXPECT_FALSE(has(m, "--moe-layer-freq")) << "an empty list repeated is empty, at once: " << m;
}
