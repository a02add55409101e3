// LoRA runs (peft.scheme lora) on the CPU: Bridge's peft fields reach the model, what is not built
// is refused by name, and a run trains the adapters alone from a pretrained base.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/front_ends.hpp"
#include "core/file_io.hpp"
#include "core/safetensors.hpp"
#include "core/error.hpp"
#include "model/gpt_model.hpp"
#include "train/capabilities.hpp"
#include "train/checkpoint.hpp"
#include "train/hf_export.hpp"
#include "train/hf_import.hpp"
#include "train/run_setup.hpp"
#include "train/run_checkpoint.hpp"
#include "train/trainer.hpp"
#include "train/training_run.hpp"

using namespace laoyao;
namespace fs = std::filesystem;

namespace {

config::Resolved resolve(const std::string& recipe, std::vector<std::string> extra) {
  config::RecipeInvocation inv;
  inv.recipe = recipe;
  inv.overrides = {"model.num_layers=2",          "model.hidden_size=32",        "model.ffn_hidden_size=64",
                   "model.num_attention_heads=4", "dataset.seq_length=32",       "train.global_batch_size=4",
                   "train.micro_batch_size=2",    "scheduler.lr_warmup_iters=0", "validation.eval_interval=1000",
                   "validation.eval_iters=0",     "tokenizer.vocab_size=128",    "logger.log_interval=1000",
                   "checkpoint.save=null",        "checkpoint.load=null"};
  inv.overrides.insert(inv.overrides.end(), extra.begin(), extra.end());
  return config::resolve_recipe(inv, 1);
}

train::TrainOptions quiet() {
  train::TrainOptions opt;
  opt.flavor = train::LogFlavor::kBridge;
  opt.out = std::tmpfile();
  return opt;
}

// A small pretrained base: the vanilla recipe's model trained a few steps and saved.
std::string pretrained_base() {
  static const std::string dir = [] {
    const std::string d = (fs::temp_directory_path() / ("laoyao_lora_base." + std::to_string(::getpid()))).string();
    fs::remove_all(d);
    config::Resolved r = resolve("vanilla_gpt_pretrain_config",
                                 {"train.train_iters=3", "checkpoint.save=" + d, "checkpoint.save_interval=3"});
    train::TrainOptions opt = quiet();
    train::train(r.cfg, r.validated.derived, opt);
    std::fclose(opt.out);
    return d;
  }();
  return dir;
}

std::vector<std::string> lora_run(std::vector<std::string> extra) {
  std::vector<std::string> o = {"peft.scheme=lora", "peft.dim=4", "peft.alpha=8",
                                "checkpoint.pretrained_checkpoint=" + pretrained_base()};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

std::string refusal(const std::string& recipe, const std::vector<std::string>& extra) {
  try {
    config::Resolved r = resolve(recipe, extra);
    std::string all;
    for (const auto& m : train::missing_features(r.cfg, 1)) all += m + "\n";
    if (!all.empty()) return all;
    train::model_config(r.cfg, r.validated.derived);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// Runs `steps` training steps of `run` and checks that the frozen base stays bit for bit and that
// every adapter moved.
void train_expecting_only_the_adapters_to_move(train::TrainingRun& run, int steps) {
  const model::ParameterTable& t = run.model->table();
  const std::vector<float> base(run.model->weights(), run.model->weights() + t.trainable_offset);
  const std::vector<float> adapters0(run.model->weights() + t.trainable_offset, run.model->weights() + t.total);
  train::TrainProgress& p = run.progress;
  for (int i = 0; i < steps; ++i) {
    p.gbs = run.ramp.running(p.consumed);
    p.M = p.gbs / run.ramp.micro_times_dp;
    ++p.iteration;
    const train::StepResult st = train::train_step(run);
    EXPECT_TRUE(st.finite);
    EXPECT_GT(st.norm, 0.0);
    p.consumed += p.gbs;
  }
  EXPECT_TRUE(std::equal(base.begin(), base.end(), run.model->weights())) << "the frozen base moved";
  for (const auto& spec : t.specs) {
    if (spec.frozen) continue;
    const float* now = run.model->weights() + spec.offset;
    const float* was = adapters0.data() + (spec.offset - t.trainable_offset);
    EXPECT_FALSE(std::equal(now, now + spec.numel, was)) << spec.name << " did not train";
  }
}

}  // namespace

TEST(LoraConfig, BridgesPeftFieldsReachTheModel) {
  config::Resolved r = resolve("vanilla_gpt_pretrain_config",
                               lora_run({"peft.dropout=0.1", "peft.target_modules=[linear_qkv,linear_fc2]",
                                         "peft.lora_A_init_method=kaiming"}));
  const model::GptConfig g = train::model_config(r.cfg, r.validated.derived);
  ASSERT_TRUE(g.lora.has_value());
  EXPECT_EQ(g.lora->dim, 4);
  EXPECT_FLOAT_EQ(g.lora->scale(), 2.0f);
  EXPECT_DOUBLE_EQ(g.lora->dropout, 0.1);
  EXPECT_TRUE(g.lora->qkv && g.lora->fc2);
  EXPECT_FALSE(g.lora->proj || g.lora->fc1);
  EXPECT_EQ(g.lora->a_init, model::LoraInit::Kaiming);
  EXPECT_EQ(g.lora->b_init, model::LoraInit::Zero);
  // The recipes' own settings: Llama 3 8B dim 8 alpha 16 on all four; Qwen3 8B on attention only.
  for (const char* recipe : {"llama3_8b_peft_config", "qwen3_8b_peft_config"}) {
    SCOPED_TRACE(recipe);
    config::Resolved p = resolve(recipe, {"tokenizer.tokenizer_type=NullTokenizer", "model.num_query_groups=2",
                                          "model.kv_channels=8", "model.tensor_model_parallel_size=1",
                                          "model.context_parallel_size=1"});
    const model::GptConfig pg = train::model_config(p.cfg, p.validated.derived);
    ASSERT_TRUE(pg.lora.has_value());
    EXPECT_EQ(pg.lora->dim, 8);
    EXPECT_FLOAT_EQ(pg.lora->scale(), 2.0f);
    EXPECT_EQ(pg.lora->fc1, std::string(recipe) == "llama3_8b_peft_config");
    EXPECT_TRUE(pg.lora->qkv && pg.lora->proj);
  }
}

TEST(LoraConfig, WhatIsNotBuiltIsRefusedByName) {
  const std::string v = "vanilla_gpt_pretrain_config";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"peft.scheme=dora"}, "PEFT 'dora'"},
      {{"peft.target_modules=[linear_qkv,router]"}, "peft.target_modules 'router'"},
      {{"peft.dropout=0.1", "peft.dropout_position=post"}, "peft.dropout_position post"},
      {{"peft.dropout_position=middle"}, "peft.dropout_position"},
      {{"peft.lora_A_init_method=orthogonal"}, "peft.lora_A_init_method 'orthogonal'"},
      {{"peft.dim=0"}, "peft.dim 0"},
      {{"model.num_moe_experts=4", "model.moe_router_topk=2", "model.add_bias_linear=false", "peft.dropout=0.1"},
       "dropout on the experts' adapters is not built yet"},
      {{"model.num_moe_experts=4", "model.moe_router_topk=2", "model.add_bias_linear=false", "peft.target_modules=[linear_qkv]",
        "model.expert_model_parallel_size=2"},
       "expert parallelism"},
      {{"model.num_moe_experts=4", "model.moe_router_topk=2", "model.add_bias_linear=false",
        "mixed_precision=bf16_with_fp8_delayed_scaling_mixed"},
       "Mixture-of-Experts model in FP8"},
  };
  for (const auto& [extra, needle] : cases) {
    const std::string got = refusal(v, lora_run(extra));
    EXPECT_NE(got.find(needle), std::string::npos) << needle << " in: " << got;
  }
  EXPECT_NE(refusal(v, {"peft.scheme=lora"}).find("PEFT requires a pretrained checkpoint"), std::string::npos);
  EXPECT_EQ(refusal(v, lora_run({})), "");
  EXPECT_EQ(refusal(v, lora_run({"model.num_moe_experts=4", "model.moe_router_topk=2", "model.add_bias_linear=false",
                                 "peft.target_modules=[linear_qkv,linear_proj]"})),
            "")
      << "an MoE model's attention";
  EXPECT_EQ(refusal(v, lora_run({"model.num_moe_experts=4", "model.moe_router_topk=2", "model.add_bias_linear=false"})),
            "")
      << "an MoE model's experts";
  const std::string fp8 = "mixed_precision=bf16_with_fp8_delayed_scaling_mixed";
  EXPECT_EQ(refusal(v, lora_run({fp8})), "") << "a base in FP8";
  EXPECT_EQ(refusal(v, lora_run({"model.num_moe_experts=4", "model.moe_router_topk=2", "model.add_bias_linear=false",
                                 fp8, "peft.target_modules=[linear_qkv,linear_proj]"})),
            "")
      << "an MoE model in FP8, its attention's adapters";
}

