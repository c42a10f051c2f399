// The TCPStore server speaking torch's TCPStore protocol (store/torch_store_protocol.h):
// every command a torch client sends, one key space shared with ringtree's clients, waits
// and their cancellation, and every misbehaviour closing that one connection only. The
// Python tests drive the same server with torch's own client.
//
// Every blocking call carries a timeout of a few seconds, so a regression fails a test
// instead of hanging the binary.

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <sys/socket.h>

#include <ringtree/error.h>
#include <ringtree/store/tcp_store.h>

#include "common/socket.h"
#include "harness/test_util.h"
#include "store/torch_store_protocol.h"

namespace ringtree {
namespace {

namespace torch = torch_store_protocol;
using test::eventually;
using std::chrono::milliseconds;
using torch::Query;

constexpr milliseconds kShortTimeout(2000);
const char* const kLocalHost = "127.0.0.1";

std::unique_ptr<TcpStore> startServer(TcpStoreOptions options = {}) {
  options.isServer = true;
  options.port = 0;
  return std::make_unique<TcpStore>(kLocalHost, options, kShortTimeout);
}

// A command as torch's client encodes it.
class Command {
 public:
  explicit Command(Query query) { bytes_.push_back(static_cast<uint8_t>(query)); }
  Command& u32(uint32_t v) {
    torch::appendU32(bytes_, v);
    return *this;
  }
  Command& u64(uint64_t v) {
    torch::appendI64(bytes_, static_cast<int64_t>(v));
    return *this;
  }
  Command& str(const std::string& s) {
    torch::appendValue(bytes_, toBytes(s));
    return *this;
  }
  Command& key(const std::string& k) { return str("/" + k); }
  Command& keys(const std::vector<std::string>& ks) {
    u64(ks.size());
    for (const auto& k : ks) key(k);
    return *this;
  }
  const Bytes& bytes() const { return bytes_; }

 private:
  Bytes bytes_;
};

// A hand-driven torch-protocol connection.
class TorchClient {
 public:
  explicit TorchClient(uint16_t port, bool validate = true) {
    std::string error;
    const auto addresses = net::resolve(kLocalHost, port, &error);
    EXPECT_FALSE(addresses.empty()) << error;
    if (addresses.empty()) return;
    EXPECT_EQ(net::connectTo(addresses.front(), net::deadlineAfter(kShortTimeout), &socket_), 0);
    if (validate) {
      EXPECT_TRUE(send(Command(Query::kValidate).u32(torch::kValidationMagic)));
      EXPECT_TRUE(send(Command(Query::kPing).u32(77)));
      EXPECT_EQ(readU32(), 77u);
    }
  }

  bool send(const Command& c) { return sendBytes(c.bytes()); }
  bool sendBytes(const Bytes& b) {
    return net::sendAll(socket_.fd(), b.data(), b.size(), net::deadlineAfter(kShortTimeout)).ok();
  }

  uint8_t readU8() {
    uint8_t v = 0xff;
    EXPECT_TRUE(read(&v, 1));
    return v;
  }
  uint32_t readU32() {
    uint8_t b[4] = {};
    EXPECT_TRUE(read(b, 4));
    return b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  int64_t readI64() {
    uint8_t b[8] = {};
    EXPECT_TRUE(read(b, 8));
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(b[i]) << (8 * i);
    return static_cast<int64_t>(u);
  }
  std::string readValue() {
    const int64_t n = readI64();
    std::string s(static_cast<size_t>(n), '\0');
    EXPECT_TRUE(read(s.data(), s.size()));
    return s;
  }

  // True when nothing arrives within ms.
  bool silentFor(milliseconds ms) {
    uint8_t byte = 0;
    return net::recvAll(socket_.fd(), &byte, 1, net::deadlineAfter(ms)).status == net::IoStatus::kTimeout;
  }

  // Keeps what the kernel buffers for this side small (no autotuning up to tcp_rmem's
  // maximum), so that a large reply cannot be sent whole while nobody reads it.
  void limitReceiveBuffer() {
    const int bytes = 64 << 10;
    ASSERT_EQ(::setsockopt(socket_.fd(), SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes)), 0);
  }

