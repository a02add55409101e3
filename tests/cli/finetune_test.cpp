// Fine-tuning as a Megatron-Bridge user runs it: the llama32_1b_sft_config recipe, shrunk, on local
// JSONL of Bridge's SQuAD rows (packed, and unpacked), from a Hugging Face import, tokenised by a
// real Llama 3 tokenizer, and the Llama PEFT recipes (LoRA) on the same; the recipe's dataset
// without dataset_root is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../train/hf_folder.hpp"
#include "core/file_io.hpp"
#include "run_binary.hpp"

using namespace laoyao::test;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string vocab_dir() {
  const char* env = std::getenv("LAOYAO_TEST_VOCABS");
  return (env && *env ? std::string(env) : std::string(LAOYAO_SOURCE_DIR) + "/build/test-vocabs") + "/llama3";
}

// SQuAD rows as Bridge writes them: {"input": "Context: ... Question: ... Answer:", "output": ...}.
std::string squad_rows(int n, int salt) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    const std::string context = "The river " + std::to_string(i * 7 + salt) + " flows north past " +
                                std::string(static_cast<size_t>(i % 5 + 1), 'a') + " hills.";
    out += "{\"input\": \"Context: " + context + " Question: Where does river " + std::to_string(i * 7 + salt) +
           " flow? Answer:\", \"output\": \"north\", \"original_answers\": [\"north\"]}\n";
  }
  return out;
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// A tiny Llama with Llama 3's vocabulary and tokenizer, imported as a pretrained checkpoint at
// DIR/imported (what the fine-tuning recipes' checkpoint.pretrained_checkpoint names).
std::string import_tiny_llama3(const std::string& dir) {
  const std::string hf = dir + "/hf", imported = dir + "/imported";
  fs::create_directories(hf);
  HfFolder model{hf, {}, {}};
  model.add("model.embed_tokens.weight", {128256, 16});
  for (int l = 0; l < 2; ++l) add_llama_layer(model, l, 16, 4, 2, 8, 24, false, false);
  model.add("model.norm.weight", {16});
  model.add("lm_head.weight", {128256, 16});
  std::string config = llama_config("LlamaForCausalLM");
  config.replace(config.find("\"vocab_size\": 64"), 16, "\"vocab_size\": 128256");
  model.write(config, laoyao::Dtype::BF16);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(vocab_dir() + "/" + f, hf + "/" + f);
  const auto r = run_laoyao({"checkpoint", "import-hf", hf, imported}, dir);
  EXPECT_EQ(r.status, 0) << r.output;
  return imported;
}

// The recipe command line over the imported model and a folder of JSONL splits.
std::vector<std::string> sft_command(const std::string& recipe, const std::string& imported, const std::string& data) {
  std::vector<std::string> base = {"run-recipe", "--recipe", recipe};
  for (auto& w : words(laoyao::read_file(imported + "/model_overrides.txt"))) base.push_back(w);
  base.push_back("dataset.dataset_root=" + data);
  for (const char* a : {"dataset.seq_length=64", "model.seq_length=64", "train.train_iters=3",
                        "train.global_batch_size=2", "validation.eval_interval=3", "validation.eval_iters=1",
                        "scheduler.lr_warmup_iters=1", "checkpoint.save=null", "checkpoint.load=null",
                        "logger.tensorboard_dir=null"})
    base.push_back(a);
  return base;
}

}  // namespace