// LoRA on an MoE model's experts from an MoE base: the base (router and experts among it) stays
// as loaded, the experts' shared adapter pair and the shared expert's train.
TEST(LoraTraining, TheExpertsAdaptersTrainFromAnMoeBase) {
  const std::vector<std::string> moe = {"model.num_moe_experts=4", "model.moe_router_topk=2",
                                        "model.add_bias_linear=false", "model.moe_ffn_hidden_size=16",
                                        "model.moe_shared_expert_intermediate_size=8", "model.moe_aux_loss_coeff=0.01"};
  const std::string base_dir = (fs::temp_directory_path() / ("laoyao_lora_moe_base." + std::to_string(::getpid()))).string();
  fs::remove_all(base_dir);
  std::vector<std::string> pre = {"train.train_iters=2", "checkpoint.save=" + base_dir, "checkpoint.save_interval=2"};
  pre.insert(pre.end(), moe.begin(), moe.end());
  config::Resolved b = resolve("vanilla_gpt_pretrain_config", pre);
  train::TrainOptions bopt = quiet();
  train::train(b.cfg, b.validated.derived, bopt);
  std::fclose(bopt.out);

  std::vector<std::string> extra = {"peft.scheme=lora", "peft.dim=4", "peft.alpha=8", "train.train_iters=3",
                                    "optimizer.lr=1e-2", "checkpoint.pretrained_checkpoint=" + base_dir};
  extra.insert(extra.end(), moe.begin(), moe.end());
  config::Resolved r = resolve("vanilla_gpt_pretrain_config", extra);
  train::TrainOptions opt = quiet();
  train::TrainingRun run(r.cfg, r.validated.derived, opt);
  const model::ParameterTable& t = run.model->table();
  ASSERT_NE(t.find("decoder.layers.0.mlp.experts.linear_fc1.adapter.linear_in.weight"), nullptr);
  ASSERT_NE(t.find("decoder.layers.1.mlp.shared_experts.linear_fc2.adapter.linear_out.weight"), nullptr);
  train_expecting_only_the_adapters_to_move(run, 3);
  std::fclose(opt.out);
  fs::remove_all(base_dir);
}

