// Host memory of GPU ranks under tensor or expert parallelism where one GPU is lent: RANKS threads
// of one process share GPU 0, each running the trainer (train::train) of a pretrain-gpt command
// line resolved for a world of RANKS. Their groups are laid out as `laoyao launch`'s
// (train/rank_groups) but meet through SharedDeviceGroup, the tests' ranks-as-threads harness: its
// collectives go through the host, so this bench reports no speed. CUDA graphs are off (a capture
// on one thread would catch another thread's copies).
//
// At the end it prints the process's peak resident set (VmHWM), that divided by RANKS (the CUDA
// libraries' pages are counted once for all ranks, so this share is a little kinder than a process
// per rank), each rank's parameters, and the share against #34's target: at most 0.5 bytes a
// parameter + 3 GB. Exit 1 when a rank failed or the share is over the target.
//   laoyao_bench_thread_ranks RANKS pretrain-gpt flags...
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config/front_ends.hpp"
#include "core/error.hpp"
#include "core/runtime_options.hpp"
#include "train/capabilities.hpp"
#include "train/rank_groups.hpp"
#include "train/run_setup.hpp"
#include "train/trainer.hpp"
#include "tests/model_cuda/shared_device_group.hpp"

using namespace laoyao;
using model::test::SharedDeviceGroup;

namespace {

// The process's peak resident set in bytes (/proc/self/status VmHWM).
double peak_resident_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) * 1024.0;
  throw Error("thread_ranks_bench: no VmHWM in /proc/self/status");
}

// One Meeting per group: the members of a group find the same one by its name and world ranks.
class Meetings {
 public:
  std::shared_ptr<SharedDeviceGroup::Meeting> of(const std::string& name, const std::vector<int64_t>& members) {
    std::string key = name;
    for (int64_t m : members) key.append(1, ' ').append(std::to_string(m));
    std::lock_guard<std::mutex> lock(mu_);
    auto& m = meetings_[key];
    if (!m) m = std::make_shared<SharedDeviceGroup::Meeting>(static_cast<int>(members.size()), key);
    return m;
  }
  void break_off_all() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, m] : meetings_) m->break_off();
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<SharedDeviceGroup::Meeting>> meetings_;
};

int position_of(int64_t rank, const std::vector<int64_t>& members) {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] == rank) return static_cast<int>(i);
  throw Error("thread_ranks_bench: rank " + std::to_string(rank) + " is not a member of its own group");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: laoyao_bench_thread_ranks RANKS pretrain-gpt flags...\n");
    return 2;
  }
  const int ranks = std::atoi(argv[1]);
  if (ranks < 1 || ranks > 8) {
    std::fprintf(stderr, "laoyao_bench_thread_ranks: RANKS is 1 to 8, not '%s'\n", argv[1]);
    return 2;
  }
  try {
    ScopedRuntimeOptions graphs_off([](RuntimeOptions& o) { o.cuda_graphs = false; });
    config::Resolved r = config::resolve_mlm(std::vector<std::string>(argv + 2, argv + argc), ranks);
    train::load_tokenizer_vocab(r.cfg, r.validated.derived, r.front_end);
    if (const auto missing = train::missing_features(r.cfg, ranks); !missing.empty()) {
      for (const auto& m : missing) std::fprintf(stderr, "laoyao_bench_thread_ranks: not built: %s\n", m.c_str());
      return 2;
    }
    Meetings meetings;
    std::vector<train::TrainSummary> summaries(static_cast<size_t>(ranks));
    std::vector<std::string> errors(static_cast<size_t>(ranks));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < ranks; ++rank)
      threads.emplace_back([&, rank] {
        try {
          LAOYAO_CUDA_CHECK(cudaSetDevice(0));
          std::vector<int64_t> everyone;
          for (int64_t q = 0; q < ranks; ++q) everyone.push_back(q);
          auto world = std::make_unique<SharedDeviceGroup>(meetings.of("world", everyone), rank);
          const train::RankGroups groups = train::make_rank_groups(
              r.cfg, ranks, rank, std::move(world), [&](const std::vector<int64_t>& members, const std::string& name) {
                return std::make_unique<SharedDeviceGroup>(meetings.of(name, members), position_of(rank, members));
              });
          train::TrainOptions opt;
          opt.use_cuda = true;
          opt.flavor = train::LogFlavor::kMegatronLM;
          groups.fill(opt);
          summaries[static_cast<size_t>(rank)] = train::train(r.cfg, r.validated.derived, opt);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(rank)] = e.what();
          meetings.break_off_all();
        }
      });
    for (auto& t : threads) t.join();
    int failed = 0;
    for (int rank = 0; rank < ranks; ++rank)
      if (!errors[static_cast<size_t>(rank)].empty())
        ++failed, std::fprintf(stderr, "thread_ranks: rank %d failed: %s\n", rank, errors[static_cast<size_t>(rank)].c_str());
    if (failed) return 1;
    const double peak = peak_resident_bytes(), share = peak / ranks;
    int64_t most = 0;
    for (const auto& s : summaries) most = std::max(most, s.parameters);
    const double target = 0.5 * static_cast<double>(most) + 3e9;
    std::printf("thread_ranks: ranks=%d host_peak_GB=%.2f per_rank_GB=%.2f parameters_per_rank=%lld "
                "B_per_param=%.3f target_GB=%.2f %s\n",
                ranks, peak / 1e9, share / 1e9, static_cast<long long>(most), share / static_cast<double>(most),
                target / 1e9, share <= target ? "within" : "over");
    return share <= target ? 0 : 1;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "laoyao_bench_thread_ranks: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "laoyao_bench_thread_ranks: %s\n", e.what());
    return 1;
  }
}
