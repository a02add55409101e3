// import-hf: Hugging Face folders written here (Hugging Face names, config.json, random values)
// become Megatron-Core-named checkpoints whose every element is checked against the mapping
// computed element by element, and which the pretrained-checkpoint reader accepts; bad folders are
// refused by name, leaving nothing behind.
#include "train/hf_import.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/rng.hpp"
#include "core/safetensors.hpp"
#include "model/gpt_layout.hpp"
#include "model/gpt_model.hpp"
#include "hf_folder.hpp"
#include "train/checkpoint.hpp"

using namespace laoyao;
using namespace laoyao::train;
using namespace laoyao::test;
namespace fs = std::filesystem;

namespace {

// The imported checkpoint's tensors, as fp32.
std::map<std::string, std::vector<float>> read_out(const std::string& dir,
                                                   std::map<std::string, std::vector<int64_t>>* shapes = nullptr) {
  SafetensorsFile f(dir + "/model.safetensors");
  std::map<std::string, std::vector<float>> out;
  for (const auto& t : f.tensors()) {
    out[t.name] = f.read_f32(t);
    if (shapes) (*shapes)[t.name] = t.shape;
  }
  return out;
}

// Megatron-Core's interleaved QKV row r: query group g's [q heads; k; v].
struct QkvRow {
  const char* which;
  int64_t row;
};
QkvRow qkv_source(int64_t r, int64_t H, int64_t G, int64_t D) {
  const int64_t per = H / G, width = (per + 2) * D, g = r / width, in = r % width;
  if (in < per * D) return {"q", g * per * D + in};
  if (in < (per + 1) * D) return {"k", g * D + in - per * D};
  return {"v", g * D + in - (per + 1) * D};
}

// The import reads as a pretrained checkpoint; and the Hugging Face folder itself, read in place
// (its entries as boxes of the parameters, 16-bit values widened as copied), gives every tensor,
// whole and a window of it, equal to the import's.
void expect_pretrained_reads(const std::string& in, const std::string& out, const HfModel& m) {
  const auto layout = model::build_gpt_parameters(m.gpt);
  const std::vector<ParamShape> shapes = param_shapes(layout.table);
  const PretrainedSource src = open_pretrained(out, shapes);
  EXPECT_EQ(src.files.size(), 1u);
  const PretrainedSource direct = open_hf_pretrained(in, m.gpt, shapes);
  EXPECT_FALSE(direct.files.empty());
  for (const ParamShape& p : shapes) {
    const model::TensorPart whole{p.name, p.shape, {model::whole_box(p.shape)}};
    const int64_t n = whole.numel();
    std::vector<float> want(static_cast<size_t>(n)), got(want.size(), -1.0f);
    src.store.read(whole, want.data());
    direct.store.read(whole, got.data());
    ASSERT_EQ(got, want) << p.name;
    const int64_t lo = n / 3, hi = std::max(lo + 1, 2 * n / 3);  // a window across rows
    std::vector<float> window(static_cast<size_t>(hi - lo), -1.0f);
    direct.store.read(model::sub_part(whole, lo, hi), window.data());
    ASSERT_EQ(window, std::vector<float>(want.begin() + lo, want.begin() + hi)) << p.name << " window";
  }
}

}  // namespace