// The base read from the pretrained checkpoint stays as it was, bit for bit; the adapters train
// (B first, from zero: A's gradient is zero until B moves).
TEST(LoraTraining, OnlyTheAdaptersMoveFromThePretrainedBase) {
  config::Resolved r = resolve("vanilla_gpt_pretrain_config", lora_run({"train.train_iters=3", "optimizer.lr=1e-2"}));
  train::TrainOptions opt = quiet();
  train::TrainingRun run(r.cfg, r.validated.derived, opt);
  const model::ParameterTable& t = run.model->table();
  ASSERT_GT(t.trainable_offset, 0);
  EXPECT_EQ(run.adam->num_params(), t.trainable()) << "Adam's moments for the adapters alone";
  EXPECT_EQ(run.model->num_trainable(), t.trainable());

  config::Resolved plain = resolve("vanilla_gpt_pretrain_config",
                                   {"train.train_iters=3", "checkpoint.pretrained_checkpoint=" + pretrained_base()});
  train::TrainOptions opt2 = quiet();
  train::TrainingRun base(plain.cfg, plain.validated.derived, opt2);
  ASSERT_EQ(base.model->num_parameters(), t.trainable_offset);
  const std::vector<float> pretrained(base.model->weights(), base.model->weights() + t.trainable_offset);
  EXPECT_TRUE(std::equal(pretrained.begin(), pretrained.end(), run.model->weights())) << "the base as loaded";
  train_expecting_only_the_adapters_to_move(run, 3);
  std::fclose(opt.out);
  std::fclose(opt2.out);
}

