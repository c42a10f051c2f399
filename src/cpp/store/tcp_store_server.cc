#include "store/tcp_store_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>

#include <ringtree/error.h>

#include "common/logging.h"
#include "store/tcp_store_server_impl.h"

namespace ringtree {

using net::Clock;
using net::Deadline;
using net::kNoDeadline;

namespace {

// epoll data of the two fds that are not connections; connection ids start above them.
constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kFirstConnectionId = 2;
constexpr int kMaxEvents = 64;
// How long accepting pauses when the process runs out of file descriptors.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
constexpr uint32_t kEpollReadEvents = EPOLLIN | EPOLLRDHUP;
// The first byte of a ringtree frame (its magic "RTS1") and of torch's client (VALIDATE).
constexpr uint8_t kRingtreeFirstByte = 'R';
constexpr uint8_t kTorchFirstByte = static_cast<uint8_t>(torch_store_protocol::Query::kValidate);

}  // namespace

TcpStoreServer::Impl::Impl(const TcpStoreOptions& options)
    : token_(options.token), maxMessageBytes_(options.maxMessageBytes), nextId_(kFirstConnectionId) {
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

int64_t TcpStoreServer::Impl::totalClients() const {
  std::lock_guard<std::mutex> lock(clientsMutex_);
  return totalClients_;
}

bool TcpStoreServer::Impl::waitForClients(int count, Deadline deadline) const {
  std::unique_lock<std::mutex> lock(clientsMutex_);
  const auto reached = [&] { return stopped_ || totalClients_ >= count; };
  if (deadline == kNoDeadline) {
    clientsChanged_.wait(lock, reached);
  } else {
    clientsChanged_.wait_until(lock, deadline, reached);
  }
  return !stopped_ && totalClients_ >= count;
}

void TcpStoreServer::Impl::stop() {
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

void TcpStoreServer::Impl::control(int operation, int fd, uint32_t events, uint64_t id) {
  epoll_event event{};
  event.events = events;
  event.data.u64 = id;
  if (::epoll_ctl(epoll_.fd(), operation, fd, &event) != 0) {
    throw NetworkError("TCPStore server: epoll_ctl failed: " + net::errnoText(errno));
  }
}

// ---- the loop ----

void TcpStoreServer::Impl::run() {
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
  table_.clear();
  deadlines_.clear();
  numClients_.store(0);
  listener_.reset();
}

Deadline TcpStoreServer::Impl::nextDeadline() const {
  Deadline next = deadlines_.empty() ? kNoDeadline : deadlines_.begin()->first;
  if (acceptPaused_) next = std::min(next, acceptResumeAt_);
  return next;
}

TcpStoreServer::Impl::Connection* TcpStoreServer::Impl::find(uint64_t id) {
  const auto it = connections_.find(id);
  return it == connections_.end() ? nullptr : it->second.get();
}

void TcpStoreServer::Impl::acceptAll() {
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

void TcpStoreServer::Impl::handleEvent(uint64_t id, uint32_t events) {
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

void TcpStoreServer::Impl::onReadable(Connection& c) {
  if (c.protocol == Protocol::kUnknown && !chooseProtocol(c)) return;
  if (c.protocol == Protocol::kTorch) {
    readTorchCommands(c);
  } else {
    readFrames(c);
  }
}

// Decides c's protocol from its first byte (peeked, not consumed). False while no byte has
// arrived, or when the connection is refused (then its close is scheduled).
bool TcpStoreServer::Impl::chooseProtocol(Connection& c) {
  uint8_t first = 0;
  const ssize_t n = ::recv(c.socket.fd(), &first, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) {
    scheduleClose(c, "closed by the peer");
    return false;
  }
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) scheduleClose(c, net::errnoText(errno));
    return false;
  }
  if (first == kTorchFirstByte) {
    if (!token_.empty()) {
      // torch's client has no way to present a shared secret.
      RINGTREE_INFO("TCPStore server on port " << port_ << ": refused torch TCPStore client " << c.peer
                                               << ": this store requires a shared secret, which torch's "
                                                  "client cannot present");
      scheduleClose(c, "torch client refused: shared secret required");
      return false;
    }
    c.protocol = Protocol::kTorch;
    return true;
  }
  // Anything else is read as ringtree's, whose header check refuses what is not.
  static_assert(kRingtreeFirstByte != kTorchFirstByte, "the protocols' first bytes differ");
  c.protocol = Protocol::kRingtree;
  return true;
}

void TcpStoreServer::Impl::admit(Connection& c) {
  c.authenticated = true;
  clearDeadline(c);
  numClients_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(clientsMutex_);
    ++totalClients_;
  }
  clientsChanged_.notify_all();
}

// ---- waiters ----

void TcpStoreServer::Impl::park(Connection& c, Waiter waiter, Deadline deadline) {
  c.waiter = std::move(waiter);
  table_.park(c.waiter->parkedOn, c.id);
  setDeadline(c, deadline);
}

void TcpStoreServer::Impl::wake(const std::string& key) {
  for (const uint64_t id : table_.takeParked(key)) {
    Connection* c = find(id);
    if (c == nullptr || c->closing || !c->waiter || c->waiter->parkedOn != key) continue;
    const std::string* missing = table_.firstMissing(c->waiter->keys);
    if (missing != nullptr) {
      // Another key is still missing: wait for that one next.
      c->waiter->parkedOn = *missing;
      table_.park(*missing, id);
      continue;
    }
    Waiter waiter = std::move(*c->waiter);
    c->waiter.reset();
    clearDeadline(*c);
    // A failure here (out of memory for a large reply) belongs to the waiter's connection,
    // not to the writer's whose request is being handled.
    try {
      answerWaiter(*c, waiter);
    } catch (const std::exception& e) {
      scheduleClose(*c, std::string("cannot answer: ") + e.what());
    }
  }
}

void TcpStoreServer::Impl::answerWaiter(Connection& c, const Waiter& waiter) {
  if (c.protocol == Protocol::kTorch) {
    send(c, Bytes{torch_store_protocol::kStopWaiting});
  } else {
    answerWait(c, waiter.op, waiter.keys);
  }
}

void TcpStoreServer::Impl::unpark(Connection& c) {
  if (!c.waiter) return;
  table_.unpark(c.waiter->parkedOn, c.id);
  c.waiter.reset();
}

// ---- deadlines ----

void TcpStoreServer::Impl::setDeadline(Connection& c, Deadline deadline) {
  clearDeadline(c);
  if (deadline == kNoDeadline) return;
  c.deadline = deadline;
  deadlines_.emplace(deadline, c.id);
}

void TcpStoreServer::Impl::clearDeadline(Connection& c) {
  if (c.deadline == kNoDeadline) return;
  deadlines_.erase({c.deadline, c.id});
  c.deadline = kNoDeadline;
}

void TcpStoreServer::Impl::expireDeadlines(Deadline now) {
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
      scheduleClose(*c, "no handshake within " + std::to_string(kHelloTimeout.count()) + " s");
    } else if (c->waiter) {  // only ringtree's waits have deadlines
      const std::vector<std::string> keys = std::move(c->waiter->keys);
      unpark(*c);
      replyTimeout(*c, keys);
    }
  }
}

