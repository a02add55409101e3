// The Gloo process group (see process_group.hpp).
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "core/runtime_options.hpp"
#include "dist/process_group.hpp"
#include "dist/tcp_store.hpp"

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

// Gloo's rendezvous over the TCP store (tcp_store.hpp).
class TcpGlooStore final : public gloo::rendezvous::Store {
 public:
  explicit TcpGlooStore(std::shared_ptr<TcpStoreClient> client) : client_(std::move(client)) {}
  void set(const std::string& key, const std::vector<char>& data) override { client_->set(key, data); }
  std::vector<char> get(const std::string& key) override { return client_->get(key); }
  void wait(const std::vector<std::string>& keys) override { client_->wait(keys, client_->timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    client_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<TcpStoreClient> client_;
};

// The job's TCP store at MASTER_ADDR:MASTER_PORT: served by this process when it is rank 0, and
// one connection to it per process, shared by its groups (ranks as threads of one process too).
std::shared_ptr<TcpStoreClient> tcp_store(const RankEnv& env, std::chrono::milliseconds timeout) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, std::unique_ptr<TcpStoreServer>> servers;
  static std::map<std::pair<std::string, int>, std::shared_ptr<TcpStoreClient>> clients;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(env.master_addr, env.master_port);
  if (env.rank == 0 && !servers.count(key)) servers[key] = std::make_unique<TcpStoreServer>(env.master_port);
  auto& client = clients[key];
  if (!client) client = std::make_shared<TcpStoreClient>(env.master_addr, env.master_port, timeout);
  return client;
}

class GlooGroup final : public ProcessGroup {
 public:
  // `rank` of `size` members, meeting under `prefix` in `store`; their sockets on `hostname`.
  GlooGroup(int rank, int size, const std::string& prefix_name, gloo::rendezvous::Store& store,
            const std::string& hostname, std::chrono::milliseconds timeout)
      : timeout_(timeout) {
    gloo::transport::tcp::attr attr;
    // GLOO_SOCKET_IFNAME names the interface, as for torch's Gloo; else the address this host
    // reaches the rendezvous from (loopback for a one-machine job).
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface)
      attr.iface = iface;
    else
      attr.hostname = hostname;
    device_ = gloo::transport::tcp::CreateDevice(attr);
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

// The ranks meet in the file store of LAOYAO_RENDEZVOUS_DIR when it is set (a folder they share),
// else in the TCP store rank 0 serves on MASTER_ADDR:MASTER_PORT.
std::unique_ptr<ProcessGroup> connect(const RankEnv& env, double timeout_minutes, int rank, int size,
                                      const std::string& prefix, const std::string& what) {
  const std::string& dir = runtime_options().rendezvous_dir;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_minutes * 60000.0));
  const std::string hostname = local_address_towards(env.master_addr, env.master_port);
  const std::string where = dir.empty() ? env.master_addr + ":" + std::to_string(env.master_port) : dir;
  try {
    if (!dir.empty()) {
      gloo::rendezvous::FileStore store(dir);
      return std::make_unique<GlooGroup>(rank, size, prefix, store, hostname, timeout);
    }
    TcpGlooStore store(tcp_store(env, timeout));
    return std::make_unique<GlooGroup>(rank, size, prefix, store, hostname, timeout);
  } catch (const Error& e) {
    throw Error("rank " + std::to_string(env.rank) + ": could not connect " + what + " through " + where + ": " +
                e.what());
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(env.rank) + ": could not connect " + what + " through " + where + ": " +
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
