#include "transport/mux/link.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include <ringtree/before_waiting.h>
#include <ringtree/error.h>

#include "common/copy.h"
#include "common/logging.h"

namespace ringtree::transport::mux {

namespace {

// The link's own messages (Envelope::noticeKind values the layers above never use):
// a channel's close message (0 bytes, on that channel), and the notice of a link whose
// side gave the whole connection up (then the end of the stream).
constexpr uint8_t kChannelClosed = 0xff;
constexpr uint8_t kConnectionAbandoned = 0xfe;

// How long a channel that lets go of its operations may wait for a shared-memory peer
// that copies from a buffer of the channel's (Pair::detachSends).
constexpr std::chrono::milliseconds kDetachTimeout{1000};

// How long a channel that gives up waits for its notice to be handed over while the
// connection moves nothing (a peer that reads nothing now; the notice stays queued and
// goes with the next pass of any channel).
constexpr std::chrono::milliseconds kStallLimit{50};

Envelope closeMessage(ChannelId id) {
  Envelope envelope;
  envelope.channel = id;
  envelope.noticeKind = kChannelClosed;
  return envelope;
}

Envelope unstamped(const Envelope& envelope) {
  Envelope plain = envelope;
  plain.channel = kBaseChannel;
  return plain;
}

}  // namespace

ChannelId channelIdOf(const std::string& name) {
  // FNV-1a, then splitmix64's finaliser, so that names differing in one character spread.
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h == kBaseChannel ? 1 : h;
}

// ---------------------------------------------------------------------------------------
// Link: channels and the connection

Link::Link(std::unique_ptr<Pair> connection)
    : connection_(std::move(connection)),
      kind_(connection_->kind()),
      plannedKind_(connection_->kind()),
      peerRank_(connection_->peerRank()),
      peerDescription_(connection_->peerDescription()) {}

Link::Link(int peerRank, std::string peerDescription, const char* kind, std::weak_ptr<LinkConnector> connector)
    : kind_(kind), plannedKind_(kind), connector_(std::move(connector)), peerRank_(peerRank), peerDescription_(std::move(peerDescription)) {}

Link::~Link() = default;

void Link::needConnection() {
  if (connection_ != nullptr || connectionRequested_ || failure_ != nullptr) return;
  connectionRequested_ = true;
  if (const std::shared_ptr<LinkConnector> connector = connector_.lock()) {
    connector->requestConnection(peerRank_);
  } else {
    connectionFailed(std::make_exception_ptr(PeerError(peerRank_, "no connection to " + peerDescription_ +
                                                                      " can be made any more: the connections it "
                                                                      "would be made with were closed")),
                     false);
  }
}

bool Link::attach(std::unique_ptr<Pair> connection) {
  const std::lock_guard<SpinMutex> lock(mutex_);
  if (connection_ != nullptr || failure_ != nullptr) return false;
  kind_.store(connection->kind(), std::memory_order_release);
  connection_ = std::move(connection);
  // What waits in the link moves with its channels' next progress; sleepers (on the
  // eventfd alone until now) wake for it and arm the connection.
  signalSleepers();
  return true;
}

void Link::connectFailed(std::exception_ptr error) {
  const std::lock_guard<SpinMutex> lock(mutex_);
  if (connection_ != nullptr || failure_ != nullptr) return;
  connectionFailed(std::move(error), false);
  signalSleepers();
}

bool Link::connected() const {
  const std::lock_guard<SpinMutex> lock(mutex_);
  return connection_ != nullptr;
}

std::unique_ptr<Pair> Link::open(ChannelId id, int selfRank, int peerRank, std::string peerDescription) {
  const std::lock_guard<SpinMutex> lock(mutex_);
  Channel& channel = channelFor(id);
  if (channel.open) {
    throw InvalidArgument("channel " + std::to_string(id) + " is open already on the connection to " +
                          peerDescription_);
  }
  closedHere_.erase(id);
  channel.open = true;
  channel.selfRank = selfRank;
  channel.peerRank = peerRank;
  channel.peerDescription = std::move(peerDescription);
  if (failure_ != nullptr) channel.peerClosed = true;
  return std::unique_ptr<Pair>(new ChannelPair(shared_from_this(), &channel));
}

Link::Channel& Link::channelFor(ChannelId id) {
  if (lastChannel_ != nullptr && lastChannel_->id == id) return *lastChannel_;
  std::unique_ptr<Channel>& slot = channels_[id];
  if (slot == nullptr) {
    slot = std::make_unique<Channel>();
    slot->id = id;
    slot->peerClosed = failure_ != nullptr;
  }
  lastChannel_ = slot.get();
  return *slot;
}

void Link::startSending(Outgoing message) {
  connection_->postSend(message.envelope, message.data, message.bytes);
  inFlight_ = std::move(message);
  sending_ = true;
}

bool Link::drive() {
  if (failure_ != nullptr || connection_ == nullptr) return false;
  bool moved = false;
  try {
    // Passes until nothing moves; the connection is asked for its next message until it
    // has none (once is enough per drive: whoever waits for it drives again).
    bool lookForIncoming = true;
    for (;;) {
      bool pass = false;
      if (!sending_ && !outgoing_.empty()) {
        Outgoing next = std::move(outgoing_.front());
        outgoing_.pop_front();
        startSending(std::move(next));
      }
      if (sending_ || incoming_ != Incoming::kNone) connection_->progress();
      if (sending_ && connection_->pendingSends() == 0) {
        if (Channel* channel = inFlight_.channel) {
          // Written only under the mutex: no read-modify-write needed.
          channel->sendsRetired.store(channel->sendsRetired.load(std::memory_order_relaxed) + 1,
                                      std::memory_order_release);
        }
        inFlight_.copy.reset();
        sending_ = false;
        pass = true;
      }
      if (incoming_ != Incoming::kNone) {
        if (connection_->pendingRecvs() == 0) {
          finishIncoming();
          pass = true;
          lookForIncoming = true;
        } else if (incoming_ == Incoming::kTentative && connection_->recvRefused()) {
          connection_->withdrawTentativeRecv();  // not its message: dispatched below
          incoming_ = Incoming::kNone;
          incomingChannel_ = nullptr;
          lookForIncoming = true;
        }
      }
      if (incoming_ == Incoming::kNone && lookForIncoming) {
        Envelope envelope;
        size_t bytes = 0;
        if (connection_->peekIncoming(&envelope, &bytes)) {
          if (dispatch(envelope, bytes)) pass = true;
        }
        lookForIncoming = false;
      }
      if (!pass && (sending_ || outgoing_.empty())) break;
      moved = true;
    }
  } catch (...) {
    connectionThrew(std::current_exception());
    moved = true;
  }
  if (moved) signalSleepers();
  return moved;
}

void Link::connectionThrew(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const NetworkError&) {
  } catch (const std::exception& e) {
    // The connection refuses to go on for another reason (a shared-memory pair whose
    // peer left with one of the link's notices next in its ring calls that a
    // mismatch): to the channels it is a connection that ended.
    error = std::make_exception_ptr(PeerError(peerRank_, "the connection to " + peerDescription_ +
                                                             " ended: " + e.what()));
  }
  connectionFailed(error, connection_->endedCleanly());
}

