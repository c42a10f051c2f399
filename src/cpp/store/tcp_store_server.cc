#include "store/tcp_store_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ringtree/error.h>

#include "common/logging.h"
#include "store/store_util.h"
#include "store/tcp_store_protocol.h"

namespace ringtree {

namespace proto = tcp_store_protocol;
using net::Clock;
using net::Deadline;
using net::kNoDeadline;

namespace {

// epoll data of the two fds that are not connections; connection ids start above them.
constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kFirstConnectionId = 2;
constexpr int kMaxEvents = 64;
// A connection that has not completed the handshake by then is closed, so that silent
// peers cannot pile up.
constexpr auto kHelloTimeout = std::chrono::seconds(30);
// How long accepting pauses when the process runs out of file descriptors.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// Bytes read from one connection per readiness event, so that one large upload does not
// starve the others.
constexpr size_t kReadBudget = size_t{1} << 20;
// First allocation for a payload; the buffer then doubles up to the frame's length.
constexpr size_t kInitialPayloadBuffer = size_t{64} << 10;
// Longest wait a request may ask for (about a year), so that deadlines never overflow.
constexpr int64_t kMaxWaitMs = int64_t{365} * 24 * 3600 * 1000;
constexpr uint32_t kEpollReadEvents = EPOLLIN | EPOLLRDHUP;

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

class TcpStoreServer::Impl {
 public:
  explicit Impl(const TcpStoreOptions& options)
      : token_(options.token), maxMessageBytes_(options.maxMessageBytes) {
    listener_ = net::listenTcp(options.bindAddress, options.port);
    port_ = net::localPort(listener_.fd());
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_.valid()) throw NetworkError("TCPStore server: epoll_create1 failed: " + net::errnoText(errno));
    wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake_.valid()) throw NetworkError("TCPStore server: eventfd failed: " + net::errnoText(errno));
    control(EPOLL_CTL_ADD, listener_.fd(), EPOLLIN, kListenerId);
    control(EPOLL_CTL_ADD, wake_.fd(), EPOLLIN, kWakeId);
    thread_ = std::thread([this] { run(); });
  }

  ~Impl() { stop(); }

  uint16_t port() const { return port_; }
  int numClients() const { return numClients_.load(); }

  int64_t totalClients() const {
    std::lock_guard<std::mutex> lock(clientsMutex_);
    return totalClients_;
  }

  bool waitForClients(int count, Deadline deadline) const {
    std::unique_lock<std::mutex> lock(clientsMutex_);
    const auto reached = [&] { return stopped_ || totalClients_ >= count; };
    if (deadline == kNoDeadline) {
      clientsChanged_.wait(lock, reached);
    } else {
      clientsChanged_.wait_until(lock, deadline, reached);
    }
    return !stopped_ && totalClients_ >= count;
  }

  void stop() {
    std::lock_guard<std::mutex> lock(stopMutex_);
    if (!thread_.joinable()) return;
    stopping_.store(true);
    const uint64_t one = 1;
    // The eventfd counter cannot overflow from one write, so this write cannot fail.
    [[maybe_unused]] const ssize_t written = ::write(wake_.fd(), &one, sizeof(one));
    thread_.join();
    {
      std::lock_guard<std::mutex> clientsLock(clientsMutex_);
      stopped_ = true;
    }
    clientsChanged_.notify_all();
  }

 private:
  // A get/wait that could not be answered at once.
  struct Waiter {
    proto::Op op = proto::Op::kWait;
    std::vector<std::string> keys;
    std::string parkedOn;  // the missing key whose write re-checks this waiter
  };

  struct Connection {
    uint64_t id = 0;
    net::Socket socket;
    std::string peer;
    bool authenticated = false;
    bool closing = false;          // scheduled for closing; ignore its events
    bool closeAfterFlush = false;  // handshake refused: close once the reply is sent
    bool writeArmed = false;       // EPOLLOUT registered
    // The frame being read: header first, then exactly header.length payload bytes.
    uint8_t headerBytes[proto::kHeaderSize] = {};
    size_t headerFilled = 0;
    bool haveHeader = false;
    proto::Header header;
    Bytes payload;
    size_t payloadFilled = 0;
    // The reply being written.
    Bytes out;
    size_t outSent = 0;
    std::optional<Waiter> waiter;
    Deadline deadline = kNoDeadline;  // registered in deadlines_ unless kNoDeadline
  };