TEST(HfImport, LlamaGqaBecomesMegatronCoreNamesElementByElement) {
  const std::string root = fresh_hf_dir("llama");
  for (Dtype dtype : {Dtype::F32, Dtype::BF16}) {
    const std::string in = root + "/in" + std::string(dtype_name(dtype)), out = root + "/out" + std::string(dtype_name(dtype));
    fs::create_directories(in);
    HfFolder hf = llama_folder(in, false);
    hf.write(llama_config("LlamaForCausalLM"), dtype, dtype == Dtype::BF16 ? 3 : 1);
    write_file_atomic(in + "/tokenizer.json", "{}");
    const HfImportResult r = import_hf(in, out);
    EXPECT_EQ(r.model.arch, HfArchitecture::Llama);
    std::map<std::string, std::vector<int64_t>> shapes;
    const auto got = read_out(out, &shapes);
    SafetensorsFile f(out + "/model.safetensors");
    for (const auto& t : f.tensors()) EXPECT_EQ(t.dtype, dtype) << t.name;  // the source's dtype, unconverted
    EXPECT_EQ(got.size(), 2u * 6 + 3);  // (ln1, qkv, proj, ln2, fc1, fc2) x 2 + embedding, final norm, output
    EXPECT_EQ(got.at("embedding.word_embeddings.weight"), hf.value.at("model.embed_tokens.weight"));
    EXPECT_EQ(got.at("output_layer.weight"), hf.value.at("lm_head.weight"));
    EXPECT_EQ(got.at("decoder.final_layernorm.weight"), hf.value.at("model.norm.weight"));
    for (int l = 0; l < 2; ++l) {
      const std::string p = "decoder.layers." + std::to_string(l) + ".", s = "model.layers." + std::to_string(l) + ".";
      EXPECT_EQ(got.at(p + "input_layernorm.weight"), hf.value.at(s + "input_layernorm.weight"));
      EXPECT_EQ(got.at(p + "pre_mlp_layernorm.weight"), hf.value.at(s + "post_attention_layernorm.weight"));
      EXPECT_EQ(got.at(p + "self_attention.linear_proj.weight"), hf.value.at(s + "self_attn.o_proj.weight"));
      EXPECT_EQ(got.at(p + "mlp.linear_fc2.weight"), hf.value.at(s + "mlp.down_proj.weight"));
      ASSERT_EQ(shapes.at(p + "self_attention.linear_qkv.weight"), (std::vector<int64_t>{64, 16}));
      const auto& qkv = got.at(p + "self_attention.linear_qkv.weight");
      for (int64_t row = 0; row < 64; ++row) {
        const QkvRow src = qkv_source(row, 4, 2, 8);
        for (int64_t c = 0; c < 16; ++c)
          ASSERT_EQ(qkv[static_cast<size_t>(row * 16 + c)],
                    hf.at(s + "self_attn." + src.which + "_proj.weight", src.row, c))
              << p << " row " << row;
      }
      const auto& fc1 = got.at(p + "mlp.linear_fc1.weight");
      for (int64_t row = 0; row < 48; ++row)
        for (int64_t c = 0; c < 16; ++c)
          ASSERT_EQ(fc1[static_cast<size_t>(row * 16 + c)],
                    row < 24 ? hf.at(s + "mlp.gate_proj.weight", row, c) : hf.at(s + "mlp.up_proj.weight", row - 24, c));
    }
    expect_pretrained_reads(in, out, r.model);
    // The flags describe the shape, name the folder and its tokenizer.
    const std::string flags = read_file(out + "/model_flags.txt");
    for (const char* want : {"--num-layers 2 ", "--hidden-size 16 ", "--ffn-hidden-size 24 ", "--num-attention-heads 4 ",
                             "--group-query-attention --num-query-groups 2 ", "--kv-channels 8 ", "--swiglu ",
                             "--normalization RMSNorm ", "--position-embedding-type rope --rotary-base 500000 ",
                             "--disable-bias-linear ", "--untie-embeddings-and-output-weights ",
                             "--make-vocab-size-divisible-by 64 ", "--tokenizer-type HuggingFaceTokenizer"})
      EXPECT_NE(flags.find(want), std::string::npos) << want << " in " << flags;
    EXPECT_NE(flags.find("--pretrained-checkpoint " + fs::absolute(out).string()), std::string::npos);
    const std::string overrides = read_file(out + "/model_overrides.txt");
    for (const char* want : {"model.num_query_groups=2", "model.gated_linear_unit=true",
                             "model.share_embeddings_and_output_weights=false", "model.vocab_size=64",
                             "checkpoint.pretrained_checkpoint="})
      EXPECT_NE(overrides.find(want), std::string::npos) << want;
    EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));
  }
  fs::remove_all(root);
}

