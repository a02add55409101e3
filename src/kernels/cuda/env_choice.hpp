// A kernel-selection environment variable (LAOYAO_GROUPED_GEMM and the like): the index of its
// value among `choices`, unset or empty meaning the first; any other value is a laoyao::Error
// naming the variable and what it accepts. Read on each call: callers keep the answer.
#pragma once
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "core/error.hpp"

namespace laoyao::kernels::cuda {

inline int env_choice(const char* name, std::initializer_list<const char*> choices) {
  const char* v = std::getenv(name);
  const std::string s = v && *v ? v : *choices.begin();
  std::string accepted;
  int i = 0;
  for (const char* c : choices) {
    if (s == c) return i;
    accepted += (i == 0 ? "" : i + 1 == static_cast<int>(choices.size()) ? " or " : ", ") + std::string(c);
    ++i;
  }
  throw Error(std::string(name) + " must be " + accepted + ", got '" + s + "'");
}

}  // namespace laoyao::kernels::cuda
