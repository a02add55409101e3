#include "train/hf_export.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "config/yaml_io.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/hf_hub.hpp"
#include "core/safetensors.hpp"
#include "model/gpt_ep.hpp"
#include "model/gpt_layout.hpp"
#include "train/checkpoint.hpp"
#include "train/hf_import.hpp"
#include "train/run_setup.hpp"

namespace laoyao::train {

namespace {

namespace fs = std::filesystem;
using Kind = HfTensorMap::Kind;


// What is exported: the model, its weights (Megatron-Core names, read whole as fp32), the config.json
// to write, the dtype by default and where the tokenizer files are. A LoRA run's checkpoint holds
// the adapters alone: its base is the run's pretrained checkpoint, the adapters merged into it.
struct Source {
  HfModel model;
  std::optional<LoadedCheckpoint> checkpoint;  // a laoyao checkpoint
  std::optional<PretrainedSource> imported;    // an import-hf folder, or a LoRA run's base
  std::string config_json;                     // an imported folder's own config.json ("" to write one)
  std::string default_dtype;
  std::string tokenizer_dir;
  std::optional<model::LoraSpec> lora;         // the checkpoint's adapters, merged on reading
  std::string base_path;                       // a LoRA run's base (its checkpoint.pretrained_checkpoint)
  const TensorStore& store() const { return checkpoint && !lora ? checkpoint->model : imported->store; }
  // Megatron-Core tensor `name` whole into out; a LoRA-adapted linear's weight as W + (alpha/dim) B A.
  void read(const std::string& name, const std::vector<int64_t>& shape, std::vector<float>& out) const;
};

// The module whose adapter a Megatron-Core linear carries in `adapters`: the linear itself, or for
// a routed expert's (mlp.experts.local_experts.E.linear_fc1) the experts' one shared pair
// (mlp.experts.linear_fc1, Bridge's share_expert_adapters); empty when it has none.
std::string adapter_of(const TensorStore& adapters, const std::string& linear) {
  if (adapters.find(linear + ".adapter.linear_in.weight")) return linear;
  const std::string marker = ".mlp.experts.local_experts.";
  const size_t at = linear.find(marker);
  if (at == std::string::npos) return "";
  const size_t dot = linear.find('.', at + marker.size());
  if (dot == std::string::npos) return "";
  const std::string shared = linear.substr(0, at) + ".mlp.experts" + linear.substr(dot);
  return adapters.find(shared + ".adapter.linear_in.weight") ? shared : "";
}

void Source::read(const std::string& name, const std::vector<int64_t>& shape, std::vector<float>& out) const {
  store().read({name, shape, {model::whole_box(shape)}}, out.data());
  const std::string suffix = ".weight";
  if (!lora || !name.ends_with(suffix)) return;
  const TensorStore& adapters = checkpoint->model;
  const std::string linear = adapter_of(adapters, name.substr(0, name.size() - suffix.size()));
  if (linear.empty()) return;
  const std::string a_name = linear + ".adapter.linear_in.weight", b_name = linear + ".adapter.linear_out.weight";
  const int64_t rows = shape[0], cols = shape[1], r = lora->dim;
  std::vector<float> A(static_cast<size_t>(r * cols)), B(static_cast<size_t>(rows * r));
  adapters.read({a_name, {r, cols}, {model::whole_box({r, cols})}}, A.data());
  adapters.read({b_name, {rows, r}, {model::whole_box({rows, r})}}, B.data());
  const double scale = lora->alpha / static_cast<double>(r);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double d = 0;
      for (int64_t k = 0; k < r; ++k) d += static_cast<double>(B[i * r + k]) * A[k * cols + j];
      out[static_cast<size_t>(i * cols + j)] += static_cast<float>(scale * d);
    }
}

std::vector<ParamShape> expected_shapes(const HfModel& m) {
  return param_shapes(model::build_gpt_parameters(m.gpt).table);
}

// A LoRA run's trained parameters: its adapters (what its checkpoints hold).
std::vector<ParamShape> trained_shapes(const model::GptConfig& whole) {
  model::ParameterTable t = model::build_gpt_parameters(whole).table;
  std::erase_if(t.specs, [](const model::ParamSpec& p) { return p.frozen; });
  return param_shapes(t);
}

Source open_source(const std::string& path) {
  std::error_code ec;
  Source s;
  if (fs::is_regular_file(fs::path(path) / "hf_config.json", ec)) {  // an import-hf folder
    const std::string config_path = (fs::path(path) / "hf_config.json").string();
    s.config_json = read_file(config_path);
    s.model = parse_hf_config(s.config_json, config_path);
    s.imported = open_pretrained(path, expected_shapes(s.model));
    const SafetensorsTensor& first = s.imported->store.entry(s.imported->store.tensors().begin()->second.front());
    s.default_dtype = first.dtype == Dtype::BF16 ? "bf16" : "fp32";
    s.tokenizer_dir = path;
    return s;
  }
  if (!fs::exists(path, ec)) throw UsageError("checkpoint '" + path + "' does not exist");
  s.checkpoint = load_checkpoint(path, std::nullopt, CheckpointVerify::kFilesRead);
  const LoadedCheckpoint& ck = *s.checkpoint;
  config::ConfigContainer c;
  config::apply_yaml(c, ck.run_config_yaml, ck.dir + "/run_config.yaml");
  config::Derived d;
  auto vocab = ck.state.model_shape.find("padded_vocab_size");
  if (vocab == ck.state.model_shape.end() || !std::holds_alternative<int64_t>(vocab->second))
    throw UsageError("checkpoint '" + ck.dir + "': train_state.json has no padded_vocab_size");
  d.padded_vocab_size = std::get<int64_t>(vocab->second);
  model::GptConfig whole = model::ep_whole_config(model_config(c, d));
  if (whole.lora) {  // the adapters alone: merged into the run's base
    check_parameters(ck, trained_shapes(whole));
    s.lora = whole.lora;
    whole.lora.reset();
    if (!c.checkpoint.pretrained_checkpoint)
      throw UsageError("checkpoint '" + ck.dir + "' is a LoRA run's without checkpoint.pretrained_checkpoint in its "
                       "run_config.yaml: its base is unknown");
    const std::string& base = *c.checkpoint.pretrained_checkpoint;
    s.base_path = base;
    const std::vector<ParamShape> shapes = param_shapes(model::build_gpt_parameters(whole).table);
    s.imported = is_hf_folder(base) ? open_hf_pretrained(base, whole, shapes)
                                    : open_pretrained(resolve_hf_path(base, "checkpoint.pretrained_checkpoint"), shapes);
  }
  s.model = hf_model_of(whole, c.model.layernorm_epsilon, c.model.init_method_std);
  if (!s.lora) check_parameters(ck, expected_shapes(s.model));
  s.default_dtype = c.model.bf16 ? "bf16" : "fp32";  // (the mixed-precision preset has set it)
  if (c.tokenizer.tokenizer_model && fs::is_directory(*c.tokenizer.tokenizer_model, ec))
    s.tokenizer_dir = *c.tokenizer.tokenizer_model;
  return s;
}

// Hugging Face tensor `k` of a map (map.hf[k]): its shape, and its values from the Megatron-Core
// tensor's (the inverse of import-hf's rearrangement).
std::vector<int64_t> hf_shape(const HfTensorMap& m, size_t k, const HfModel& hf) {
  const model::GptConfig& g = hf.gpt;
  std::vector<int64_t> tail(m.shape.begin() + 1, m.shape.end());
  auto rows = [&](int64_t r) {
    std::vector<int64_t> s = {r};
    s.insert(s.end(), tail.begin(), tail.end());
    return s;
  };
  switch (m.kind) {
    case Kind::Copy: return m.shape;
    case Kind::Transpose: return {m.shape[1], m.shape[0]};
    case Kind::Qkv: return rows((k == 0 ? g.heads : g.query_groups) * g.kv_channels);
    case Kind::Gpt2Qkv: return m.shape.size() == 2 ? std::vector<int64_t>{m.shape[1], m.shape[0]} : m.shape;
    case Kind::GateUp: return rows(m.shape[0] / 2);
  }
  return m.shape;
}

int64_t hf_numel(const HfTensorMap& m, size_t k, const HfModel& hf) {
  int64_t numel = 1;
  for (int64_t d : hf_shape(m, k, hf)) numel *= d;
  return numel;
}

// out: hf_numel(m, k, hf) values, room the caller makes. T: float (values), or uint16_t (bf16
// bits moved as they are stored).
template <class T>
void hf_values(const HfTensorMap& m, size_t k, const HfModel& hf, const T* src, T* out) {
  const model::GptConfig& g = hf.gpt;
  const int64_t row = m.shape.size() > 1 ? m.shape[1] : 1;  // elements per Megatron-Core row
  auto copy_rows = [&](int64_t src_row, int64_t dst_row, int64_t count) {
    std::memcpy(out + dst_row * row, src + src_row * row, sizeof(T) * static_cast<size_t>(count * row));
  };
  const int64_t D = g.kv_channels, per_group = g.heads / g.query_groups;
  switch (m.kind) {
    case Kind::Copy:  // export_hf converts these from src itself
      throw Error("hf_values: a copied tensor has no values of its own");
    case Kind::Transpose:  // src [N, K] -> out [K, N]
      for (int64_t r = 0; r < m.shape[0]; ++r)
        for (int64_t c = 0; c < m.shape[1]; ++c) out[static_cast<size_t>(c * m.shape[0] + r)] = src[static_cast<size_t>(r * m.shape[1] + c)];
      return;
    case Kind::Qkv:
      for (int64_t grp = 0; grp < g.query_groups; ++grp) {
        const int64_t base = grp * (per_group + 2) * D;
        if (k == 0) copy_rows(base, grp * per_group * D, per_group * D);
        if (k == 1) copy_rows(base + per_group * D, grp * D, D);
        if (k == 2) copy_rows(base + (per_group + 1) * D, grp * D, D);
      }
      return;
    case Kind::Gpt2Qkv: {
      const int64_t h = g.hidden, cols = m.shape.size() == 2 ? m.shape[1] : 1;
      for (int64_t r = 0; r < 3 * h; ++r) {
        const int64_t head = r / (3 * D), part = r % (3 * D) / D, d = r % D, col = part * h + head * D + d;
        for (int64_t c = 0; c < cols; ++c)  // weight: out [h, 3h] (Conv1D), column col of row c
          out[static_cast<size_t>(m.shape.size() == 2 ? c * 3 * h + col : col)] = src[static_cast<size_t>(r * cols + c)];
      }
      return;
    }
    case Kind::GateUp:
      copy_rows(k == 0 ? 0 : m.shape[0] / 2, 0, m.shape[0] / 2);
      return;
  }
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// values in `dtype`'s bytes (bf16: rounded to nearest even).
std::vector<uint8_t> as_bytes(const std::vector<float>& v, Dtype dtype) {
  std::vector<uint8_t> bytes(v.size() * dtype_size(dtype));
  if (dtype == Dtype::F32) {
    std::memcpy(bytes.data(), v.data(), bytes.size());
  } else {
    auto* b = reinterpret_cast<uint16_t*>(bytes.data());
    for (size_t j = 0; j < v.size(); ++j) b[j] = f32_to_bf16(v[j]);
  }
  return bytes;
}

// A LoRA run's adapters as PEFT writes them (HfExportOptions::adapters): adapter_model.safetensors
// under PEFT's names (base_model.model.<Hugging Face module>.lora_A / lora_B.weight), linear_in as
// the lora_A of each Hugging Face linear a Megatron-Core one fuses (q/k/v, gate/up: the same A for
// each), linear_out's rows split as the layer's weight rows are; adapter_config.json with the
// fields Megatron-Bridge's export writes.
HfExportResult export_adapters(const Source& src, const std::string& out_dir, Dtype dtype, HfExportResult result) {
  if (!src.lora)
    throw UsageError("--adapters writes a LoRA run's adapters: '" + src.checkpoint->dir + "' is not a LoRA run's checkpoint");
  if (src.model.arch == HfArchitecture::Gpt2)
    throw UsageError("--adapters: GPT-2's Conv1D layers would need PEFT's fan_in_fan_out adapters, which are not "
                     "written; export the merged model (without --adapters)");
  const TensorStore& adapters = src.checkpoint->model;
  const int64_t r = src.lora->dim;
  struct Out {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Out> outs;
  std::set<std::string> modules;
  for (const HfTensorMap& m : hf_tensor_maps(src.model)) {
    const std::string suffix = ".weight";
    if (!m.mcore.ends_with(suffix) || m.shape.size() != 2) continue;
    const std::string linear = adapter_of(adapters, m.mcore.substr(0, m.mcore.size() - suffix.size()));
    if (linear.empty()) continue;
    std::vector<float> A(static_cast<size_t>(r * m.shape[1])), B(static_cast<size_t>(m.shape[0] * r)), part;
    adapters.read({linear + ".adapter.linear_in.weight", {r, m.shape[1]}, {model::whole_box({r, m.shape[1]})}}, A.data());
    adapters.read({linear + ".adapter.linear_out.weight", {m.shape[0], r}, {model::whole_box({m.shape[0], r})}},
                  B.data());
    HfTensorMap rows_of_b = m;  // linear_out's rows are the layer's: split the same way
    rows_of_b.shape = {m.shape[0], r};
    for (size_t k = 0; k < m.hf.size(); ++k) {
      const std::string module = m.hf[k].substr(0, m.hf[k].size() - suffix.size());
      modules.insert(module.substr(module.rfind('.') + 1));
      outs.push_back({"base_model.model." + module + ".lora_A.weight", {r, m.shape[1]}, as_bytes(A, dtype)});
      if (m.kind != Kind::Copy) {
        part.resize(static_cast<size_t>(hf_numel(rows_of_b, k, src.model)));
        hf_values(rows_of_b, k, src.model, B.data(), part.data());
      }
      outs.push_back({"base_model.model." + module + ".lora_B.weight", hf_shape(rows_of_b, k, src.model),
                      as_bytes(m.kind == Kind::Copy ? B : part, dtype)});
    }
  }
  ScratchFolder scratch(out_dir);
  std::vector<TensorWrite> writes;
  for (const Out& o : outs) writes.push_back({o.name, dtype, o.shape, nullptr});
  write_safetensors(scratch.file("adapter_model.safetensors"), writes, {{"format", "pt"}},
                    [&](size_t w, size_t offset, size_t n, void* dst) { std::memcpy(dst, outs[w].bytes.data() + offset, n); },
                    /*hash=*/false);
  const model::LoraSpec& l = *src.lora;
  const bool whole_alpha = l.alpha == static_cast<double>(static_cast<int64_t>(l.alpha));
  const nlohmann::json config = {
      {"peft_type", "LORA"},
      {"auto_mapping", nullptr},
      {"base_model_name_or_path", src.base_path},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"lora_alpha", whole_alpha ? nlohmann::json(static_cast<int64_t>(l.alpha)) : nlohmann::json(l.alpha)},
      {"lora_dropout", l.dropout},
      {"modules_to_save", nullptr},
      {"r", r},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"target_modules", std::vector<std::string>(modules.begin(), modules.end())},
      {"task_type", "CAUSAL_LM"},
      {"use_dora", false},
      {"use_rslora", false}};
  write_file_atomic(scratch.file("adapter_config.json"), config.dump(2) + "\n");
  scratch.commit();
  for (const Out& o : outs) result.bytes += o.bytes.size();
  result.tensors = static_cast<int64_t>(outs.size());
  result.files = {"adapter_model.safetensors", "adapter_config.json"};
  return result;
}

}  // namespace

