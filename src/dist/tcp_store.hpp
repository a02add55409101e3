// A key-value store over TCP on MASTER_ADDR:MASTER_PORT, what ranks on several hosts meet through
// when they share no filesystem (torch's TCPStore, in its role for Gloo): the job's rank 0 serves
// it, every rank (rank 0 too) connects to it. Keys are set once and read after a wait; a wait that
// outlasts its timeout, and a connection nobody answers within the timeout, fail naming the address.
// Gloo's rendezvous reads and writes it through its Store interface (process_group_gloo.cpp).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace laoyao::dist {

// The store's server: listens on every interface at `port` (0: a free one, see port()) and answers
// until destroyed. Errors (the port in use, ...) are laoyao::Error naming the port.
class TcpStoreServer {
 public:
  explicit TcpStoreServer(int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A connection to the store at host:port, retried until `timeout` passes (the server may start
// after its clients). One request at a time (calls from several threads take turns).
class TcpStoreClient {
 public:
  TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStoreClient();
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  // The value of `key`, waiting for it up to the timeout.
  std::vector<char> get(const std::string& key);
  // Returns once every key is set; laoyao::Error naming the missing ones after `timeout`.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }

 private:
  std::vector<char> request(char op, const std::string& key, const std::vector<char>& value, int64_t timeout_ms);
  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  std::mutex mutex_;  // one request at a time on the connection
};

// The local address this host reaches `host` from (the interface the route to it leaves by),
// for the collectives' own sockets: "127.0.0.1" for a loopback host.
std::string local_address_towards(const std::string& host, int port);

}  // namespace laoyao::dist
