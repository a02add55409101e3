// The Gloo process group (see process_group.hpp).
#include <chrono>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "core/runtime_options.hpp"
#include "dist/process_group.hpp"

#if LAOYAO_HAVE_GLOO
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace laoyao::dist {

#if LAOYAO_HAVE_GLOO
namespace {

class GlooGroup final : public ProcessGroup {
 public:
  // `rank` of `size` members, meeting under `prefix` in the file store in `dir`.
  GlooGroup(int rank, int size, const std::string& prefix_name, const std::string& dir,
            std::chrono::milliseconds timeout)
      : timeout_(timeout) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";  // CPU ranks of one machine (the file store is local too)
    device_ = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir);
    gloo::rendezvous::PrefixStore prefix(prefix_name, store);
    context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context_->setTimeout(timeout);
    context_->connectFullMesh(prefix, device_);
  }
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  void all_reduce_sum(float* data, size_t n) override { reduce(data, n); }
  void all_reduce_sum(double* data, size_t n) override { reduce(data, n); }
  void all_reduce_max(float* data, size_t n) override { reduce(data, n, static_cast<ReduceFn>(&gloo::max<float>)); }
  void barrier() override {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout_);
    run([&] { gloo::barrier(opts); }, "barrier");
  }

 private:
  using ReduceFn = void (*)(void*, const void*, const void*, size_t);  // Gloo's element-wise c = op(a, b)
  template <class T>
  void reduce(T* data, size_t n, ReduceFn op = static_cast<ReduceFn>(&gloo::sum<T>)) {
    if (n == 0) return;
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, n);
    opts.setReduceFunction(op);
    opts.setTimeout(timeout_);
    run([&] { gloo::allreduce(opts); }, "all-reduce");
  }
  template <class F>
  void run(F&& f, const char* what) {
    try {
      f();
    } catch (const std::exception& e) {
      throw Error(std::string("rank ") + std::to_string(context_->rank) + ": " + what + " among " +
                  std::to_string(context_->size) + " ranks failed (a rank died, or none answered within " +
                  std::to_string(timeout_.count() / 60000.0) + " minutes: --distributed-timeout-minutes): " +
                  e.what());
    }
  }

  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

}  // namespace

bool gloo_built() { return true; }

namespace {

std::unique_ptr<ProcessGroup> connect(const RankEnv& env, double timeout_minutes, int rank, int size,
                                      const std::string& prefix, const std::string& what) {
  const std::string& dir = runtime_options().rendezvous_dir;
  if (dir.empty())
    throw UsageError("CPU ranks meet through a directory they share: set LAOYAO_RENDEZVOUS_DIR (laoyao launch "
                     "sets it for the ranks it starts)");
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_minutes * 60000.0));
  try {
    return std::make_unique<GlooGroup>(rank, size, prefix, dir, timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(env.rank) + ": could not connect " + what + " through " + dir + ": " +
                e.what());
  }
}

}  // namespace

std::unique_ptr<ProcessGroup> make_cpu_process_group(const RankEnv& env, double timeout_minutes) {
  return connect(env, timeout_minutes, static_cast<int>(env.rank), static_cast<int>(env.world_size), "laoyao",
                 "the " + std::to_string(env.world_size) + " ranks");
}

std::unique_ptr<ProcessGroup> make_cpu_process_group(const RankEnv& env, double timeout_minutes,
                                                     const std::vector<int64_t>& members, const std::string& name) {
  int place = -1;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] == env.rank) place = static_cast<int>(i);
  if (place < 0) throw Error("rank " + std::to_string(env.rank) + " is not a member of its own " + name + " group");
  // One store prefix per group: its name and its first member tell the groups of one kind apart.
  const std::string prefix = "laoyao/" + name + "/" + std::to_string(members.front());
  return connect(env, timeout_minutes, place, static_cast<int>(members.size()), prefix,
                 "its " + name + " group of " + std::to_string(members.size()) + " ranks");
}
#else
bool gloo_built() { return false; }

std::unique_ptr<ProcessGroup> make_cpu_process_group(const RankEnv&, double) {
  throw UsageError("this laoyao was built without Gloo (Debian libgloo-dev), so CPU ranks cannot communicate");
}

std::unique_ptr<ProcessGroup> make_cpu_process_group(const RankEnv& env, double timeout, const std::vector<int64_t>&,
                                                     const std::string&) {
  return make_cpu_process_group(env, timeout);
}
#endif

}  // namespace laoyao::dist
