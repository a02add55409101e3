#include "core/hf_hub.hpp"

#include <cstdlib>
#include <filesystem>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace laoyao {

namespace {

namespace fs = std::filesystem;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool plain_part(const std::string& p) { return !p.empty() && p != "." && p != ".."; }

}  // namespace

bool is_hf_hub_id(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || s.find('/', slash + 1) != std::string::npos) return false;
  if (s[0] == '~') return false;
  return plain_part(s.substr(0, slash)) && plain_part(s.substr(slash + 1));
}

std::vector<std::string> hf_cache_dirs() {
  std::vector<std::string> out;
  std::string hub = env("HF_HUB_CACHE");
  if (hub.empty()) hub = env("HUGGINGFACE_HUB_CACHE");
  if (hub.empty()) {
    std::string home = env("HF_HOME");
    if (home.empty()) {
      const std::string xdg = env("XDG_CACHE_HOME");
      home = (xdg.empty() ? env("HOME") + "/.cache" : xdg) + "/huggingface";
    }
    hub = home + "/hub";
  }
  out.push_back(hub);
  const std::string transformers = env("TRANSFORMERS_CACHE");
  if (!transformers.empty() && transformers != hub) out.push_back(transformers);
  return out;
}

std::string resolve_hf_path(const std::string& path_or_id, const std::string& what) {
  std::error_code ec;
  if (fs::exists(path_or_id, ec) || !is_hf_hub_id(path_or_id)) return path_or_id;
  const std::string repo = "models--" + path_or_id.substr(0, path_or_id.find('/')) + "--" +
                           path_or_id.substr(path_or_id.find('/') + 1);
  std::string searched;
  for (const auto& cache : hf_cache_dirs()) {
    const fs::path dir = fs::path(cache) / repo;
    searched += (searched.empty() ? "" : ", ") + dir.string();
    const fs::path ref = dir / "refs" / "main";
    std::string commit;
    if (fs::is_regular_file(ref, ec)) {
      commit = read_file(ref.string());
      while (!commit.empty() && (commit.back() == '\n' || commit.back() == ' ')) commit.pop_back();
    }
    if (!commit.empty() && fs::is_directory(dir / "snapshots" / commit, ec)) return (dir / "snapshots" / commit).string();
    // A cache copied without its refs: one snapshot is unambiguous.
    std::vector<fs::path> snapshots;
    if (fs::is_directory(dir / "snapshots", ec))
      for (const auto& e : fs::directory_iterator(dir / "snapshots", ec))
        if (e.is_directory()) snapshots.push_back(e.path());
    if (commit.empty() && snapshots.size() == 1) return snapshots[0].string();
    if (snapshots.size() > 1 && commit.empty())
      throw UsageError(what + " '" + path_or_id + "': " + dir.string() + " holds " + std::to_string(snapshots.size()) +
                       " snapshots and no refs/main saying which; give the snapshot folder itself");
  }
  throw UsageError(what + " '" + path_or_id + "' is neither a local path nor a Hugging Face model in the local cache "
                   "(searched " + searched + "). Nothing is downloaded: fetch it where there is network (`hf download " +
                   path_or_id + "`) and copy the cache here, point HF_HUB_CACHE or HF_HOME at a cache holding it, or "
                   "give a local folder");
}

}  // namespace laoyao
