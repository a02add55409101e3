// The training log text must equal Megatron's byte for byte: the expected strings below are the
// real lines quoted in /work/shared/reference (megatron-lm.md §10, megatron-bridge.md §7).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "train/flops.hpp"
#include "train/training_log.hpp"
#include "reference_log_lines.hpp"

using namespace laoyao::train;
using laoyao::train::test::kBridgeLine;
using laoyao::train::test::kMlmLine;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Timestamp ts(int y, int mo, int d, int h, int mi, int s, int us) {
  Timestamp t;
  t.year = y, t.month = mo, t.day = d, t.hour = h, t.minute = mi, t.second = s, t.microsecond = us;
  return t;
}

TrainingLogValues mlm_run_values() {
  TrainingLogValues v;
  v.iteration = 1;
  v.train_iters = 30;
  v.consumed_samples = 32;
  v.elapsed_ms_per_iteration = 3054.0;
  v.throughput_tflops_per_gpu = 0.3;
  v.learning_rate = 2.91e-4;
  v.global_batch_size = 32;
  v.losses = {{"lm loss", 10.42071}};
  v.loss_scale = 1.0;
  v.grad_norm = 0.651;
  return v;
}

}  // namespace

TEST(TrainingLog, MegatronLmLineMatchesTheObservedRunByteForByte) {
  EXPECT_EQ(format_training_line(mlm_run_values(), ts(2026, 11, 30, 5, 34, 22, 661240),
                                 LogFlavor::kMegatronLM),
            kMlmLine);
}

TEST(TrainingLog, BridgeLineWithMoeAndMtpLossesMatchesIssue4024ByteForByte) {
  TrainingLogValues v;
  v.iteration = 43;
  v.train_iters = 6069;
  v.consumed_samples = 22016;
  v.elapsed_ms_per_iteration = 26714.9;
  v.learning_rate = 8.6e-5;
  v.global_batch_size = 512;
  v.losses = {{"lm loss", 0.7866524},
              {"seq_load_balancing_loss", 1.228777},
              {"mtp_1 loss", 1.109981},
              {"mtp_2 loss", 1.170827}};
  v.grad_norm = 1.517;
  EXPECT_EQ(format_training_line(v, ts(2026, 5, 28, 22, 32, 59, 123456), LogFlavor::kBridge),
            kBridgeLine);
}

TEST(TrainingLog, TimestampFormsOfBothFlavors) {
  Timestamp t = ts(2026, 1, 2, 3, 4, 5, 6);
  EXPECT_EQ(format_timestamp(t, LogFlavor::kMegatronLM), "[2026-01-02 03:04:05.000006]");
  EXPECT_EQ(format_timestamp(t, LogFlavor::kBridge), "[2026-01-02 03:04:05]");
  Timestamp now = now_timestamp();
  EXPECT_GE(now.year, 2024);
  EXPECT_GE(now.microsecond, 0);
  EXPECT_LT(now.microsecond, 1000000);
}

