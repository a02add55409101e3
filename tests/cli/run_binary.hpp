// Runs the built `laoyao` binary as a user would, in a given directory, capturing its output.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace laoyao::test {

struct RunResult {
  int status = -1;     // exit status
  std::string output;  // stdout and stderr together
};

inline std::string shell_word(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline RunResult run_laoyao(const std::vector<std::string>& args, const std::string& cwd = ".",
                            const std::string& env = "") {
  // Appended piece by piece: GCC 12 misreads `"literal" + std::string&&` as an overlapping copy.
  std::string cmd = "cd ";
  cmd += shell_word(cwd);
  cmd += " && ";
  cmd += env;
  cmd += " ";
  cmd += shell_word(LAOYAO_BINARY);
  for (const auto& a : args) {
    cmd += " ";
    cmd += shell_word(a);
  }
  cmd += " 2>&1";
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// A fresh empty directory under the system temp folder, private to this process (test runs of
// two checkouts at once must not share one).
inline std::string fresh_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("laoyao_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

inline size_t count_entries(const std::string& dir) {
  size_t n = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) (void)e, ++n;
  return n;
}

// Every "lm loss: X" (training) and "lm loss value: X" (validation) in a log, in order.
inline std::vector<double> losses_in(const std::string& log) {
  std::vector<double> out;
  size_t at = 0;
  while ((at = log.find("lm loss", at)) != std::string::npos) {
    at += 7;
    for (const std::string key : {": ", " value: "})
      if (log.compare(at, key.size(), key) == 0) out.push_back(std::stod(log.substr(at + key.size())));
  }
  return out;
}

// Every "grad norm: X" of a log (printed with three decimals), in order.
inline std::vector<double> grad_norms_in(const std::string& log) {
  std::vector<double> out;
  for (size_t at = 0; (at = log.find("grad norm: ", at)) != std::string::npos; at += 11)
    out.push_back(std::stod(log.substr(at + 11)));
  return out;
}

}  // namespace laoyao::test
