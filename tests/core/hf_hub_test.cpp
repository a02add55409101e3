// Hub ids resolve to the local Hugging Face cache's snapshot, as transformers resolves them offline;
// paths stay paths; a miss names the folders searched and how to fill them.
#include "core/hf_hub.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.hpp"
#include "core/file_io.hpp"

using namespace laoyao;
namespace fs = std::filesystem;

namespace {

// Sets an environment variable for the scope, restoring the old value after.
struct EnvVar {
  std::string name, old;
  bool had;
  EnvVar(const char* n, const std::string& value) : name(n), had(std::getenv(n) != nullptr) {
    if (had) old = std::getenv(n);
    ::setenv(n, value.c_str(), 1);
  }
  ~EnvVar() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

}  // namespace

TEST(HfHub, IdsAreOrgSlashNameAndPathsAreNot) {
  EXPECT_TRUE(is_hf_hub_id("meta-llama/Llama-3.2-1B"));
  EXPECT_TRUE(is_hf_hub_id("Qwen/Qwen3-8B"));
  for (const char* path : {"/models/llama", "./llama/x", "../x", "llama", "a/b/c", "~/x", "a/", "/a", "./x", "../.."})
    EXPECT_FALSE(is_hf_hub_id(path)) << path;
}

TEST(HfHub, AnIdResolvesToItsCachedSnapshotAndAMissSaysWhereItLooked) {
  const fs::path root = fs::temp_directory_path() / ("laoyao_hf_hub_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path repo = root / "hub" / "models--Qwen--Qwen3-8B";
  fs::create_directories(repo / "snapshots" / "b968826d" );
  fs::create_directories(repo / "snapshots" / "0ld" );
  fs::create_directories(repo / "refs");
  write_file_atomic((repo / "refs" / "main").string(), "b968826d\n");
  {
    EnvVar cache("HF_HUB_CACHE", (root / "hub").string());
    EXPECT_EQ(resolve_hf_path("Qwen/Qwen3-8B", "x"), (repo / "snapshots" / "b968826d").string());
    EXPECT_EQ(resolve_hf_path("/not/an/id/at/all", "x"), "/not/an/id/at/all");  // paths pass through
    try {
      resolve_hf_path("meta-llama/Llama-3.2-1B", "--tokenizer-model");
      ADD_FAILURE() << "resolved a model the cache does not hold";
    } catch (const UsageError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--tokenizer-model 'meta-llama/Llama-3.2-1B'"), std::string::npos) << m;
      EXPECT_NE(m.find((root / "hub" / "models--meta-llama--Llama-3.2-1B").string()), std::string::npos) << m;
      EXPECT_NE(m.find("HF_HUB_CACHE"), std::string::npos) << m;
      EXPECT_NE(m.find("Nothing is downloaded"), std::string::npos) << m;
    }
    // Two snapshots and no refs/main: which one is not guessed.
    fs::remove(repo / "refs" / "main");
    EXPECT_THROW(resolve_hf_path("Qwen/Qwen3-8B", "x"), UsageError);
  }
  {  // HF_HOME's hub, when HF_HUB_CACHE is not set
    EnvVar unset_cache("HF_HUB_CACHE", "");
    ::unsetenv("HF_HUB_CACHE");
    EnvVar home("HF_HOME", root.string());
    EXPECT_EQ(hf_cache_dirs().front(), (root / "hub").string());
    fs::remove_all(repo / "snapshots" / "0ld");  // one snapshot left: unambiguous without refs
    EXPECT_EQ(resolve_hf_path("Qwen/Qwen3-8B", "x"), (repo / "snapshots" / "b968826d").string());
  }
  fs::remove_all(root);
}