TEST(FinetuneCli, TheSftRecipeTrainsOnLocalSquadRowsPackedAndUnpacked) {
  if (!fs::exists(vocab_dir() + "/tokenizer.json")) {
    ADD_FAILURE() << "test vocabulary " << vocab_dir() << " is missing: run scripts/fetch_test_vocabs.sh";
    return;
  }
  const std::string dir = fresh_dir("finetune"), imported = import_tiny_llama3(dir), data = dir + "/squad";
  fs::create_directories(data);
  laoyao::write_file_atomic(data + "/training.jsonl", squad_rows(24, 1));
  laoyao::write_file_atomic(data + "/validation.jsonl", squad_rows(8, 500));

  std::vector<std::string> base = sft_command("llama32_1b_sft_config", imported, data);
  auto r = run_laoyao(base, dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "loaded pretrained weights from " + fs::absolute(imported).string())) << r.output;
  EXPECT_TRUE(contains(r.output, "iteration        3/       3")) << r.output;
  EXPECT_TRUE(contains(r.output, "validation loss at iteration 3")) << r.output;

  std::vector<std::string> unpacked = base;
  unpacked.push_back("dataset.packed_sequence=false");
  r = run_laoyao(unpacked, dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "iteration        3/       3")) << r.output;

  // Validation and test rows in Bridge's batch-sampler order: shuffled, the last partial global
  // batch padded with -1 rows (the last row, no loss), read on cyclically into the next epoch.
  laoyao::write_file_atomic(data + "/test.jsonl", squad_rows(5, 900));
  std::vector<std::string> order = {"data-samples", "--splits", "valid,test"};
  order.insert(order.end(), unpacked.begin() + 1, unpacked.end());  // the recipe line without "run-recipe"
  for (const char* a : {"train.global_batch_size=3", "validation.eval_iters=2"}) order.push_back(a);
  r = run_laoyao(order, dir);
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<std::vector<int64_t>> valid, test;
  std::vector<bool> pad_has_no_loss;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    const auto j = nlohmann::json::parse(line);
    const auto idx = j["sample_indices"].get<std::vector<int64_t>>();
    (j["split"] == "test" ? test : valid).push_back(idx);
    if (idx[0] == -1) {
      double mask = 0;
      for (double m : j["loss_mask"][0].get<std::vector<double>>()) mask += m;
      pad_has_no_loss.push_back(mask == 0);
    }
  }
  // Iteration 3's evaluation and the final one, 2 iterations of 3 rows each: 12 rows of a stream
  // whose first epoch is 8 rows and one pad.
  ASSERT_EQ(valid.size(), 12u) << r.output;
  std::vector<int64_t> epoch;
  for (size_t k = 0; k < 8; ++k) epoch.push_back(valid[k][0]);
  EXPECT_EQ(valid[8][0], -1);
  std::vector<int64_t> sorted = epoch;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7})) << r.output;
  EXPECT_NE(epoch, sorted) << "the validation rows are shuffled";
  ASSERT_EQ(test.size(), 6u) << r.output;  // the end's test evaluation: rows 5 + a pad, then the next epoch
  EXPECT_EQ(test[5][0], -1);
  EXPECT_NE(test[0][0], -1);
  EXPECT_EQ(pad_has_no_loss, (std::vector<bool>{true, true})) << r.output;

  // The PEFT recipes: LoRA on the same rows from the same import (Llama 3 8B's at dim 8, alpha 16;
  // single-GPU parallel sizes; the second with examples padded to multiples of 4, as Qwen3 8B's PEFT
  // recipe packs them).
  for (const char* recipe : {"llama32_1b_peft_config", "llama3_8b_peft_config"}) {
    std::vector<std::string> peft = base;
    peft[2] = recipe;
    for (const char* a : {"model.tensor_model_parallel_size=1", "model.context_parallel_size=1",
                          "model.sequence_parallel=false"})
      peft.push_back(a);
    if (std::string(recipe) == "llama3_8b_peft_config") peft.push_back("dataset.pad_seq_to_mult=4");
    r = run_laoyao(peft, dir);
    ASSERT_EQ(r.status, 0) << recipe << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "iteration        3/       3")) << r.output;
    EXPECT_TRUE(contains(r.output, "validation loss at iteration 3")) << r.output;
  }

  // Context parallelism over two CPU ranks: each packed sequence (padded to a multiple of 2 x CP,
  // as Bridge asks) split into 4 chunks, each rank two of each (Megatron's THD partition), the
  // attention within each sequence over the gathered keys: SFT and LoRA, with the per-token loss
  // Bridge requires with CP, print one rank's losses and grad norms. Sequences not padded so, and
  // CP fine-tuning without the per-token loss, are refused by name.
  const std::vector<std::string> per_token = {"model.calculate_per_token_loss=true", "ddp.average_in_collective=false"};
  for (const char* recipe : {"llama32_1b_sft_config", "llama32_1b_peft_config"}) {
    SCOPED_TRACE(recipe);
    std::vector<std::string> one = base;
    one[2] = recipe;
    one.push_back("dataset.pad_seq_to_mult=4");
    one.insert(one.end(), per_token.begin(), per_token.end());
    const auto single = run_laoyao(one, dir);
    ASSERT_EQ(single.status, 0) << single.output;
    std::vector<std::string> cp = {"launch", "--nproc-per-node", "2", "--", "laoyao"};
    cp.insert(cp.end(), one.begin(), one.end());
    cp.push_back("model.context_parallel_size=2");
    r = run_laoyao(cp, dir);
    ASSERT_EQ(r.status, 0) << r.output;
    const auto want = losses_in(single.output), got = losses_in(r.output);
    ASSERT_EQ(want.size(), 6u) << single.output;  // 3 iterations, the validation and the test evaluations
    ASSERT_EQ(got.size(), want.size()) << r.output;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << i;
    EXPECT_EQ(grad_norms_in(r.output), grad_norms_in(single.output));
  }
  std::vector<std::string> unpadded = {"launch", "--nproc-per-node", "2", "--", "laoyao"};
  unpadded.insert(unpadded.end(), base.begin(), base.end());
  unpadded.push_back("model.context_parallel_size=2");
  r = run_laoyao(unpadded, dir);  // (the launcher exits 1 when a rank fails: torchrun's way)
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "model.calculate_per_token_loss must be true")) << r.output;
  unpadded.insert(unpadded.end(), per_token.begin(), per_token.end());
  r = run_laoyao(unpadded, dir);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "dataset.pad_seq_to_mult 1; set it to a multiple of 4")) << r.output;

  // The recipe's own dataset (SQuAD from the hub) is not downloaded: refused, naming what to give.
  std::vector<std::string> hub = {"run-recipe", "--recipe", "llama32_1b_sft_config", "model.num_layers=2",
                                  "model.hidden_size=16", "model.num_attention_heads=4", "model.num_query_groups=2",
                                  "model.ffn_hidden_size=24", "tokenizer.tokenizer_model=" + vocab_dir()};
  r = run_laoyao(hub, dir);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "dataset.dataset_root")) << r.output;
  fs::remove_all(dir);
}