TEST(HfImport, Gpt2ConvWeightsAreTransposedAndItsFusedQkvInterleavedPerHead) {
  const std::string root = fresh_hf_dir("gpt2"), in = root + "/in", out = root + "/out";
  fs::create_directories(in);
  HfFolder hf{in, {}, {}};
  const int64_t h = 12, H = 3, D = h / H, P = 32, V = 50;
  hf.add("transformer.wte.weight", {V, h});
  hf.add("transformer.wpe.weight", {P, h});
  const std::string p = "transformer.h.0.";
  for (const char* ln : {"ln_1", "ln_2"}) hf.add(p + ln + ".weight", {h}), hf.add(p + ln + ".bias", {h});
  hf.add(p + "attn.c_attn.weight", {h, 3 * h});
  hf.add(p + "attn.c_attn.bias", {3 * h});
  hf.add(p + "attn.c_proj.weight", {h, h});
  hf.add(p + "attn.c_proj.bias", {h});
  hf.add(p + "attn.bias", {1, 1, P, P});  // the causal mask buffer old checkpoints keep: skipped
  hf.add(p + "mlp.c_fc.weight", {h, 4 * h});
  hf.add(p + "mlp.c_fc.bias", {4 * h});
  hf.add(p + "mlp.c_proj.weight", {4 * h, h});
  hf.add(p + "mlp.c_proj.bias", {h});
  hf.add("transformer.ln_f.weight", {h}), hf.add("transformer.ln_f.bias", {h});
  hf.write("{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 12, \"n_layer\": 1, \"n_head\": 3, "
           "\"n_positions\": 32, \"vocab_size\": 50, \"activation_function\": \"gelu_new\"}");
  const HfImportResult r = import_hf(in, out);
  const auto got = read_out(out);
  EXPECT_EQ(got.at("embedding.position_embeddings.weight"), hf.value.at("transformer.wpe.weight"));
  EXPECT_EQ(got.count("output_layer.weight"), 0u);  // tied
  const auto& qkv = got.at("decoder.layers.0.self_attention.linear_qkv.weight");
  const auto& qkv_b = got.at("decoder.layers.0.self_attention.linear_qkv.bias");
  for (int64_t row = 0; row < 3 * h; ++row) {
    const int64_t head = row / (3 * D), part = row % (3 * D) / D, d = row % D, col = part * h + head * D + d;
    ASSERT_EQ(qkv_b[static_cast<size_t>(row)], hf.at(p + "attn.c_attn.bias", col, 0));
    for (int64_t c = 0; c < h; ++c)
      ASSERT_EQ(qkv[static_cast<size_t>(row * h + c)], hf.at(p + "attn.c_attn.weight", c, col)) << row << "," << c;
  }
  const auto& fc1 = got.at("decoder.layers.0.mlp.linear_fc1.weight");
  for (int64_t row = 0; row < 4 * h; ++row)
    for (int64_t c = 0; c < h; ++c)
      ASSERT_EQ(fc1[static_cast<size_t>(row * h + c)], hf.at(p + "mlp.c_fc.weight", c, row));
  EXPECT_EQ(got.at("decoder.layers.0.input_layernorm.bias"), hf.value.at(p + "ln_1.bias"));
  expect_pretrained_reads(in, out, r.model);
  const std::string flags = read_file(out + "/model_flags.txt");
  EXPECT_NE(flags.find("--position-embedding-type learned_absolute"), std::string::npos) << flags;
  EXPECT_NE(flags.find("--normalization LayerNorm"), std::string::npos) << flags;
  EXPECT_NE(flags.find("--make-vocab-size-divisible-by 2 "), std::string::npos) << flags;
  EXPECT_EQ(flags.find("--disable-bias-linear"), std::string::npos) << flags;
  fs::remove_all(root);
}