// What a checkpoint is about to overwrite is not drawn at random first: under PEFT with a
// pretrained base only the adapters are drawn (and hold their initial values), without PEFT
// nothing is drawn when a pretrained checkpoint gives every weight, everything without one.
TEST(LoraTraining, WhatACheckpointOverwritesIsNotDrawnFirst) {
  config::Resolved r = resolve("vanilla_gpt_pretrain_config", lora_run({"train.train_iters=3"}));
  train::TrainOptions opt = quiet();
  train::TrainingRun run(r.cfg, r.validated.derived, opt);
  const model::ParamFilter drawn = train::initial_params_drawn(r.cfg.checkpoint, *run.model);
  ASSERT_TRUE(drawn);
  int64_t adapters = 0;
  for (const model::ParamSpec& p : run.model->table().specs) {
    EXPECT_EQ(drawn(p), !p.frozen) << p.name;
    if (p.frozen) continue;
    ++adapters;
    std::vector<float> want(static_cast<size_t>(p.numel));
    model::ParameterInit(p, static_cast<uint64_t>(r.cfg.rng.seed), r.cfg.model.bf16).next(want.data(), p.numel);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), run.model->weights() + p.offset)) << p.name;
  }
  EXPECT_GT(adapters, 0);
  std::fclose(opt.out);

  config::Resolved plain = resolve("vanilla_gpt_pretrain_config",
                                   {"train.train_iters=3", "checkpoint.pretrained_checkpoint=" + pretrained_base()});
  model::GptModel full(train::model_config(plain.cfg, plain.validated.derived));
  const model::ParamFilter none = train::initial_params_drawn(plain.cfg.checkpoint, full);
  ASSERT_TRUE(none);
  for (const model::ParamSpec& p : full.table().specs) EXPECT_FALSE(none(p)) << p.name;
  plain.cfg.checkpoint.pretrained_checkpoint.reset();
  EXPECT_FALSE(train::initial_params_drawn(plain.cfg.checkpoint, full)) << "every parameter drawn";
}

// Against the frozen base on the same batches (the mock data's later batches are harder): the
// adapters lower the loss.
TEST(LoraTraining, TheAdaptersLearn) {
  auto losses = [](const char* lr) {
    config::Resolved r = resolve("vanilla_gpt_pretrain_config",
                                 lora_run({"train.train_iters=30", std::string("optimizer.lr=") + lr,
                                           std::string("optimizer.min_lr=") + lr, "peft.dim=8", "peft.alpha=16",
                                           "model.hidden_dropout=0", "model.attention_dropout=0"}));
    train::TrainOptions opt = quiet();
    const train::TrainSummary s = train::train(r.cfg, r.validated.derived, opt);
    std::fclose(opt.out);
    return s.lm_loss;
  };
  const std::vector<double> base = losses("0"), tuned = losses("3e-3");
  ASSERT_EQ(base.size(), 30u);
  ASSERT_EQ(tuned.size(), 30u);
  EXPECT_EQ(base[0], tuned[0]) << "the first step's loss is the base model's (B starts at zero)";
  double gain = 0;
  for (size_t i = 25; i < 30; ++i) gain += (base[i] - tuned[i]) / 5;
  EXPECT_GT(gain, 0.05) << "the last five iterations' loss, base minus LoRA";
}

