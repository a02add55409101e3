// The TCP rendezvous store: values set by one client are read by another, a get waits for its key,
// a client started before the server connects once it listens, and the failures (nobody answering,
// a key that never comes, a port in use) are errors naming the address, the key or the port.
#include "dist/tcp_store.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/error.hpp"

using namespace laoyao::dist;
using namespace std::chrono_literals;

namespace {

std::string text(const std::vector<char>& v) { return std::string(v.begin(), v.end()); }
std::vector<char> bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

}  // namespace

TEST(TcpStore, ClientsShareValuesAndAGetWaitsForItsKey) {
  TcpStoreServer server(0);
  ASSERT_GT(server.port(), 0);
  TcpStoreClient a("127.0.0.1", server.port(), 5s), b("localhost", server.port(), 5s);
  a.set("rank_0", bytes("addr of rank 0"));
  EXPECT_EQ(text(b.get("rank_0")), "addr of rank 0");
  std::string binary = "a";
  binary += '\0';
  binary += "b\xff";
  b.set("bin", bytes(binary));
  EXPECT_EQ(text(a.get("bin")), binary);
  // A get blocks until another client sets the key.
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    a.set("late", bytes("here"));
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(text(b.get("late")), "here");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 150ms);
  later.join();
  b.wait({"rank_0", "late"}, 1s);
  a.set("rank_0", bytes("again"));  // (a key set twice keeps the last value)
  EXPECT_EQ(text(b.get("rank_0")), "again");
}

TEST(TcpStore, AClientRetriesUntilTheServerListens) {
  int port = 0;
  {
    TcpStoreServer probe(0);  // a free port, given back
    port = probe.port();
  }
  std::unique_ptr<TcpStoreServer> server;
  std::thread start([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>(port);
  });
  TcpStoreClient c("127.0.0.1", port, 10s);
  c.set("k", bytes("v"));
  EXPECT_EQ(text(c.get("k")), "v");
  start.join();
}

TEST(TcpStore, FailuresNameTheAddressTheKeyOrThePort) {
  int port = 0;
  {
    TcpStoreServer probe(0);
    port = probe.port();
  }
  try {
    TcpStoreClient nobody("127.0.0.1", port, 300ms);
    ADD_FAILURE() << "connected to nobody";
  } catch (const laoyao::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nobody answered at 127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
  TcpStoreServer server(0);
  TcpStoreClient c("127.0.0.1", server.port(), 300ms);
  try {
    c.get("never");
    ADD_FAILURE() << "a key nobody sets was read";
  } catch (const laoyao::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
  }
  try {
    TcpStoreServer twice(server.port());
    ADD_FAILURE() << "two servers on one port";
  } catch (const laoyao::Error& e) {
    EXPECT_NE(std::string(e.what()).find("port " + std::to_string(server.port())), std::string::npos) << e.what();
  }
  EXPECT_EQ(local_address_towards("127.0.0.1", 1), "127.0.0.1");
}