TEST(TrainingLog, OptionalFieldsAppearInMegatronsOrderOnlyWhenSet) {
  TrainingLogValues v = mlm_run_values();
  v.iteration = 123456789;  // wider than {:8d}: Python widens, never truncates
  v.train_iters = 200000000;
  v.consumed_samples = 1234567890123;
  v.skipped_samples = 7;
  v.energy_j_per_iter_per_gpu = 12.34;
  v.power_w_per_gpu = 456.78;
  v.decoupled_learning_rate = 1e-5;
  v.losses = {{"lm loss", 2.5}, {"load_balancing_loss", 1.0}};
  v.loss_scale = 65536.0;
  v.num_zeros = 1234.0;
  v.params_norm = 271.8281828;
  v.max_attention_logit = 31.41592;
  v.skipped_iterations = 3;
  v.nan_iterations = 1234;  // wider than {:3d}
  std::string expected =
      " [2026-01-02 03:04:05] iteration 123456789/200000000 | consumed samples: 1234567890123 |"
      " skipped samples:            7 | elapsed time per iteration (ms): 3054.0 |"
      " throughput per GPU (TFLOP/s/GPU): 0.3 | energy per GPU (J/iter/GPU): 12.3 |"
      " power per GPU (W/GPU): 456.8 | learning rate: 2.910000E-04 |"
      " decoupled learning rate: 1.000000E-05 | global batch size:    32 |"
      " lm loss: 2.500000E+00 | load_balancing_loss: 1.000000E+00 | loss scale: 65536.0 |"
      " grad norm: 0.651 | num zeros: 1234.0 | params norm: 271.828 |"
      " max attention logit: 31.416 | number of skipped iterations:   3 |"
      " number of nan iterations: 1234 |";
  EXPECT_EQ(format_training_line(v, ts(2026, 1, 2, 3, 4, 5, 0), LogFlavor::kBridge), expected);

  // Unset optionals vanish; skipped samples only when > 0; no learning rate when unknown.
  TrainingLogValues bare;
  bare.iteration = 2;
  bare.train_iters = 3;
  bare.consumed_samples = 8;
  bare.elapsed_ms_per_iteration = 0.04;
  bare.global_batch_size = 4;
  bare.losses = {{"lm loss", 1.0}};
  EXPECT_EQ(format_training_line(bare, ts(2026, 1, 2, 3, 4, 5, 0), LogFlavor::kBridge),
            " [2026-01-02 03:04:05] iteration        2/       3 | consumed samples:            8 |"
            " elapsed time per iteration (ms): 0.0 | global batch size:     4 |"
            " lm loss: 1.000000E+00 | loss scale: 1.0 | number of skipped iterations:   0 |"
            " number of nan iterations:   0 |");
}

TEST(TrainingLog, NegativeAndNanLossAveragesAreNotPrintedAsMegatronSkipsThem) {
  TrainingLogValues v = mlm_run_values();
  v.losses = {{"lm loss", kNaN}, {"z_loss", -0.5}, {"mtp_1 loss", 0.0}};
  v.grad_norm = kNaN;
  std::string line = format_training_line(v, ts(2026, 1, 1, 0, 0, 0, 0), LogFlavor::kMegatronLM);
  EXPECT_EQ(line.find("lm loss"), std::string::npos);
  EXPECT_EQ(line.find("z_loss"), std::string::npos);
  EXPECT_NE(line.find(" mtp_1 loss: 0.000000E+00 |"), std::string::npos);
  EXPECT_NE(line.find(" grad norm: nan |"), std::string::npos);
  v.grad_norm = -kNaN;  // Python prints no sign on NaN (glibc would print "-nan")
  line = format_training_line(v, ts(2026, 1, 1, 0, 0, 0, 0), LogFlavor::kMegatronLM);
  EXPECT_NE(line.find(" grad norm: nan |"), std::string::npos);
  v.grad_norm = kInf;
  line = format_training_line(v, ts(2026, 1, 1, 0, 0, 0, 0), LogFlavor::kMegatronLM);
  EXPECT_NE(line.find(" grad norm: inf |"), std::string::npos);
}