  // Reads until the server closes the connection (true: an orderly close, or a reset when
  // the server dropped it with bytes still queued) or 20 s pass (false, generous for the
  // sanitizer builds); *bytes: how many came.
  bool readUntilClosed(size_t* bytes) {
    std::vector<uint8_t> chunk(1 << 16);
    *bytes = 0;
    const auto deadline = net::deadlineAfter(std::chrono::seconds(20));
    for (;;) {
      const ssize_t n = ::recv(socket_.fd(), chunk.data(), chunk.size(), MSG_DONTWAIT);
      if (n == 0) return true;
      if (n > 0) {
        *bytes += static_cast<size_t>(n);
        continue;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
      if (net::Clock::now() > deadline) return false;
      std::this_thread::sleep_for(milliseconds(1));
    }
  }

  // True when the server closes the connection within 2 s without sending anything more.
  bool closedByServer() {
    uint8_t byte = 0;
    return net::recvAll(socket_.fd(), &byte, 1, net::deadlineAfter(kShortTimeout)).status == net::IoStatus::kClosed;
  }

 private:
  bool read(void* p, size_t n) { return net::recvAll(socket_.fd(), p, n, net::deadlineAfter(kShortTimeout)).ok(); }

  net::Socket socket_;
};

TEST(TorchStoreProtocol, EveryCommandAndOneKeySpaceWithRingtreeClients) {
  auto server = startServer();
  TorchClient t(server->port());

  ASSERT_TRUE(t.send(Command(Query::kSet).key("a").str("alpha")));
  ASSERT_TRUE(t.send(Command(Query::kGet).key("a")));
  EXPECT_EQ(t.readValue(), "alpha");
  EXPECT_EQ(toString(server->get("a")), "alpha") << "torch's '/a' is ringtree's 'a'";
  server->set("b", toBytes("beta"));
  ASSERT_TRUE(t.send(Command(Query::kGet).key("b")));
  EXPECT_EQ(t.readValue(), "beta");
  ASSERT_TRUE(t.send(Command(Query::kGet).key("missing")));
  EXPECT_EQ(t.readValue(), "");

  ASSERT_TRUE(t.send(Command(Query::kAdd).key("n").u64(5)));
  EXPECT_EQ(t.readI64(), 5);
  ASSERT_TRUE(t.send(Command(Query::kAdd).key("n").u64(static_cast<uint64_t>(-7))));
  EXPECT_EQ(t.readI64(), -2);
  EXPECT_EQ(server->add("n", 0), -2);

  ASSERT_TRUE(t.send(Command(Query::kCompareSet).key("cas").str("").str("first")));
  EXPECT_EQ(t.readValue(), "first");
  ASSERT_TRUE(t.send(Command(Query::kCompareSet).key("cas").str("wrong").str("x")));
  EXPECT_EQ(t.readValue(), "first");
  ASSERT_TRUE(t.send(Command(Query::kCompareSet).key("absent").str("exp").str("x")));
  EXPECT_EQ(t.readValue(), "exp");

  ASSERT_TRUE(t.send(Command(Query::kCheck).keys({"a", "b"})));
  EXPECT_EQ(t.readU8(), torch::kReady);
  ASSERT_TRUE(t.send(Command(Query::kCheck).keys({"a", "absent"})));
  EXPECT_EQ(t.readU8(), torch::kNotReady);

  ASSERT_TRUE(t.send(Command(Query::kAppend).key("log").str("ab")));
  ASSERT_TRUE(t.send(Command(Query::kAppend).key("log").str("c")));
  ASSERT_TRUE(t.send(Command(Query::kGet).key("log")));  // appends have no reply: this orders them
  EXPECT_EQ(t.readValue(), "abc");
  EXPECT_EQ(toString(server->get("log")), "abc");

  Command multiSet(Query::kMultiSet);
  multiSet.u64(2).key("m1").str("1").key("m2").str("2");
  ASSERT_TRUE(t.send(multiSet));
  ASSERT_TRUE(t.send(Command(Query::kMultiGet).keys({"m2", "m1"})));
  EXPECT_EQ(t.readValue(), "2");
  EXPECT_EQ(t.readValue(), "1");

  ASSERT_TRUE(t.send(Command(Query::kGetNumKeys)));
  const int64_t keys = t.readI64();
  EXPECT_EQ(keys, server->numKeys());
  ASSERT_TRUE(t.send(Command(Query::kDeleteKey).key("m1")));
  EXPECT_EQ(t.readI64(), 1);
  ASSERT_TRUE(t.send(Command(Query::kDeleteKey).key("m1")));
  EXPECT_EQ(t.readI64(), 0);
  EXPECT_EQ(server->numKeys(), keys - 1);
}

TEST(TorchStoreProtocol, CommandsSentTogetherOrByteByByteAreAllServed) {
  auto server = startServer();
  TorchClient t(server->port());
  Bytes stream;
  for (const Command& c : {Command(Query::kSet).key("x").str(std::string(100000, 'x')),
                           Command(Query::kAdd).key("y").u64(2), Command(Query::kGet).key("x")}) {
    stream.insert(stream.end(), c.bytes().begin(), c.bytes().end());
  }
  ASSERT_TRUE(t.sendBytes(stream));
  EXPECT_EQ(t.readI64(), 2);
  EXPECT_EQ(t.readValue().size(), 100000u);

  const Command get = Command(Query::kGet).key("y");
  for (const uint8_t byte : get.bytes()) ASSERT_TRUE(t.sendBytes(Bytes{byte}));
  EXPECT_EQ(t.readValue(), "2");
}

TEST(TorchStoreProtocol, WaitIsAnsweredByAWriteOfAnotherClientAndCanBeCanceled) {
  auto server = startServer();
  TorchClient t(server->port());
  ASSERT_TRUE(t.send(Command(Query::kWait).keys({"w1", "w2"})));
  EXPECT_TRUE(t.silentFor(milliseconds(200)));
  server->set("w1", toBytes("1"));
  EXPECT_TRUE(t.silentFor(milliseconds(100)));
  server->set("w2", toBytes("2"));
  EXPECT_EQ(t.readU8(), torch::kStopWaiting);

  // A wait that times out on the client's side: the client cancels it.
  ASSERT_TRUE(t.send(Command(Query::kWait).keys({"never"})));
  EXPECT_TRUE(t.silentFor(milliseconds(100)));
  ASSERT_TRUE(t.send(Command(Query::kCancelWait)));
  EXPECT_EQ(t.readU8(), torch::kWaitCanceled);
  server->set("never", toBytes("late"));  // the canceled wait is not answered
  ASSERT_TRUE(t.send(Command(Query::kGet).key("never")));
  EXPECT_EQ(t.readValue(), "late");

  // A cancel that crosses the answer: both replies come, in order.
  ASSERT_TRUE(t.send(Command(Query::kWait).keys({"never"})));
  EXPECT_EQ(t.readU8(), torch::kStopWaiting);
  ASSERT_TRUE(t.send(Command(Query::kCancelWait)));
  EXPECT_EQ(t.readU8(), torch::kWaitCanceled);
}

TEST(TorchStoreProtocol, MisbehaviourClosesThatConnectionOnly) {
  auto server = startServer();
  const uint16_t port = server->port();
  const auto expectClosedAfter = [&](const Bytes& bytes, bool validate, const char* what) {
    TorchClient t(port, validate);
    t.sendBytes(bytes);
    EXPECT_TRUE(t.closedByServer()) << what;
  };
  expectClosedAfter(Command(Query::kSet).key("k").str("v").bytes(), false, "a command before VALIDATE");
  expectClosedAfter(Command(Query::kValidate).u32(0x12345678).bytes(), false, "VALIDATE with a wrong magic");
  expectClosedAfter(Command(Query::kValidate).u32(torch::kValidationMagic).bytes(), true, "a second VALIDATE");
  expectClosedAfter(Bytes{14, 0, 0, 0}, true, "an unsupported query (QUEUE_PUSH)");
  // A length of 1 TiB: refused from its header, nothing allocated.
  expectClosedAfter(Command(Query::kSet).u64(uint64_t{1} << 40).bytes(), true, "a key over the size limit");
  expectClosedAfter(Command(Query::kCheck).u64(uint64_t{1} << 40).bytes(), true, "a key list over the limit");
  {
    TorchClient t(port);
    ASSERT_TRUE(t.send(Command(Query::kWait).keys({"never"})));
    ASSERT_TRUE(t.send(Command(Query::kGet).key("x")));
    EXPECT_TRUE(t.closedByServer()) << "a command other than CANCEL_WAIT while a WAIT is pending";
  }
  // The server still serves both kinds of client.
  TorchClient t(port);
  ASSERT_TRUE(t.send(Command(Query::kAdd).key("alive").u64(1)));
  EXPECT_EQ(t.readI64(), 1);
  TcpStoreOptions options;
  options.isServer = false;
  options.port = port;
  TcpStore client(kLocalHost, options, kShortTimeout);
  EXPECT_EQ(client.add("alive", 1), 2);
}

TEST(TorchStoreProtocol, AClientThatDoesNotReadItsRepliesCannotPileThemUp) {
  auto server = startServer();
  const std::string value(size_t{16} << 20, 'v');
  {
    TorchClient t(server->port());
    t.limitReceiveBuffer();
    ASSERT_TRUE(t.send(Command(Query::kSet).key("big").str(value)));
    ASSERT_TRUE(eventually([&] { return server->numServerClients() == 2; }, std::chrono::seconds(20)))
        << "VALIDATE was not admitted";
    // Two GETs, and nothing read until the server has dropped the connection: the first
    // reply does not fit the socket buffers (64 KiB here, at most tcp_wmem's maximum on the
    // server's side), so the second request arrives while it is still being sent. (Reading
    // at once would race the server: a fast reader can drain the first reply before the
    // second request is parsed.)
    ASSERT_TRUE(t.send(Command(Query::kGet).key("big")));
    ASSERT_TRUE(t.send(Command(Query::kGet).key("big")));
    EXPECT_TRUE(eventually([&] { return server->numServerClients() == 1; }, std::chrono::seconds(20)))
        << "the server kept the connection";
    size_t received = 0;
    EXPECT_TRUE(t.readUntilClosed(&received));
    EXPECT_LT(received, 2 * value.size()) << "the second reply was never built";
  }
  {
    // A MULTI_GET whose reply would pass 4 GiB is refused before anything is allocated.
    TorchClient t(server->port());
    ASSERT_TRUE(t.send(Command(Query::kMultiGet).keys(std::vector<std::string>(300, "big"))));
    EXPECT_TRUE(t.closedByServer());
  }
  TorchClient t(server->port());
  ASSERT_TRUE(t.send(Command(Query::kAdd).key("alive").u64(1)));
  EXPECT_EQ(t.readI64(), 1);
}

TEST(TorchStoreProtocol, ServerWithSharedSecretRefusesTorchClients) {
  TcpStoreOptions options;
  options.token = "s3cret";
  auto server = startServer(options);
  TorchClient t(server->port(), false);
  t.send(Command(Query::kValidate).u32(torch::kValidationMagic));
  EXPECT_TRUE(t.closedByServer());
}

TEST(TorchStoreProtocol, ParserNeedsEveryByteAndNothingMore) {
  Command c(Query::kMultiSet);
  c.u64(2).key("k1").str("v1").key("k2").str("");
  const Bytes& bytes = c.bytes();
  const torch::Limits limits{1 << 20, 16};
  for (size_t size = 0; size < bytes.size(); ++size) {
    torch::Command command;
    size_t consumed = 0;
    std::string error;
    EXPECT_EQ(torch::parseCommand(bytes.data(), size, limits, &command, &consumed, &error),
              torch::ParseResult::kIncomplete)
        << size;
  }
  Bytes twice = bytes;
  twice.insert(twice.end(), bytes.begin(), bytes.end());
  torch::Command command;
  size_t consumed = 0;
  std::string error;
  ASSERT_EQ(torch::parseCommand(twice.data(), twice.size(), limits, &command, &consumed, &error),
            torch::ParseResult::kComplete);
  EXPECT_EQ(consumed, bytes.size());
  EXPECT_EQ(command.keys, (std::vector<std::string>{"k1", "k2"}));
  EXPECT_EQ(toString(command.values[0]), "v1");
  EXPECT_TRUE(command.values[1].empty());

  Command tooMany(Query::kWait);
  tooMany.u64(17);
  EXPECT_EQ(torch::parseCommand(tooMany.bytes().data(), tooMany.bytes().size(), limits, &command, &consumed, &error),
            torch::ParseResult::kMalformed);
  EXPECT_NE(error.find("17 keys"), std::string::npos) << error;
}

}  // namespace
}  // namespace ringtree