TEST(HfImport, Qwen2BiasesQwen3NormsAndQwen3MoeExpertsMap) {
  const std::string root = fresh_hf_dir("qwen");
  {  // Qwen2: q/k/v biases interleaved like the weights; tied
    const std::string in = root + "/q2", out = root + "/q2out";
    fs::create_directories(in);
    HfFolder hf{in, {}, {}};
    hf.add("model.embed_tokens.weight", {64, 16});
    for (int l = 0; l < 2; ++l) add_llama_layer(hf, l, 16, 4, 2, 8, 24, true, false);
    hf.add("model.norm.weight", {16});
    hf.write(llama_config("Qwen2ForCausalLM", ", \"tie_word_embeddings\": true"));
    const HfImportResult r = import_hf(in, out);
    const auto got = read_out(out);
    const auto& b = got.at("decoder.layers.1.self_attention.linear_qkv.bias");
    for (int64_t row = 0; row < 64; ++row) {
      const QkvRow src = qkv_source(row, 4, 2, 8);
      ASSERT_EQ(b[static_cast<size_t>(row)], hf.at("model.layers.1.self_attn." + std::string(src.which) + "_proj.bias", src.row, 0));
    }
    EXPECT_EQ(got.count("output_layer.weight"), 0u);
    expect_pretrained_reads(in, out, r.model);
    EXPECT_NE(r.flags.find("--disable-bias-linear --add-qkv-bias"), std::string::npos) << r.flags;
  }
  {  // Qwen3: q/k norms
    const std::string in = root + "/q3", out = root + "/q3out";
    fs::create_directories(in);
    HfFolder hf{in, {}, {}};
    hf.add("model.embed_tokens.weight", {64, 16});
    for (int l = 0; l < 2; ++l) add_llama_layer(hf, l, 16, 4, 2, 8, 24, false, true);
    hf.add("model.norm.weight", {16});
    hf.write(llama_config("Qwen3ForCausalLM", ", \"tie_word_embeddings\": true"));
    const HfImportResult r = import_hf(in, out);
    const auto got = read_out(out);
    EXPECT_EQ(got.at("decoder.layers.0.self_attention.q_layernorm.weight"),
              hf.value.at("model.layers.0.self_attn.q_norm.weight"));
    EXPECT_EQ(got.at("decoder.layers.1.self_attention.k_layernorm.weight"),
              hf.value.at("model.layers.1.self_attn.k_norm.weight"));
    expect_pretrained_reads(in, out, r.model);
    EXPECT_NE(r.flags.find("--qk-layernorm"), std::string::npos);
  }
  // Qwen3-MoE: router and experts one by one; the expert count as the hub's configs name it and as
  // transformers 5 saves it (its attribute_map's num_local_experts), the latter with no
  // load-balancing loss (router_aux_loss_coef 0.0, as a small random config saves it).
  for (const std::string experts : {"num_experts", "num_local_experts"}) {
    SCOPED_TRACE(experts);
    const bool aux = experts == "num_experts";
    const std::string in = root + "/moe_" + experts, out = root + "/moeout_" + experts;
    fs::create_directories(in);
    HfFolder hf = qwen3_moe_folder(in);
    hf.write(llama_config("Qwen3MoeForCausalLM", ", \"" + experts + "\": 4, \"num_experts_per_tok\": 2, "
                                                 "\"moe_intermediate_size\": 8, \"norm_topk_prob\": true, "
                                                 "\"router_aux_loss_coef\": " + (aux ? "0.001" : "0.0")));
    const HfImportResult r = import_hf(in, out);
    const auto got = read_out(out);
    EXPECT_EQ(got.at("decoder.layers.1.mlp.router.weight"), hf.value.at("model.layers.1.mlp.gate.weight"));
    const auto& fc1 = got.at("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight");
    for (int64_t row = 0; row < 16; ++row)
      for (int64_t c = 0; c < 16; ++c)
        ASSERT_EQ(fc1[static_cast<size_t>(row * 16 + c)],
                  row < 8 ? hf.at("model.layers.1.mlp.experts.3.gate_proj.weight", row, c)
                          : hf.at("model.layers.1.mlp.experts.3.up_proj.weight", row - 8, c));
    EXPECT_EQ(got.at("decoder.layers.0.mlp.experts.local_experts.2.linear_fc2.weight"),
              hf.value.at("model.layers.0.mlp.experts.2.down_proj.weight"));
    expect_pretrained_reads(in, out, r.model);
    for (const char* want : {"--num-experts 4", "--moe-router-topk 2", "--moe-ffn-hidden-size 8"})
      EXPECT_NE(r.flags.find(want), std::string::npos) << want;
    EXPECT_EQ(r.flags.find("--moe-aux-loss-coeff 0.001") != std::string::npos, aux);
    EXPECT_EQ(r.model.gpt.moe.aux_loss_coeff, aux ? 0.001 : 0.0);
    EXPECT_EQ(r.flags.find("--moe-router-pre-softmax"), std::string::npos);  // renormalised top k
  }
  fs::remove_all(root);
}

