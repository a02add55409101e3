#include "model/parameters.hpp"

#include "core/error.hpp"
#include "core/rng.hpp"

namespace laoyao::model {

int64_t ParameterTable::add(std::string name, std::vector<int64_t> shape, Init init, double std) {
  ParamSpec p;
  p.numel = 1;
  for (auto d : shape) {
    if (d <= 0) throw Error("parameter " + name + " has a non-positive dimension");
    p.numel *= d;
  }
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.offset = total;
  p.init = init;
  p.std = std;
  // Megatron's no_weight_decay_cond: 1-D parameters and biases get wd_mult 0, with its exceptions.
  const auto has = [&](const char* part) { return p.name.find(part) != std::string::npos; };
  bool no_wd = p.shape.size() == 1 || p.name.ends_with(".bias") || (weight_decay.skip_embeddings && has("embedding"));
  if (weight_decay.apply_to_qk_layernorm && (has("q_layernorm.") || has("k_layernorm."))) no_wd = false;
  p.weight_decay = !no_wd;
  total += p.numel;
  specs.push_back(std::move(p));
  return specs.back().offset;
}

const ParamSpec* ParameterTable::find(const std::string& name) const {
  for (const auto& p : specs)
    if (p.name == name) return &p;
  return nullptr;
}

void ParameterTable::freeze_all() {
  for (auto& p : specs) p.frozen = true;
  trainable_offset = total;
}

bool ParameterTable::has_buffers() const {
  for (const auto& p : specs)
    if (p.buffer) return true;
  return false;
}

ParameterInit::ParameterInit(const ParamSpec& p, uint64_t seed, bool round_bf16)
    : p_(p), round_bf16_(round_bf16), rng_(seed, p.name) {}

void ParameterInit::next(float* w, int64_t n) {
  switch (p_.init) {
    case Init::Zeros:
      for (int64_t i = 0; i < n; ++i) w[i] = 0.0f;
      break;
    case Init::Ones:
      for (int64_t i = 0; i < n; ++i) w[i] = 1.0f;
      break;
    case Init::Normal:
      for (int64_t i = 0; i < n; ++i) {
        const float v = static_cast<float>(rng_.normal() * p_.std);
        w[i] = round_bf16_ ? round_to_bf16(v) : v;
      }
      break;
    case Init::Uniform:
      for (int64_t i = 0; i < n; ++i) {
        const float v = static_cast<float>((2.0 * rng_.uniform() - 1.0) * p_.std);
        w[i] = round_bf16_ ? round_to_bf16(v) : v;
      }
      break;
  }
}

void init_parameters(const ParameterTable& table, float* weights, uint64_t seed, bool round_bf16,
                     const ParamFilter& drawn) {
  // Each parameter draws from its own stream, so the parameters can be filled in any order (here in
  // parallel, largest first in practice) and the values stay the same.
  const int64_t n = static_cast<int64_t>(table.specs.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t k = 0; k < n; ++k) {
    const ParamSpec& p = table.specs[static_cast<size_t>(k)];
    if (!drawn || drawn(p)) ParameterInit(p, seed, round_bf16).next(weights + p.offset, p.numel);
  }
}

}  // namespace laoyao::model