bool Link::dispatch(const Envelope& envelope, size_t bytes) {
  headLeft_ = false;
  const auto drop = [&] {
    dropped_.reset(bytes > 0 ? new uint8_t[bytes] : nullptr);
    connection_->postRecv(envelope, dropped_.get(), bytes);
    incoming_ = Incoming::kDropped;
    return true;
  };
  if (envelope.noticeKind == kConnectionAbandoned) {
    throw PeerError(peerRank_, peerDescription_ + " gave up its connection to this rank (a message of one of its "
                               "communicators was half transferred when that communicator failed)");
  }
  if (envelope.noticeKind == kChannelClosed) {
    if (bytes != 0) {
      throw PeerError(peerRank_, peerDescription_ + " broke the channel protocol: a close message of " +
                                     std::to_string(bytes) + " bytes");
    }
    if (closedHere_.count(envelope.channel) == 0) channelFor(envelope.channel).peerClosed = true;
    return drop();
  }
  if (closedHere_.count(envelope.channel) != 0) return drop();
  Channel& channel = channelFor(envelope.channel);
  if (channel.open) {
    // A channel that failed or closed takes nothing more (its buffers are no longer its).
    if (channel.failure != nullptr || channel.closed) return drop();
    serve(channel);
    if (channel.failure == nullptr && channel.arrived.empty() && !channel.receives.empty()) {
      const Receive& receive = channel.receives.front();
      if (envelope == receive.expected && bytes == receive.bytes) {
        if (receive.discard) {
          channel.popReceive();
          return drop();
        }
        connection_->postRecv(envelope, receive.data, bytes, receive.accumulate);
        incoming_ = Incoming::kIntoReceive;
        incomingChannel_ = &channel;
        return true;
      }
      if (!receive.tentative) {
        failChannel(channel, std::make_exception_ptr(EnvelopeMismatch(
                                 channel.peerRank, unstamped(receive.expected), receive.bytes, unstamped(envelope), bytes,
                                 channel.peerDescription + " sent a message of " + envelopeText(envelope, bytes) +
                                     " where this rank expected " + envelopeText(receive.expected, receive.bytes))));
        return drop();
      }
      channel.refused = true;  // the message waits (below) for the receive that takes it
    }
    if (channel.failure != nullptr) return drop();
  }
  if (!anotherChannelWaits(&channel)) {
    headLeft_ = true;
    headEnvelope_ = envelope;
    headBytes_ = bytes;
    return false;
  }
  Arrived arrived{envelope, bytes, std::unique_ptr<uint8_t[]>(bytes > 0 ? new uint8_t[bytes] : nullptr), false};
  connection_->postRecv(envelope, arrived.data.get(), bytes);
  channel.arrived.push_back(std::move(arrived));
  incoming_ = Incoming::kIntoArrived;
  incomingChannel_ = &channel;
  return true;
}

