#include "train/hf_import.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/hf_hub.hpp"
#include "core/safetensors.hpp"

namespace laoyao::train {

namespace {

namespace fs = std::filesystem;
using Kind = HfTensorMap::Kind;


// Every safetensors file of the folder (through the index when there is one), opened once, and
// which of them holds each tensor.
struct HfTensors {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsTensor*> by_name;
  std::map<std::string, size_t> file_of;
};

HfTensors open_tensors(const std::string& dir) {
  HfTensors out;
  std::vector<std::string> names;
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index_path)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(index_path));
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(index_path + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw UsageError(index_path + ": no \"weight_map\" object");
    std::set<std::string> shards;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw UsageError(index_path + ": tensor '" + tensor + "' maps to " + file.dump());
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == ".." || f.empty())
        throw UsageError(index_path + ": tensor '" + tensor + "' maps to '" + f + "', not a file in the folder");
      weight_map[tensor] = f;
      shards.insert(f);
    }
    for (const auto& f : shards) {
      const std::string path = (fs::path(dir) / f).string();
      if (!fs::is_regular_file(path))
        throw UsageError(index_path + " names the shard '" + f + "', which is not in " + dir);
      names.push_back(path);
    }
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
  }
  if (names.empty()) throw UsageError(dir + " holds no *.safetensors files");
  for (const auto& n : names) {
    out.files.push_back(std::make_unique<SafetensorsFile>(n));
    const size_t i = out.files.size() - 1;
    for (const auto& t : out.files[i]->tensors()) {
      auto [it, fresh] = out.by_name.emplace(t.name, &t);
      if (!fresh)
        throw UsageError("tensor '" + t.name + "' is in both " + out.files[out.file_of[t.name]]->path() + " and " + n);
      out.file_of[t.name] = i;
    }
  }
  for (const auto& [tensor, file] : weight_map) {
    auto it = out.file_of.find(tensor);
    if (it == out.file_of.end() || fs::path(out.files[it->second]->path()).filename() != file)
      throw UsageError(index_path + " puts '" + tensor + "' in " + file + ", which does not hold it");
  }
  return out;
}

// A mapping's sources, found and checked against the parameter's shape.
struct Sources {
  std::vector<const SafetensorsTensor*> t;
  Dtype dtype = Dtype::F32;
};

[[noreturn]] void bad_shape(const HfTensorMap& m, const SafetensorsTensor& t, const std::string& want) {
  throw UsageError("tensor '" + t.name + "' has shape " + shape_string(t.shape) + "; config.json's model needs " +
                   want + " (for " + m.mcore + " " + shape_string(m.shape) + ")");
}

void check_shapes(const HfTensorMap& m, const Sources& s, const HfModel& hf) {
  const auto& out = m.shape;
  const std::vector<int64_t> tail(out.begin() + 1, out.end());
  auto rows_of = [&](const SafetensorsTensor& t, int64_t rows) {
    std::vector<int64_t> want = {rows};
    want.insert(want.end(), tail.begin(), tail.end());
    if (t.shape != want) bad_shape(m, t, shape_string(want));
  };
  const model::GptConfig& g = hf.gpt;
  switch (m.kind) {
    case Kind::Copy:
      if (s.t[0]->shape != out) bad_shape(m, *s.t[0], shape_string(out));
      break;
    case Kind::Transpose:
      if (s.t[0]->shape != std::vector<int64_t>{out[1], out[0]}) bad_shape(m, *s.t[0], shape_string({out[1], out[0]}));
      break;
    case Kind::Qkv:
      rows_of(*s.t[0], g.heads * g.kv_channels);
      rows_of(*s.t[1], g.query_groups * g.kv_channels);
      rows_of(*s.t[2], g.query_groups * g.kv_channels);
      break;
    case Kind::Gpt2Qkv:
      if (out.size() == 2) {
        if (s.t[0]->shape != std::vector<int64_t>{out[1], out[0]}) bad_shape(m, *s.t[0], shape_string({out[1], out[0]}));
      } else if (s.t[0]->shape != out) {
        bad_shape(m, *s.t[0], shape_string(out));
      }
      break;
    case Kind::GateUp:
      rows_of(*s.t[0], out[0] / 2);
      rows_of(*s.t[1], out[0] / 2);
      break;
  }
}

