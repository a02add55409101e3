#include "dist/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.hpp"
#include "core/runtime_options.hpp"

namespace laoyao::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> g_signal{0};
extern "C" void on_launcher_signal(int sig) { g_signal.store(sig); }

struct Rank {
  int64_t rank = 0, local_rank = 0;
  pid_t pid = -1;
  int fd = -1;           // read end of the rank's stdout+stderr pipe; -1 once closed
  std::string pending;   // a partial line
  bool exited = false;
  int status = 0;
};

void emit(std::FILE* out, const Rank& r, const std::string& line) {
  std::fprintf(out, "[rank%lld]: %s\n", static_cast<long long>(r.rank), line.c_str());
}

// Moves the complete lines of r.pending to `out`; with `all`, the partial last line too.
void flush_lines(std::FILE* out, Rank& r, bool all) {
  size_t start = 0, nl;
  while ((nl = r.pending.find('\n', start)) != std::string::npos) {
    emit(out, r, r.pending.substr(start, nl - start));
    start = nl + 1;
  }
  r.pending.erase(0, start);
  if (all && !r.pending.empty()) emit(out, r, r.pending), r.pending.clear();
  std::fflush(out);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "stopped (status " + std::to_string(status) + ")";
}

pid_t start_rank(const LaunchOptions& o, Rank& r, int write_fd) {
  const pid_t pid = fork();
  if (pid < 0) throw Error(std::string("laoyao launch: fork failed: ") + std::strerror(errno));
  if (pid > 0) return pid;
  // The child: its own process group (so a stop reaches what it starts), output into the pipe.
  setpgid(0, 0);
  dup2(write_fd, STDOUT_FILENO);
  dup2(write_fd, STDERR_FILENO);
  close(write_fd);
  const int64_t world = o.nproc_per_node * o.nnodes;
  setenv("RANK", std::to_string(r.rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(r.local_rank).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
  setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
  setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
  std::vector<char*> argv;
  for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "laoyao launch: cannot run '%s': %s\n", argv[0], std::strerror(errno));
  _exit(127);
}

}  // namespace

int launch(const LaunchOptions& o) {
  if (o.command.empty()) throw UsageError("launch: no command to run");
  // The ranks meet through a file store on one node (a fresh directory per job, removed when it
  // ends); on several, through the TCP store rank 0 serves on --master-addr:--master-port (or a
  // folder they share, given as LAOYAO_RENDEZVOUS_DIR).
  std::string rendezvous;
  if (runtime_options().rendezvous_dir.empty() && o.nnodes == 1) {
    char tmpl[] = "/tmp/laoyao_rendezvous_XXXXXX";
    if (!mkdtemp(tmpl)) throw Error(std::string("laoyao launch: cannot create a rendezvous directory: ") +
                                    std::strerror(errno));
    rendezvous = tmpl;
    setenv("LAOYAO_RENDEZVOUS_DIR", tmpl, 1);
  }
  struct RemoveDir {
    const std::string& dir;
    ~RemoveDir() {
      if (dir.empty()) return;
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      unsetenv("LAOYAO_RENDEZVOUS_DIR");
    }
  } remove_dir{rendezvous};
  std::vector<Rank> ranks(static_cast<size_t>(o.nproc_per_node));
  struct sigaction sa {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_signal.store(0);

  for (int64_t i = 0; i < o.nproc_per_node; ++i) {
    Rank& r = ranks[static_cast<size_t>(i)];
    r.local_rank = i;
    r.rank = o.node_rank * o.nproc_per_node + i;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw Error(std::string("laoyao launch: pipe failed: ") + std::strerror(errno));
    r.pid = start_rank(o, r, fds[1]);
    setpgid(r.pid, r.pid);  // also from the parent, so a signal sent right away finds the group
    close(fds[1]);
    r.fd = fds[0];
  }

  const Rank* failed = nullptr;
  std::string stop_reason;
  bool stopping = false, killed = false, signalled = false;
  Clock::time_point kill_at{};
  auto stop_all = [&](const std::string& why) {
    if (stopping) return;
    stopping = true;
    stop_reason = why;
    for (const Rank& r : ranks)
      if (!r.exited) kill(-r.pid, SIGTERM);
    kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.grace_seconds * 1000));
  };

  size_t alive = ranks.size();
  Clock::time_point drain_until{};
  while (true) {
    // Output first: whatever the ranks wrote.
    std::vector<pollfd> fds;
    std::vector<Rank*> owners;
    for (Rank& r : ranks)
      if (r.fd >= 0) fds.push_back({r.fd, POLLIN, 0}), owners.push_back(&r);
    if (fds.empty() && alive == 0) break;
    if (alive == 0) {
      // Every rank has exited; a grandchild may still hold a pipe open: drain briefly, then stop.
      if (drain_until == Clock::time_point{}) drain_until = Clock::now() + std::chrono::milliseconds(500);
      if (Clock::now() > drain_until) break;
    }
    if (!fds.empty()) {
      const int n = poll(fds.data(), fds.size(), 100);
      if (n > 0)
        for (size_t k = 0; k < fds.size(); ++k) {
          if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          Rank& r = *owners[k];
          char buf[65536];
          const ssize_t got = read(r.fd, buf, sizeof buf);
          if (got > 0) {
            r.pending.append(buf, static_cast<size_t>(got));
            flush_lines(o.out, r, false);
          } else if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
            flush_lines(o.out, r, true);
            close(r.fd);
            r.fd = -1;
          }
        }
    } else {
      usleep(100000);
    }
    // Then exits.
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (Rank& r : ranks) {
        if (r.pid != pid || r.exited) continue;
        r.exited = true, r.status = status, --alive;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !failed && !stopping) {
          failed = &r;
          stop_all("rank " + std::to_string(r.rank) + " " + describe_status(status));
        }
      }
    }
    if (const int sig = g_signal.exchange(0); sig != 0) {
      signalled = true;
      stop_all(std::string("the launcher received ") + strsignal(sig));
    }
    if (stopping && !killed && alive > 0 && Clock::now() > kill_at) {
      for (const Rank& r : ranks)
        if (!r.exited) kill(-r.pid, SIGKILL);
      killed = true;
    }
  }
  for (Rank& r : ranks)
    if (r.fd >= 0) flush_lines(o.out, r, true), close(r.fd), r.fd = -1;
  // After a stop signal the handlers stay: the same signal may come again (GNU timeout sends it to
  // the launcher and then to its process group), and the launcher must still report and exit 1.
  if (!signalled) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }

  if (!stopping) return 0;
  std::fprintf(o.out, "laoyao launch: %s; the other ranks were stopped%s\n", stop_reason.c_str(),
               killed ? " (some only by SIGKILL)" : "");
  for (const Rank& r : ranks)
    std::fprintf(o.out, "laoyao launch:   rank %lld (local %lld, pid %d) %s\n", static_cast<long long>(r.rank),
                 static_cast<long long>(r.local_rank), static_cast<int>(r.pid), describe_status(r.status).c_str());
  std::fflush(o.out);
  return 1;
}

}  // namespace laoyao::dist