// ---- sending and closing ----

void TcpStoreServer::Impl::send(Connection& c, Bytes bytes) {
  if (c.out.empty()) {
    c.out = std::move(bytes);
    c.outSent = 0;
  } else {
    c.out.erase(c.out.begin(), c.out.begin() + static_cast<std::ptrdiff_t>(c.outSent));
    c.outSent = 0;
    c.out.insert(c.out.end(), bytes.begin(), bytes.end());
  }
  flush(c);
}

void TcpStoreServer::Impl::flush(Connection& c) {
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
bool TcpStoreServer::Impl::setEvents(Connection& c, uint32_t events) {
  epoll_event event{};
  event.events = events;
  event.data.u64 = c.id;
  if (::epoll_ctl(epoll_.fd(), EPOLL_CTL_MOD, c.socket.fd(), &event) == 0) return true;
  scheduleClose(c, "epoll_ctl failed: " + net::errnoText(errno));
  return false;
}

// Marks c for closing at the end of this loop iteration (other code of this iteration
// may still hold a pointer to it) and releases its waiter, deadline and client count.
void TcpStoreServer::Impl::scheduleClose(Connection& c, const std::string& reason) {
  if (c.closing) return;
  c.closing = true;
  RINGTREE_DEBUG("TCPStore server on port " << port_ << ": closing connection from " << c.peer << ": " << reason);
  unpark(c);
  clearDeadline(c);
  if (c.authenticated) numClients_.fetch_sub(1);
  pendingClose_.push_back(c.id);
}

void TcpStoreServer::Impl::closePending() {
  for (const uint64_t id : pendingClose_) {
    const auto it = connections_.find(id);
    if (it == connections_.end()) continue;
    ::epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, it->second->socket.fd(), nullptr);
    connections_.erase(it);
  }
  pendingClose_.clear();
}

// ---- the public class ----

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
