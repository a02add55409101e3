// export-hf: Hugging Face folders of every architecture (DeepSeek-V2/V3's too), imported and exported again, give back
// their tensors bit for bit (BF16 and F32), in shards with an index when asked, with their own
// config.json; the architecture of a Megatron config is found or refused by name.
#include "train/hf_export.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/safetensors.hpp"
#include "hf_folder.hpp"

using namespace laoyao;
using namespace laoyao::train;
using namespace laoyao::test;
namespace fs = std::filesystem;

namespace {

// Every tensor of a Hugging Face folder (through its index or all its files): name -> (dtype,
// shape, bytes).
struct Stored {
  Dtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  bool operator==(const Stored&) const = default;
};
std::map<std::string, Stored> read_folder(const std::string& dir) {
  std::map<std::string, Stored> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    SafetensorsFile f(e.path().string());
    for (const auto& t : f.tensors()) out[t.name] = {t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)};
  }
  return out;
}

// The four architectures' folders (GPT-2's mask buffers left out: export writes parameters only).
HfFolder gpt2_folder(const std::string& dir) {
  HfFolder hf{dir, {}, {}};
  hf.add("transformer.wte.weight", {50, 12});
  hf.add("transformer.wpe.weight", {32, 12});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    for (const char* ln : {"ln_1", "ln_2"}) hf.add(p + ln + ".weight", {12}), hf.add(p + ln + ".bias", {12});
    hf.add(p + "attn.c_attn.weight", {12, 36}), hf.add(p + "attn.c_attn.bias", {36});
    hf.add(p + "attn.c_proj.weight", {12, 12}), hf.add(p + "attn.c_proj.bias", {12});
    hf.add(p + "mlp.c_fc.weight", {12, 48}), hf.add(p + "mlp.c_fc.bias", {48});
    hf.add(p + "mlp.c_proj.weight", {48, 12}), hf.add(p + "mlp.c_proj.bias", {12});
  }
  hf.add("transformer.ln_f.weight", {12}), hf.add("transformer.ln_f.bias", {12});
  return hf;
}
const char* kGpt2Config =
    "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", \"n_embd\": 12, \"n_layer\": 2, "
    "\"n_head\": 3, \"n_positions\": 32, \"vocab_size\": 50, \"bos_token_id\": 49, \"torch_dtype\": \"float32\"}";


}  // namespace

