#include "cli/run_common.hpp"

#include <cstdio>

#include "train/capabilities.hpp"

namespace laoyao::cli {

void print_messages(const config::Resolved& r) {
  for (const auto& n : r.notes) std::printf("%s\n", n.c_str());
  for (const auto& n : r.validated.notes) std::printf("%s\n", n.c_str());
  for (const auto& w : r.validated.warnings) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
}

int start_training(config::Resolved& r) {
  auto missing = train::missing_features(r.cfg);
  if (!missing.empty()) {
    std::fprintf(stderr, "laoyao: cannot train this configuration yet; it resolved and validated, but this build lacks:\n");
    for (const auto& m : missing) std::fprintf(stderr, "  - %s\n", m.c_str());
    std::fprintf(stderr, "Nothing was written.\n");
    return 2;
  }
  return 0;
}

}  // namespace laoyao::cli