// The frozen base's linears in FP8 (its forward and input-gradient GEMMs; no weight gradient),
// the adapters beside them in BF16 as Bridge runs them (outside Transformer Engine's FP8 autocast):
// only the adapters move, and the losses stay within FP8's reach of the BF16 run's, not on them.
TEST(LoraTraining, TheBaseRunsInFp8BesideBf16Adapters) {
  auto run = [](std::vector<std::string> fp8) {
    fp8.insert(fp8.end(), {"train.train_iters=20", "optimizer.lr=3e-3", "optimizer.min_lr=3e-3",
                           "model.hidden_dropout=0", "model.attention_dropout=0"});
    config::Resolved r = resolve("vanilla_gpt_pretrain_config", lora_run(fp8));
    train::TrainOptions opt = quiet();
    const train::TrainSummary s = train::train(r.cfg, r.validated.derived, opt);
    std::fclose(opt.out);
    return s.lm_loss;
  };
  const std::vector<double> bf16 = run({});
  ASSERT_EQ(bf16.size(), 20u);
  // (current scaling's preset keeps the first and last layers in BF16: all of this 2-layer base)
  for (const char* mp : {"bf16_with_fp8_delayed_scaling_mixed", "{bf16:true,fp8:hybrid,fp8_recipe:tensorwise}"}) {
    SCOPED_TRACE(mp);
    const std::vector<double> fp8 = run({std::string("mixed_precision=") + mp});
    ASSERT_EQ(fp8.size(), bf16.size());
    EXPECT_NE(fp8[0], bf16[0]) << "the base's forward in FP8";
    for (size_t i = 0; i < fp8.size(); ++i) EXPECT_LT(std::abs(fp8[i] - bf16[i]), 0.01 * bf16[i]) << "iteration " << i;
  }
  config::Resolved r = resolve("vanilla_gpt_pretrain_config",
                               lora_run({"mixed_precision=bf16_with_fp8_delayed_scaling_mixed", "optimizer.lr=1e-2"}));
  train::TrainOptions opt = quiet();
  train::TrainingRun fp8_run(r.cfg, r.validated.derived, opt);
  ASSERT_TRUE(fp8_run.model->config().fp8.has_value());
  train_expecting_only_the_adapters_to_move(fp8_run, 3);
  std::fclose(opt.out);
}

// A LoRA run's checkpoint holds the adapters and their moments alone (Bridge's adapter checkpoint);
// resumed (the base again from the pretrained checkpoint) it continues as the uninterrupted run.
TEST(LoraTraining, CheckpointsHoldTheAdaptersAloneAndResumeExactly) {
  const std::string dir = (fs::temp_directory_path() / ("laoyao_lora_ckpt." + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  // A constant learning rate: the schedule is the same whatever train_iters says.
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> o = {"optimizer.lr=3e-3", "optimizer.min_lr=3e-3", "model.hidden_dropout=0.1"};
    o.insert(o.end(), extra.begin(), extra.end());
    config::Resolved r = resolve("vanilla_gpt_pretrain_config", lora_run(o));
    train::TrainOptions opt = quiet();
    const train::TrainSummary s = train::train(r.cfg, r.validated.derived, opt);
    std::fclose(opt.out);
    return s.lm_loss;
  };
  const std::vector<double> whole = run({"train.train_iters=6"});
  const std::vector<double> first = run({"train.train_iters=3", "checkpoint.save=" + dir, "checkpoint.save_interval=3"});
  const train::LoadedCheckpoint ckpt = train::load_checkpoint(dir);
  ASSERT_FALSE(ckpt.model.tensors().empty());
  for (const auto& [name, stored] : ckpt.model.tensors())
    EXPECT_NE(name.find(".adapter.linear_"), std::string::npos) << name << ": the base is not the run's to save";
  ASSERT_TRUE(ckpt.optimizer.has_value());
  EXPECT_EQ(ckpt.optimizer->tensors().size(), 2 * ckpt.model.tensors().size()) << "exp_avg and exp_avg_sq each";
  const std::vector<double> rest = run({"train.train_iters=6", "checkpoint.load=" + dir});
  ASSERT_EQ(whole.size(), 6u);
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(rest.size(), 3u) << "resumed at iteration 3";
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first[i], whole[i]) << i;
    EXPECT_EQ(rest[i], whole[3 + i]) << 3 + i;
  }
  fs::remove_all(dir);
}

namespace {

// The weights of m's frozen parameters (frozen) or of the others, whole from `store`.
void read_into(model::GptModel& m, const train::TensorStore& store, bool frozen) {
  for (const auto& p : m.table().specs)
    if (p.frozen == frozen)
      store.read({p.name, p.shape, {model::whole_box(p.shape)}}, m.weights() + p.offset);
}

}  // namespace

