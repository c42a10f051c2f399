#include <ringtree/store/tcp_store.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include <ringtree/error.h>

#include "common/env.h"
#include "common/socket.h"
#include "store/store_util.h"
#include "store/tcp_store_protocol.h"
#include "store/tcp_store_server.h"

namespace ringtree {

namespace proto = tcp_store_protocol;
using net::Clock;
using net::Deadline;
using std::chrono::milliseconds;

namespace {

// Time the client grants the server beyond a request's own timeout before it declares
// the server unresponsive (the server answers timeouts itself; this only catches a hung
// server or a dead network path).
constexpr milliseconds kReplyMargin = std::chrono::seconds(5);
// Bounds on one connection attempt to one address: at least this long even when the
// store timeout is shorter, at most this long so that other addresses get their turn.
constexpr milliseconds kMinConnectAttempt = std::chrono::seconds(1);
constexpr milliseconds kMaxConnectAttempt = std::chrono::seconds(10);
// Pause between connection rounds: doubles from the first to the maximum.
constexpr milliseconds kFirstBackoff(10);
constexpr milliseconds kMaxBackoff(1000);

// Throws InvalidArgument for more keys than one request may carry.
void checkKeyCount(const std::vector<std::string>& keys, const char* name) {
  if (keys.size() > proto::kMaxKeysPerRequest) {
    throw InvalidArgument("TCPStore " + std::string(name) + ": " + std::to_string(keys.size()) +
                          " keys in one request; at most " + std::to_string(proto::kMaxKeysPerRequest) +
                          " are allowed");
  }
}

int64_t elapsedMs(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

}  // namespace

// One connection to the server. Every request holds mutex_ from send to the end of the
// reply. After an I/O failure or a malformed reply the stream position is unknown, so the
// connection is closed for good and every later request throws NetworkError.
class TcpStore::Client {
 public:
  struct Reply {
    proto::Status status = proto::Status::kOk;
    Bytes payload;
  };

  // Connects (retrying with backoff until timeout) and performs the handshake. Throws
  // NetworkError when no connection could be made in time or the server refused us.
  Client(const std::string& host, uint16_t port, std::string token, uint32_t maxMessageBytes,
         milliseconds timeout)
      : endpoint_(net::formatHostPort(host, port)), token_(std::move(token)), maxMessageBytes_(maxMessageBytes) {
    if (token_.size() > proto::kMaxTokenBytes) {
      throw InvalidArgument("TCPStore token is " + std::to_string(token_.size()) + " bytes; at most " +
                            std::to_string(proto::kMaxTokenBytes) + " are allowed");
    }
    connect(host, port, timeout);
  }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& token() const { return token_; }
  uint32_t maxMessageBytes() const { return maxMessageBytes_; }

  // Sends one request and returns its reply. kOk and kTimeout are returned; the other
  // statuses throw: kInvalidArgument -> InvalidArgument, kError -> StoreError. `timeout`
  // is how long the server may take to answer (the request's own wait), to which
  // kReplyMargin is added. Throws InvalidArgument for a request over maxMessageBytes,
  // NetworkError when the connection is or gets lost.
  Reply call(proto::Op op, const char* name, proto::Writer&& request, milliseconds timeout) {
    if (request.payloadSize() > maxMessageBytes_) {
      throw InvalidArgument("TCPStore " + std::string(name) + ": request of " +
                            std::to_string(request.payloadSize()) + " bytes exceeds maxMessageBytes (" +
                            std::to_string(maxMessageBytes_) + ")");
    }
    const Bytes frame = std::move(request).frame(static_cast<uint8_t>(op));
    std::lock_guard<std::mutex> lock(mutex_);
    if (!socket_.valid()) {
      throw NetworkError("connection to TCPStore at " + endpoint_ + " was lost earlier (" + lostReason_ +
                         "); cannot " + name);
    }
    const Deadline deadline =
        timeout > milliseconds::max() - kReplyMargin ? net::kNoDeadline : net::deadlineAfter(timeout + kReplyMargin);
    Reply reply = exchange(frame, deadline, name, std::numeric_limits<uint32_t>::max());
    switch (reply.status) {
      case proto::Status::kOk:
      case proto::Status::kTimeout:
        return reply;
      case proto::Status::kInvalidArgument:
        throw InvalidArgument("TCPStore " + std::string(name) + ": " + messageOf(reply, name));
      case proto::Status::kError:
        throw StoreError("TCPStore " + std::string(name) + ": " + messageOf(reply, name));
      case proto::Status::kAuthRefused:
      case proto::Status::kVersionMismatch:
        break;
    }
    throw lose(std::string("unexpected handshake reply to ") + name);
  }

