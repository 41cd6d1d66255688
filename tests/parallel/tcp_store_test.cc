// The TCP rendezvous store of deployments on several hosts (parallel/tcp_store.h): set / get /
// wait between clients, waits for keys set later, timeouts and bad addresses with errors naming
// the address, and Gloo groups meeting through it (GlooRendezvous::tcp). Servers listen on port 0
// (a free port the kernel picks), so parallel ctest runs cannot collide.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "parallel/gloo_communicator.h"
#include "parallel/host_address.h"
#include "parallel/rank_workers.h"
#include "parallel/tcp_store.h"

namespace m3 {
namespace {

using std::chrono::milliseconds;

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TcpStore, SetGetAndWaitBetweenClients) {
  TcpStoreServer server("127.0.0.1", 0);
  ASSERT_GT(server.port(), 0);
  auto a = TcpStore::connect("127.0.0.1", server.port(), milliseconds(5000));
  auto b = TcpStore::connect("127.0.0.1", server.port(), milliseconds(5000));
  EXPECT_EQ(a->address(), "127.0.0.1:" + std::to_string(server.port()));
  EXPECT_FALSE(b->contains("x"));
  a->set("x", bytes("hello"));
  a->set("empty", {});
  std::vector<char> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31);
  a->set("big", big);
  EXPECT_TRUE(b->contains("x"));
  EXPECT_EQ(b->get("x"), bytes("hello"));
  EXPECT_TRUE(b->get("empty").empty());
  EXPECT_EQ(b->get("big"), big);
  b->set("x", bytes("again"));  // a later set replaces the value
  EXPECT_EQ(a->get("x"), bytes("again"));
  b->wait({"x", "empty", "big"}, milliseconds(100));
}

TEST(TcpStore, GetAndWaitBlockUntilAnotherClientSets) {
  TcpStoreServer server("127.0.0.1", 0);
  auto reader = TcpStore::connect("127.0.0.1", server.port(), milliseconds(10000));
  std::thread writer([port = server.port()] {
    auto w = TcpStore::connect("127.0.0.1", port, milliseconds(5000));
    std::this_thread::sleep_for(milliseconds(200));
    w->set("late/1", bytes("one"));
    std::this_thread::sleep_for(milliseconds(100));
    w->set("late/2", bytes("two"));
  });
  EXPECT_EQ(reader->get("late/1"), bytes("one"));
  reader->wait({"late/1", "late/2"}, milliseconds(5000));
  EXPECT_EQ(reader->get("late/2"), bytes("two"));
  writer.join();
}

TEST(TcpStore, WaitTimesOutNamingTheMissingKeysAndTheAddress) {
  TcpStoreServer server("127.0.0.1", 0);
  auto c = TcpStore::connect("127.0.0.1", server.port(), milliseconds(300));
  c->set("here", bytes("1"));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { c->wait({"here", "missing"}, milliseconds(300)); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(3000));
  EXPECT_NE(e.find("'missing' not set within 300 ms"), std::string::npos) << e;
  EXPECT_EQ(e.find("'here'"), std::string::npos) << e;
  EXPECT_NE(e.find("127.0.0.1:" + std::to_string(server.port())), std::string::npos) << e;
  // get waits for the client's timeout.
  EXPECT_NE(error_of([&] { c->get("never"); }).find("'never' not set"), std::string::npos);
}

TEST(TcpStore, ConnectRetriesUntilTheServerListens) {
  int port = 0;
  { port = TcpStoreServer("127.0.0.1", 0).port(); }  // a port free a moment ago
  std::unique_ptr<TcpStoreServer> server;
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(300));
    server = std::make_unique<TcpStoreServer>("127.0.0.1", port);
  });
  std::shared_ptr<TcpStore> c;
  try {
    c = TcpStore::connect("127.0.0.1", port, milliseconds(10000));
  } catch (const Error& e) {
    later.join();
    GTEST_SKIP() << "port " << port << " was taken meanwhile: " << e.what();
  }
  later.join();
  c->set("k", bytes("v"));
  EXPECT_EQ(c->get("k"), bytes("v"));
}

TEST(TcpStore, BadAddressesFailNamingThem) {
  int port = 0;
  { port = TcpStoreServer("127.0.0.1", 0).port(); }  // nothing listens there now
  const auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of([&] { TcpStore::connect("127.0.0.1", port, milliseconds(300)); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(3000));
  EXPECT_NE(e.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e;
  EXPECT_NE(e.find("nothing answered within 300 ms"), std::string::npos) << e;

  e = error_of([&] { TcpStore::connect("no-such-host.invalid", 29500, milliseconds(300)); });
  EXPECT_NE(e.find("cannot resolve 'no-such-host.invalid'"), std::string::npos) << e;

  TcpStoreServer taken("127.0.0.1", 0);
  e = error_of([&] { TcpStoreServer again("127.0.0.1", taken.port()); });
  EXPECT_NE(e.find("cannot listen on 127.0.0.1:" + std::to_string(taken.port())), std::string::npos) << e;
}

TEST(TcpStore, AClientOfAStoppedServerFailsNamingIt) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  auto c = TcpStore::connect("127.0.0.1", server->port(), milliseconds(1000));
  c->set("k", bytes("v"));
  server.reset();
  const std::string e = error_of([&] { c->get("k"); });
  EXPECT_NE(e.find("rendezvous store at 127.0.0.1:"), std::string::npos) << e;
}

TEST(TcpStore, GlooGroupsMeetThroughIt) {
  TcpStoreServer server("127.0.0.1", 0);
  constexpr int kRanks = 3;
  RankWorkers workers(kRanks);
  std::vector<std::unique_ptr<Communicator>> comms(kRanks);
  workers.run([&](int r) {
    // A client per rank, as each host's process has its own.
    GlooRendezvous rendezvous =
        GlooRendezvous::tcp(TcpStore::connect("127.0.0.1", server.port(), milliseconds(10000)));
    comms[r] = connect_gloo(rendezvous, r, kRanks, "over-tcp");
  });
  workers.run([&](int r) {
    Tensor t = Tensor::zeros({4}, DType::kI64);
    for (int i = 0; i < 4; ++i) t.data_as<int64_t>()[i] = (r + 1) * (i + 1);
    comms[r]->all_reduce(t);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(t.data_as<int64_t>()[i], 6 * (i + 1));
  });
}

TEST(TcpStore, AGlooRankWhosePeersNeverComeFailsNamingTheGroup) {
  TcpStoreServer server("127.0.0.1", 0);
  GlooRendezvous rendezvous =
      GlooRendezvous::tcp(TcpStore::connect("127.0.0.1", server.port(), milliseconds(300)));
  GlooOptions options;
  options.timeout = milliseconds(300);  // gloo waits for its peers' keys this long
  const std::string e = error_of([&] { connect_gloo(rendezvous, 0, 2, "lonely", options); });
  EXPECT_NE(e.find("gloo group 'lonely'"), std::string::npos) << e;
  EXPECT_NE(e.find("not set within 300 ms"), std::string::npos) << e;
}

TEST(HostAddress, TheRouteToLoopbackStartsAtLoopback) {
  EXPECT_EQ(local_address_towards("127.0.0.1", 29500), "127.0.0.1");
  EXPECT_NE(error_of([] { local_address_towards("no-such-host.invalid", 29500); }).find("cannot resolve"),
            std::string::npos);
}

}  // namespace
}  // namespace m3