// export-hf of a LoRA checkpoint: the base (the run's pretrained checkpoint) with (alpha/dim) B A
// merged into each adapted weight, as a Hugging Face folder whose model computes the adapted one's
// losses.
TEST(LoraTraining, ExportHfMergesTheAdaptersIntoTheBase) {
  const std::string dir = (fs::temp_directory_path() / ("laoyao_lora_export." + std::to_string(::getpid()))).string();
  const std::string hf = dir + "_hf";
  fs::remove_all(dir), fs::remove_all(hf);
  config::Resolved r = resolve("vanilla_gpt_pretrain_config",
                               lora_run({"train.train_iters=3", "optimizer.lr=1e-2", "checkpoint.save=" + dir,
                                         "checkpoint.save_interval=3"}));
  train::TrainOptions opt = quiet();
  train::train(r.cfg, r.validated.derived, opt);
  std::fclose(opt.out);
  train::HfExportOptions fp32;
  fp32.dtype = "fp32";
  train::export_hf(dir, hf, fp32);

  const model::GptConfig adapted_cfg = train::model_config(r.cfg, r.validated.derived);
  model::GptConfig plain_cfg = adapted_cfg;
  plain_cfg.lora.reset();
  model::GptModel adapted(adapted_cfg), plain(plain_cfg);
  const std::vector<train::ParamShape> base_shapes = train::param_shapes(plain.table());
  read_into(adapted, train::open_pretrained(pretrained_base(), base_shapes).store, true);
  read_into(adapted, train::load_checkpoint(dir).model, false);
  read_into(plain, train::open_hf_pretrained(hf, plain_cfg, base_shapes).store, false);

  const int64_t b = 2, s = 32, T = b * s;
  std::vector<int64_t> tokens(T), labels(T), positions(T);
  for (int64_t t = 0; t < T; ++t) tokens[t] = (7 * t + 3) % 128, labels[t] = (5 * t + 1) % 128, positions[t] = t % s;
  const model::MicroBatch mb{b, s, tokens.data(), labels.data(), positions.data()};
  std::vector<float> la(T), lp(T);
  adapted.forward(mb, {}, la.data());
  plain.forward(mb, {}, lp.data());
  double worst = 0, moved = 0;
  for (int64_t t = 0; t < T; ++t) worst = std::max(worst, std::abs(double(la[t]) - lp[t]) / std::abs(double(la[t])));
  EXPECT_LT(worst, 1e-5) << "the merged model's per-token losses against the adapted model's";
  // (the adapters did train: the merged weights are not the base's)
  model::GptModel base(plain_cfg);
  read_into(base, train::open_pretrained(pretrained_base(), base_shapes).store, false);
  std::vector<float> lb(T);
  base.forward(mb, {}, lb.data());
  for (int64_t t = 0; t < T; ++t) moved = std::max(moved, std::abs(double(lb[t]) - la[t]));
  EXPECT_GT(moved, 1e-3);
  fs::remove_all(dir), fs::remove_all(hf);
}

namespace {

// Every tensor of a folder's safetensors files, as fp32.
std::map<std::string, std::vector<float>> read_tensors(const std::string& dir) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") {
      SafetensorsFile f(e.path().string());
      for (const auto& t : f.tensors()) out[t.name] = f.read_f32(t);
    }
  return out;
}

}  // namespace