TEST(HfExport, EveryArchitectureRoundTripsBitForBit) {
  const std::string root = fresh_hf_dir("roundtrip");
  struct Case {
    std::string name, config;
    std::function<HfFolder(const std::string&)> folder;
  };
  const std::vector<Case> cases = {
      {"gpt2", kGpt2Config, gpt2_folder},
      {"llama", llama_config("LlamaForCausalLM"), [](const std::string& d) { return llama_folder(d, false); }},
      {"qwen3", llama_config("Qwen3ForCausalLM", ", \"tie_word_embeddings\": true"),
       [](const std::string& d) {
         HfFolder hf{d, {}, {}};
         hf.add("model.embed_tokens.weight", {64, 16});
         for (int l = 0; l < 2; ++l) add_llama_layer(hf, l, 16, 4, 2, 8, 24, false, true);
         hf.add("model.norm.weight", {16});
         return hf;
       }},
      {"qwen2", llama_config("Qwen2ForCausalLM"),
       [](const std::string& d) {
         HfFolder hf = llama_folder(d, false);
         for (int l = 0; l < 2; ++l)
           for (const char* x : {"q", "k", "v"})
             hf.add("model.layers." + std::to_string(l) + ".self_attn." + x + "_proj.bias",
                    {std::string(x) == "q" ? 32 : 16});
         return hf;
       }},
      {"qwen3moe", llama_config("Qwen3MoeForCausalLM", ", \"num_experts\": 4, \"num_experts_per_tok\": 2, "
                                                        "\"moe_intermediate_size\": 8"),
       qwen3_moe_folder},
      {"deepseek_v2", deepseek_config(false), [](const std::string& d) { return deepseek_folder(d, false); }},
      {"deepseek_v3", deepseek_config(true), [](const std::string& d) { return deepseek_folder(d, true); }},
  };
  for (const auto& c : cases)
    for (Dtype dtype : {Dtype::BF16, Dtype::F32}) {
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(dtype)));
      const std::string base = root + "/" + c.name + std::string(dtype_name(dtype));
      fs::create_directories(base + "/hf");
      c.folder(base + "/hf").write(c.config, dtype);
      write_file_atomic(base + "/hf/tokenizer.json", "{\"model\": {}}");
      import_hf(base + "/hf", base + "/imported");
      HfExportOptions small;
      small.max_shard_bytes = 6000;  // several files, with an index
      const HfExportResult r = export_hf(base + "/imported", base + "/exported", small);
      EXPECT_EQ(r.dtype, dtype == Dtype::BF16 ? "bf16" : "fp32");  // the imported weights' own
      EXPECT_GE(r.files.size(), 2u);
      EXPECT_TRUE(fs::exists(base + "/exported/model.safetensors.index.json"));
      const auto original = read_folder(base + "/hf"), exported = read_folder(base + "/exported");
      EXPECT_EQ(exported.size(), original.size());
      for (const auto& [name, t] : original) {
        auto it = exported.find(name);
        ASSERT_NE(it, exported.end()) << name;
        EXPECT_TRUE(it->second == t) << name;
      }
      // config.json as it was (its other fields kept), the tokenizer copied.
      const auto before = nlohmann::json::parse(c.config), after = nlohmann::json::parse(read_file(base + "/exported/config.json"));
      EXPECT_EQ(after["architectures"], before["architectures"]);
      if (before.contains("bos_token_id")) {
        EXPECT_EQ(after["bos_token_id"], before["bos_token_id"]);
      }
      EXPECT_EQ(after["torch_dtype"], dtype == Dtype::BF16 ? "bfloat16" : "float32");
      EXPECT_EQ(read_file(base + "/exported/tokenizer.json"), "{\"model\": {}}");
      // ... and what was exported imports again, through its index, to the same checkpoint.
      import_hf(base + "/exported", base + "/again");
      SafetensorsFile a(base + "/imported/model.safetensors"), b(base + "/again/model.safetensors");
      ASSERT_EQ(a.tensors().size(), b.tensors().size());
      for (const auto& t : a.tensors()) {
        const SafetensorsTensor* u = b.find(t.name);
        ASSERT_NE(u, nullptr) << t.name;
        EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.nbytes), std::vector<uint8_t>(u->data, u->data + u->nbytes))
            << t.name;
      }
      // An F32 folder exported as BF16: every value rounded to nearest even.
      if (dtype == Dtype::F32) {
        HfExportOptions bf16;
        bf16.dtype = "bf16";
        export_hf(base + "/imported", base + "/as_bf16", bf16);
        SafetensorsFile f(base + "/as_bf16/model.safetensors");
        for (const auto& t : f.tensors()) {
          EXPECT_EQ(t.dtype, Dtype::BF16);
          const auto& o = original.at(t.name);
          const auto* want = reinterpret_cast<const float*>(o.bytes.data());
          const auto* got = reinterpret_cast<const uint16_t*>(t.data);
          for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(got[i], f32_to_bf16(want[i])) << t.name;
        }
      }
    }
  fs::remove_all(root);
}

TEST(HfExport, AMegatronConfigFindsItsArchitectureOrIsRefusedByName) {
  model::GptConfig g;
  g.num_layers = 2, g.hidden = 16, g.heads = 4, g.query_groups = 2, g.kv_channels = 8, g.ffn = 24, g.vocab = 64;
  g.max_positions = 128, g.norm = model::Norm::RMSNorm, g.activation = model::Activation::SwiGLU;
  g.positions = model::Positions::Rope, g.add_bias_linear = false, g.add_qkv_bias = false, g.tied_embeddings = false;
  EXPECT_EQ(hf_model_of(g, 1e-5, 0.02).arch, HfArchitecture::Llama);
  g.add_qkv_bias = true;
  EXPECT_EQ(hf_model_of(g, 1e-5, 0.02).arch, HfArchitecture::Qwen2);
  g.add_qkv_bias = false, g.qk_layernorm = true;
  EXPECT_EQ(hf_model_of(g, 1e-5, 0.02).arch, HfArchitecture::Qwen3);
  // config.json reads back as the same model.
  const HfModel q3 = hf_model_of(g, 1e-6, 0.02);
  const HfModel back = parse_hf_config(hf_config_json(q3, "bfloat16"), "config.json");
  EXPECT_EQ(back.arch, HfArchitecture::Qwen3);
  EXPECT_EQ(back.gpt.query_groups, 2);
  EXPECT_EQ(back.gpt.kv_channels, 8);
  EXPECT_EQ(back.norm_eps, 1e-6);
  EXPECT_FALSE(back.gpt.tied_embeddings);
  auto refused = [&](model::GptConfig c, const std::string& needle) {
    try {
      hf_model_of(c, 1e-5, 0.02);
      ADD_FAILURE() << "accepted (wanted " << needle << ")";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("GPT2LMHeadModel"), std::string::npos) << e.what();
    }
  };
  model::GptConfig moe = g;
  moe.moe.num_experts = 4, moe.moe.ffn = 8, moe.moe.layers = {true, true}, moe.moe.shared_ffn = 8;
  refused(moe, "shared expert");
  model::GptConfig gelu = g;
  gelu.activation = model::Activation::GeluTanh;
  refused(gelu, "GeLU");
}