TEST(HfImport, BadFoldersAreRefusedByNameAndLeaveNothing) {
  const std::string root = fresh_hf_dir("bad");
  auto refused = [&](const std::string& in, const std::string& needle) {
    const std::string out = root + "/out";
    try {
      import_hf(in, out);
      ADD_FAILURE() << "accepted " << in << " (wanted an error with " << needle << ")";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(out));
    for (const auto& e : fs::directory_iterator(root))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  };
  auto folder = [&](const std::string& name, const std::string& config, auto&& edit) {
    const std::string in = root + "/" + name;
    fs::create_directories(in);
    HfFolder hf = llama_folder(in, false);
    edit(hf);
    hf.write(config);
    return in;
  };
  auto none = [](HfFolder&) {};
  refused(root + "/absent", "is not a directory");
  refused(folder("arch", llama_config("MambaForCausalLM"), none), "Qwen3MoeForCausalLM");  // lists the supported
  refused(folder("missing", llama_config("LlamaForCausalLM"),
                 [](HfFolder& hf) { hf.value.erase("model.layers.1.mlp.up_proj.weight"); }),
          "model.layers.1.mlp.up_proj.weight");
  refused(folder("extra", llama_config("LlamaForCausalLM"), [](HfFolder& hf) { hf.add("model.layers.0.extra.weight", {2}); }),
          "model.layers.0.extra.weight");
  refused(folder("shape", llama_config("LlamaForCausalLM"),
                 [](HfFolder& hf) { hf.add("model.layers.0.self_attn.k_proj.weight", {24, 16}); }),
          "model.layers.0.self_attn.k_proj.weight");
  refused(folder("heads", llama_config("LlamaForCausalLM", ", \"num_key_value_heads\": 3"), none), "num_key_value_heads");
  refused(folder("scaling", llama_config("LlamaForCausalLM", ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}"), none),
          "rope_scaling");
  {  // an index naming a shard that is not there
    const std::string in = root + "/index";
    fs::create_directories(in);
    llama_folder(in, false).write(llama_config("LlamaForCausalLM"), Dtype::F32, 2);
    fs::remove(in + "/model-1.safetensors");
    refused(in, "model-1.safetensors");
  }
  {  // a truncated file
    const std::string in = root + "/truncated";
    fs::create_directories(in);
    llama_folder(in, false).write(llama_config("LlamaForCausalLM"));
    fs::resize_file(in + "/model.safetensors", fs::file_size(in + "/model.safetensors") - 10);
    refused(in, "model.safetensors");
  }
  {  // an output folder that is not empty is not touched
    const std::string in = folder("good", llama_config("LlamaForCausalLM"), none), out = root + "/full";
    fs::create_directories(out);
    write_file_atomic(out + "/keep.txt", "mine");
    EXPECT_THROW(import_hf(in, out), UsageError);
    EXPECT_EQ(read_file(out + "/keep.txt"), "mine");
  }
  fs::remove_all(root);
}

namespace {

// Hugging Face's LlamaForCausalLM forward (modeling_llama: RMSNorm, q/k/v projections, rotate-half
// RoPE, GQA causal attention, SwiGLU as down(silu(gate) * up), lm_head), naive in fp64 on the
// Hugging Face tensors: per-token cross entropy of each position's next token.
std::vector<double> hf_llama_losses(const HfFolder& hf, const model::GptConfig& g, const std::vector<int64_t>& tok,
                                    const std::vector<int64_t>& labels) {
  const int64_t s = static_cast<int64_t>(tok.size()), h = g.hidden, H = g.heads, G = g.query_groups,
                D = g.kv_channels, F = g.ffn, V = g.vocab;
  using Mat = std::vector<std::vector<double>>;
  auto W = [&](const std::string& n) { return hf.value.at(n); };
  auto linear = [&](const Mat& x, const std::string& n, int64_t out, int64_t in) {
    const auto w = W(n);
    Mat y(x.size(), std::vector<double>(static_cast<size_t>(out), 0.0));
    for (size_t t = 0; t < x.size(); ++t)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) y[t][o] += x[t][i] * w[static_cast<size_t>(o * in + i)];
    return y;
  };
  auto rmsnorm = [&](const Mat& x, const std::string& n) {
    const auto w = W(n);
    Mat y = x;
    for (auto& row : y) {
      double ss = 0;
      for (double v : row) ss += v * v;
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(row.size()) + g.norm_eps);
      for (size_t i = 0; i < row.size(); ++i) row[i] *= r * w[i];
    }
    return y;
  };
  auto rope = [&](Mat& x, int64_t heads) {  // x [s, heads * D]
    for (int64_t t = 0; t < s; ++t)
      for (int64_t hd = 0; hd < heads; ++hd) {
        std::vector<double> v(x[t].begin() + hd * D, x[t].begin() + (hd + 1) * D);
        for (int64_t i = 0; i < D / 2; ++i) {
          const double f = 1.0 / std::pow(g.rotary_base, 2.0 * static_cast<double>(i) / static_cast<double>(D));
          const double c = std::cos(static_cast<double>(t) * f), sn = std::sin(static_cast<double>(t) * f);
          x[t][hd * D + i] = v[i] * c - v[i + D / 2] * sn;
          x[t][hd * D + i + D / 2] = v[i + D / 2] * c + v[i] * sn;
        }
      }
  };
  Mat x(static_cast<size_t>(s));
  const auto emb = W("model.embed_tokens.weight");
  for (int64_t t = 0; t < s; ++t) x[t].assign(emb.begin() + tok[t] * h, emb.begin() + (tok[t] + 1) * h);
  for (int64_t l = 0; l < g.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const Mat n1 = rmsnorm(x, p + "input_layernorm.weight");
    Mat q = linear(n1, p + "self_attn.q_proj.weight", H * D, h), k = linear(n1, p + "self_attn.k_proj.weight", G * D, h),
        v = linear(n1, p + "self_attn.v_proj.weight", G * D, h);
    rope(q, H), rope(k, G);
    Mat ctx(static_cast<size_t>(s), std::vector<double>(static_cast<size_t>(H * D), 0.0));
    for (int64_t hd = 0; hd < H; ++hd) {
      const int64_t kv = hd / (H / G);
      for (int64_t i = 0; i < s; ++i) {
        std::vector<double> sc(static_cast<size_t>(i + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < D; ++e) d += q[i][hd * D + e] * k[j][kv * D + e];
          sc[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, sc[j]);
        }
        for (auto& z : sc) sum += (z = std::exp(z - mx));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < D; ++e) ctx[i][hd * D + e] += sc[j] / sum * v[j][kv * D + e];
      }
    }
    const Mat o = linear(ctx, p + "self_attn.o_proj.weight", h, H * D);
    for (int64_t t = 0; t < s; ++t)
      for (int64_t i = 0; i < h; ++i) x[t][i] += o[t][i];
    const Mat n2 = rmsnorm(x, p + "post_attention_layernorm.weight");
    Mat gate = linear(n2, p + "mlp.gate_proj.weight", F, h);
    const Mat up = linear(n2, p + "mlp.up_proj.weight", F, h);
    for (int64_t t = 0; t < s; ++t)
      for (int64_t i = 0; i < F; ++i) gate[t][i] = gate[t][i] / (1.0 + std::exp(-gate[t][i])) * up[t][i];
    const Mat down = linear(gate, p + "mlp.down_proj.weight", h, F);
    for (int64_t t = 0; t < s; ++t)
      for (int64_t i = 0; i < h; ++i) x[t][i] += down[t][i];
  }
  const Mat logits = linear(rmsnorm(x, "model.norm.weight"), "lm_head.weight", V, h);
  std::vector<double> loss;
  for (int64_t t = 0; t < s; ++t) {
    double mx = -1e300, sum = 0;
    for (double z : logits[t]) mx = std::max(mx, z);
    for (double z : logits[t]) sum += std::exp(z - mx);
    loss.push_back(std::log(sum) + mx - logits[t][labels[t]]);
  }
  return loss;
}

}  // namespace