  // Throws NetworkError (and closes the connection) unless a reply payload parsed fine.
  void expect(bool parsed, const char* name) {
    if (parsed) return;
    std::lock_guard<std::mutex> lock(mutex_);
    throw lose(std::string("malformed reply to ") + name);
  }

  // A kGet request (get() and multiGet()) waiting up to timeout; returns the values in key
  // order. Throws StoreError naming the missing keys at the timeout.
  std::vector<Bytes> getValues(const std::vector<std::string>& keys, const char* name, milliseconds timeout) {
    checkKeyCount(keys, name);
    const auto reply = call(proto::Op::kGet, name, std::move(proto::Writer().i64(timeout.count()).keys(keys)), timeout);
    throwIfTimedOut(reply, name, timeout);
    proto::Reader r(reply.payload);
    uint32_t count = 0;
    bool parsed = r.u32(&count) && count == keys.size();
    std::vector<Bytes> values(parsed ? count : 0);
    for (auto& value : values) parsed = parsed && r.bytes(&value);
    expect(parsed && r.done(), name);
    return values;
  }

  // For a kGet/kWait reply: throws StoreError naming the keys the server reported missing.
  void throwIfTimedOut(const Reply& reply, const char* name, milliseconds timeout) {
    if (reply.status != proto::Status::kTimeout) return;
    proto::Reader r(reply.payload);
    std::vector<std::string> missing;
    expect(r.keys(&missing) && r.done(), name);
    detail::throwWaitTimeout("TCPStore", name, timeout, missing);
  }

