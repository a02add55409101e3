// `laoyao checkpoint import-hf` as a user types it: a Hugging Face Llama folder imported, then
// trained from with the flags it wrote (`pretrain-gpt $(cat OUT/model_flags.txt) ...`) and with its
// Bridge overrides; bad arguments and folders exit 2 with nothing written.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "../train/hf_folder.hpp"
#include "core/file_io.hpp"
#include "core/safetensors.hpp"
#include "run_binary.hpp"

using namespace laoyao::test;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// A tiny training run on top of a model's flags: mock data, NullTokenizer (63 + EOD = the 64 rows).
std::vector<std::string> tiny_run(std::vector<std::string> args) {
  for (const char* a : {"--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters",
                        "2", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "63", "--lr", "1e-4",
                        "--eval-iters", "1", "--eval-interval", "2", "--log-interval", "1"})
    args.emplace_back(a);
  return args;
}

}  // namespace

TEST(CheckpointCli, AnImportedLlamaTrainsFromItsFlagsAndItsOverrides) {
  const std::string dir = fresh_dir("import_hf"), in = dir + "/hf", out = dir + "/imported";
  fs::create_directories(in);
  llama_folder(in, false).write(llama_config("LlamaForCausalLM"), laoyao::Dtype::BF16);
  auto r = run_laoyao({"checkpoint", "import-hf", in, out}, dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "imported LlamaForCausalLM: 15 tensors")) << r.output;
  EXPECT_TRUE(contains(r.output, "no tokenizer files")) << r.output;

  std::vector<std::string> mlm = {"pretrain-gpt"};
  for (auto& w : words(laoyao::read_file(out + "/model_flags.txt"))) mlm.push_back(w);
  r = run_laoyao(tiny_run(mlm), dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "loaded pretrained weights from " + fs::absolute(out).string())) << r.output;
  EXPECT_TRUE(contains(r.output, "iteration        2/       2")) << r.output;

  // The Bridge overrides on a recipe: the same model, read from the same folder.
  std::vector<std::string> bridge = {"run-recipe", "--recipe", "vanilla_gpt_pretrain_config"};
  for (auto& w : words(laoyao::read_file(out + "/model_overrides.txt"))) bridge.push_back(w);
  for (const char* a : {"dataset.seq_length=16", "train.train_iters=2", "train.global_batch_size=2",
                        "train.micro_batch_size=1", "validation.eval_interval=2", "validation.eval_iters=1",
                        "scheduler.lr_warmup_iters=0", "tokenizer.vocab_size=63", "logger.log_interval=1"})
    bridge.emplace_back(a);
  r = run_laoyao(bridge, dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "loaded pretrained weights from " + fs::absolute(out).string())) << r.output;
  EXPECT_TRUE(contains(r.output, "iteration        2/       2")) << r.output;
  fs::remove_all(dir);
}

TEST(CheckpointCli, BadArgumentsAndFoldersExitTwoWritingNothing) {
  const std::string dir = fresh_dir("import_hf_bad"), in = dir + "/hf";
  fs::create_directories(in);
  llama_folder(in, false).write(llama_config("FalconForCausalLM"));
  auto r = run_laoyao({"checkpoint", "import-hf", in}, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "import-hf takes HF_DIR OUT_DIR")) << r.output;
  r = run_laoyao({"checkpoint", "import-hff", in, dir + "/out"}, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "did you mean import-hf")) << r.output;
  r = run_laoyao({"checkpoint", "import-hf", in, dir + "/out"}, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "\"FalconForCausalLM\" is not supported")) << r.output;
  EXPECT_TRUE(contains(r.output, "LlamaForCausalLM")) << r.output;
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename(), "hf");  // nothing written
  fs::remove_all(dir);
}

