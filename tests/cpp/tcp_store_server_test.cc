// TcpStore server robustness: port 0, many concurrent clients, malformed / truncated /
// oversized / unauthenticated frames, silent and vanishing clients, tokens, timeouts.
// After every misbehaving peer the server must still serve a well-behaved client.
//
// Every blocking call here carries a timeout of a few seconds at most, so a regression
// fails a test instead of hanging the binary.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/error.h>
#include <ringtree/store/tcp_store.h>

#include "common/socket.h"
#include "store/tcp_store_protocol.h"
#include "harness/test_util.h"

namespace ringtree {
namespace {

namespace proto = tcp_store_protocol;
using test::eventually;
using test::ScopedEnv;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kShortTimeout(2000);
// Slack allowed on top of a timeout before an error must have been thrown, and the bound
// of what needs no waiting, in ms (see test_util.h).
constexpr int64_t kMargin = test::kLateBy.count();
constexpr int64_t kPromptMs = test::kPrompt.count();
const char* const kLocalHost = "127.0.0.1";

int64_t msSince(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

std::unique_ptr<TcpStore> startServer(TcpStoreOptions options = {}, milliseconds timeout = kShortTimeout) {
  options.isServer = true;
  options.port = 0;
  return std::make_unique<TcpStore>(kLocalHost, options, timeout);
}

std::unique_ptr<TcpStore> connectClient(uint16_t port, TcpStoreOptions options = {},
                                        milliseconds timeout = kShortTimeout) {
  options.isServer = false;
  options.port = port;
  return std::make_unique<TcpStore>(kLocalHost, options, timeout);
}

// A fresh client does a few round trips correctly.
void expectServes(uint16_t port, const std::string& token = "") {
  TcpStoreOptions options;
  options.token = token;
  auto client = connectClient(port, options);
  static std::atomic<int> round{0};
  const std::string key = "probe/" + std::to_string(round.fetch_add(1));
  client->set(key, toBytes("ok"));
  EXPECT_EQ(toString(client->get(key)), "ok");
  EXPECT_EQ(client->add(key + "/n", 3), 3);
  EXPECT_TRUE(client->check({key, key + "/n"}));
}

Bytes frame(proto::Op op, proto::Writer&& w) { return std::move(w).frame(static_cast<uint8_t>(op)); }

Bytes helloFrame(const std::string& token = "") {
  return frame(proto::Op::kHello, std::move(proto::Writer().u32(proto::kVersion).str(token)));
}

// A hand-driven connection for sending arbitrary bytes.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    std::string error;
    const auto addresses = net::resolve(kLocalHost, port, &error);
    EXPECT_FALSE(addresses.empty()) << error;
    if (addresses.empty()) return;
    const int rc = net::connectTo(addresses.front(), net::deadlineAfter(kShortTimeout), &socket_);
    EXPECT_EQ(rc, 0) << net::errnoText(rc);
  }

  // Sends bytes; false when the server has already closed the connection.
  bool send(const Bytes& bytes) {
    return net::sendAll(socket_.fd(), bytes.data(), bytes.size(), net::deadlineAfter(kShortTimeout)).ok();
  }

  // Reads one reply frame; false on EOF / timeout / bad header.
  bool readReply(proto::Status* status, Bytes* payload) {
    uint8_t header[proto::kHeaderSize];
    if (!net::recvAll(socket_.fd(), header, sizeof(header), net::deadlineAfter(kShortTimeout)).ok()) return false;
    proto::Header h;
    if (!proto::decodeHeader(header, &h)) return false;
    *status = static_cast<proto::Status>(h.code);
    payload->resize(h.length);
    return net::recvAll(socket_.fd(), payload->data(), payload->size(), net::deadlineAfter(kShortTimeout)).ok();
  }

