// The TCPStore server's handling of ringtree's own protocol (store/tcp_store_protocol.h):
// reading frames, the handshake, and every request.

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <limits>

#include <ringtree/error.h>

#include "common/logging.h"
#include "store/tcp_store_server_impl.h"

namespace ringtree {

namespace proto = tcp_store_protocol;
using net::Deadline;

namespace {

// First allocation for a payload; the buffer then doubles up to the frame's length.
constexpr size_t kInitialPayloadBuffer = size_t{64} << 10;
// Longest wait a request may ask for (about a year), so that deadlines never overflow.
constexpr int64_t kMaxWaitMs = int64_t{365} * 24 * 3600 * 1000;

// Compares in time that depends only on the lengths, not on where the contents differ.
bool constantTimeEquals(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const auto x = static_cast<unsigned char>(i < a.size() ? a[i] : 0);
    const auto y = static_cast<unsigned char>(i < b.size() ? b[i] : 0);
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

const char* opName(uint8_t code) {
  switch (static_cast<proto::Op>(code)) {
    case proto::Op::kHello: return "HELLO";
    case proto::Op::kSet: return "SET";
    case proto::Op::kGet: return "GET";
    case proto::Op::kAdd: return "ADD";
    case proto::Op::kCompareSet: return "COMPARE_SET";
    case proto::Op::kCheck: return "CHECK";
    case proto::Op::kWait: return "WAIT";
    case proto::Op::kDelete: return "DELETE";
    case proto::Op::kNumKeys: return "NUM_KEYS";
    case proto::Op::kAppend: return "APPEND";
    case proto::Op::kMultiSet: return "MULTI_SET";
  }
  return "unknown op";
}

}  // namespace

void TcpStoreServer::Impl::readFrames(Connection& c) {
  size_t budget = kReadBudget;
  while (!c.closing && budget > 0) {
    if (c.waiter.has_value() || !c.out.empty() || c.closeAfterFlush) {
      // The previous request is unanswered: the peer may only close, never send.
      uint8_t byte = 0;
      const ssize_t n = ::recv(c.socket.fd(), &byte, 1, MSG_DONTWAIT);
      if (n == 0) {
        scheduleClose(c, "closed by the peer with a request pending");
      } else if (n > 0) {
        scheduleClose(c, "sent data before reading the reply to its previous request");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        scheduleClose(c, net::errnoText(errno));
      }
      return;
    }
    uint8_t* target = nullptr;
    size_t wanted = 0;
    if (!c.haveHeader) {
      target = c.headerBytes + c.headerFilled;
      wanted = proto::kHeaderSize - c.headerFilled;
    } else {
      // The buffer grows with the bytes that actually arrive, so a length field that
      // promises more than the peer sends costs nothing.
      if (c.payloadFilled == c.payload.size()) {
        const size_t grown = std::max(c.payload.size() * 2, kInitialPayloadBuffer);
        c.payload.resize(std::min<size_t>(grown, c.header.length));
      }
      target = c.payload.data() + c.payloadFilled;
      wanted = c.payload.size() - c.payloadFilled;
    }
    wanted = std::min(wanted, budget);
    const ssize_t n = ::recv(c.socket.fd(), target, wanted, MSG_DONTWAIT);
    if (n == 0) {
      const bool midFrame = c.headerFilled > 0;
      scheduleClose(c, midFrame ? "closed by the peer in the middle of a frame" : "closed by the peer");
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) scheduleClose(c, net::errnoText(errno));
      return;
    }
    budget -= static_cast<size_t>(n);
    if (!c.haveHeader) {
      c.headerFilled += static_cast<size_t>(n);
      if (c.headerFilled < proto::kHeaderSize || !acceptHeader(c)) continue;
    } else {
      c.payloadFilled += static_cast<size_t>(n);
    }
    if (c.haveHeader && c.payloadFilled == c.header.length) {
      const uint8_t code = c.header.code;
      Bytes payload = std::move(c.payload);
      c.payload = Bytes();
      c.haveHeader = false;
      c.headerFilled = 0;
      c.payloadFilled = 0;
      handleFrame(c, code, payload);
    }
  }
}

// Validates a complete header before anything is allocated for the payload. Returns
// false (and schedules the close) when the frame is refused.
bool TcpStoreServer::Impl::acceptHeader(Connection& c) {
  proto::Header header;
  if (!proto::decodeHeader(c.headerBytes, &header)) {
    scheduleClose(c, "bad frame header (magic or reserved bytes)");
    return false;
  }
  if (!proto::isKnownOp(header.code)) {
    scheduleClose(c, "unknown op " + std::to_string(header.code));
    return false;
  }
  if (!c.authenticated && header.code != static_cast<uint8_t>(proto::Op::kHello)) {
    scheduleClose(c, std::string(opName(header.code)) + " before HELLO");
    return false;
  }
  const uint32_t limit = c.authenticated ? maxMessageBytes_ : proto::kMaxHelloPayload;
  if (header.length > limit) {
    scheduleClose(c, std::string(opName(header.code)) + " frame of " + std::to_string(header.length) +
                         " bytes exceeds the limit of " + std::to_string(limit) + " bytes");
    return false;
  }
  c.header = header;
  c.haveHeader = true;
  c.payload.clear();
  c.payloadFilled = 0;
  return true;
}

void TcpStoreServer::Impl::handleFrame(Connection& c, uint8_t code, const Bytes& payload) {
  const auto op = static_cast<proto::Op>(code);
  proto::Reader r(payload);
  if (!c.authenticated) {  // acceptHeader() let only a HELLO through
    handleHello(c, r);
    return;
  }
  const auto malformed = [&] { scheduleClose(c, std::string("malformed ") + opName(code) + " payload"); };
  switch (op) {
    case proto::Op::kHello:
      scheduleClose(c, "second HELLO");
      return;
    case proto::Op::kSet: {
      std::string key;
      Bytes value;
      if (!(r.str(&key) && r.bytes(&value) && r.done())) return malformed();
      table_.set(key, std::move(value));
      reply(c, proto::Status::kOk, proto::Writer());
      wake(key);
      return;
    }
    case proto::Op::kGet:
    case proto::Op::kWait: {
      int64_t timeoutMs = 0;
      std::vector<std::string> keys;
      if (!(r.i64(&timeoutMs) && timeoutMs >= 0 && r.keys(&keys) && r.done())) return malformed();
      startWait(c, op, std::move(keys), timeoutMs);
      return;
    }
    case proto::Op::kAdd: {
      std::string key;
      int64_t delta = 0;
      if (!(r.str(&key) && r.i64(&delta) && r.done())) return malformed();
      int64_t sum = 0;
      try {
        sum = table_.add(key, delta);  // the client puts "TCPStore add: " before the text
      } catch (const InvalidArgument& e) {
        return replyMessage(c, proto::Status::kInvalidArgument, e.what());
      }
      reply(c, proto::Status::kOk, std::move(proto::Writer().i64(sum)));
      wake(key);
      return;
    }
    case proto::Op::kCompareSet: {
      std::string key;
      Bytes expected;
      Bytes desired;
      if (!(r.str(&key) && r.bytes(&expected) && r.bytes(&desired) && r.done())) return malformed();
      bool written = false;
      const Bytes result = table_.compareSet(key, expected, desired, &written);
      reply(c, proto::Status::kOk, std::move(proto::Writer().bytes(result)));
      if (written) wake(key);
      return;
    }
    case proto::Op::kCheck: {
      std::vector<std::string> keys;
      if (!(r.keys(&keys) && r.done())) return malformed();
      reply(c, proto::Status::kOk, std::move(proto::Writer().u8(table_.firstMissing(keys) == nullptr ? 1 : 0)));
      return;
    }
    case proto::Op::kDelete: {
      std::string key;
      if (!(r.str(&key) && r.done())) return malformed();
      reply(c, proto::Status::kOk, std::move(proto::Writer().u8(table_.erase(key) ? 1 : 0)));
      return;
    }
    case proto::Op::kNumKeys: {
      if (!r.done()) return malformed();
      reply(c, proto::Status::kOk, std::move(proto::Writer().i64(static_cast<int64_t>(table_.size()))));
      return;
    }
    case proto::Op::kAppend: {
      std::string key;
      Bytes value;
      if (!(r.str(&key) && r.bytes(&value) && r.done())) return malformed();
      table_.append(key, value);
      reply(c, proto::Status::kOk, proto::Writer());
      wake(key);
      return;
    }
    case proto::Op::kMultiSet: {
      uint32_t count = 0;
      if (!r.u32(&count) || count > proto::kMaxKeysPerRequest || count > r.remaining() / 8) return malformed();
      // Parse everything first, so that a malformed request changes nothing.
      std::vector<std::pair<std::string, Bytes>> entries(count);
      for (auto& entry : entries) {
        if (!(r.str(&entry.first) && r.bytes(&entry.second))) return malformed();
      }
      if (!r.done()) return malformed();
      for (auto& entry : entries) table_.set(entry.first, std::move(entry.second));
      reply(c, proto::Status::kOk, proto::Writer());
      for (const auto& entry : entries) wake(entry.first);
      return;
    }
  }
}

void TcpStoreServer::Impl::handleHello(Connection& c, proto::Reader& r) {
  uint32_t version = 0;
  std::string token;
  if (!(r.u32(&version) && r.str(&token) && r.done())) {
    scheduleClose(c, "malformed HELLO payload");
    return;
  }
  if (version != proto::kVersion) {
    RINGTREE_INFO("TCPStore server on port " << port_ << ": refused " << c.peer << ": protocol version "
                                             << version << ", server speaks " << proto::kVersion);
    c.closeAfterFlush = true;
    reply(c, proto::Status::kVersionMismatch, std::move(proto::Writer().u32(proto::kVersion)));
    return;
  }
  if (!constantTimeEquals(token, token_)) {
    const char* reason = token_.empty() ? "shared secret mismatch: this server has no token but the client presented one"
                                        : "shared secret mismatch";
    RINGTREE_INFO("TCPStore server on port " << port_ << ": refused " << c.peer << ": " << reason);
    c.closeAfterFlush = true;
    replyMessage(c, proto::Status::kAuthRefused, reason);
    return;
  }
  admit(c);
  reply(c, proto::Status::kOk, std::move(proto::Writer().u32(proto::kVersion)));
}

void TcpStoreServer::Impl::startWait(Connection& c, proto::Op op, std::vector<std::string> keys, int64_t timeoutMs) {
  const std::string* missing = table_.firstMissing(keys);
  if (missing == nullptr) {
    answerWait(c, op, keys);
    return;
  }
  if (timeoutMs == 0) {
    replyTimeout(c, keys);
    return;
  }
  std::string parkedOn = *missing;
  park(c, Waiter{op, std::move(keys), std::move(parkedOn)},
       net::deadlineAfter(std::chrono::milliseconds(std::min(timeoutMs, kMaxWaitMs))));
}

// Replies to a get/wait whose keys all exist.
void TcpStoreServer::Impl::answerWait(Connection& c, proto::Op op, const std::vector<std::string>& keys) {
  if (op == proto::Op::kWait) {
    reply(c, proto::Status::kOk, proto::Writer());
    return;
  }
  uint64_t size = 4;
  for (const auto& key : keys) size += 4 + table_.find(key)->size();
  if (size > std::numeric_limits<uint32_t>::max()) {
    replyMessage(c, proto::Status::kError,
                 "the values of " + std::to_string(keys.size()) + " keys total " + std::to_string(size) +
                     " bytes, more than one reply can carry (4 GiB)");
    return;
  }
  proto::Writer w;
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) w.bytes(*table_.find(key));
  reply(c, proto::Status::kOk, std::move(w));
}

void TcpStoreServer::Impl::replyTimeout(Connection& c, const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (table_.find(key) == nullptr) missing.push_back(key);
  }
  reply(c, proto::Status::kTimeout, std::move(proto::Writer().keys(missing)));
}

void TcpStoreServer::Impl::replyMessage(Connection& c, proto::Status status, const std::string& message) {
  reply(c, status, std::move(proto::Writer().str(message)));
}

// Queues a reply (the connection has none pending: the protocol is request/response).
void TcpStoreServer::Impl::reply(Connection& c, proto::Status status, proto::Writer&& w) {
  send(c, std::move(w).frame(static_cast<uint8_t>(status)));
}

}  // namespace ringtree