// Train from an import, save, export the checkpoint: the Hugging Face folder holds the run's fp32
// main weights (bit for bit with --dtype fp32, rounded to BF16 by default after a --bf16 run) under
// Llama's names, with a config.json of its shape, and imports again to the same tensors.
TEST(CheckpointCli, ATrainedCheckpointExportsAsTheHuggingFaceModelItCameFrom) {
  const std::string dir = fresh_dir("export_hf"), in = dir + "/hf", imported = dir + "/imported";
  fs::create_directories(in);
  llama_folder(in, false).write(llama_config("LlamaForCausalLM"));
  ASSERT_EQ(run_laoyao({"checkpoint", "import-hf", in, imported}, dir).status, 0);
  std::vector<std::string> mlm = {"pretrain-gpt"};
  for (auto& w : words(laoyao::read_file(imported + "/model_flags.txt"))) mlm.push_back(w);
  mlm = tiny_run(mlm);
  for (const char* a : {"--bf16", "--save", "saved", "--save-interval", "2"}) mlm.emplace_back(a);
  auto r = run_laoyao(mlm, dir);
  ASSERT_EQ(r.status, 0) << r.output;

  r = run_laoyao({"checkpoint", "export-hf", dir + "/saved", dir + "/fp32", "--dtype", "fp32"}, dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "exported LlamaForCausalLM (fp32): 21 tensors")) << r.output;
  const std::string config = laoyao::read_file(dir + "/fp32/config.json");
  for (const char* want : {"\"LlamaForCausalLM\"", "\"num_key_value_heads\": 2", "\"rope_theta\": 500000",
                           "\"tie_word_embeddings\": false", "\"torch_dtype\": \"float32\""})
    EXPECT_TRUE(contains(config, want)) << want << " in " << config;
  ASSERT_EQ(run_laoyao({"checkpoint", "import-hf", dir + "/fp32", dir + "/again"}, dir).status, 0);
  laoyao::SafetensorsFile saved(dir + "/saved/iter_0000002/model.safetensors"), again(dir + "/again/model.safetensors");
  ASSERT_EQ(saved.tensors().size(), again.tensors().size());
  for (const auto& t : saved.tensors()) {
    const auto* u = again.find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(saved.read_f32(t), again.read_f32(*u)) << t.name;
  }

  r = run_laoyao({"checkpoint", "export-hf", dir + "/saved/iter_0000002", dir + "/bf16"}, dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "(bf16)")) << r.output;
  laoyao::SafetensorsFile bf16(dir + "/bf16/model.safetensors");
  const auto* emb = bf16.find("model.embed_tokens.weight");
  ASSERT_NE(emb, nullptr);
  ASSERT_EQ(emb->dtype, laoyao::Dtype::BF16);
  const auto want = saved.read_f32(*saved.find("embedding.word_embeddings.weight"));
  const auto* got = reinterpret_cast<const uint16_t*>(emb->data);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], laoyao::f32_to_bf16(want[i])) << i;

  // Bad arguments: exit 2, nothing written.
  r = run_laoyao({"checkpoint", "export-hf", dir + "/saved", dir + "/x", "--dtype", "fp16"}, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "expected bf16 or fp32")) << r.output;
  r = run_laoyao({"checkpoint", "export-hf", dir + "/nothing", dir + "/x"}, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "nothing")) << r.output;
  r = run_laoyao({"checkpoint", "export-hf", dir + "/saved", dir + "/x", "--max-shard-size", "5XB"}, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "--max-shard-size '5XB'")) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/x"));
  fs::remove_all(dir);
}

namespace {

// The "lm loss" values of a log's iteration lines.
std::vector<std::string> losses(const std::string& log) {
  std::vector<std::string> out;
  for (size_t at = log.find("lm loss: "); at != std::string::npos; at = log.find("lm loss: ", at + 1))
    out.push_back(log.substr(at, log.find('|', at) - at));
  return out;
}

}  // namespace