 private:
  void connect(const std::string& host, uint16_t port, milliseconds timeout) {
    const auto start = Clock::now();
    const Deadline deadline = net::deadlineAfter(timeout);
    milliseconds backoff = kFirstBackoff;
    std::string lastError;
    for (;;) {
      std::string resolveError;
      const auto addresses = net::resolve(host, port, &resolveError);
      if (addresses.empty()) lastError = "cannot resolve " + host + ": " + resolveError;
      for (const auto& address : addresses) {
        const auto now = Clock::now();
        const Deadline attemptDeadline =
            std::min(std::max(deadline, now + kMinConnectAttempt), now + kMaxConnectAttempt);
        net::Socket socket;
        const int error = net::connectTo(address, attemptDeadline, &socket);
        if (error != 0) {
          lastError = address.toString() + ": " + net::errnoText(error);
          continue;
        }
        try {
          net::setNoDelay(socket.fd());
        } catch (const NetworkError&) {
          // Only latency suffers.
        }
        socket_ = std::move(socket);
        if (handshake(std::max(deadline, Clock::now() + kReplyMargin), &lastError)) return;
        socket_.reset();
      }
      if (Clock::now() >= deadline) {
        throw NetworkError("cannot connect to TCPStore at " + endpoint_ + " within " +
                           std::to_string(timeout.count()) + " ms (tried for " + std::to_string(elapsedMs(start)) +
                           " ms): " + lastError);
      }
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      std::this_thread::sleep_for(std::max(milliseconds(1), std::min(backoff, left)));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }

  // HELLO exchange on socket_. Returns true when accepted; false (with *error set) when
  // the attempt failed in a way worth retrying; throws NetworkError when refused.
  bool handshake(Deadline deadline, std::string* error) {
    const Bytes hello =
        std::move(proto::Writer().u32(proto::kVersion).str(token_)).frame(static_cast<uint8_t>(proto::Op::kHello));
    Reply reply;
    try {
      reply = exchange(hello, deadline, "handshake", proto::kMaxHelloPayload);
    } catch (const NetworkError& e) {
      *error = e.what();
      return false;
    }
    proto::Reader r(reply.payload);
    switch (reply.status) {
      case proto::Status::kOk: {
        uint32_t version = 0;
        if (r.u32(&version) && r.done() && version == proto::kVersion) return true;
        *error = "malformed handshake reply from " + endpoint_;
        return false;
      }
      case proto::Status::kAuthRefused: {
        std::string reason;
        if (!(r.str(&reason) && r.done())) reason = "shared secret mismatch";
        throw NetworkError("TCPStore at " + endpoint_ + " refused this client: " + reason +
                           " (RINGTREE_STORE_TOKEN / token)");
      }
      case proto::Status::kVersionMismatch: {
        uint32_t version = 0;
        const std::string theirs = r.u32(&version) ? std::to_string(version) : std::string("another");
        throw NetworkError("TCPStore at " + endpoint_ + " speaks protocol version " + theirs +
                           "; this client speaks version " + std::to_string(proto::kVersion) +
                           " (mixed ringtree versions?)");
      }
      case proto::Status::kTimeout:
      case proto::Status::kInvalidArgument:
      case proto::Status::kError:
        break;
    }
    *error = "unexpected handshake reply from " + endpoint_ + " (not a ringtree TCPStore?)";
    return false;
  }

  // Sends frame and reads one reply of at most maxReply payload bytes. Caller holds
  // mutex_ (or is the constructor). Throws NetworkError (closing the connection) on any
  // failure.
  Reply exchange(const Bytes& frame, Deadline deadline, const char* name, uint32_t maxReply) {
    net::IoResult io = net::sendAll(socket_.fd(), frame.data(), frame.size(), deadline);
    if (!io.ok()) throw lost(io, name);
    uint8_t headerBytes[proto::kHeaderSize];
    io = net::recvAll(socket_.fd(), headerBytes, sizeof(headerBytes), deadline);
    if (!io.ok()) throw lost(io, name);
    proto::Header header;
    if (!proto::decodeHeader(headerBytes, &header) || !proto::isKnownStatus(header.code) ||
        header.length > maxReply) {
      throw lose(std::string("malformed reply header to ") + name + " (not a ringtree TCPStore?)");
    }
    Reply reply;
    reply.status = static_cast<proto::Status>(header.code);
    reply.payload.resize(header.length);
    io = net::recvAll(socket_.fd(), reply.payload.data(), reply.payload.size(), deadline);
    if (!io.ok()) throw lost(io, name);
    return reply;
  }

  std::string messageOf(const Reply& reply, const char* name) {
    proto::Reader r(reply.payload);
    std::string message;
    if (!(r.str(&message) && r.done())) throw lose(std::string("malformed error reply to ") + name);
    return message;
  }

  NetworkError lost(const net::IoResult& io, const char* name) {
    if (io.status == net::IoStatus::kTimeout) {
      return lose("TCPStore at " + endpoint_ + " did not answer " + name + " in time (timeout + " +
                  std::to_string(kReplyMargin.count()) + " ms margin)");
    }
    return lose("connection to TCPStore at " + endpoint_ + " lost during " + name + ": " + io.describe());
  }

  // Closes the connection for good; returns the error to throw. Caller holds mutex_.
  NetworkError lose(const std::string& reason) {
    socket_.reset();
    lostReason_ = reason;
    const bool named = reason.find(endpoint_) != std::string::npos;
    return NetworkError(named ? reason : "TCPStore at " + endpoint_ + ": " + reason);
  }

  const std::string endpoint_;
  const std::string token_;
  const uint32_t maxMessageBytes_;
  std::mutex mutex_;
  net::Socket socket_;      // guarded by mutex_; invalid once lost
  std::string lostReason_;  // guarded by mutex_
};

TcpStore::TcpStore(const std::string& host, const TcpStoreOptions& options, Timeout timeout)
    : Store(timeout), host_(host), port_(options.port) {
  const auto deadline = net::deadlineAfter(timeout);
  const std::string token = options.token.empty() ? env::storeToken() : options.token;
  if (options.isServer) {
    TcpStoreOptions serverOptions = options;
    serverOptions.token = token;
    server_ = std::make_unique<TcpStoreServer>(serverOptions);
    port_ = server_->port();
  }
  client_ = std::make_unique<Client>(host_, port_, token, options.maxMessageBytes, timeout);
  if (server_ && options.numWorkers > 0 && options.waitForWorkers &&
      !server_->waitForClients(options.numWorkers, deadline)) {
    throw StoreError("TCPStore at " + client_->endpoint() + ": only " + std::to_string(server_->totalClients()) +
                     " of " + std::to_string(options.numWorkers) + " workers connected within " +
                     std::to_string(timeout.count()) + " ms");
  }
}

TcpStore::~TcpStore() = default;

int TcpStore::numServerClients() const { return server_ ? server_->numClients() : -1; }

int64_t TcpStore::totalServerClients() const { return server_ ? server_->totalClients() : -1; }

std::shared_ptr<Store> TcpStore::clone() {
  TcpStoreOptions options;
  options.port = port_;
  options.token = client_->token();
  options.maxMessageBytes = client_->maxMessageBytes();
  return std::make_shared<TcpStore>(host_, options, timeout());
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  const auto reply = client_->call(proto::Op::kSet, "set", std::move(proto::Writer().str(key).bytes(value)), timeout());
  client_->expect(reply.status == proto::Status::kOk && reply.payload.empty(), "set");
}

Bytes TcpStore::get(const std::string& key) { return client_->getValues({key}, "get", timeout()).front(); }

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const auto reply = client_->call(proto::Op::kAdd, "add", std::move(proto::Writer().str(key).i64(delta)), timeout());
  proto::Reader r(reply.payload);
  int64_t value = 0;
  client_->expect(reply.status == proto::Status::kOk && r.i64(&value) && r.done(), "add");
  return value;
}

Bytes TcpStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const auto reply = client_->call(proto::Op::kCompareSet, "compare_set",
                                   std::move(proto::Writer().str(key).bytes(expected).bytes(desired)), timeout());
  proto::Reader r(reply.payload);
  Bytes value;
  client_->expect(reply.status == proto::Status::kOk && r.bytes(&value) && r.done(), "compare_set");
  return value;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  checkKeyCount(keys, "check");
  const auto reply = client_->call(proto::Op::kCheck, "check", std::move(proto::Writer().keys(keys)), timeout());
  proto::Reader r(reply.payload);
  uint8_t all = 0;
  client_->expect(reply.status == proto::Status::kOk && r.u8(&all) && r.done(), "check");
  return all != 0;
}

void TcpStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  if (timeout.count() < 0) {
    throw InvalidArgument("TCPStore wait: timeout must be >= 0 ms, got " + std::to_string(timeout.count()) + " ms");
  }
  checkKeyCount(keys, "wait");
  const auto reply = client_->call(proto::Op::kWait, "wait",
                                   std::move(proto::Writer().i64(timeout.count()).keys(keys)), timeout);
  client_->throwIfTimedOut(reply, "wait", timeout);
  client_->expect(reply.payload.empty(), "wait");
}