TEST(TrainingLog, PythonFormatSpecEdgeCases) {
  EXPECT_EQ(pyfmt::exp_upper(kNaN, 6), "NAN");
  EXPECT_EQ(pyfmt::exp_upper(-kNaN, 6), "NAN");
  EXPECT_EQ(pyfmt::exp_upper(kInf, 6), "INF");
  EXPECT_EQ(pyfmt::exp_upper(-kInf, 6), "-INF");
  EXPECT_EQ(pyfmt::exp_lower(-kInf, 2), "-inf");
  EXPECT_EQ(pyfmt::fixed(kNaN, 3), "nan");
  EXPECT_EQ(pyfmt::fixed(-kInf, 3), "-inf");
  EXPECT_EQ(pyfmt::fixed(-0.0, 1), "-0.0");  // Python keeps the sign of negative zero
  EXPECT_EQ(pyfmt::exp_upper(-0.0, 6), "-0.000000E+00");
  EXPECT_EQ(pyfmt::exp_upper(0.0, 6), "0.000000E+00");
  EXPECT_EQ(pyfmt::exp_upper(1e100, 6), "1.000000E+100");
  EXPECT_EQ(pyfmt::exp_upper(1.2345675e-7, 6), "1.234568E-07");
  EXPECT_EQ(pyfmt::fixed(0.125, 2), "0.12");   // exact tie: round half to even, as Python
  EXPECT_EQ(pyfmt::fixed(2.675, 2), "2.67");   // 2.675 is 2.67499999... in binary
  EXPECT_EQ(pyfmt::fixed(-0.04, 1), "-0.0");
  EXPECT_EQ(pyfmt::integer(-5, 8), "      -5");
  EXPECT_EQ(pyfmt::integer(123, 2), "123");
  // str(float) (Python repr)
  EXPECT_EQ(pyfmt::float_str(1234.0), "1234.0");
  EXPECT_EQ(pyfmt::float_str(0.0), "0.0");
  EXPECT_EQ(pyfmt::float_str(-0.0), "-0.0");
  EXPECT_EQ(pyfmt::float_str(0.1), "0.1");
  EXPECT_EQ(pyfmt::float_str(1.5), "1.5");
  EXPECT_EQ(pyfmt::float_str(0.0001), "0.0001");
  EXPECT_EQ(pyfmt::float_str(1e-5), "1e-05");
  EXPECT_EQ(pyfmt::float_str(1e15), "1000000000000000.0");
  EXPECT_EQ(pyfmt::float_str(1e16), "1e+16");
  EXPECT_EQ(pyfmt::float_str(1.5e16), "1.5e+16");
  EXPECT_EQ(pyfmt::float_str(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(pyfmt::float_str(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(pyfmt::float_str(kNaN), "nan");
  EXPECT_EQ(pyfmt::float_str(-kInf), "-inf");
}

TEST(TrainingLog, ValidationBlockMatchesMegatron) {
  ValidationLogValues v;
  v.iteration = 10;
  v.losses = {{"lm loss", 9.285186}};
  // megatron-lm.md §10.2 [run]; the string ends with "| " (trailing space).
  const std::string line =
      " validation loss at iteration 10 | lm loss value: 9.285186E+00 | lm loss PPL: 1.077718E+04 | ";
  EXPECT_EQ(format_validation_line(v), line);
  // Dash lines are '-' * (len(string) + 1) in evaluate_and_print_results (MLM and Bridge).
  std::string dashes(line.size() + 1, '-');
  EXPECT_EQ(dashes.size(), 94u);
  EXPECT_EQ(format_validation_block(v), dashes + "\n" + line + "\n" + dashes + "\n");

  v.iteration = 30;
  v.set = EvalSet::kValidationSet;
  v.losses = {{"lm loss", 8.427104}};
  EXPECT_EQ(format_validation_line(v),
            " validation loss at iteration 30 on validation set | lm loss value: 8.427104E+00 |"
            " lm loss PPL: 4.569248E+03 | ");
  v.set = EvalSet::kTestSet;
  v.validation_set_index = 1;
  v.losses = {{"lm loss", 8.407009}, {"mtp_1 loss", 9.0}};
  EXPECT_EQ(format_validation_line(v),
            " validation-1 loss at iteration 30 on test set | lm loss value: 8.407009E+00 |"
            " lm loss PPL: 4.478346E+03 | mtp_1 loss value: 9.000000E+00 |"
            " mtp_1 loss PPL: 8.103084E+03 | ");
}

TEST(TrainingLog, PerplexityIsCappedAtExp20WithPythonMinSemantics) {
  EXPECT_DOUBLE_EQ(validation_ppl(2.0), std::exp(2.0));
  EXPECT_DOUBLE_EQ(validation_ppl(25.0), std::exp(20.0));
  EXPECT_DOUBLE_EQ(validation_ppl(kInf), std::exp(20.0));
  EXPECT_DOUBLE_EQ(validation_ppl(kNaN), std::exp(20.0));  // min(20, nan) == 20 in Python
  ValidationLogValues v;
  v.iteration = 1;
  v.losses = {{"lm loss", kNaN}};
  EXPECT_EQ(format_validation_line(v),
            " validation loss at iteration 1 | lm loss value: NAN | lm loss PPL: 4.851652E+08 | ");
}

TEST(TrainingLog, BridgeStepTimeLine) {
  EXPECT_EQ(format_bridge_step_time_line(5.39, 2347.0),
            "Step Time : 5.39s GPU utilization: 2347.0MODEL_TFLOP/s/GPU");
  EXPECT_EQ(format_bridge_step_time_line(0.104, 9.478), "Step Time : 0.10s GPU utilization: 9.5MODEL_TFLOP/s/GPU");
}

// ---- FLOPs ------------------------------------------------------------------------------------

namespace {
FlopShape reference_run_shape() {
  // megatron-lm.md §13.1: L=2, h=256, 4 heads, f=1024, s=512, gbs=32, NullTokenizer --vocab-size
  // 32000 (current MLM: vocab = 32000, a multiple of 128, so V_pad = 32000).
  FlopShape s;
  s.global_batch_size = 32;
  s.seq_length = 512;
  s.num_layers = 2;
  s.hidden_size = 256;
  s.ffn_hidden_size = 1024;
  s.num_attention_heads = 4;
  s.padded_vocab_size = 32000;
  return s;
}
std::string sci3(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", x);
  return buf;
}
}  // namespace

TEST(Flops, ReferenceRunWorkedValueAndPrintedThroughput) {
  FlopShape s = reference_run_shape();
  double flops = num_floating_point_operations(s);
  // 16384 tokens * (6*256*1024*2*2 + 6*(256*(256+512) + 256*256)*2 + 6*256*32000)
  //   + 32*512^2 * 6*256*2
  EXPECT_EQ(flops, 985694994432.0);
  EXPECT_EQ(sci3(flops), "9.857e+11");  // megatron-lm.md §10.3: 9.857e11 FLOP/iter
  // "104.0 ms -> 9.5 TFLOP/s/GPU" on one GPU.
  EXPECT_EQ(pyfmt::fixed(tflops_per_gpu(flops, 0.104, 1, LogFlavor::kMegatronLM), 1), "9.5");
  EXPECT_EQ(pyfmt::fixed(tflops_per_gpu(flops, 0.104, 1, LogFlavor::kBridge), 1), "9.5");
  EXPECT_NEAR(tflops_per_gpu(flops, 0.104, 8, LogFlavor::kMegatronLM), flops / 0.104 / 8e12, 1e-9);
  // The padded-vocab question: NullTokenizer's old "+1" vocab (32001 -> padded 32128) gives
  // 9.889e11, which does not match the reference.
  s.padded_vocab_size = 32128;
  EXPECT_EQ(sci3(num_floating_point_operations(s)), "9.889e+11");
}

TEST(Flops, MhaClosedFormWithFfnFourH) {
  FlopShape s = reference_run_shape();
  // 72*B*s*L*h^2*(1 + s/(12h) + V/(12hL)) for MHA and f = 4h.
  double B = 32, sq = 512, L = 2, h = 256, V = 32000;
  double closed = 72 * B * sq * L * h * h * (1 + sq / (12 * h) + V / (12 * h * L));
  EXPECT_NEAR(num_floating_point_operations(s), closed, closed * 1e-12);
}

TEST(Flops, GqaGatedAndKvChannelsTerms) {
  FlopShape s = reference_run_shape();
  double base = num_floating_point_operations(s);
  const double tokens = 32.0 * 512;
  // GQA with 2 groups of d=64: K and V projections shrink from 2*256 to 2*128 columns.
  FlopShape g = s;
  g.num_query_groups = 2;
  EXPECT_DOUBLE_EQ(base - num_floating_point_operations(g), tokens * 6 * 256 * (2 * 128) * 2);
  // SwiGLU: 3 instead of 2 MLP GEMM factors.
  FlopShape sw = s;
  sw.gated_linear_unit = true;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(sw) - base, tokens * 6 * 256 * 1024 * 1 * 2);
  // Explicit kv_channels equal to h/heads changes nothing.
  FlopShape kv = s;
  kv.kv_channels = 64;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(kv), base);
  // Bridge's packed-sequence effective length only changes the core-attention term.
  FlopShape packed = s;
  packed.effective_seq_length = 256.0;
  EXPECT_DOUBLE_EQ(base - num_floating_point_operations(packed), tokens * 6 * 256 * 256 * 2);
}

// Multi-latent attention: Megatron's MLA attention term in place of the QKV one (DeepSeek-V2-Lite's
// attention: 16 heads, no q latent, kv latent 512, 128 + 64 q/k and 128 v dims per head; and with a
// q latent of 1536, V3's).
TEST(Flops, MultiLatentAttentionCountsItsProjectionsAndUnequalHeadDims) {
  FlopShape s = reference_run_shape();  // h 256, 2 layers, s 512, 32 sequences
  const double tokens = 32.0 * 512, h = 256, n = 4, L = 2, sq = 512;
  const double others = num_floating_point_operations(s) - tokens * L * 6 * (h * 3 * h + h * 512.0 / 2 * 2 + h * h);
  FlopShape mla = s;
  mla.multi_latent_attention = true;
  mla.kv_lora_rank = 512, mla.qk_head_dim = 128, mla.qk_pos_emb_head_dim = 64, mla.v_head_dim = 128;
  const double lite_attention = 6 * (h * n * 192 + 512 * (h + n * 256 + 1) + h * 64 + n * 128 * h + n * 192 * sq / 2 +
                                     n * 128 * sq / 2);
  EXPECT_DOUBLE_EQ(num_floating_point_operations(mla), others + tokens * L * lite_attention);
  mla.q_lora_rank = 1536;
  const double v3_attention = lite_attention - 6 * h * n * 192 + 6 * 1536 * (h + n * 192 + 1);
  EXPECT_DOUBLE_EQ(num_floating_point_operations(mla), others + tokens * L * v3_attention);
}

TEST(Flops, MoeLayersReplaceFfnByRoutedTimesTopkPlusShared) {
  FlopShape dense = reference_run_shape();
  dense.ffn_hidden_size = 512 * 2 + 256;  // what an MoE layer with topk 2 + shared 256 counts
  FlopShape moe = reference_run_shape();
  moe.num_experts = 8;
  moe.moe_router_topk = 2;
  moe.moe_ffn_hidden_size = 512;
  moe.moe_shared_expert_ffn_hidden_size = 256;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(moe), num_floating_point_operations(dense));

  // First layer dense (f=1024), second MoE: half of each.
  FlopShape mixed = moe;
  mixed.moe_layer_pattern = {0, 1};
  const double tokens = 32.0 * 512;
  double all_moe = num_floating_point_operations(moe);
  EXPECT_DOUBLE_EQ(num_floating_point_operations(mixed) - all_moe,
                   tokens * 6 * 256 * 2 * (1024 - (512 * 2 + 256)));
  // moe_layer_freq 2 on two layers = pattern {1, 0}: same count as {0, 1}.
  FlopShape freq = moe;
  freq.moe_layer_freq = 2;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(freq), num_floating_point_operations(mixed));
}