// The parameter's bytes, assembled from its sources (each kind a rearrangement of rows) at the
// front of dst; returns their count. dst only grows: shrinking and growing it again would
// zero-fill each large tensor's bytes once more before they are written over.
size_t assemble(const HfTensorMap& m, const Sources& s, const HfModel& hf, std::vector<uint8_t>& dst) {
  const size_t es = dtype_size(s.dtype);
  int64_t numel = 1;
  for (int64_t d : m.shape) numel *= d;
  const size_t bytes = static_cast<size_t>(numel) * es;
  if (dst.size() < bytes) dst.resize(bytes);
  const int64_t row = m.shape.size() > 1 ? numel / m.shape[0] : 1;  // elements per row
  const size_t row_bytes = static_cast<size_t>(row) * es;
  uint8_t* out = dst.data();
  auto rows = [&](const SafetensorsTensor& t, int64_t first, int64_t count) {
    std::memcpy(out, t.data + static_cast<size_t>(first) * row_bytes, static_cast<size_t>(count) * row_bytes);
    out += static_cast<size_t>(count) * row_bytes;
  };
  auto transpose = [&](const uint8_t* src, int64_t in_rows, int64_t in_cols, uint8_t* to) {
    // src [in_rows, in_cols] -> to [in_cols, in_rows]
    for (int64_t r = 0; r < in_rows; ++r)
      for (int64_t c = 0; c < in_cols; ++c)
        std::memcpy(to + static_cast<size_t>(c * in_rows + r) * es, src + static_cast<size_t>(r * in_cols + c) * es, es);
  };
  const model::GptConfig& g = hf.gpt;
  const int64_t D = g.kv_channels, per_group = g.heads / g.query_groups;
  switch (m.kind) {
    case Kind::Copy:
      rows(*s.t[0], 0, m.shape.empty() ? 1 : m.shape[0]);
      break;
    case Kind::Transpose:
      transpose(s.t[0]->data, m.shape[1], m.shape[0], out);
      break;
    case Kind::Qkv:  // [q heads of g; k_g; v_g] for each query group g
      for (int64_t grp = 0; grp < g.query_groups; ++grp) {
        rows(*s.t[0], grp * per_group * D, per_group * D);
        rows(*s.t[1], grp * D, D);
        rows(*s.t[2], grp * D, D);
      }
      break;
    case Kind::Gpt2Qkv: {
      // c_attn's output columns are [q | k | v], each heads x D; as rows (transposed weight):
      // head h's q, k, v rows.
      const int64_t h = g.hidden;
      std::vector<uint8_t> t;
      const uint8_t* src = s.t[0]->data;
      if (m.shape.size() == 2) {
        t.resize(bytes);
        transpose(s.t[0]->data, h, 3 * h, t.data());
        src = t.data();
      }
      for (int64_t head = 0; head < g.heads; ++head)
        for (int64_t part = 0; part < 3; ++part) {
          const size_t first = static_cast<size_t>(part * h + head * D) * row_bytes;
          std::memcpy(out, src + first, static_cast<size_t>(D) * row_bytes);
          out += static_cast<size_t>(D) * row_bytes;
        }
      break;
    }
    case Kind::GateUp:
      rows(*s.t[0], 0, m.shape[0] / 2);
      rows(*s.t[1], 0, m.shape[0] / 2);
      break;
  }
  return bytes;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

}  // namespace