HfExportResult export_hf(const std::string& source, const std::string& out_dir, const HfExportOptions& options,
                         const HfProgress& progress) {
  if (!options.dtype.empty() && options.dtype != "bf16" && options.dtype != "fp32")
    throw UsageError("--dtype '" + options.dtype + "': expected bf16 or fp32");
  const Source src = open_source(source);
  HfExportResult result;
  result.model = src.model;
  result.dtype = options.dtype.empty() ? src.default_dtype : options.dtype;
  const Dtype dtype = result.dtype == "bf16" ? Dtype::BF16 : Dtype::F32;
  if (options.adapters) return export_adapters(src, out_dir, dtype, std::move(result));
  const size_t es = dtype_size(dtype);

  // Every Hugging Face tensor: its map, which of the map's sources, its shape; then the files.
  struct Out {
    size_t map, k;
    std::vector<int64_t> shape;
    uint64_t bytes;
  };
  const std::vector<HfTensorMap> maps = hf_tensor_maps(src.model);
  std::vector<Out> outs;
  for (size_t i = 0; i < maps.size(); ++i)
    for (size_t k = 0; k < maps[i].hf.size(); ++k) {
      Out o{i, k, hf_shape(maps[i], k, src.model), es};
      for (int64_t d : o.shape) o.bytes *= static_cast<uint64_t>(d);
      outs.push_back(std::move(o));
    }
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (in_shard > 0 && in_shard + outs[i].bytes > options.max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(i);
    in_shard += outs[i].bytes;
  }

  ScratchFolder scratch(out_dir);  // written beside out_dir, moved into place at the end
  // One Megatron-Core tensor read at a time (its Hugging Face tensors all come from it), one
  // Hugging Face tensor converted at a time.
  size_t cached_map = SIZE_MAX, cached_out = SIZE_MAX;
  std::vector<float> mcore, values;
  std::vector<uint16_t> bits;
  std::vector<uint8_t> bytes;
  const SafetensorsTensor* stored = nullptr;  // the cached tensor's stored bf16 entry, when used as is
  const uint16_t* stored_bits = nullptr;      // its bits, 2-byte aligned
  const uint8_t* out_bytes = nullptr;         // the current Hugging Face tensor's bytes
  const auto start = std::chrono::steady_clock::now();
  auto last_report = start;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t f = 0; f < shards.size(); ++f) {
    const std::string name = shards.size() == 1 ? "model.safetensors" : shard_name(f, shards.size());
    std::vector<TensorWrite> writes;
    for (size_t i : shards[f]) {
      writes.push_back({maps[outs[i].map].hf[outs[i].k], dtype, outs[i].shape, nullptr});
      weight_map[writes.back().name] = name;
    }
    auto fill = [&](size_t w, size_t offset, size_t n, void* dst) {
      const size_t i = shards[f][w];
      if (i != cached_out) {
        const HfTensorMap& m = maps[outs[i].map];
        const int64_t n_out = static_cast<int64_t>(outs[i].bytes / es);
        if (outs[i].map != cached_map) {
          if (cached_map != SIZE_MAX) src.store().release_tensor(maps[cached_map].mcore);
          cached_map = outs[i].map;
          // Stored whole in bf16 and written in bf16 (no adapters to merge): the stored bits move
          // as they are (widening to fp32 and rounding back gives the same bits, at twice the
          // passes); otherwise the tensor is read as fp32.
          stored = nullptr;
          if (dtype == Dtype::BF16 && !src.lora)
            if (const SafetensorsTensor* t = src.store().whole_entry(m.mcore); t && t->dtype == Dtype::BF16)
              stored = t;
          if (stored && m.kind != Kind::Copy) {  // its rows rearranged as bf16 bits
            if (reinterpret_cast<uintptr_t>(stored->data) % alignof(uint16_t) == 0) {
              stored_bits = reinterpret_cast<const uint16_t*>(stored->data);
            } else {  // (a file may place an entry at an odd offset)
              if (bits.size() < stored->nbytes / 2) bits.resize(stored->nbytes / 2);
              std::memcpy(bits.data(), stored->data, stored->nbytes);
              stored_bits = bits.data();
            }
          }
          if (!stored) {
            int64_t numel = 1;
            for (int64_t d : m.shape) numel *= d;
            // (The buffers only grow: a resize down and up again would zero-fill each large
            // tensor once more before it is written over.)
            if (mcore.size() < static_cast<size_t>(numel)) mcore.resize(static_cast<size_t>(numel));
            src.read(m.mcore, m.shape, mcore);
          }
        }
        if (!(stored && m.kind == Kind::Copy) && bytes.size() < outs[i].bytes) bytes.resize(outs[i].bytes);
        out_bytes = bytes.data();
        if (stored && m.kind == Kind::Copy) {
          out_bytes = stored->data;  // straight from the mapping
        } else if (stored) {
          hf_values(m, outs[i].k, src.model, stored_bits, reinterpret_cast<uint16_t*>(bytes.data()));
        } else {
          if (m.kind != Kind::Copy) {
            if (values.size() < static_cast<size_t>(n_out)) values.resize(static_cast<size_t>(n_out));
            hf_values(m, outs[i].k, src.model, mcore.data(), values.data());
          }
          const float* v = m.kind == Kind::Copy ? mcore.data() : values.data();
          if (dtype == Dtype::F32) {
            std::memcpy(bytes.data(), v, outs[i].bytes);
          } else {
            auto* b = reinterpret_cast<uint16_t*>(bytes.data());
#pragma omp parallel for schedule(static) if (n_out > (int64_t{1} << 20))
            for (int64_t j = 0; j < n_out; ++j) b[j] = f32_to_bf16(v[j]);
          }
        }
        cached_out = i;
        result.tensors += 1;
        result.bytes += outs[i].bytes;
        const auto now = std::chrono::steady_clock::now();
        if (progress && now - last_report > std::chrono::seconds(5)) {
          progress(result.tensors, static_cast<int64_t>(outs.size()), result.bytes,
                   std::chrono::duration<double>(now - start).count());
          last_report = now;
        }
      }
      std::memcpy(dst, out_bytes + offset, n);
    };
    write_safetensors(scratch.file(name), writes, {{"format", "pt"}}, fill, /*hash=*/false);
    result.files.push_back(name);
  }
  if (shards.size() > 1) {
    uint64_t total = 0;
    for (const auto& o : outs) total += o.bytes;
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic(scratch.file("model.safetensors.index.json"), index.dump(2) + "\n");
  }

  // config.json: an imported folder's own (its dtype updated), else the architecture's.
  const std::string torch_dtype = result.dtype == "bf16" ? "bfloat16" : "float32";
  std::string config = hf_config_json(src.model, torch_dtype);
  if (!src.config_json.empty()) {
    nlohmann::json j = nlohmann::json::parse(src.config_json);
    j["torch_dtype"] = torch_dtype;
    config = j.dump(2) + "\n";
  }
  write_file_atomic(scratch.file("config.json"), config);
  std::error_code ec;
  for (const char* f : kHfTokenizerFiles) {
    if (src.tokenizer_dir.empty()) break;
    const fs::path from = fs::path(src.tokenizer_dir) / f;
    if (!fs::is_regular_file(from, ec)) continue;
    fs::copy_file(from, scratch.file(f));
    result.tokenizer.push_back(f);
  }
  scratch.commit();
  return result;
}

}  // namespace laoyao::train