namespace {

void expect_peft_files_of_the_merged_delta(bool moe) {
  SCOPED_TRACE(moe ? "Qwen3-MoE" : "Llama");
  const std::string root = (fs::temp_directory_path() / ("laoyao_lora_peft." + std::to_string(::getpid()))).string();
  fs::remove_all(root);
  std::vector<std::string> llama = {
      "model.normalization=RMSNorm",          "model.gated_linear_unit=true",
      "model.position_embedding_type=rope",   "model.add_bias_linear=false",
      "model.share_embeddings_and_output_weights=false", "model.num_query_groups=2",
      "model.hidden_dropout=0",               "model.attention_dropout=0"};
  if (moe)
    for (const char* o : {"model.qk_layernorm=true", "model.num_moe_experts=4", "model.moe_router_topk=2",
                          "model.moe_ffn_hidden_size=16", "model.moe_aux_loss_coeff=0.01"})
      llama.push_back(o);
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), llama.begin(), llama.end());
    return extra;
  };
  auto train_run = [&](const std::vector<std::string>& o) {
    config::Resolved r = resolve("vanilla_gpt_pretrain_config", o);
    train::TrainOptions opt = quiet();
    train::train(r.cfg, r.validated.derived, opt);
    std::fclose(opt.out);
  };
  const std::string base = root + "/base", ckpt = root + "/lora";
  train_run(with({"train.train_iters=2", "checkpoint.save=" + base, "checkpoint.save_interval=2"}));
  train_run(with({"train.train_iters=3", "optimizer.lr=1e-2", "peft.scheme=lora", "peft.dim=4", "peft.alpha=8",
                  "checkpoint.pretrained_checkpoint=" + base, "checkpoint.save=" + ckpt, "checkpoint.save_interval=3"}));
  train::HfExportOptions fp32;
  fp32.dtype = "fp32";
  train::export_hf(base, root + "/base_hf", fp32);
  train::export_hf(ckpt, root + "/merged_hf", fp32);
  train::HfExportOptions adapters = fp32;
  adapters.adapters = true;
  train::export_hf(ckpt, root + "/peft", adapters);

  const nlohmann::json config = nlohmann::json::parse(read_file(root + "/peft/adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8);
  EXPECT_EQ(config["target_modules"],
            (std::vector<std::string>{"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"}));
  const auto lora = read_tensors(root + "/peft"), merged = read_tensors(root + "/merged_hf"),
             before = read_tensors(root + "/base_hf");
  EXPECT_EQ(lora.size(), moe ? 2u * 16 * 2 : 2u * 7 * 2)
      << "lora_A and lora_B of each linear (Qwen3-MoE: q, k, v, o and 4 experts' three) in each of two layers";
  for (const auto& [name, b] : lora) {
    const std::string tail = ".lora_B.weight";
    if (!name.ends_with(tail)) continue;
    const std::string module = name.substr(0, name.size() - tail.size());
    ASSERT_EQ(module.rfind("base_model.model.", 0), 0u) << name;
    const std::string weight = module.substr(17) + ".weight";
    const std::vector<float>& a = lora.at(module + ".lora_A.weight");
    const std::vector<float>&w1 = merged.at(weight), &w0 = before.at(weight);
    const size_t rows = b.size() / 4, cols = a.size() / 4;
    ASSERT_EQ(w1.size(), rows * cols) << weight;
    double err = 0, size = 0;
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) {
        double d = 0;
        for (size_t k = 0; k < 4; ++k) d += double(b[i * 4 + k]) * a[k * cols + j];
        err = std::max(err, std::abs(2.0 * d - (double(w1[i * cols + j]) - w0[i * cols + j])));
        size = std::max(size, std::abs(2.0 * d));
      }
    EXPECT_GT(size, 0.0) << weight << ": the adapter trained";
    EXPECT_LT(err, 1e-6 + 1e-4 * size) << weight;
  }
  // Not a LoRA run's checkpoint: refused by name, nothing written.
  try {
    train::export_hf(base, root + "/not", adapters);
    ADD_FAILURE() << "--adapters of a plain checkpoint";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not a LoRA run's checkpoint"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(root + "/not"));
  fs::remove_all(root);
}

}  // namespace

// export-hf --adapters: PEFT's adapter_model.safetensors and adapter_config.json, each Hugging Face
// linear's lora_B A (scaled by alpha / r) the same delta the merged export adds to its weight. An
// MoE model's experts (Qwen3-MoE's layout) the same: each expert's gate/up/down_proj gets the
// experts' one pair, as Bridge's export writes a shared expert adapter per expert.
TEST(LoraTraining, ExportHfAdaptersArePeftFilesOfTheMergedDelta) {
  expect_peft_files_of_the_merged_delta(false);
  expect_peft_files_of_the_merged_delta(true);
}