TEST(Flops, InconsistentShapesAreRefused) {
  FlopShape s = reference_run_shape();
  s.hidden_size = 0;
  EXPECT_THROW(num_floating_point_operations(s), laoyao::UsageError);
  s = reference_run_shape();
  s.num_attention_heads = 3;  // 256 % 3 != 0 and no kv_channels
  EXPECT_THROW(num_floating_point_operations(s), laoyao::UsageError);
  s = reference_run_shape();
  s.num_experts = 4;
  s.moe_router_topk = 1;
  s.moe_layer_pattern = {1, 1, 1};
  EXPECT_THROW(num_floating_point_operations(s), laoyao::UsageError);
}

// Megatron-LM's report_memory (MiB, two decimals) and Bridge's (1e9 bytes to 5 significant digits,
// Python's str of the float), for 41.45 GB held on global rank 3.
TEST(MemoryReport, MegatronLmAndBridgeLines) {
  const size_t bytes = 41452345678;
  EXPECT_EQ(format_memory_report(1, 3, bytes, LogFlavor::kMegatronLM),
            "[Rank 3] (after 1 iterations) memory (MB) | allocated: 39532.04 | max allocated: 39532.04 | "
            "reserved: 39532.04 | max reserved: 39532.04");
  EXPECT_EQ(format_memory_report(10, 0, bytes, LogFlavor::kBridge),
            "[Rank 0] (after 10 iterations) memory (GB) | mem-allocated-gigabytes: 41.452 | "
            "mem-active-gigabytes: 41.452 | mem-reserved-gigabytes: 41.452 | mem-max-allocated-gigabytes: 41.452 | "
            "mem-max-active-gigabytes: 41.452 | mem-max-reserved-gigabytes: 41.452");
  // round(x, -floor(log10(x)) + 4): 0.37 GB keeps five digits after its first; a whole 2.0 prints "2.0".
  EXPECT_NE(format_memory_report(1, 0, 370123456, LogFlavor::kBridge).find("mem-allocated-gigabytes: 0.37012 |"),
            std::string::npos);
  EXPECT_NE(format_memory_report(1, 0, 2000000000, LogFlavor::kBridge).find("mem-allocated-gigabytes: 2.0 |"),
            std::string::npos);
  EXPECT_NE(format_memory_report(1, 0, 123456789012, LogFlavor::kBridge).find("gigabytes: 123.46 |"),
            std::string::npos);
}

