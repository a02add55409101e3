#include "model/gpt_ep.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace laoyao::model {

namespace {

constexpr const char* kExperts = ".mlp.experts.local_experts.";

// The whole table's entry of a rank's parameter p (the same shape).
const ParamSpec& whole_spec(const ParameterTable& whole, const ParamSpec& p, int64_t rank, int64_t local_experts) {
  const std::string name = ep_whole_name(p.name, rank, local_experts);
  const ParamSpec* w = whole.find(name);
  if (!w || w->numel != p.numel) throw Error("expert parallelism: the whole model has no parameter " + name +
                                             " of " + std::to_string(p.numel) + " elements");
  return *w;
}

}  // namespace

GptConfig ep_whole_config(const GptConfig& c) {
  GptConfig w = c;
  w.moe.expert_parallel = 1;
  return w;
}

bool is_routed_expert(const std::string& name) { return name.find(kExperts) != std::string::npos; }

std::string ep_whole_name(const std::string& local_name, int64_t rank, int64_t local_experts) {
  const size_t at = local_name.find(kExperts);
  if (at == std::string::npos) return local_name;
  const size_t begin = at + std::char_traits<char>::length(kExperts), end = local_name.find('.', begin);
  const int64_t local = std::stoll(local_name.substr(begin, end - begin));
  return local_name.substr(0, begin) + std::to_string(rank * local_experts + local) + local_name.substr(end);
}

void ep_shard(const ParameterTable& whole_table, const float* whole_w, const ParameterTable& local_table,
              float* local_w, int64_t rank, int64_t local_experts) {
  for (const auto& p : local_table.specs) {
    const ParamSpec& w = whole_spec(whole_table, p, rank, local_experts);
    std::copy(whole_w + w.offset, whole_w + w.offset + p.numel, local_w + p.offset);
  }
}

void ep_place(const ParameterTable& whole_table, float* whole_w, const ParameterTable& local_table,
              const float* local_w, int64_t rank, int64_t local_experts, bool replicated) {
  for (const auto& p : local_table.specs) {
    if (!replicated && !is_routed_expert(p.name)) continue;
    const ParamSpec& w = whole_spec(whole_table, p, rank, local_experts);
    std::copy(local_w + p.offset, local_w + p.offset + p.numel, whole_w + w.offset);
  }
}

}  // namespace laoyao::model