  // Completes the handshake.
  void hello() {
    ASSERT_TRUE(send(helloFrame()));
    proto::Status status = proto::Status::kError;
    Bytes payload;
    ASSERT_TRUE(readReply(&status, &payload));
    ASSERT_EQ(status, proto::Status::kOk);
  }

  // True when the server closes the connection within 2 s without sending anything more.
  bool closedByServer() {
    uint8_t byte = 0;
    const auto io = net::recvAll(socket_.fd(), &byte, 1, net::deadlineAfter(kShortTimeout));
    return io.status == net::IoStatus::kClosed;
  }

  void close() { socket_.reset(); }

 private:
  net::Socket socket_;
};

// ---- basics ----

TEST(TcpStoreServer, PortZeroIsReportedAndServed) {
  auto server = startServer();
  EXPECT_TRUE(server->isServer());
  EXPECT_NE(server->port(), 0);
  auto client = connectClient(server->port());
  EXPECT_FALSE(client->isServer());
  EXPECT_EQ(client->port(), server->port());
  EXPECT_EQ(client->host(), kLocalHost);
  client->set("k", toBytes("v"));
  EXPECT_EQ(toString(server->get("k")), "v");
}

TEST(TcpStoreServer, SemanticsMatchStoreContract) {
  auto server = startServer();
  auto& s = *server;
  EXPECT_EQ(s.numKeys(), 0);
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(s.add("n", -7), -2);
  EXPECT_EQ(toString(s.get("n")), "-2");
  s.set("text", toBytes("abc"));
  EXPECT_THROW(s.add("text", 1), InvalidArgument);
  s.set("big", toBytes("9223372036854775807"));
  EXPECT_THROW(s.add("big", 1), InvalidArgument);

  // compareSet: missing key + empty expected sets; missing + non-empty returns expected.
  EXPECT_EQ(toString(s.compareSet("cas", {}, toBytes("first"))), "first");
  EXPECT_EQ(toString(s.compareSet("cas", toBytes("wrong"), toBytes("x"))), "first");
  EXPECT_EQ(toString(s.compareSet("cas", toBytes("first"), toBytes("second"))), "second");
  EXPECT_EQ(toString(s.compareSet("absent", toBytes("exp"), toBytes("x"))), "exp");
  EXPECT_FALSE(s.check({"absent"}));

  s.append("log", toBytes("a"));
  s.append("log", toBytes("bc"));
  EXPECT_EQ(toString(s.get("log")), "abc");

  // Binary keys and values, and the empty key.
  const std::string binaryKey("k\0ey", 4);
  const Bytes binaryValue = {0, 1, 2, 0, 255};
  s.set(binaryKey, binaryValue);
  EXPECT_EQ(s.get(binaryKey), binaryValue);
  s.set("", toBytes("empty key"));
  EXPECT_EQ(toString(s.get("")), "empty key");

  s.multiSet({"m1", "m2"}, {toBytes("1"), toBytes("2")});
  const auto values = s.multiGet({"m2", "m1"});
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(toString(values[0]), "2");
  EXPECT_EQ(toString(values[1]), "1");
  EXPECT_TRUE(s.multiGet({}).empty());
  EXPECT_THROW(s.multiSet({"a"}, {}), InvalidArgument);

  EXPECT_TRUE(s.check({"m1", "m2", "n"}));
  EXPECT_FALSE(s.check({"m1", "nope"}));
  const int64_t before = s.numKeys();
  EXPECT_TRUE(s.deleteKey("m1"));
  EXPECT_FALSE(s.deleteKey("m1"));
  EXPECT_EQ(s.numKeys(), before - 1);
  EXPECT_THROW(s.wait({"m1"}, milliseconds(-1)), InvalidArgument);
}

TEST(TcpStoreServer, RequestOverMaxMessageBytesIsRefusedClientSide) {
  TcpStoreOptions options;
  options.maxMessageBytes = 1024;
  auto server = startServer(options);
  EXPECT_THROW(server->set("k", Bytes(4096, 'x')), InvalidArgument);
  server->set("k", Bytes(100, 'x'));  // the connection is still usable
  EXPECT_EQ(server->get("k").size(), 100u);
}

TEST(TcpStoreServer, SixtyFourClientsAddConcurrently) {
  auto server = startServer();
  constexpr int kClients = 64;
  constexpr int kAddsPerClient = 1000;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(connectClient(server->port(), {}, std::chrono::seconds(10)));
  EXPECT_EQ(server->numServerClients(), kClients + 1);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        for (int j = 0; j < kAddsPerClient; ++j) clients[i]->add("counter", 1);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "client " << i << ": " << e.what();
        failures.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(toString(server->get("counter")), std::to_string(kClients * kAddsPerClient));
  EXPECT_EQ(server->add("counter", 0), kClients * kAddsPerClient);
}

// ---- blocking get / wait ----

TEST(TcpStoreServer, BlockingGetIsWokenBySetFromAnotherClient) {
  auto server = startServer();
  auto waiter = connectClient(server->port(), {}, std::chrono::seconds(5));
  auto other = connectClient(server->port());
  std::atomic<bool> done{false};
  std::string got;
  std::thread t([&] {
    try {
      got = toString(waiter->get("late"));
    } catch (const std::exception& e) {
      got = e.what();
    }
    done = true;
  });
  // While one client blocks, the server keeps serving the others.
  std::this_thread::sleep_for(milliseconds(50));
  for (int i = 0; i < 20; ++i) other->set("busy/" + std::to_string(i), toBytes("x"));
  EXPECT_EQ(other->numKeys(), 20);
  EXPECT_FALSE(done.load());
  other->set("late", toBytes("finally"));
  t.join();
  EXPECT_EQ(got, "finally");
}

TEST(TcpStoreServer, WaitOnSeveralKeysAndSeveralWaiters) {
  auto server = startServer();
  constexpr int kWaiters = 4;
  std::vector<std::unique_ptr<TcpStore>> waiters;
  for (int i = 0; i < kWaiters; ++i) waiters.push_back(connectClient(server->port(), {}, std::chrono::seconds(5)));
  std::atomic<int> woken{0};
  std::vector<std::thread> threads;
  for (auto& w : waiters) {
    threads.emplace_back([&woken, &w] {
      try {
        w->wait({"x", "y"});
        woken.fetch_add(1);
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(50));
  server->set("x", toBytes("1"));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(woken.load(), 0);  // y is still missing
  server->add("y", 1);
  for (auto& t : threads) t.join();
  EXPECT_EQ(woken.load(), kWaiters);
}

TEST(TcpStoreServer, GetOnMissingKeyTimesOutNamingKeyAndTimeout) {
  auto server = startServer({}, milliseconds(200));
  const auto start = Clock::now();
  try {
    server->get("missing");
    FAIL() << "get of a missing key returned";
  } catch (const StoreError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("missing"), std::string::npos) << message;
    EXPECT_NE(message.find("200 ms"), std::string::npos) << message;
  }
  const auto elapsed = msSince(start);
  EXPECT_GE(elapsed, 190);
  EXPECT_LT(elapsed, 200 + kMargin);

  server->set("present", toBytes("1"));
  try {
    server->wait({"present", "absent"}, milliseconds(100));
    FAIL() << "wait returned";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("keys not set: [absent]"), std::string::npos) << e.what();
  }

  // Timeout 0 checks once.
  const auto zeroStart = Clock::now();
  EXPECT_THROW(server->wait({"absent"}, milliseconds(0)), StoreError);
  EXPECT_LT(msSince(zeroStart), kPromptMs);
  server->wait({"present"}, milliseconds(0));
  // The connection survives timeouts.
  EXPECT_EQ(toString(server->get("present")), "1");
}

// ---- connection management ----

TEST(TcpStoreServer, ConnectionRefusedThrowsNetworkErrorNamingEndpointWithinTimeout) {
  uint16_t port = 0;
  {
    // A port that was free a moment ago and has no listener now.
    net::Socket probe = net::listenTcp(kLocalHost, 0);
    port = net::localPort(probe.fd());
  }
  const auto start = Clock::now();
  try {
    connectClient(port, {}, milliseconds(300));
    FAIL() << "connected to a port without a server";
  } catch (const NetworkError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(std::string(kLocalHost) + ":" + std::to_string(port)), std::string::npos) << message;
    EXPECT_NE(message.find("refused"), std::string::npos) << message;
  }
  const auto elapsed = msSince(start);
  EXPECT_GE(elapsed, 250);  // it retried until the timeout
  EXPECT_LT(elapsed, 300 + kMargin);
}

TEST(TcpStoreServer, NumServerClientsFollowsConnections) {
  auto server = startServer();
  EXPECT_EQ(server->numServerClients(), 1);
  auto a = connectClient(server->port());
  auto b = connectClient(server->port());
  EXPECT_EQ(server->numServerClients(), 3);
  EXPECT_EQ(a->numServerClients(), -1);
  a.reset();
  EXPECT_TRUE(eventually([&] { return server->numServerClients() == 2; }));
  // Connections that never complete the handshake are not clients.
  RawClient silent(server->port());
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(server->numServerClients(), 2);
}

// A port with no listener (free a moment ago). Only for tests that need the port before
// the server exists; the library itself never does this.
uint16_t unusedPort() {
  net::Socket probe = net::listenTcp(kLocalHost, 0);
  return net::localPort(probe.fd());
}

TEST(TcpStoreServer, WaitForWorkersReturnsOnceAllConnected) {
  const uint16_t port = unusedPort();
  TcpStoreOptions options;
  options.isServer = true;
  options.port = port;
  options.numWorkers = 3;
  std::unique_ptr<TcpStore> server;
  std::string error;
  std::thread starter([&] {
    try {
      server = std::make_unique<TcpStore>(kLocalHost, options, std::chrono::seconds(5));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  // Workers may start before the server listens: they retry until it does.
  auto w1 = connectClient(port, {}, std::chrono::seconds(5));
  auto w2 = connectClient(port, {}, std::chrono::seconds(5));
  starter.join();
  ASSERT_TRUE(server) << error;
  EXPECT_EQ(server->numServerClients(), 3);
  EXPECT_EQ(w1->numKeys(), 0);  // the worker count lives in no key
}

TEST(TcpStoreServer, WaitForWorkersTimesOut) {
  TcpStoreOptions options;
  options.numWorkers = 2;
  const auto start = Clock::now();
  try {
    startServer(options, milliseconds(200));
    FAIL() << "constructor returned without the second worker";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 2 workers"), std::string::npos) << e.what();
  }
  EXPECT_LT(msSince(start), 200 + kMargin);
}

TEST(TcpStoreServer, ResolvesHostNamesAndIpv6) {
  auto server = startServer();
  TcpStoreOptions options;
  options.port = server->port();
  TcpStore byName("localhost", options, kShortTimeout);
  byName.set("a", toBytes("1"));
  std::string error;
  if (net::resolve("::1", server->port(), &error).empty()) GTEST_SKIP() << "no IPv6: " << error;
  net::Socket probe;
  std::string unused;
  if (net::connectTo(net::resolve("::1", server->port(), &unused).front(), net::deadlineAfter(kShortTimeout),
                     &probe) != 0) {
    GTEST_SKIP() << "IPv6 loopback not reachable";
  }
  TcpStore byIpv6("::1", options, kShortTimeout);
  EXPECT_EQ(toString(byIpv6.get("a")), "1");
}

TEST(TcpStoreServer, ServerShutdownFailsBlockedClientWithNetworkError) {
  auto server = startServer();
  auto client = connectClient(server->port(), {}, std::chrono::seconds(10));
  std::string error;
  const auto start = Clock::now();
  std::thread t([&] {
    try {
      client->get("never");
    } catch (const NetworkError& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = std::string("wrong exception type: ") + e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(50));
  server.reset();
  t.join();
  EXPECT_LT(msSince(start), kPromptMs);  // at the shutdown, not at the client's 10 s timeout
  EXPECT_NE(error.find("lost during get"), std::string::npos) << error;
  // Later requests fail at once with the same cause.
  try {
    client->set("k", toBytes("v"));
    FAIL() << "set on a lost connection returned";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("lost"), std::string::npos) << e.what();
  }
}

// ---- tokens ----

TEST(TcpStoreServer, MatchingTokenIsAccepted) {
  TcpStoreOptions options;
  options.token = "s3cret";
  auto server = startServer(options);
  auto client = connectClient(server->port(), options);
  client->set("k", toBytes("v"));
  EXPECT_EQ(toString(server->get("k")), "v");
}

void expectRefused(uint16_t port, const std::string& token) {
  TcpStoreOptions options;
  options.token = token;
  const auto start = Clock::now();
  try {
    connectClient(port, options, std::chrono::seconds(20));
    FAIL() << "client with token '" << token << "' was accepted";
  } catch (const NetworkError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("refused this client: shared secret mismatch"), std::string::npos) << message;
    EXPECT_NE(message.find("RINGTREE_STORE_TOKEN"), std::string::npos) << message;
    EXPECT_NE(message.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << message;
  }
  EXPECT_LT(msSince(start), kPromptMs);  // a refusal is final: no retries until the 20 s timeout
}

TEST(TcpStoreServer, WrongOrMissingTokenIsRefused) {
  TcpStoreOptions options;
  options.token = "s3cret";
  auto server = startServer(options);
  expectRefused(server->port(), "wrong");
  expectRefused(server->port(), "s3cre");
  expectRefused(server->port(), "");
  EXPECT_EQ(server->numServerClients(), 1);
  expectServes(server->port(), "s3cret");
}

TEST(TcpStoreServer, TokenPresentedToServerWithoutTokenIsRefused) {
  auto server = startServer();
  expectRefused(server->port(), "unexpected");
}


TEST(TcpStoreServer, TokenFromEnvironment) {
  std::unique_ptr<TcpStore> server;
  {
    ScopedEnv token("RINGTREE_STORE_TOKEN", "from-env");
    server = startServer();
    auto client = connectClient(server->port());
    client->set("k", toBytes("v"));
  }
  {
    ScopedEnv token("RINGTREE_STORE_TOKEN", "");
    expectRefused(server->port(), "");
  }
}

// ---- misbehaving peers: each is dropped alone, and the server serves on ----

TEST(TcpStoreServer, RandomBytesCloseOnlyThatConnection) {
  auto server = startServer();
  auto bystander = connectClient(server->port());
  std::mt19937 rng(12345);
  for (int round = 0; round < 8; ++round) {
    Bytes junk(1 + rng() % 4096);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    RawClient raw(server->port());
    raw.send(junk);
    EXPECT_TRUE(raw.closedByServer()) << "round " << round;
  }
  // The same after a successful handshake.
  for (int round = 0; round < 8; ++round) {
    Bytes junk(1 + rng() % 4096);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    RawClient raw(server->port());
    raw.hello();
    raw.send(junk);
    EXPECT_TRUE(raw.closedByServer()) << "round " << round;
  }
  bystander->set("still", toBytes("here"));
  EXPECT_EQ(toString(bystander->get("still")), "here");
  expectServes(server->port());
}

TEST(TcpStoreServer, MutatedFramesNeverHurtTheServer) {
  auto server = startServer();
  const std::vector<Bytes> valid = {
      frame(proto::Op::kSet, std::move(proto::Writer().str("fuzz/a").str("value"))),
      frame(proto::Op::kGet, std::move(proto::Writer().i64(50).keys({"fuzz/a", "fuzz/b"}))),
      frame(proto::Op::kAdd, std::move(proto::Writer().str("fuzz/n").i64(7))),
      frame(proto::Op::kCompareSet, std::move(proto::Writer().str("fuzz/a").str("value").str("new"))),
      frame(proto::Op::kCheck, std::move(proto::Writer().keys({"fuzz/a", "x", "y"}))),
      frame(proto::Op::kWait, std::move(proto::Writer().i64(50).keys({"fuzz/c"}))),
      frame(proto::Op::kDelete, std::move(proto::Writer().str("fuzz/a"))),
      frame(proto::Op::kAppend, std::move(proto::Writer().str("fuzz/log").str("abc"))),
      frame(proto::Op::kMultiSet, std::move(proto::Writer().u32(2).str("fuzz/m1").str("1").str("fuzz/m2").str("2"))),
  };
  std::mt19937 rng(2024);
  for (int round = 0; round < 300; ++round) {
    Bytes bytes = valid[rng() % valid.size()];
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < flips; ++i) {
      // Mostly the length fields and payload, sometimes the op or a truncation.
      const size_t at = 4 + rng() % (bytes.size() - 4);
      bytes[at] = static_cast<uint8_t>(rng());
    }
    if (rng() % 8 == 0) bytes.resize(rng() % bytes.size());
    RawClient raw(server->port());
    raw.hello();
    raw.send(bytes);
    if (round % 50 == 0) expectServes(server->port());
  }
  EXPECT_TRUE(eventually([&] { return server->numServerClients() == 1; }));
  expectServes(server->port());
}

TEST(TcpStoreServer, RequestsBeforeHelloAreRejected) {
  auto server = startServer();
  {
    RawClient raw(server->port());
    raw.send(frame(proto::Op::kSet, std::move(proto::Writer().str("k").str("v"))));
    EXPECT_TRUE(raw.closedByServer());
  }
  {
    RawClient raw(server->port());
    raw.send(toBytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_TRUE(raw.closedByServer());
  }
  {
    // A HELLO of another protocol version is answered, then closed.
    RawClient raw(server->port());
    raw.send(frame(proto::Op::kHello, std::move(proto::Writer().u32(proto::kVersion + 1).str(""))));
    proto::Status status = proto::Status::kOk;
    Bytes payload;
    ASSERT_TRUE(raw.readReply(&status, &payload));
    EXPECT_EQ(status, proto::Status::kVersionMismatch);
    EXPECT_TRUE(raw.closedByServer());
  }
  EXPECT_FALSE(server->check({"k"}));
  expectServes(server->port());
}

TEST(TcpStoreServer, MalformedFramesCloseTheConnection) {
  TcpStoreOptions options;
  options.maxMessageBytes = 1024;
  auto server = startServer(options);
  const uint16_t port = server->port();
  const auto expectDropped = [port](const Bytes& bytes, bool hello, const char* what) {
    RawClient raw(port);
    if (hello) raw.hello();
    raw.send(bytes);
    EXPECT_TRUE(raw.closedByServer()) << what;
  };
  Bytes set = frame(proto::Op::kSet, std::move(proto::Writer().str("k").str("v")));

  Bytes badMagic = set;
  badMagic[0] ^= 0xff;
  expectDropped(badMagic, true, "bad magic");
  Bytes reserved = set;
  reserved[6] = 1;
  expectDropped(reserved, true, "non-zero reserved byte");
  Bytes unknownOp = set;
  unknownOp[4] = 200;
  expectDropped(unknownOp, true, "unknown op");

  // Length fields: over maxMessageBytes, and the largest u32; refused before allocating.
  Bytes oversized = set;
  proto::storeU32(oversized.data() + 8, 1025);
  expectDropped(oversized, true, "frame over maxMessageBytes");
  proto::storeU32(oversized.data() + 8, 0xffffffffu);
  expectDropped(oversized, true, "4 GiB frame");
  Bytes bigHello = helloFrame();
  proto::storeU32(bigHello.data() + 8, proto::kMaxHelloPayload + 1);
  expectDropped(bigHello, false, "oversized HELLO");

  // Payloads whose inner lengths or counts lie.
  Bytes keyTooLong = frame(proto::Op::kSet, std::move(proto::Writer().u32(1000).u32(0)));
  expectDropped(keyTooLong, true, "key length beyond the payload");
  Bytes hugeCount = frame(proto::Op::kCheck, std::move(proto::Writer().u32(0xffffffffu)));
  expectDropped(hugeCount, true, "key count beyond the payload");
  Bytes multiSetCount = frame(proto::Op::kMultiSet, std::move(proto::Writer().u32(50).str("a").str("b")));
  expectDropped(multiSetCount, true, "multi_set count beyond the payload");
  Bytes trailing = frame(proto::Op::kNumKeys, std::move(proto::Writer().u8(0)));
  expectDropped(trailing, true, "trailing bytes");
  Bytes negativeTimeout = frame(proto::Op::kWait, std::move(proto::Writer().i64(-5).keys({"k"})));
  expectDropped(negativeTimeout, true, "negative timeout");
  expectDropped(helloFrame(), true, "second HELLO");

  EXPECT_EQ(server->numKeys(), 0);  // no malformed request changed anything
  expectServes(port);
}

TEST(TcpStoreServer, TruncatedFramesDoNotBlockOthers) {
  auto server = startServer();
  const uint16_t port = server->port();
  const Bytes set = frame(proto::Op::kSet, std::move(proto::Writer().str("half").str("value")));
  // Half a header and half a payload, left open while others are served.
  RawClient halfHeader(port);
  halfHeader.hello();
  halfHeader.send(Bytes(set.begin(), set.begin() + 5));
  RawClient halfPayload(port);
  halfPayload.hello();
  halfPayload.send(Bytes(set.begin(), set.begin() + proto::kHeaderSize + 3));
  expectServes(port);
  // ... and then closed mid-frame.
  halfHeader.close();
  halfPayload.close();
  EXPECT_TRUE(eventually([&] { return server->numServerClients() == 1; }));
  EXPECT_FALSE(server->check({"half"}));
  expectServes(port);
}

TEST(TcpStoreServer, SilentClientDoesNotBlockAnyone) {
  auto server = startServer();
  RawClient silent(server->port());
  RawClient silentAfterHello(server->port());
  silentAfterHello.hello();
  const auto start = Clock::now();
  expectServes(server->port());
  server->set("k", toBytes("v"));
  EXPECT_EQ(toString(server->get("k")), "v");
  EXPECT_LT(msSince(start), kPromptMs);  // nobody waited for the silent clients
}

TEST(TcpStoreServer, ClientDisconnectingMidWaitIsForgotten) {
  auto server = startServer();
  {
    RawClient raw(server->port());
    raw.hello();
    raw.send(frame(proto::Op::kWait, std::move(proto::Writer().i64(60000).keys({"gone", "other"}))));
    raw.send(frame(proto::Op::kGet, std::move(proto::Writer().i64(60000).keys({"gone"}))));  // pipelined: refused
    EXPECT_TRUE(raw.closedByServer());
  }
  {
    RawClient raw(server->port());
    raw.hello();
    raw.send(frame(proto::Op::kGet, std::move(proto::Writer().i64(60000).keys({"gone"}))));
    std::this_thread::sleep_for(milliseconds(20));
    raw.close();
  }
  EXPECT_TRUE(eventually([&] { return server->numServerClients() == 1; }));
  // Writing the key the vanished client waited for must not touch its connection.
  server->set("gone", toBytes("now"));
  server->set("other", toBytes("too"));
  EXPECT_EQ(toString(server->get("gone")), "now");
  expectServes(server->port());
}

}  // namespace
}  // namespace ringtree