namespace {

// A Hugging Face folder's tensors, each parameter's sources found and checked: what import_hf
// converts and open_hf_pretrained reads.
struct CheckedHf {
  HfModel hf;
  HfTensors tensors;
  std::vector<HfTensorMap> maps;
  std::vector<Sources> sources;  // maps[i]'s
};

CheckedHf check_hf_folder(const std::string& hf_dir, const std::string& config_path) {
  CheckedHf c;
  c.hf = parse_hf_config(read_file(config_path), config_path);
  const HfModel& hf = c.hf;
  c.tensors = open_tensors(hf_dir);
  c.maps = hf_tensor_maps(hf);
  const HfTensors& tensors = c.tensors;
  const std::vector<HfTensorMap>& maps = c.maps;

  // Find every parameter's sources (GPT-2 folders saved without the "transformer." prefix too).
  auto find = [&](const std::string& name) -> const SafetensorsTensor* {
    auto it = tensors.by_name.find(name);
    if (it == tensors.by_name.end() && name.rfind("transformer.", 0) == 0) it = tensors.by_name.find(name.substr(12));
    return it == tensors.by_name.end() ? nullptr : it->second;
  };
  std::vector<Sources>& sources = c.sources;
  sources.resize(maps.size());
  std::set<std::string> used;
  std::vector<std::string> missing;
  for (size_t i = 0; i < maps.size(); ++i) {
    for (const auto& name : maps[i].hf) {
      const SafetensorsTensor* t = find(name);
      if (!t) {
        missing.push_back(name);
        continue;
      }
      sources[i].t.push_back(t);
      used.insert(t->name);
    }
  }
  if (!missing.empty())
    throw UsageError("'" + hf_dir + "' (" + hf.arch_name + ") lacks tensor" + (missing.size() > 1 ? "s " : " ") +
                     join(missing, ", "));
  std::vector<std::string> extra;
  for (const auto& [name, t] : tensors.by_name)
    if (!used.count(name) && !hf_ignored_tensor(hf, name)) extra.push_back(name);
  if (!extra.empty())
    throw UsageError("'" + hf_dir + "' holds tensor" + (extra.size() > 1 ? "s" : "") + " that " + hf.arch_name +
                     " with this config.json does not have: " + join(extra, ", "));
  for (size_t i = 0; i < maps.size(); ++i) {
    Sources& s = sources[i];
    s.dtype = s.t[0]->dtype;
    for (const auto* t : s.t) {
      if (t->dtype != Dtype::F32 && t->dtype != Dtype::BF16 && t->dtype != Dtype::F16)
        throw UsageError("tensor '" + t->name + "' is " + std::string(dtype_name(t->dtype)) +
                         " (import-hf reads F32, BF16 and F16)");
      if (t->dtype != s.dtype)
        throw UsageError("tensors '" + s.t[0]->name + "' and '" + t->name + "' differ in dtype (" +
                         std::string(dtype_name(s.dtype)) + ", " + std::string(dtype_name(t->dtype)) +
                         "), and both make " + maps[i].mcore);
    }
    check_shapes(maps[i], s, hf);
  }
  return c;
}

}  // namespace

