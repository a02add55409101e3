#include "dist/tcp_store.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.hpp"

namespace laoyao::dist {

namespace {

using Clock = std::chrono::steady_clock;

// The wire: a request is op (1 byte: 'S' set, 'G' get, 'W' wait), the timeout in ms (8 bytes),
// then length-prefixed strings (4-byte lengths): the key and, for a set, the value. The reply is a
// status byte ('+' done, '-' timed out) and, for a get, the length-prefixed value.
bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, n -= static_cast<size_t>(r);
  }
  return true;
}

void put_bytes(std::vector<char>& out, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  out.insert(out.end(), p, p + n);
}

void put_string(std::vector<char>& out, const char* data, size_t n) {
  const uint32_t len = static_cast<uint32_t>(n);
  put_bytes(out, &len, sizeof len);
  put_bytes(out, data, n);
}

bool get_string(int fd, std::string& out) {
  uint32_t len = 0;
  if (!read_all(fd, &len, sizeof len) || len > (1u << 30)) return false;
  out.resize(len);
  return len == 0 || read_all(fd, out.data(), len);
}

}  // namespace

// ---- the server

struct TcpStoreServer::State {
  int listen_fd = -1, port = 0;
  std::atomic<bool> stopping{false};
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, std::string> values;
  std::thread acceptor;
  std::vector<std::thread> handlers;
  std::vector<int> client_fds;

  // Waits until the key is set or the deadline passes (false).
  bool wait_for(std::unique_lock<std::mutex>& lock, const std::string& key, int64_t timeout_ms) {
    const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
    return changed.wait_until(lock, until, [&] { return stopping || values.count(key) > 0; }) && !stopping;
  }

  void serve(int fd) {
    for (;;) {
      char op = 0;
      int64_t timeout_ms = 0;
      std::string key, value;
      if (!read_all(fd, &op, 1) || !read_all(fd, &timeout_ms, sizeof timeout_ms) || !get_string(fd, key)) break;
      if (op == 'S' && !get_string(fd, value)) break;
      std::vector<char> reply;
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (op == 'S') {
          values[key] = std::move(value);
          changed.notify_all();
          reply.push_back('+');
        } else if (op == 'G' || op == 'W') {
          const bool found = wait_for(lock, key, timeout_ms);
          reply.push_back(found ? '+' : '-');
          if (found && op == 'G') put_string(reply, values[key].data(), values[key].size());
        } else {
          break;
        }
      }
      if (!write_all(fd, reply.data(), reply.size())) break;
    }
    ::close(fd);
  }
};

TcpStoreServer::TcpStoreServer(int port) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s.listen_fd < 0) throw Error(std::string("TCP store: socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(s.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(s.listen_fd, 128) != 0) {
    const std::string why = std::strerror(errno);
    ::close(s.listen_fd);
    throw Error("the rendezvous store cannot listen on port " + std::to_string(port) + " (MASTER_PORT): " + why +
                " (another job on this port? choose another with --master-port)");
  }
  socklen_t len = sizeof addr;
  ::getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  s.port = ntohs(addr.sin_port);
  s.acceptor = std::thread([&s] {
    while (!s.stopping) {
      pollfd p{s.listen_fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int fd = ::accept4(s.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      const int nodelay = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof nodelay);
      std::lock_guard<std::mutex> lock(s.mutex);
      s.client_fds.push_back(fd);
      s.handlers.emplace_back([&s, fd] { s.serve(fd); });
    }
  });
}

TcpStoreServer::~TcpStoreServer() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stopping = true;
    s.changed.notify_all();
    for (int fd : s.client_fds) ::shutdown(fd, SHUT_RDWR);  // handlers blocked in recv return
  }
  if (s.acceptor.joinable()) s.acceptor.join();
  for (auto& t : s.handlers) t.join();
  ::close(s.listen_fd);
}

int TcpStoreServer::port() const { return state_->port; }

// ---- the client

namespace {

// A connected socket to host:port, or -1 (errno's reason in `why`).
int try_connect(const std::string& host, int port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    why = gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd >= 0) {
    const int nodelay = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof nodelay);
  }
  return fd;
}

}  // namespace

TcpStoreClient::TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout)
    : host_(host), port_(port), timeout_(timeout) {
  const auto until = Clock::now() + timeout;
  std::string why = "no answer";
  auto pause = std::chrono::milliseconds(10);
  while ((fd_ = try_connect(host, port, why)) < 0) {
    if (Clock::now() >= until)
      throw Error("nobody answered at " + address() + " (MASTER_ADDR:MASTER_PORT, the rendezvous store rank 0 serves) "
                  "within " + std::to_string(timeout.count() / 1000.0) + " s: " + why);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<char> TcpStoreClient::request(char op, const std::string& key, const std::vector<char>& value,
                                          int64_t timeout_ms) {
  std::vector<char> msg;
  msg.push_back(op);
  put_bytes(msg, &timeout_ms, sizeof timeout_ms);
  put_string(msg, key.data(), key.size());
  if (op == 'S') put_string(msg, value.data(), value.size());
  std::lock_guard<std::mutex> lock(mutex_);
  char status = 0;
  if (!write_all(fd_, msg.data(), msg.size()) || !read_all(fd_, &status, 1))
    throw Error("the rendezvous store at " + address() + " closed the connection (rank 0, which serves it, stopped?)");
  if (status != '+') throw Error("timed out after " + std::to_string(timeout_ms / 1000.0) + " s waiting at the "
                                 "rendezvous store " + address() + " for '" + key + "' (a rank did not start?)");
  std::string out;
  if (op == 'G' && !get_string(fd_, out))
    throw Error("the rendezvous store at " + address() + " closed the connection");
  return std::vector<char>(out.begin(), out.end());
}

void TcpStoreClient::set(const std::string& key, const std::vector<char>& value) {
  request('S', key, value, 0);
}

std::vector<char> TcpStoreClient::get(const std::string& key) { return request('G', key, {}, timeout_.count()); }

void TcpStoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  for (const auto& k : keys) request('W', k, {}, timeout.count());
}

std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  // A datagram socket's connect sends nothing: it only picks the route, whose source address is ours.
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char buf[INET_ADDRSTRLEN];
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf))
      out = buf;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return out;
}

}  // namespace laoyao::dist