// --log-memory-to-tensorboard: Megatron-LM's byte tags, Bridge's memory line under "memory/".
TEST(MemoryReport, TensorBoardScalarsPerFlavor) {
  const auto mlm = memory_scalars(41452345678, LogFlavor::kMegatronLM);
  ASSERT_EQ(mlm.size(), 3u);
  EXPECT_EQ(mlm[0], (std::pair<std::string, double>{"mem-reserved-bytes", 41452345678.0}));
  EXPECT_EQ(mlm[2].first, "mem-max-allocated-bytes");
  const auto bridge = memory_scalars(41452345678, LogFlavor::kBridge);
  ASSERT_EQ(bridge.size(), 6u);
  EXPECT_EQ(bridge[0], (std::pair<std::string, double>{"memory/mem-allocated-gigabytes", 41.452}));
  EXPECT_EQ(bridge[5].first, "memory/mem-max-reserved-gigabytes");
}

// Bridge's report_throughput: nothing until the window is full; then window - 1 batches over the
// history's whole span (Bridge keeps window + 1 times), per device over the world size; a span
// that does not advance is skipped.
TEST(ThroughputReport, BridgesRollingWindow) {
  EXPECT_TRUE(throughput_report({1.0, 2.0}, 3, 16, 2, 128, 4)->empty()) << "two of three";
  const auto r = throughput_report({1.0, 2.0, 3.0, 5.0}, 3, 16, 2, 128, 4);
  ASSERT_TRUE(r);
  const std::vector<std::pair<std::string, double>> want = {
      {"throughput/batches_per_sec", 2.0 / 4.0},           {"throughput/samples_per_sec", 32.0 / 4.0},
      {"throughput/device/batches_per_sec", 2.0 / 16.0},   {"throughput/device/samples_per_sec", 32.0 / 16.0},
      {"throughput/micro_batch_size", 2.0},                {"throughput/global_batch_size", 16.0},
      {"throughput/tokens_per_sec", 32.0 * 128.0 / 4.0},   {"throughput/device/tokens_per_sec", 32.0 * 128.0 / 16.0}};
  EXPECT_EQ(*r, want);
  EXPECT_FALSE(throughput_report({2.0, 2.0, 2.0}, 3, 16, 2, 128, 4)) << "no time passed";
}