// The imported Llama, run by laoyao's GPT (the CPU backend, fp32), gives Hugging Face's Llama's
// losses computed here in fp64 from the Hugging Face tensors: the mapping keeps the model's meaning
// (query groups, rotate-half RoPE, gate before up), not only its numbers.
TEST(HfImport, AnImportedLlamaComputesHuggingFacesLosses) {
  const std::string root = fresh_hf_dir("llama_loss"), in = root + "/in", out = root + "/out";
  fs::create_directories(in);
  HfFolder hf = llama_folder(in, false);
  for (auto& [name, v] : hf.value)  // weights of a trained model's size, so that the losses differ by token
    for (auto& x : v) x *= name.find("norm") != std::string::npos ? 0.1f : 0.2f;
  for (auto& [name, v] : hf.value)
    if (name.find("norm") != std::string::npos)
      for (auto& x : v) x += 1.0f;
  hf.write(llama_config("LlamaForCausalLM"));
  const HfImportResult r = import_hf(in, out);
  model::GptModel gpt(r.model.gpt);
  const PretrainedWeights w = load_pretrained_weights(out, param_shapes(gpt.table()));
  for (const auto& p : gpt.table().specs) {
    const auto& v = w.tensors.at(p.name);
    std::copy(v.begin(), v.end(), gpt.weights() + p.offset);
  }
  const std::vector<int64_t> tok = {3, 17, 42, 5, 63, 0, 9, 28}, labels = {17, 42, 5, 63, 0, 9, 28, 11};
  const int64_t s = static_cast<int64_t>(tok.size());
  std::vector<int64_t> pos(static_cast<size_t>(s));
  for (int64_t t = 0; t < s; ++t) pos[t] = t;
  std::vector<float> loss(static_cast<size_t>(s));
  gpt.forward({1, s, tok.data(), labels.data(), pos.data(), nullptr}, {}, loss.data());
  const std::vector<double> want = hf_llama_losses(hf, r.model.gpt, tok, labels);
  for (int64_t t = 0; t < s; ++t) EXPECT_NEAR(loss[t], want[t], 1e-4 * std::abs(want[t])) << "token " << t;
  fs::remove_all(root);
}

