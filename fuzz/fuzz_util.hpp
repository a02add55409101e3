// Shared by the libFuzzer targets of fuzz/ (scripts/fuzz.sh builds and runs them).
//
// A reader given hostile bytes may succeed or end in a laoyao::Error (a UsageError is the message a
// user sees, exit 2). Anything else is a finding: a crash or sanitizer report, a std::exception of
// another kind escaping (std::out_of_range, nlohmann::json's, std::bad_alloc: the CLI would print
// "failed: ..." naming no file), or an allocation past libFuzzer's -malloc_limit_mb.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace laoyao::fuzz {

// Parts of one input: the separator is long enough that random mutation rarely makes one, and the
// seed corpus (fuzz/corpus/) holds it where a target wants several files.
inline constexpr std::string_view kSeparator = "\n--laoyao-fuzz-part--\n";

inline std::vector<std::string> split_parts(const uint8_t* data, size_t size, size_t max_parts) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = all.find(kSeparator);
    if (at == std::string_view::npos) break;
    parts.emplace_back(all.substr(0, at));
    all.remove_prefix(at + kSeparator.size());
  }
  parts.emplace_back(all);
  parts.resize(max_parts);
  return parts;
}

// Runs one reader call; a laoyao::Error is a clean refusal, any other exception aborts.
template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const laoyao::Error& e) {
    static const bool verbose = std::getenv("LAOYAO_FUZZ_VERBOSE") != nullptr;  // to check that seeds load
    if (verbose) std::fprintf(stderr, "laoyao fuzz: refused: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "laoyao fuzz: an exception that is not a laoyao::Error escaped: %s\n", e.what());
    std::abort();
  }
}

// A private scratch folder for targets whose readers take paths (memory-backed where /dev/shm is).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base = std::filesystem::exists("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                                      : std::filesystem::temp_directory_path();
    auto d = base / ("laoyao_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

}  // namespace laoyao::fuzz