// Chat rows (Bridge's ChatSFTPreprocessingConfig): conversations rendered by the chat template, the
// loss on the assistant turns; packed and unpacked, LoRA too. A template whose assistant turns
// cannot be located (the Llama 3 base model's own), a bad preprocessing mapping and prompt-completion
// rows read as chat are refused by name with exit 2.
TEST(FinetuneCli, ChatRowsTrainThroughTheChatTemplate) {
  if (!fs::exists(vocab_dir() + "/tokenizer.json")) {
    ADD_FAILURE() << "test vocabulary " << vocab_dir() << " is missing: run scripts/fetch_test_vocabs.sh";
    return;
  }
  const std::string dir = fresh_dir("finetune_chat"), imported = import_tiny_llama3(dir), data = dir + "/chat";
  fs::create_directories(data);
  auto chat_rows = [](int n, int salt) {
    std::string out;
    for (int i = 0; i < n; ++i) {
      const std::string k = std::to_string(i * 3 + salt);
      out += "{\"messages\": [{\"role\": \"system\", \"content\": \"Answer briefly.\"}, {\"role\": \"user\", \"content\": "
             "\"What is " + k + " plus one?\"}, {\"role\": \"assistant\", \"content\": \"" + std::to_string(i * 3 + salt + 1) +
             ".\"}" + (i % 2 ? ", {\"role\": \"user\", \"content\": \"Sure?\"}, {\"role\": \"assistant\", \"content\": \"Yes.\"}" : "") +
             "]}\n";
    }
    return out;
  };
  laoyao::write_file_atomic(data + "/training.jsonl", chat_rows(16, 1));
  laoyao::write_file_atomic(data + "/validation.jsonl", chat_rows(4, 100));
  // Meta-Llama-3-8B-Instruct's template (the base model's appends the assistant header always).
  laoyao::write_file_atomic(dir + "/instruct.jinja",
                            "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
                            "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
                            "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
                            "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
                            "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}");
  const std::string chat = "dataset.preprocessing={_target_: megatron.bridge.data.sft_processing.ChatSFTPreprocessingConfig, loss_mode: assistant}";
  for (const char* recipe : {"llama32_1b_sft_config", "llama32_1b_peft_config"})
    for (const char* packed : {"true", "false"}) {
      SCOPED_TRACE(std::string(recipe) + " packed " + packed);
      std::vector<std::string> cmd = sft_command(recipe, imported, data);
      cmd.push_back(chat);
      cmd.push_back("tokenizer.chat_template_path=" + dir + "/instruct.jinja");
      cmd.push_back(std::string("dataset.packed_sequence=") + packed);
      const auto r = run_laoyao(cmd, dir);
      ASSERT_EQ(r.status, 0) << r.output;
      EXPECT_TRUE(contains(r.output, "iteration        3/       3")) << r.output;
      EXPECT_TRUE(contains(r.output, "validation loss at iteration 3")) << r.output;
    }
  // The rows' loss masks: on the answers and their <|eot_id|> (128009), never on a header.
  std::vector<std::string> samples = {"data-samples"};
  std::vector<std::string> cmd = sft_command("llama32_1b_sft_config", imported, data);
  samples.insert(samples.end(), cmd.begin() + 1, cmd.end());
  for (const std::string& a : {chat, "tokenizer.chat_template_path=" + dir + "/instruct.jinja", std::string("dataset.packed_sequence=false")})
    samples.push_back(a);
  auto r = run_laoyao(samples, dir);
  ASSERT_EQ(r.status, 0) << r.output;
  int rows = 0, eot_with_loss = 0;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    const auto j = nlohmann::json::parse(line);
    const auto labels = j["labels"][0].get<std::vector<int64_t>>();
    const auto mask = j["loss_mask"][0].get<std::vector<double>>();
    ++rows;
    for (size_t k = 0; k < labels.size(); ++k) {
      if (mask[k] == 0) continue;
      EXPECT_NE(labels[k], 128006) << "a header token has loss";  // <|start_header_id|>
      EXPECT_NE(labels[k], 128000) << "BOS has loss";
      if (labels[k] == 128009) ++eot_with_loss;
    }
  }
  EXPECT_GT(rows, 0) << r.output;
  EXPECT_GE(eot_with_loss, rows) << "each row's answer ends with <|eot_id|> in the loss";

  auto refused = [&](std::vector<std::string> extra, const std::string& want) {
    std::vector<std::string> c = sft_command("llama32_1b_sft_config", imported, data);
    c.insert(c.end(), extra.begin(), extra.end());
    const auto res = run_laoyao(c, dir);
    EXPECT_EQ(res.status, 2) << res.output;
    EXPECT_TRUE(contains(res.output, want)) << want << "\n" << res.output;
  };
  refused({chat}, "training.jsonl:1: the chat template's assistant boundaries match no assistant turn");
  refused({"dataset.preprocessing={_target_: ChatSFTPreprocessingConfig, loss_mode: answers}"},
          "bad chat loss_mode 'answers': choose from assistant, last_turn, full");
  refused({"dataset.preprocessing={loss_mode: assistant}"}, "dataset.preprocessing needs a mapping with _target_");
  refused({"dataset.preprocessing={_target_: ChatSFTPreprocessingConfig, seperator: x}"},
          "dataset.preprocessing.seperator is not a field of ChatSFTPreprocessingConfig");
  refused({"dataset.preprocessing={_target_: PromptCompletionSFTPreprocessingConfig}"},
          "a prompt-completion row needs \"prompt\" and \"completion\"");
  fs::remove_all(dir);
}