// DeepSeek's config.json: what Megatron-Core's MLA and router cannot compute as transformers does
// is refused naming the field.
TEST(HfImport, DeepseekConfigsMegatronCannotMatchAreRefusedByField) {
  auto with = [](bool v3, const std::string& field, const std::string& value) {
    std::string c = deepseek_config(v3);
    const std::string key = "\"" + field + "\": ";
    const size_t at = c.find(key);
    if (at == std::string::npos) return c.substr(0, c.size() - 1) + ", " + key + value + "}";
    const size_t end = c.find_first_of(",}", at + key.size());
    return c.substr(0, at + key.size()) + value + c.substr(end);
  };
  EXPECT_EQ(parse_hf_config(deepseek_config(false), "c").gpt.mla->softmax_scale,
            std::pow(0.1 * 0.707 * std::log(40.0) + 1.0, 2) / std::sqrt(8.0));
  const HfModel v3 = parse_hf_config(deepseek_config(true), "c");
  EXPECT_TRUE(v3.gpt.moe.sigmoid && v3.gpt.moe.expert_bias);
  EXPECT_EQ(v3.gpt.moe.num_groups, 2);
  const std::vector<std::tuple<bool, std::string, std::string, std::string>> bad = {
      {true, "num_nextn_predict_layers", "1", "multi-token prediction"},
      {false, "qk_rope_head_dim", "3", "is odd"},
      {false, "topk_method", "\"group_limited_greedy\", \"n_group\": 2, \"topk_group\": 1", "ranks groups by their best"},
      {true, "norm_topk_prob", "false", "renormalises the top k"},
      {true, "rope_scaling", "{\"type\": \"linear\", \"factor\": 2}", "not supported for multi-latent attention"},
      {false, "num_key_value_heads", "1", "a key per head"}};
  for (const auto& [v3_case, field, value, message] : bad) {
    try {
      parse_hf_config(with(v3_case, field, value), "config.json");
      ADD_FAILURE() << field << " accepted";
    } catch (const laoyao::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

// transformers 5 writes RoPE's base and scaling as one rope_parameters object: read as the older
// rope_theta and rope_scaling are, its "default" type unscaled, another type refused by name.
TEST(HfImport, TransformersFiveRopeParametersAreReadAsRopeThetaAndScaling) {
  auto config = [](const std::string& params) {
    std::string c = llama_config("LlamaForCausalLM", ", \"rope_parameters\": " + params);
    const std::string theta = "\"rope_theta\": 500000.0, ";
    return c.replace(c.find(theta), theta.size(), "");
  };
  const HfModel plain = parse_hf_config(config("{\"rope_type\": \"default\", \"rope_theta\": 20000.0}"), "c");
  EXPECT_EQ(plain.gpt.rotary_base, 20000.0);
  EXPECT_FALSE(plain.gpt.rope_scaling);
  const HfModel llama3 = parse_hf_config(
      config("{\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 32.0, \"low_freq_factor\": 1.0, "
             "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}"),
      "c");
  EXPECT_EQ(llama3.gpt.rotary_base, 500000.0);
  EXPECT_TRUE(llama3.gpt.rope_scaling);
  EXPECT_EQ(llama3.gpt.rope_scaling_factor, 32.0);
  try {
    parse_hf_config(config("{\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0}"), "config.json");
    ADD_FAILURE() << "yarn accepted";
  } catch (const laoyao::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("\"rope_parameters\" of type \"yarn\""), std::string::npos) << e.what();
  }
}