bool TcpStore::deleteKey(const std::string& key) {
  const auto reply = client_->call(proto::Op::kDelete, "delete_key", std::move(proto::Writer().str(key)), timeout());
  proto::Reader r(reply.payload);
  uint8_t existed = 0;
  client_->expect(reply.status == proto::Status::kOk && r.u8(&existed) && r.done(), "delete_key");
  return existed != 0;
}

int64_t TcpStore::numKeys() {
  const auto reply = client_->call(proto::Op::kNumKeys, "num_keys", proto::Writer(), timeout());
  proto::Reader r(reply.payload);
  int64_t count = 0;
  client_->expect(reply.status == proto::Status::kOk && r.i64(&count) && r.done(), "num_keys");
  return count;
}

void TcpStore::append(const std::string& key, const Bytes& value) {
  const auto reply =
      client_->call(proto::Op::kAppend, "append", std::move(proto::Writer().str(key).bytes(value)), timeout());
  client_->expect(reply.status == proto::Status::kOk && reply.payload.empty(), "append");
}

std::vector<Bytes> TcpStore::multiGet(const std::vector<std::string>& keys) {
  return client_->getValues(keys, "multi_get", timeout());
}

void TcpStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw InvalidArgument("multi_set: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  }
  checkKeyCount(keys, "multi_set");
  proto::Writer w;
  w.u32(static_cast<uint32_t>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) w.str(keys[i]).bytes(values[i]);
  const auto reply = client_->call(proto::Op::kMultiSet, "multi_set", std::move(w), timeout());
  client_->expect(reply.status == proto::Status::kOk && reply.payload.empty(), "multi_set");
}

}  // namespace ringtree