// report_memory_flag: Megatron-LM reports at its first-iteration line and at the next (the first
// interval's), Bridge at its first line only unless that was iteration 1; a Megatron-LM run
// resumed from iteration 100 reports once, at its first line.
TEST(MemoryReport, ScheduleFollowsMegatronsFlag) {
  auto reported = [](LogFlavor f, int64_t loaded, std::initializer_list<int64_t> lines) {
    MemoryReportSchedule s(f, loaded);
    std::vector<int64_t> out;
    for (int64_t it : lines)
      if (s.at_log_line(it)) out.push_back(it);
    return out;
  };
  EXPECT_EQ(reported(LogFlavor::kMegatronLM, 0, {1, 10, 20, 30}), (std::vector<int64_t>{1, 10}));
  EXPECT_EQ(reported(LogFlavor::kBridge, 0, {10, 20, 30}), (std::vector<int64_t>{10}));
  EXPECT_EQ(reported(LogFlavor::kBridge, 0, {1, 2, 3}), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(reported(LogFlavor::kMegatronLM, 100, {110, 120}), (std::vector<int64_t>{110}));
  EXPECT_EQ(reported(LogFlavor::kMegatronLM, 100, {101, 102, 103}), (std::vector<int64_t>{101, 102}));
  EXPECT_EQ(reported(LogFlavor::kBridge, 100, {110, 120}), (std::vector<int64_t>{110}));
}