HfImportResult import_hf(const std::string& hf_path, const std::string& out_dir, const HfProgress& progress) {
  const std::string hf_dir = resolve_hf_path(hf_path, "import-hf");
  std::error_code ec;
  if (!fs::is_directory(hf_dir, ec)) throw UsageError("Hugging Face folder '" + hf_dir + "' is not a directory");
  const std::string config_path = (fs::path(hf_dir) / "config.json").string();
  if (!fs::is_regular_file(config_path, ec))
    throw UsageError("'" + hf_dir + "' has no config.json: not a Hugging Face model folder");

  CheckedHf checked = check_hf_folder(hf_dir, config_path);
  HfImportResult result;
  result.model = checked.hf;
  const HfModel& hf = result.model;
  const HfTensors& tensors = checked.tensors;
  const std::vector<HfTensorMap>& maps = checked.maps;
  const std::vector<Sources>& sources = checked.sources;

  ScratchFolder scratch(out_dir);  // written beside out_dir, moved into place at the end
  const fs::path final_dir = scratch.final_path();

  std::vector<TensorWrite> writes;
  for (size_t i = 0; i < maps.size(); ++i) writes.push_back({maps[i].mcore, sources[i].dtype, maps[i].shape, nullptr});
  // The writer asks for each tensor's bytes a window at a time, in order: one tensor is assembled
  // at a time, and its sources' pages given back once it is done.
  size_t current = SIZE_MAX;
  std::vector<uint8_t> buffer;
  const auto start = std::chrono::steady_clock::now();
  auto last_report = start;
  auto fill = [&](size_t i, size_t offset, size_t n, void* dst) {
    if (i != current) {
      if (current != SIZE_MAX)
        for (const auto* t : sources[current].t) tensors.files[tensors.file_of.at(t->name)]->release(t->data, t->nbytes);
      result.bytes += assemble(maps[i], sources[i], hf, buffer);
      current = i;
      result.tensors = static_cast<int64_t>(i) + 1;
      const auto now = std::chrono::steady_clock::now();
      if (progress && now - last_report > std::chrono::seconds(5)) {
        progress(result.tensors, static_cast<int64_t>(maps.size()), result.bytes,
                   std::chrono::duration<double>(now - start).count());
        last_report = now;
      }
    }
    std::memcpy(dst, buffer.data() + offset, n);
  };
  write_safetensors(scratch.file("model.safetensors"), writes,
                    {{"format", "pt"}, {"source", hf.arch_name}}, fill, /*hash=*/false);
  result.tensors = static_cast<int64_t>(maps.size());

  // config.json itself, under another name (the folder is not a Hugging Face one): export-hf
  // writes it back.
  fs::copy_file(config_path, scratch.file("hf_config.json"));
  // The tokenizer files, and the flags that name them.
  for (const char* f : kHfTokenizerFiles) {
    const fs::path src = fs::path(hf_dir) / f;
    if (!fs::is_regular_file(src, ec)) continue;
    fs::copy_file(src, scratch.file(f), fs::copy_options::overwrite_existing);
    result.tokenizer.push_back(f);
  }
  std::vector<std::string> flags = hf_megatron_flags(hf);
  std::vector<std::string> overrides = hf_bridge_overrides(hf);
  const bool hf_tokenizer = fs::is_regular_file(fs::path(hf_dir) / "tokenizer.json", ec);
  if (hf_tokenizer) {
    flags.insert(flags.end(), {"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", final_dir.string()});
    overrides.push_back("tokenizer.tokenizer_type=HuggingFaceTokenizer");
    overrides.push_back("tokenizer.tokenizer_model=" + final_dir.string());
  }
  flags.insert(flags.end(), {"--pretrained-checkpoint", final_dir.string()});
  overrides.push_back("checkpoint.pretrained_checkpoint=" + final_dir.string());
  result.flags = join(flags, " ");
  result.overrides = join(overrides, " ");
  write_file_atomic(scratch.file("model_flags.txt"), result.flags + "\n");
  write_file_atomic(scratch.file("model_overrides.txt"), result.overrides + "\n");

  scratch.commit();
  return result;
}

}  // namespace laoyao::train