  void control(int operation, int fd, uint32_t events, uint64_t id) {
    epoll_event event{};
    event.events = events;
    event.data.u64 = id;
    if (::epoll_ctl(epoll_.fd(), operation, fd, &event) != 0) {
      throw NetworkError("TCPStore server: epoll_ctl failed: " + net::errnoText(errno));
    }
  }

  // ---- the loop (everything below runs on the loop thread only) ----

  void run() {
    epoll_event events[kMaxEvents];
    while (!stopping_.load()) {
      const int n = ::epoll_wait(epoll_.fd(), events, kMaxEvents, net::pollTimeoutMs(nextDeadline()));
      if (n < 0) {
        if (errno == EINTR) continue;
        RINGTREE_WARN("TCPStore server on port " << port_ << ": epoll_wait failed, stopping: "
                                                 << net::errnoText(errno));
        break;
      }
      // handleEvent() confines failures to their connection; this catch is the last line
      // of defence that keeps the loop (and the process) alive.
      try {
        for (int i = 0; i < n; ++i) {
          const uint64_t id = events[i].data.u64;
          if (id == kWakeId) {
            uint64_t value = 0;
            [[maybe_unused]] const ssize_t drained = ::read(wake_.fd(), &value, sizeof(value));
          } else if (id == kListenerId) {
            acceptAll();
          } else {
            handleEvent(id, events[i].events);
          }
        }
        expireDeadlines(Clock::now());
      } catch (const std::exception& e) {
        RINGTREE_WARN("TCPStore server on port " << port_ << ": " << e.what());
      }
      closePending();
    }
    // Stopping: drop every connection and the listener (new connections are refused).
    for (auto& entry : connections_) ::epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, entry.second->socket.fd(), nullptr);
    connections_.clear();
    parked_.clear();
    deadlines_.clear();
    numClients_.store(0);
    listener_.reset();
  }

  Deadline nextDeadline() const {
    Deadline next = deadlines_.empty() ? kNoDeadline : deadlines_.begin()->first;
    if (acceptPaused_) next = std::min(next, acceptResumeAt_);
    return next;
  }

  Connection* find(uint64_t id) {
    const auto it = connections_.find(id);
    return it == connections_.end() ? nullptr : it->second.get();
  }

  void acceptAll() {
    for (;;) {
      const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int error = errno;
        if (error == EINTR || error == ECONNABORTED || error == EPROTO) continue;
        if (error == EAGAIN || error == EWOULDBLOCK) return;
        // Out of descriptors or memory: stop accepting for a moment instead of spinning on
        // a listener that stays readable.
        RINGTREE_WARN("TCPStore server on port " << port_ << ": accept failed (" << net::errnoText(error)
                                                 << "); pausing new connections");
        ::epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, listener_.fd(), nullptr);
        acceptPaused_ = true;
        acceptResumeAt_ = Clock::now() + kAcceptPause;
        return;
      }
      net::Socket socket(fd);
      auto connection = std::make_unique<Connection>();
      connection->id = nextId_++;
      connection->socket = std::move(socket);
      connection->peer = net::peerName(fd);
      // Latency of small replies matters; failure to set it is harmless.
      try {
        net::setNoDelay(fd);
      } catch (const NetworkError& e) {
        RINGTREE_DEBUG("TCPStore server: " << connection->peer << ": " << e.what());
      }
      try {
        control(EPOLL_CTL_ADD, fd, kEpollReadEvents, connection->id);
      } catch (const NetworkError& e) {
        RINGTREE_WARN(e.what() << "; dropping connection from " << connection->peer);
        continue;
      }
      setDeadline(*connection, Clock::now() + kHelloTimeout);
      RINGTREE_DEBUG("TCPStore server on port " << port_ << ": connection from " << connection->peer);
      connections_.emplace(connection->id, std::move(connection));
    }
  }

  void handleEvent(uint64_t id, uint32_t events) {
    Connection* c = find(id);
    if (c == nullptr || c->closing) return;
    // Nothing a peer sends may take the server down: any failure (e.g. out of memory for
    // a large value) costs that one connection only.
    try {
      if (events & EPOLLERR) {
        int error = 0;
        socklen_t length = sizeof(error);
        ::getsockopt(c->socket.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
        scheduleClose(*c, "socket error: " + net::errnoText(error));
        return;
      }
      if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) onReadable(*c);
      if (!c->closing && (events & EPOLLOUT)) flush(*c);
    } catch (const std::exception& e) {
      RINGTREE_WARN("TCPStore server: dropping connection from " << c->peer << ": " << e.what());
      scheduleClose(*c, e.what());
    }
  }

  bool busy(const Connection& c) const { return c.waiter.has_value() || !c.out.empty() || c.closeAfterFlush; }

  void onReadable(Connection& c) {
    size_t budget = kReadBudget;
    while (!c.closing && budget > 0) {
      if (busy(c)) {
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
  bool acceptHeader(Connection& c) {
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

  void handleFrame(Connection& c, uint8_t code, const Bytes& payload) {
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
        data_[key] = std::move(value);
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
        const auto it = data_.find(key);
        int64_t sum = 0;
        try {
          // The client puts "TCPStore add: " before the text.
          sum = detail::addToCounter("", key, it == data_.end() ? nullptr : &it->second, delta);
        } catch (const InvalidArgument& e) {
          return replyMessage(c, proto::Status::kInvalidArgument, e.what());
        }
        data_[key] = toBytes(std::to_string(sum));
        reply(c, proto::Status::kOk, std::move(proto::Writer().i64(sum)));
        wake(key);
        return;
      }
      case proto::Op::kCompareSet: {
        std::string key;
        Bytes expected;
        Bytes desired;
        if (!(r.str(&key) && r.bytes(&expected) && r.bytes(&desired) && r.done())) return malformed();
        const auto it = data_.find(key);
        bool written = false;
        const Bytes result = detail::compareSet(it == data_.end() ? nullptr : &it->second, expected, desired,
                                                [&](const Bytes& value) {
                                                  data_[key] = value;
                                                  written = true;
                                                });
        reply(c, proto::Status::kOk, std::move(proto::Writer().bytes(result)));
        if (written) wake(key);
        return;
      }
      case proto::Op::kCheck: {
        std::vector<std::string> keys;
        if (!(r.keys(&keys) && r.done())) return malformed();
        reply(c, proto::Status::kOk, std::move(proto::Writer().u8(firstMissing(keys) == nullptr ? 1 : 0)));
        return;
      }
      case proto::Op::kDelete: {
        std::string key;
        if (!(r.str(&key) && r.done())) return malformed();
        const bool existed = data_.erase(key) > 0;
        reply(c, proto::Status::kOk, std::move(proto::Writer().u8(existed ? 1 : 0)));
        return;
      }
      case proto::Op::kNumKeys: {
        if (!r.done()) return malformed();
        reply(c, proto::Status::kOk, std::move(proto::Writer().i64(static_cast<int64_t>(data_.size()))));
        return;
      }
      case proto::Op::kAppend: {
        std::string key;
        Bytes value;
        if (!(r.str(&key) && r.bytes(&value) && r.done())) return malformed();
        Bytes& stored = data_[key];
        stored.insert(stored.end(), value.begin(), value.end());
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
        for (auto& entry : entries) data_[entry.first] = std::move(entry.second);
        reply(c, proto::Status::kOk, proto::Writer());
        for (const auto& entry : entries) wake(entry.first);
        return;
      }
    }
  }

  void handleHello(Connection& c, proto::Reader& r) {
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
    c.authenticated = true;
    clearDeadline(c);
    numClients_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(clientsMutex_);
      ++totalClients_;
    }
    clientsChanged_.notify_all();
    reply(c, proto::Status::kOk, std::move(proto::Writer().u32(proto::kVersion)));
  }

  // ---- get / wait ----

  const std::string* firstMissing(const std::vector<std::string>& keys) const {
    for (const auto& key : keys) {
      if (data_.find(key) == data_.end()) return &key;
    }
    return nullptr;
  }

  void startWait(Connection& c, proto::Op op, std::vector<std::string> keys, int64_t timeoutMs) {
    const std::string* missing = firstMissing(keys);
    if (missing == nullptr) {
      answerWait(c, op, keys);
      return;
    }
    if (timeoutMs == 0) {
      replyTimeout(c, keys);
      return;
    }
    c.waiter = Waiter{op, std::move(keys), *missing};
    parked_[c.waiter->parkedOn].push_back(c.id);
    setDeadline(c, net::deadlineAfter(std::chrono::milliseconds(std::min(timeoutMs, kMaxWaitMs))));
  }

  // Replies to a get/wait whose keys all exist.
  void answerWait(Connection& c, proto::Op op, const std::vector<std::string>& keys) {
    if (op == proto::Op::kWait) {
      reply(c, proto::Status::kOk, proto::Writer());
      return;
    }
    uint64_t size = 4;
    for (const auto& key : keys) size += 4 + data_.at(key).size();
    if (size > std::numeric_limits<uint32_t>::max()) {
      replyMessage(c, proto::Status::kError,
                   "the values of " + std::to_string(keys.size()) + " keys total " + std::to_string(size) +
                       " bytes, more than one reply can carry (4 GiB)");
      return;
    }
    proto::Writer w;
    w.u32(static_cast<uint32_t>(keys.size()));
    for (const auto& key : keys) w.bytes(data_.at(key));
    reply(c, proto::Status::kOk, std::move(w));
  }

  void replyTimeout(Connection& c, const std::vector<std::string>& keys) {
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (data_.find(key) == data_.end()) missing.push_back(key);
    }
    reply(c, proto::Status::kTimeout, std::move(proto::Writer().keys(missing)));
  }

  // Re-checks the waiters parked on key after a write to it.
  void wake(const std::string& key) {
    const auto it = parked_.find(key);
    if (it == parked_.end()) return;
    const std::vector<uint64_t> ids = std::move(it->second);
    parked_.erase(it);
    for (const uint64_t id : ids) {
      Connection* c = find(id);
      if (c == nullptr || c->closing || !c->waiter || c->waiter->parkedOn != key) continue;
      const std::string* missing = firstMissing(c->waiter->keys);
      if (missing != nullptr) {
        // Another key is still missing: wait for that one next.
        c->waiter->parkedOn = *missing;
        parked_[*missing].push_back(id);
        continue;
      }
      Waiter waiter = std::move(*c->waiter);
      c->waiter.reset();
      clearDeadline(*c);
      // A failure here (out of memory for a large reply) belongs to the waiter's connection,
      // not to the writer's whose request is being handled.
      try {
        answerWait(*c, waiter.op, waiter.keys);
      } catch (const std::exception& e) {
        scheduleClose(*c, std::string("cannot answer: ") + e.what());
      }
    }
  }

  // Removes c's waiter (if any) from the parked lists.
  void unpark(Connection& c) {
    if (!c.waiter) return;
    const auto it = parked_.find(c.waiter->parkedOn);
    if (it != parked_.end()) {
      auto& ids = it->second;
      ids.erase(std::remove(ids.begin(), ids.end(), c.id), ids.end());
      if (ids.empty()) parked_.erase(it);
    }
    c.waiter.reset();
  }

  // ---- deadlines ----

  void setDeadline(Connection& c, Deadline deadline) {
    clearDeadline(c);
    if (deadline == kNoDeadline) return;
    c.deadline = deadline;
    deadlines_.emplace(deadline, c.id);
  }

  void clearDeadline(Connection& c) {
    if (c.deadline == kNoDeadline) return;
    deadlines_.erase({c.deadline, c.id});
    c.deadline = kNoDeadline;
  }

  void expireDeadlines(Deadline now) {
    if (acceptPaused_ && now >= acceptResumeAt_) {
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.u64 = kListenerId;
      if (::epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, listener_.fd(), &event) == 0) {
        acceptPaused_ = false;
      } else {
        acceptResumeAt_ = now + kAcceptPause;
      }
    }
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const uint64_t id = deadlines_.begin()->second;
      deadlines_.erase(deadlines_.begin());
      Connection* c = find(id);
      if (c == nullptr) continue;
      c->deadline = kNoDeadline;
      if (c->closing) continue;
      if (!c->authenticated) {
        scheduleClose(*c, "no HELLO within " + std::to_string(kHelloTimeout.count()) + " s");
      } else if (c->waiter) {
        const std::vector<std::string> keys = std::move(c->waiter->keys);
        unpark(*c);
        replyTimeout(*c, keys);
      }
    }
  }

  // ---- replies and closing ----

  void replyMessage(Connection& c, proto::Status status, const std::string& message) {
    reply(c, status, std::move(proto::Writer().str(message)));
  }

  // Queues a reply (the connection has none pending: the protocol is request/response)
  // and sends as much as the socket takes now.
  void reply(Connection& c, proto::Status status, proto::Writer&& w) {
    c.out = std::move(w).frame(static_cast<uint8_t>(status));
    c.outSent = 0;
    flush(c);
  }

  void flush(Connection& c) {
    while (c.outSent < c.out.size()) {
      const ssize_t n =
          ::send(c.socket.fd(), c.out.data() + c.outSent, c.out.size() - c.outSent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        c.outSent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!c.writeArmed && setEvents(c, kEpollReadEvents | EPOLLOUT)) c.writeArmed = true;
        return;
      }
      scheduleClose(c, "send failed: " + net::errnoText(errno));
      return;
    }
    c.out = Bytes();
    c.outSent = 0;
    if (c.writeArmed && setEvents(c, kEpollReadEvents)) c.writeArmed = false;
    if (c.closeAfterFlush) scheduleClose(c, "handshake refused");
  }

  // Changes the events c is polled for; on failure schedules its close and returns false.
  bool setEvents(Connection& c, uint32_t events) {
    epoll_event event{};
    event.events = events;
    event.data.u64 = c.id;
    if (::epoll_ctl(epoll_.fd(), EPOLL_CTL_MOD, c.socket.fd(), &event) == 0) return true;
    scheduleClose(c, "epoll_ctl failed: " + net::errnoText(errno));
    return false;
  }

  // Marks c for closing at the end of this loop iteration (other code of this iteration
  // may still hold a pointer to it) and releases its waiter, deadline and client count.
  void scheduleClose(Connection& c, const std::string& reason) {
    if (c.closing) return;
    c.closing = true;
    RINGTREE_DEBUG("TCPStore server on port " << port_ << ": closing connection from " << c.peer << ": " << reason);
    unpark(c);
    clearDeadline(c);
    if (c.authenticated) numClients_.fetch_sub(1);
    pendingClose_.push_back(c.id);
  }

  void closePending() {
    for (const uint64_t id : pendingClose_) {
      const auto it = connections_.find(id);
      if (it == connections_.end()) continue;
      ::epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, it->second->socket.fd(), nullptr);
      connections_.erase(it);
    }
    pendingClose_.clear();
  }

  const std::string token_;
  const uint32_t maxMessageBytes_;
  net::Socket listener_;
  uint16_t port_ = 0;
  net::Socket epoll_;
  net::Socket wake_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::mutex stopMutex_;

  std::atomic<int> numClients_{0};
  mutable std::mutex clientsMutex_;
  mutable std::condition_variable clientsChanged_;
  int64_t totalClients_ = 0;  // guarded by clientsMutex_
  bool stopped_ = false;      // guarded by clientsMutex_

  // Loop-thread state.
  std::unordered_map<std::string, Bytes> data_;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  uint64_t nextId_ = kFirstConnectionId;
  // Missing key -> connections whose get/wait waits for it.
  std::unordered_map<std::string, std::vector<uint64_t>> parked_;
  std::set<std::pair<Deadline, uint64_t>> deadlines_;
  std::vector<uint64_t> pendingClose_;
  bool acceptPaused_ = false;
  Deadline acceptResumeAt_ = kNoDeadline;
};

TcpStoreServer::TcpStoreServer(const TcpStoreOptions& options) : impl_(std::make_unique<Impl>(options)) {}

TcpStoreServer::~TcpStoreServer() = default;

uint16_t TcpStoreServer::port() const { return impl_->port(); }

int TcpStoreServer::numClients() const { return impl_->numClients(); }

bool TcpStoreServer::waitForClients(int count, net::Deadline deadline) const {
  return impl_->waitForClients(count, deadline);
}

int64_t TcpStoreServer::totalClients() const { return impl_->totalClients(); }

void TcpStoreServer::stop() { impl_->stop(); }

}  // namespace ringtree