// --pretrained-checkpoint naming the Hugging Face folder itself, or its hub id in a local cache,
// trains exactly as from its import; a flag that contradicts config.json is refused by name.
TEST(CheckpointCli, APretrainedHuggingFaceFolderOrHubIdLoadsAsItsImport) {
  const std::string dir = fresh_dir("pretrained_hf"), in = dir + "/hf", imported = dir + "/imported";
  fs::create_directories(in);
  llama_folder(in, false).write(llama_config("LlamaForCausalLM"));
  ASSERT_EQ(run_laoyao({"checkpoint", "import-hf", in, imported}, dir).status, 0);
  std::vector<std::string> flags = words(laoyao::read_file(imported + "/model_flags.txt"));
  auto from = [&](const std::string& pretrained, const std::string& env = "", std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"pretrain-gpt"};
    for (size_t i = 0; i < flags.size(); ++i) {
      if (flags[i] == "--pretrained-checkpoint") ++i;
      else args.push_back(flags[i]);
    }
    args = tiny_run(args);
    args.insert(args.end(), {"--pretrained-checkpoint", pretrained});
    args.insert(args.end(), extra.begin(), extra.end());
    return run_laoyao(args, dir, env);
  };
  const auto base = from(imported);
  ASSERT_EQ(base.status, 0) << base.output;
  ASSERT_EQ(losses(base.output).size(), 2u) << base.output;  // the 2 iterations

  const auto direct = from(in);
  ASSERT_EQ(direct.status, 0) << direct.output;
  EXPECT_TRUE(contains(direct.output, "loaded pretrained weights from " + in)) << direct.output;
  EXPECT_EQ(losses(direct.output), losses(base.output));

  // The same folder as a hub id in a cache (HF_HUB_CACHE), as the recipes name models.
  const std::string snapshot = dir + "/cache/models--tiny--llama/snapshots/abc123";
  fs::create_directories(snapshot);
  fs::create_directories(dir + "/cache/models--tiny--llama/refs");
  laoyao::write_file_atomic(dir + "/cache/models--tiny--llama/refs/main", "abc123");
  for (const auto& e : fs::directory_iterator(in)) fs::copy_file(e.path(), snapshot + "/" + e.path().filename().string());
  const auto hub = from("tiny/llama", "HF_HUB_CACHE=" + shell_word(dir + "/cache"));
  ASSERT_EQ(hub.status, 0) << hub.output;
  EXPECT_EQ(losses(hub.output), losses(base.output));
  auto r = run_laoyao({"checkpoint", "import-hf", "tiny/llama", dir + "/from_hub"}, dir,
                      "HF_HUB_CACHE=" + shell_word(dir + "/cache"));
  EXPECT_EQ(r.status, 0) << r.output;
  r = run_laoyao({"checkpoint", "import-hf", "tiny/other", dir + "/missing"}, dir,
                 "HF_HUB_CACHE=" + shell_word(dir + "/cache"));
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "models--tiny--other")) << r.output;

  // Flags that contradict config.json: each named with both values, before anything is read.
  r = from(in, "", {"--num-layers", "3", "--rotary-base", "10000"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--num-layers 3 (config.json: num_hidden_layers 2)")) << r.output;
  EXPECT_TRUE(contains(r.output, "--rotary-base 10000 (config.json: rope_theta 500000)")) << r.output;
  fs::remove_all(dir);
}

// DeepSeek-V2 and V3 folders (multi-latent attention, a dense first layer, routed and shared
// experts; V3's expert bias): imported, trained from the flags and the Bridge overrides import-hf
// wrote (and from the folder itself), saved and exported back as the same architecture, whose
// import holds the trained tensors.
TEST(CheckpointCli, DeepseekFoldersTrainFromTheirFlagsAndExportAsDeepseek) {
  for (const bool v3 : {false, true}) {
    SCOPED_TRACE(v3 ? "V3" : "V2");
    const std::string dir = fresh_dir(v3 ? "deepseek_v3" : "deepseek_v2"), in = dir + "/hf", out = dir + "/imported";
    fs::create_directories(in);
    deepseek_folder(in, v3).write(deepseek_config(v3), laoyao::Dtype::BF16);
    auto r = run_laoyao({"checkpoint", "import-hf", in, out}, dir);
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string arch = v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM";
    EXPECT_TRUE(contains(r.output, "imported " + arch)) << r.output;
    const std::string flags = laoyao::read_file(out + "/model_flags.txt");
    for (const char* want : {"--multi-latent-attention", "--kv-lora-rank 8", "--qk-head-dim 4", "--v-head-dim 6",
                             "--moe-layer-freq ([0]*1+[1]*1)", "--moe-shared-expert-intermediate-size 8",
                             "--moe-router-topk-scaling-factor 2.5", "--moe-router-load-balancing-type seq_aux_loss"})
      EXPECT_TRUE(contains(flags, want)) << want << " in " << flags;
    EXPECT_EQ(contains(flags, "--moe-router-enable-expert-bias"), v3) << flags;
    EXPECT_EQ(contains(flags, "--rope-type yarn --rotary-scaling-factor 40"), !v3) << flags;

    std::vector<std::string> mlm = {"pretrain-gpt"};
    for (auto& w : words(flags)) mlm.push_back(w);
    mlm = tiny_run(mlm);
    for (const char* a : {"--save", "saved", "--save-interval", "2"}) mlm.emplace_back(a);
    r = run_laoyao(mlm, dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "loaded pretrained weights from " + fs::absolute(out).string())) << r.output;
    EXPECT_TRUE(contains(r.output, "iteration        2/       2")) << r.output;
    const auto trained = losses(r.output);

    // The folder itself as the pretrained checkpoint trains the same steps.
    std::vector<std::string> direct = mlm;
    for (auto& a : direct)
      if (a == out) a = in;
    direct.resize(direct.size() - 4);  // (no --save)
    r = run_laoyao(direct, dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(losses(r.output), trained);

    // The Bridge overrides on the recipe.
    std::vector<std::string> bridge = {"run-recipe", "--recipe", "deepseek_v2_lite_pretrain_config"};
    for (auto& w : words(laoyao::read_file(out + "/model_overrides.txt"))) bridge.push_back(w);
    for (const char* a : {"dataset.seq_length=16", "model.seq_length=16", "train.train_iters=2",
                          "train.global_batch_size=2", "train.micro_batch_size=1", "validation.eval_interval=2",
                          "validation.eval_iters=1", "scheduler.lr_warmup_iters=0", "tokenizer.vocab_size=63",
                          "logger.log_interval=1", "model.expert_model_parallel_size=1", "checkpoint.save=null"})
      bridge.emplace_back(a);
    r = run_laoyao(bridge, dir, "LAOYAO_DEVICE=cpu");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "loaded pretrained weights from " + fs::absolute(out).string())) << r.output;

    // Exported from the run's checkpoint: the architecture it came from, the trained tensors.
    r = run_laoyao({"checkpoint", "export-hf", dir + "/saved", dir + "/exported", "--dtype", "fp32"}, dir);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "exported " + arch)) << r.output;
    const std::string config = laoyao::read_file(dir + "/exported/config.json");
    for (const std::string& want : std::vector<std::string>{"\"kv_lora_rank\": 8", "\"first_k_dense_replace\": 1",
                                                            "\"n_shared_experts\": 1",
                                                            std::string("\"topk_method\": \"") +
                                                                (v3 ? "noaux_tc" : "greedy") + "\""})
      EXPECT_TRUE(contains(config, want)) << want << " in " << config;
    ASSERT_EQ(run_laoyao({"checkpoint", "import-hf", dir + "/exported", dir + "/again"}, dir).status, 0);
    laoyao::SafetensorsFile saved(dir + "/saved/iter_0000002/model.safetensors"),
        again(dir + "/again/model.safetensors");
    ASSERT_EQ(saved.tensors().size(), again.tensors().size());
    for (const auto& t : saved.tensors()) {
      const auto* u = again.find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      EXPECT_EQ(saved.read_f32(t), again.read_f32(*u)) << t.name;
    }
    fs::remove_all(dir);
  }
}