namespace laoyao::train {

namespace {

// The settings of the run's model that config.json fixes, as (flag, the run's value, config.json's
// field, its value), for those that differ.
std::vector<std::string> contradictions(const HfModel& hf, const model::GptConfig& run) {
  const model::GptConfig& h = hf.gpt;
  std::vector<std::string> out;
  auto differ = [&](const std::string& flag, const std::string& ours, const std::string& field, const std::string& theirs) {
    if (ours != theirs) out.push_back(flag + " " + ours + " (config.json: " + field + " " + theirs + ")");
  };
  auto n = [](auto v) { return hf_number(static_cast<double>(v)); };
  auto b = [](bool v) { return std::string(v ? "on" : "off"); };
  const bool gpt2 = hf.arch == HfArchitecture::Gpt2;
  differ("--num-layers", n(run.num_layers), gpt2 ? "n_layer" : "num_hidden_layers", n(h.num_layers));
  differ("--hidden-size", n(run.hidden), gpt2 ? "n_embd" : "hidden_size", n(h.hidden));
  differ("--num-attention-heads", n(run.heads), gpt2 ? "n_head" : "num_attention_heads", n(h.heads));
  differ("--num-query-groups", n(run.query_groups), "num_key_value_heads", n(h.query_groups));
  differ("--kv-channels", n(run.kv_channels), "head_dim", n(h.kv_channels));
  differ("--ffn-hidden-size", n(run.ffn), gpt2 ? "n_inner" : "intermediate_size", n(h.ffn));
  differ("the padded vocabulary", n(run.vocab), "vocab_size", n(h.vocab));
  differ("--normalization", run.norm == model::Norm::RMSNorm ? "RMSNorm" : "LayerNorm", "its norm",
         h.norm == model::Norm::RMSNorm ? "RMSNorm" : "LayerNorm");
  if (std::abs(run.norm_eps - h.norm_eps) > 1e-3f * h.norm_eps)
    differ("--norm-epsilon", n(run.norm_eps), gpt2 ? "layer_norm_epsilon" : "rms_norm_eps", n(hf.norm_eps));
  auto act = [](model::Activation a) {
    return std::string(a == model::Activation::SwiGLU ? "swiglu" : a == model::Activation::GeluErf ? "gelu (erf)" : "gelu (tanh)");
  };
  differ("the activation", act(run.activation), gpt2 ? "activation_function" : "hidden_act", act(h.activation));
  auto pos = [](model::Positions p) {
    return std::string(p == model::Positions::Rope ? "rope" : p == model::Positions::LearnedAbsolute ? "learned_absolute" : "none");
  };
  differ("--position-embedding-type", pos(run.positions), "its positions", pos(h.positions));
  if (h.positions == model::Positions::Rope && run.positions == model::Positions::Rope) {
    if (run.rotary_base != h.rotary_base) differ("--rotary-base", n(run.rotary_base), "rope_theta", n(h.rotary_base));
    differ("--use-rope-scaling", b(run.rope_scaling), "rope_scaling", b(h.rope_scaling));
    if (run.rope_scaling && h.rope_scaling && run.rope_scaling_factor != h.rope_scaling_factor)
      differ("--rope-scaling-factor", n(run.rope_scaling_factor), "rope_scaling.factor", n(h.rope_scaling_factor));
  }
  differ("--qk-layernorm", b(run.qk_layernorm), "q_norm/k_norm", b(h.qk_layernorm));
  differ("the linear biases (--disable-bias-linear)", b(run.add_bias_linear), "mlp_bias", b(h.add_bias_linear));
  differ("the QKV bias (--add-qkv-bias)", b(run.add_qkv_bias), "attention_bias", b(h.add_qkv_bias));
  differ("tied embeddings (--untie-embeddings-and-output-weights)", b(run.tied_embeddings), "tie_word_embeddings",
         b(h.tied_embeddings));
  differ("--num-experts", n(run.moe.num_experts), "num_experts", n(h.moe.num_experts));
  if (h.moe.num_experts > 0 && run.moe.num_experts > 0) {
    differ("--moe-router-topk", n(run.moe.topk), "num_experts_per_tok", n(h.moe.topk));
    differ("--moe-ffn-hidden-size", n(run.moe.ffn), "moe_intermediate_size", n(h.moe.ffn));
    differ("--moe-router-pre-softmax", b(run.moe.pre_softmax), "norm_topk_prob (negated)", b(h.moe.pre_softmax));
    differ("--moe-shared-expert-intermediate-size", n(run.moe.shared_ffn), "n_shared_experts x moe_intermediate_size",
           n(h.moe.shared_ffn));
    auto layers = [](const model::GptConfig& g) {
      std::string s;
      for (int64_t l = 0; l < g.num_layers; ++l) s += g.is_moe_layer(l) ? '1' : '0';
      return s;
    };
    differ("--moe-layer-freq", layers(run), "first_k_dense_replace", layers(h));
  }
  differ("--multi-latent-attention", b(run.mla.has_value()), "its attention", b(h.mla.has_value()));
  if (run.mla && h.mla) {
    differ("--q-lora-rank", n(run.mla->q_lora_rank), "q_lora_rank", n(h.mla->q_lora_rank));
    differ("--kv-lora-rank", n(run.mla->kv_lora_rank), "kv_lora_rank", n(h.mla->kv_lora_rank));
    differ("--qk-head-dim", n(run.mla->qk_head_dim), "qk_nope_head_dim", n(h.mla->qk_head_dim));
    differ("--qk-pos-emb-head-dim", n(run.mla->qk_pos_emb_head_dim), "qk_rope_head_dim", n(h.mla->qk_pos_emb_head_dim));
    differ("--v-head-dim", n(run.mla->v_head_dim), "v_head_dim", n(h.mla->v_head_dim));
    differ("--rope-type", run.yarn ? "yarn" : "rope", "rope_scaling", h.yarn ? "yarn" : "rope");
  }
  return out;
}

// The folder's own files as the pretrained store when every parameter is its sources' rows
// rearranged (Copy, Qkv, GateUp): each source entry is a part of the parameter whose boxes are the
// rows it gives, in its own order, so nothing is converted or written before the weights are read.
PretrainedSource read_in_place(const std::string& dir, CheckedHf c, const std::vector<ParamShape>& expected) {
  PretrainedSource out{TensorStore("pretrained checkpoint '" + dir + "'"), {}, {}};
  // (The sources' entry pointers stay good: a file's move keeps its list of entries where it is.)
  std::vector<size_t> at(c.tensors.files.size());
  for (size_t f = 0; f < at.size(); ++f) {
    out.files.push_back(c.tensors.files[f]->path());
    at[f] = out.store.add_file(std::move(*c.tensors.files[f]), std::nullopt);
  }
  const model::GptConfig& g = c.hf.gpt;
  for (size_t i = 0; i < c.maps.size(); ++i) {
    const HfTensorMap& m = c.maps[i];
    const std::vector<const SafetensorsTensor*>& src = c.sources[i].t;
    auto rows = [&](int64_t first, int64_t count) {
      model::Box b = model::whole_box(m.shape);
      b.start[0] = first, b.size[0] = count;
      return b;
    };
    auto add = [&](size_t k, std::vector<model::Box> boxes) {
      out.store.add(at[c.tensors.file_of.at(src[k]->name)], src[k]->name, {m.mcore, m.shape, std::move(boxes)});
    };
    switch (m.kind) {
      case Kind::Copy:
        add(0, {model::whole_box(m.shape)});
        break;
      case Kind::GateUp:
        add(0, {rows(0, m.shape[0] / 2)});
        add(1, {rows(m.shape[0] / 2, m.shape[0] / 2)});
        break;
      case Kind::Qkv: {  // group grp's rows: [q heads; k; v], each source giving its rows of every group
        const int64_t D = g.kv_channels, per_group = g.heads / g.query_groups, stride = (per_group + 2) * D;
        std::vector<model::Box> q, k, v;
        for (int64_t grp = 0; grp < g.query_groups; ++grp) {
          q.push_back(rows(grp * stride, per_group * D));
          k.push_back(rows(grp * stride + per_group * D, D));
          v.push_back(rows(grp * stride + (per_group + 1) * D, D));
        }
        add(0, std::move(q)), add(1, std::move(k)), add(2, std::move(v));
        break;
      }
      default:
        throw Error("read_in_place: " + m.mcore + " is not a rearrangement of rows");
    }
  }
  check_pretrained_store(out.store, expected, dir);
  return out;
}

}  // namespace

bool is_hf_folder(const std::string& path) {
  std::error_code ec;
  const std::string dir = resolve_hf_path(path, "checkpoint.pretrained_checkpoint");
  return fs::is_regular_file(fs::path(dir) / "config.json", ec) && !fs::exists(fs::path(dir) / "hf_config.json", ec);
}

PretrainedSource open_hf_pretrained(const std::string& path, const model::GptConfig& run,
                                    const std::vector<ParamShape>& expected) {
  const std::string dir = resolve_hf_path(path, "checkpoint.pretrained_checkpoint");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const HfModel hf = parse_hf_config(read_file(config_path), config_path);
  const std::vector<std::string> bad = contradictions(hf, run);
  if (!bad.empty()) {
    std::string list;
    for (const auto& x : bad) list += "\n  " + x;
    throw UsageError("pretrained checkpoint '" + path + "' is a " + hf.arch_name +
                     " whose config.json the run's model contradicts (`laoyao checkpoint import-hf` writes the "
                     "flags that match it):" + list);
  }
  CheckedHf checked = check_hf_folder(dir, config_path);
  const bool rows_only = std::all_of(checked.maps.begin(), checked.maps.end(), [](const HfTensorMap& m) {
    return m.kind == Kind::Copy || m.kind == Kind::Qkv || m.kind == Kind::GateUp;
  });
  if (rows_only) return read_in_place(dir, std::move(checked), expected);
  // GPT-2's transposed weights: converted as import-hf converts them, into a scratch folder.
  const std::string tmp = (fs::temp_directory_path() / ("laoyao_hf_pretrained." + std::to_string(::getpid()))).string();
  std::error_code ec;
  fs::remove_all(tmp, ec);
  PretrainedSource src = [&] {
    struct Remove {
      std::string path;
      ~Remove() {
        std::error_code e;
        fs::remove_all(path, e);
      }
    } remove{tmp};
    import_hf(dir, tmp);
    return open_pretrained(tmp, expected);  // mapped: the files may go
  }();
  src.files.clear();
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") src.files.push_back(e.path().string());
  return src;
}

}  // namespace laoyao::train