void Link::finishIncoming() {
  const Incoming finished = incoming_;
  Channel* channel = incomingChannel_;
  incoming_ = Incoming::kNone;
  incomingChannel_ = nullptr;
  switch (finished) {
    case Incoming::kTentative:
    case Incoming::kIntoReceive: channel->popReceive(); break;
    case Incoming::kIntoArrived:
      channel->arrived.back().complete = true;
      if (channel->open) serve(*channel);
      break;
    case Incoming::kDropped: dropped_.reset(); break;
    case Incoming::kNone: break;
  }
}

void Link::postTentatively(Channel& channel) {
  if (connection_ == nullptr || incoming_ != Incoming::kNone || headLeft_ || failure_ != nullptr ||
      !channel.arrived.empty() ||
      channel.receives.empty() || channel.failure != nullptr || channel.closed || channel.refused ||
      channel.receives.front().discard) {
    return;
  }
  const Receive& receive = channel.receives.front();
  connection_->postTentativeRecv(receive.expected, receive.data, receive.bytes, receive.accumulate);
  incoming_ = Incoming::kTentative;
  incomingChannel_ = &channel;
}

void Link::releaseIncoming(Channel& channel) {
  if (incomingChannel_ != &channel) return;
  if (incoming_ == Incoming::kTentative && connection_->withdrawTentativeRecv()) {
    incoming_ = Incoming::kNone;
  } else if (incoming_ == Incoming::kTentative || incoming_ == Incoming::kIntoReceive) {
    connection_->detachRecvs();
    incoming_ = Incoming::kDropped;
  } else if (incoming_ == Incoming::kIntoArrived) {
    dropped_ = std::move(channel.arrived.back().data);  // it goes on arriving there
    incoming_ = Incoming::kDropped;
  }
  incomingChannel_ = nullptr;
}

void Link::serve(Channel& channel) {
  while (channel.failure == nullptr && !channel.receives.empty() && !channel.arrived.empty()) {
    Arrived& message = channel.arrived.front();
    const Receive& receive = channel.receives.front();
    if (message.envelope != receive.expected || message.bytes != receive.bytes) {
      if (receive.tentative) {
        channel.refused = true;
        return;
      }
      failChannel(channel, std::make_exception_ptr(EnvelopeMismatch(
                               channel.peerRank, unstamped(receive.expected), receive.bytes,
                               unstamped(message.envelope), message.bytes,
                               channel.peerDescription + " sent a message of " +
                                   envelopeText(message.envelope, message.bytes) + " where this rank expected " +
                                   envelopeText(receive.expected, receive.bytes))));
      return;
    }
    if (!message.complete) return;
    if (receive.bytes > 0 && !receive.discard) {
      if (receive.accumulate.fn != nullptr) {
        receive.accumulate.fn(receive.data, message.data.get(), receive.bytes / receive.accumulate.elementSize);
      } else {
        copyBytes(receive.data, message.data.get(), receive.bytes);
      }
    }
    channel.arrived.pop_front();
    channel.popReceive();
  }
}

bool Link::anotherChannelWaits(const Channel* except) const {
  for (const auto& entry : channels_) {
    const Channel& c = *entry.second;
    if (&c == except || !c.open || c.failure != nullptr || c.closed || c.refused) continue;
    if (c.wantsIncoming || c.receives.size() > c.arrived.size()) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------
// Link: failures and closing

void Link::connectionFailed(std::exception_ptr error, bool clean) {
  failure_ = std::move(error);
  ended_ = clean;
  headLeft_ = false;
  for (auto& entry : channels_) entry.second->peerClosed = true;
}

void Link::abandonConnection(const std::string& why, net::Deadline deadline) {
  if (failure_ != nullptr) return;
  Envelope notice;
  notice.noticeKind = kConnectionAbandoned;
  if (connection_ != nullptr) connection_->sendNotice(notice, deadline);
  connectionFailed(std::make_exception_ptr(NetworkError("the connection to " + peerDescription_ + " was given up: " + why)),
                   false);
}

std::string Link::pendingText(const Channel& channel) const {
  if (!channel.receives.empty()) {
    return "the receive of " + envelopeText(channel.receives.front().expected, channel.receives.front().bytes);
  }
  if (sending_ && inFlight_.channel == &channel) return "the send of " + envelopeText(inFlight_.envelope, inFlight_.bytes);
  for (const Outgoing& o : outgoing_) {
    if (o.channel == &channel) return "the send of " + envelopeText(o.envelope, o.bytes);
  }
  return {};
}

void Link::rethrowConnectionFailure(const Channel& channel) const {
  const std::string pending = pendingText(channel);
  if (ended_) {
    throw PeerError(channel.peerRank, "rank " + std::to_string(channel.selfRank) + ": connection to " +
                                          channel.peerDescription + " closed" +
                                          (pending.empty() ? std::string() : " during " + pending) +
                                          ": end of stream (the peer process exited, crashed or closed its "
                                          "communicator)");
  }
  const std::string context = (pending.empty() ? std::string() : " (this rank was waiting for " + pending + ")") +
                              (channel.peerRank == peerRank_ ? std::string()
                                                             : " (in this communicator: " + channel.peerDescription + ")");
  try {
    std::rethrow_exception(failure_);
  } catch (const PeerError& e) {
    throw PeerError(channel.peerRank, e.what() + context);
  } catch (const NetworkError& e) {
    throw NetworkError(e.what() + context);
  } catch (const std::exception& e) {
    throw PeerError(channel.peerRank, std::string("the connection to ") + channel.peerDescription +
                                          " failed: " + e.what() + context);
  }
}

void Link::failChannel(Channel& channel, std::exception_ptr error) {
  if (channel.failure == nullptr) channel.failure = std::move(error);
}

void Link::quiesce(Channel& channel, net::Deadline deadline, bool sendBuffersValid) {
  // A message of the channel that the connection is moving goes on from the connection's
  // own copy (sends; only while their buffers are still valid) or into nothing
  // (receives): the stream stays whole, the channel's buffers are free at once. A send
  // whose buffer may be gone leaves the connection in the middle of a message: it is given
  // up.
  if (failure_ == nullptr && sending_ && inFlight_.channel == &channel) {
    if (!sendBuffersValid) {
      abandonConnection("a communicator was destroyed while the connection still sent one of its messages", deadline);
    } else if (connection_->detachSends(deadline)) {
      inFlight_.channel = nullptr;
    } else {
      abandonConnection("a message of a communicator that gave up could not be detached from its buffer", deadline);
    }
  }
  if (sending_ && inFlight_.channel == &channel) inFlight_.channel = nullptr;  // the connection was given up
  releaseIncoming(channel);
  outgoing_.erase(std::remove_if(outgoing_.begin(), outgoing_.end(),
                                 [&](const Outgoing& o) { return o.channel == &channel; }),
                  outgoing_.end());
  channel.clearReceives();
  channel.arrived.clear();
  channel.sendsRetired.store(channel.sendsPosted.load(std::memory_order_relaxed), std::memory_order_release);
}

void Link::close(Channel& channel, net::Deadline deadline, bool sendBuffersValid) {
  quiesce(channel, deadline, sendBuffersValid);
  channel.closed = true;
  if (failure_ == nullptr) outgoing_.push_back(Outgoing{nullptr, closeMessage(channel.id), nullptr, 0, nullptr});
}

template <typename Done>
bool Link::driveUntil(std::unique_lock<SpinMutex>& lock, net::Deadline deadline, Done done) {
  auto lastMove = net::Clock::now();
  for (int pass = 0;; ++pass) {
    // Waiting for a connection being made (a lazy link's first use) is not a stall.
    if (drive() || (connection_ == nullptr && connectionRequested_)) lastMove = net::Clock::now();
    if (done()) return true;
    const auto now = net::Clock::now();
    if (failure_ != nullptr || now >= deadline || now - lastMove >= kStallLimit) return false;
    lock.unlock();
    BeforeWaiting::notify();
    if (pass < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    lock.lock();
  }
}

// ---------------------------------------------------------------------------------------
// Link: sleeping

int Link::sleepDescriptor() {
  if (epoll_.valid()) return epoll_.fd();
  if (sleepDescriptorsFailed_) return -1;
  net::Socket epoll(::epoll_create1(EPOLL_CLOEXEC));
  net::Socket notify(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC | EFD_SEMAPHORE));
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = notify.fd();
  if (!epoll.valid() || !notify.valid() || ::epoll_ctl(epoll.fd(), EPOLL_CTL_ADD, notify.fd(), &event) != 0) {
    RINGTREE_WARN("cannot create the wait descriptors of the connection to " << peerDescription_ << " ("
                                                                             << net::errnoText(errno)
                                                                             << "): its waits sleep in short slices");
    sleepDescriptorsFailed_ = true;
    return -1;
  }
  epoll_ = std::move(epoll);
  notify_ = std::move(notify);
  return epoll_.fd();
}

void Link::disarmConnection() {
  connection_->disarmWait();
  connectionArmedBy_ = nullptr;
  if (connectionInEpoll_) {
    // Waits on nothing of the connection until the next sleeper arms it (a descriptor left
    // armed for writing would wake every sleeper at once, again and again).
    epoll_event event{};
    event.data.fd = connectionFd_;
    ::epoll_ctl(epoll_.fd(), EPOLL_CTL_MOD, connectionFd_, &event);
  }
  signalSleepers();  // a thread still asleep on the link takes over the connection
}

void Link::signalSleepers() {
  if (!notify_.valid() || tokens_ >= sleepers_) return;
  const uint64_t add = static_cast<uint64_t>(sleepers_ - tokens_);
  if (::write(notify_.fd(), &add, sizeof(add)) == static_cast<ssize_t>(sizeof(add))) tokens_ = sleepers_;
}

void Link::takeToken() {
  if (tokens_ == 0) return;
  uint64_t one = 0;
  if (::read(notify_.fd(), &one, sizeof(one)) == static_cast<ssize_t>(sizeof(one))) {
    --tokens_;
  } else if (errno != EAGAIN) {
    RINGTREE_WARN("reading the wait eventfd of the connection to " << peerDescription_
                                                                   << " failed: " << net::errnoText(errno));
  }
}

// ---------------------------------------------------------------------------------------
// ChannelPair

ChannelPair::ChannelPair(std::shared_ptr<Link> link, Link::Channel* channel)
    : Pair(channel->peerRank, channel->peerDescription), link_(std::move(link)), channel_(channel) {}

ChannelPair::~ChannelPair() {
  std::unique_lock<SpinMutex> lock(link_->mutex_);
  Link& link = *link_;
  Link::Channel& channel = *channel_;
  if (channel.sleeping) {  // a caller that did not disarm (the contract asks it to)
    channel.sleeping = false;
    --link.sleepers_;
    link.takeToken();
  }
  if (link.connectionArmedBy_ == this) link.disarmConnection();
  if (!channel.closed) link.close(channel, net::deadlineAfter(kDetachTimeout), /*sendBuffersValid=*/false);
  link.releaseIncoming(channel);  // (close() did, unless sendNotice() closed it earlier)
  // Hand the close message over if the connection takes it at once; otherwise it goes with
  // the next pass of any channel (or is lost with the link, whose stream then ends).
  link.drive();
  const ChannelId id = channel.id;
  link.closedHere_.insert(id);
  if (link.lastChannel_ == &channel) link.lastChannel_ = nullptr;
  link.channels_.erase(id);
}

Envelope ChannelPair::stamped(const Envelope& envelope) const {
  Envelope out = envelope;
  out.channel = channel_->id;
  return out;
}

void ChannelPair::fail(std::exception_ptr error) {
  link_->failChannel(*channel_, std::move(error));
  link_->quiesce(*channel_, net::deadlineAfter(kDetachTimeout), /*sendBuffersValid=*/true);
  std::rethrow_exception(channel_->failure);
}

std::exception_ptr ChannelPair::peerClosedError(const std::string& doing) const {
  return std::make_exception_ptr(PeerError(
      peerRank(), "rank " + std::to_string(channel_->selfRank) + ": " + peerDescription() +
                      " closed this channel (its communicator was destroyed, aborted or gave up after a failure)" +
                      (doing.empty() ? std::string() : " during " + doing)));
}

void ChannelPair::rethrowIfFailed() {
  if (channel_->failure != nullptr) fail(channel_->failure);
  if (link_->failure_ != nullptr && !link_->ended_) link_->rethrowConnectionFailure(*channel_);
}

void ChannelPair::postSend(const Envelope& envelope, const void* data, size_t bytes) {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  rethrowIfFailed();
  if (link_->failure_ != nullptr) link_->rethrowConnectionFailure(*channel_);
  if (channel_->peerClosed) fail(peerClosedError("the send of " + envelopeText(envelope, bytes)));
  if (data == nullptr && bytes > 0) {
    throw InvalidArgument("postSend to " + peerDescription() + ": null buffer of " + std::to_string(bytes) + " bytes");
  }
  Link::Outgoing message{channel_, stamped(envelope), data, bytes, nullptr};
  link_->needConnection();
  if (!link_->sending_ && link_->outgoing_.empty() && link_->connection_ != nullptr) {
    try {
      link_->startSending(std::move(message));  // posting only: progress() moves it
    } catch (...) {
      link_->connectionFailed(std::current_exception(), false);
      link_->rethrowConnectionFailure(*channel_);
    }
  } else {
    link_->outgoing_.push_back(std::move(message));
  }
  channel_->sendsPosted.store(channel_->sendsPosted.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

void ChannelPair::postRecv(const Envelope& expected, void* data, size_t bytes, const Accumulate& accumulate) {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  rethrowIfFailed();
  if (data == nullptr && bytes > 0) {
    throw InvalidArgument("postRecv from " + peerDescription() + ": null buffer of " + std::to_string(bytes) +
                          " bytes");
  }
  if (accumulate.fn != nullptr && (accumulate.elementSize == 0 || accumulate.elementSize > Link::kMaxElementBytes ||
                                   bytes % accumulate.elementSize != 0)) {
    throw InvalidArgument("postRecv from " + peerDescription() + ": " + std::to_string(bytes) +
                          " bytes are not whole elements of " + std::to_string(accumulate.elementSize) +
                          " bytes (at most " + std::to_string(Link::kMaxElementBytes) + ")");
  }
  channel_->pushReceive(Link::Receive{stamped(expected), static_cast<uint8_t*>(data), bytes, accumulate});
  link_->needConnection();
  if (channel_->receives.size() == 1) {
    try {
      link_->postTentatively(*channel_);
    } catch (...) {
      link_->connectionFailed(std::current_exception(), false);
      link_->rethrowConnectionFailure(*channel_);
    }
  }
}

bool ChannelPair::progress() {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  Link& link = *link_;
  Link::Channel& channel = *channel_;
  link.drive();
  link.serve(channel);
  rethrowIfFailed();
  const bool sendsDone = channel.sendsDone();
  if (channel.peerClosed && channel.arrived.empty() && (!channel.receives.empty() || !sendsDone)) {
    // Nothing more comes from the peer's end, nor is read there: what is pending fails.
    if (link.failure_ != nullptr) link.rethrowConnectionFailure(channel);
    fail(peerClosedError(link.pendingText(channel)));
  }
  return sendsDone && channel.receives.empty();
}

size_t ChannelPair::pendingSends() const {
  const uint64_t retired = channel_->sendsRetired.load(std::memory_order_acquire);
  return static_cast<size_t>(channel_->sendsPosted.load(std::memory_order_relaxed) - retired);
}

size_t ChannelPair::pendingRecvs() const { return channel_->receivesPending.load(std::memory_order_acquire); }

bool ChannelPair::peekIncoming(Envelope* envelope, size_t* bytes) {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  Link& link = *link_;
  Link::Channel& channel = *channel_;
  if (!channel.receives.empty()) return false;
  link.drive();
  if (channel.failure != nullptr) fail(channel.failure);
  // What arrived before the connection failed is still seen first.
  if (!channel.arrived.empty()) {
    *envelope = unstamped(channel.arrived.front().envelope);
    *bytes = channel.arrived.front().bytes;
    return true;
  }
  if (link.headLeft_ && link.headEnvelope_.channel == channel.id) {
    *envelope = unstamped(link.headEnvelope_);
    *bytes = link.headBytes_;
    return true;
  }
  if (link.failure_ != nullptr) link.rethrowConnectionFailure(channel);
  if (channel.peerClosed) fail(peerClosedError(""));
  return false;
}

bool ChannelPair::takeIncoming(void* data, size_t bytes) {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  Link& link = *link_;
  Link::Channel& channel = *channel_;
  if (!channel.receives.empty() || channel.failure != nullptr) return false;
  if (!channel.arrived.empty()) {
    Link::Arrived& message = channel.arrived.front();
    if (!message.complete || message.bytes != bytes) return false;
    if (bytes > 0) copyBytes(data, message.data.get(), bytes);
    channel.arrived.pop_front();
    return true;
  }
  if (!link.headLeft_ || link.headEnvelope_.channel != channel.id || link.headBytes_ != bytes ||
      link.incoming_ != Link::Incoming::kNone || link.failure_ != nullptr) {
    return false;
  }
  try {
    if (!link.connection_->takeIncoming(data, bytes)) return false;
  } catch (...) {
    link.connectionThrew(std::current_exception());
    link.signalSleepers();
    link.rethrowConnectionFailure(channel);
  }
  link.headLeft_ = false;
  // A pass that moves something wakes the link's sleepers (see drive()): a message of
  // another channel may come next.
  if (link.sleepers_ > 0) link.signalSleepers();
  return true;
}

bool ChannelPair::endedCleanly() const noexcept {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  return link_->ended_;
}

bool ChannelPair::peerTookEverything() const noexcept {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  return link_->connection_ == nullptr || link_->connection_->peerTookEverything();
}

void ChannelPair::postTentativeRecv(const Envelope& expected, void* data, size_t bytes, const Accumulate& accumulate) {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  rethrowIfFailed();
  if (!channel_->receives.empty()) {
    throw InvalidArgument("postTentativeRecv from " + peerDescription() + " while another receive is posted");
  }
  if (data == nullptr && bytes > 0) {
    throw InvalidArgument("postTentativeRecv from " + peerDescription() + ": null buffer of " +
                          std::to_string(bytes) + " bytes");
  }
  Link::Receive receive{stamped(expected), static_cast<uint8_t*>(data), bytes, accumulate};
  receive.tentative = true;
  channel_->refused = false;
  channel_->pushReceive(receive);
  link_->needConnection();
  try {
    link_->postTentatively(*channel_);
  } catch (...) {
    link_->connectionFailed(std::current_exception(), false);
    link_->rethrowConnectionFailure(*channel_);
  }
}

bool ChannelPair::recvRefused() const noexcept {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  return channel_->refused;
}

bool ChannelPair::withdrawTentativeRecv() noexcept {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  Link& link = *link_;
  if (channel_->receives.size() != 1 || !channel_->receives.front().tentative) return false;
  if (link.incomingChannel_ == channel_ && link.incoming_ != Link::Incoming::kIntoArrived) {
    // The connection holds the receive: only a tentative one that took nothing comes back.
    if (link.incoming_ != Link::Incoming::kTentative || !link.connection_->withdrawTentativeRecv()) return false;
    link.incoming_ = Link::Incoming::kNone;
    link.incomingChannel_ = nullptr;
  }
  channel_->popReceive();
  channel_->refused = false;
  return true;
}

bool ChannelPair::detachSends(net::Deadline deadline) {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  Link& link = *link_;
  for (Link::Outgoing& o : link.outgoing_) {
    if (o.channel != channel_ || o.copy != nullptr || o.bytes == 0) continue;
    std::unique_ptr<uint8_t[]> copy(new uint8_t[o.bytes]);
    std::memcpy(copy.get(), o.data, o.bytes);
    o.data = copy.get();
    o.copy = std::move(copy);
  }
  if (link.failure_ == nullptr && link.sending_ && link.inFlight_.channel == channel_) {
    return link.connection_->detachSends(deadline);
  }
  return true;
}

void ChannelPair::detachRecvs() {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  Link& link = *link_;
  if (link.incomingChannel_ == channel_ &&
      (link.incoming_ == Link::Incoming::kTentative || link.incoming_ == Link::Incoming::kIntoReceive)) {
    if (link.incoming_ == Link::Incoming::kTentative && link.connection_->withdrawTentativeRecv()) {
      link.incoming_ = Link::Incoming::kNone;  // nothing taken: the receive stays queued, discarding
    } else {
      link.connection_->detachRecvs();
      link.incoming_ = Link::Incoming::kDropped;
      channel_->popReceive();  // its message is the connection's to drop now
    }
    link.incomingChannel_ = nullptr;
  }
  for (Link::Receive& receive : channel_->receives) receive.discard = true;
}

void ChannelPair::checkIncoming(const Envelope* current) {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  Link& link = *link_;
  Link::Channel& channel = *channel_;
  if (!channel.receives.empty()) return;
  link.drive();
  if (channel.failure != nullptr) fail(channel.failure);
  const Envelope* next = nullptr;
  size_t nextBytes = 0;
  if (!channel.arrived.empty()) {
    next = &channel.arrived.front().envelope;
    nextBytes = channel.arrived.front().bytes;
  } else if (link.headLeft_ && link.headEnvelope_.channel == channel.id) {
    next = &link.headEnvelope_;
    nextBytes = link.headBytes_;
  }
  if (next != nullptr) {
    const Envelope actual = unstamped(*next);
    const bool otherCall = current != nullptr && actual.sequence == current->sequence && actual != *current;
    if (isNotice(actual) || otherCall) {
      const Envelope expected = current != nullptr ? *current : Envelope{};
      fail(std::make_exception_ptr(EnvelopeMismatch(peerRank(), expected, 0, actual, nextBytes,
                                                    peerDescription() + " sent " + envelopeText(actual, nextBytes) +
                                                        " where no message was expected")));
    }
  }
  if (link.failure_ != nullptr &&
      (!link.ended_ || !channel.sendsDone() ||
       (channel.sendsPosted.load(std::memory_order_relaxed) > 0 && !link.connection_->peerTookEverything()))) {
    // A peer that went away before it took what this side sent never will.
    link.rethrowConnectionFailure(channel);
  }
  if (channel.peerClosed && channel.arrived.empty() && !channel.sendsDone()) {
    fail(peerClosedError(link.pendingText(channel)));
  }
}

bool ChannelPair::hungUp() noexcept {
  std::shared_ptr<LinkConnector> connector;
  {
    const std::lock_guard<SpinMutex> lock(link_->mutex_);
    link_->drive();
    if (channel_->peerClosed || link_->failure_ != nullptr) return true;
    if (link_->connection_ != nullptr) return link_->connection_->hungUp();
    connector = link_->connector_.lock();
  }
  // No connection yet: the peer's process, as far as the connector can tell (read
  // outside the mutex).
  return connector != nullptr && connector->peerGone(link_->peerRank_);
}

void ChannelPair::arm(pollfd* pfd, bool incoming) {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  Link& link = *link_;
  channel_->wantsIncoming = incoming;
  // With this channel's wish known, a message left in the connection is taken or stays:
  // what the connection is armed for below follows from that.
  link.drive();
  channel_->sleeping = true;
  ++link.sleepers_;
  const int sleep = link.sleepDescriptor();
  // Without a connection, the eventfd alone: attach() and connectFailed() give tokens.
  if (link.connectionArmedBy_ == nullptr && link.connection_ != nullptr) {
    link.connectionArmedBy_ = this;
    pollfd connection{};
    if (link.incoming_ == Link::Incoming::kNone && !link.headLeft_) {
      link.connection_->armWaitForIncoming(&connection);
    } else {
      link.connection_->armWait(&connection);
    }
    if (sleep < 0) {
      *pfd = connection;
      return;
    }
    epoll_event event{};
    uint32_t events = 0;
    if ((connection.events & POLLIN) != 0) events |= EPOLLIN;
    if ((connection.events & POLLOUT) != 0) events |= EPOLLOUT;
    if ((connection.events & POLLRDHUP) != 0) events |= EPOLLRDHUP;
    event.events = events;
    event.data.fd = connection.fd;
    const int op = link.connectionInEpoll_ ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (::epoll_ctl(sleep, op, connection.fd, &event) == 0) {
      link.connectionInEpoll_ = true;
      link.connectionFd_ = connection.fd;
    } else {
      RINGTREE_WARN("cannot wait on the connection to " << link.peerDescription_ << " through epoll ("
                                                        << net::errnoText(errno) << "): a slice-bounded wait");
    }
  }
  pfd->fd = sleep;  // -1 (the kernel refused the descriptors): poll() sleeps its timeout
  pfd->events = POLLIN;
  pfd->revents = 0;
}

void ChannelPair::armWait(pollfd* pfd) { arm(pfd, /*incoming=*/false); }

void ChannelPair::armWaitForIncoming(pollfd* pfd) { arm(pfd, /*incoming=*/true); }

void ChannelPair::disarmWait() {
  const std::lock_guard<SpinMutex> lock(link_->mutex_);
  Link& link = *link_;
  channel_->wantsIncoming = false;
  if (channel_->sleeping) {
    channel_->sleeping = false;
    --link.sleepers_;
    link.takeToken();
  }
  if (link.connectionArmedBy_ == this) link.disarmConnection();
}

void ChannelPair::sendNotice(const Envelope& notice, net::Deadline deadline) noexcept {
  try {
    std::unique_lock<SpinMutex> lock(link_->mutex_);
    Link& link = *link_;
    Link::Channel& channel = *channel_;
    if (channel.closed) return;
    const bool peerListens = link.failure_ == nullptr && !channel.peerClosed;
    link.close(channel, deadline, /*sendBuffersValid=*/true);
    link.failChannel(channel, std::make_exception_ptr(NetworkError(
                                  "the channel to " + peerDescription() + " was abandoned after a failed call")));
    if (peerListens && link.failure_ == nullptr) {
      link.needConnection();  // a peer never connected to may be waiting on this rank elsewhere
      // Right before the close message close() queued.
      link.outgoing_.insert(link.outgoing_.end() - 1, Link::Outgoing{nullptr, stamped(notice), nullptr, 0, nullptr});
      const auto ours = [&](const Link::Outgoing& o) { return o.envelope.channel == channel.id; };
      link.driveUntil(lock, deadline, [&] {
        return !(link.sending_ && ours(link.inFlight_)) &&
               std::none_of(link.outgoing_.begin(), link.outgoing_.end(), ours);
      });
    }
  } catch (...) {
    // Best effort: the peer then does not learn why this rank gave up.
  }
}

}  // namespace ringtree::transport::mux
