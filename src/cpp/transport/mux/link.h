#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common/socket.h"
#include "common/spin_mutex.h"
#include "transport/pair.h"

// Channels: several communicators over one connection per peer. A Link owns the
// connection (a tcp or shm Pair) to one peer; each communicator that uses it opens a
// channel, a Pair of its own with the same contract, whose messages carry the channel's
// id (Envelope::channel) and are matched apart from every other channel's.
namespace ringtree::transport::mux {

using ChannelId = uint64_t;

// Who makes a link's connection when the link is made without one (Link's lazy
// constructor): the rendezvous's PeerConnector. Both calls come with the link's mutex
// held, so neither may block or call back into a link.
class LinkConnector {
 public:
  virtual ~LinkConnector() = default;
  // Asks for the connection to `peer` to be made; the answer comes later, on any thread,
  // through Link::attach() or Link::connectFailed(). Called once per link at most.
  virtual void requestConnection(int peer) noexcept = 0;
  // Whether `peer`'s process is known to have exited (a peer of this host whose pid is
  // gone): how a link without a connection tells a peer that hung up. False when it
  // cannot be known (another host).
  virtual bool peerGone(int peer) noexcept = 0;
};

// The id of the channel a connection's first communicator uses (the world's collectives).
constexpr ChannelId kBaseChannel = 0;

// The id of a channel named `name`: a 64-bit hash, never kBaseChannel. Both ends of a
// channel open it under the same name.
ChannelId channelIdOf(const std::string& name);

// One connection to one peer, shared by the channels opened on it.
//
// Sends: every channel's messages are handed to the connection one at a time, in the
// order they were posted (across channels), so that a channel that gives up can withdraw
// those it has not handed over yet. A send finishes when the connection has taken it.
//
// Receives: the oldest receive of a channel is posted to the connection tentatively
// (Pair::postTentativeRecv) when nothing else is posted there and the channel has no
// earlier message waiting: the message, if it is that receive's, lands straight in its
// buffer. Otherwise the link looks at each arriving message's envelope
// (Pair::peekIncoming) before it takes it, and:
//   - the oldest posted receive of the message's channel takes it when the channel has no
//     earlier message waiting: the connection receives it straight into that buffer
//     (with its Accumulate);
//   - a message of another shape than that receive expects fails that channel alone
//     (EnvelopeMismatch), and is dropped;
//   - otherwise it stays in the connection (its sender's send may stay pending) until its
//     channel posts a receive for it, or another channel waits for a message behind it
//     (has a receive posted, or sleeps armed for incoming messages): it is then taken into
//     a buffer of its channel's, which a later receive copies from; the same for a channel
//     not opened here yet, which finds its messages when it opens. So a message is
//     copied twice only when two channels of the link wait at once;
//   - a message of a channel closed here is dropped.
//
// Failures: when the connection breaks, every channel fails with its error (a PeerError
// naming the peer as each channel knows it). When it ends cleanly (the peer closed it, or
// its process ended, between two messages), every channel is closed by the peer: what
// arrived before is still delivered, and a channel fails only once it needs something
// from the peer. A channel that gives up (ChannelPair::sendNotice) or closes fails alone:
// the others keep the connection, and the peer's end of that channel is told with a close
// message after the notice. A message of the channel that the connection is moving then
// goes on from the connection's copy, or into nothing (Pair::detachSends/detachRecvs),
// so that its buffer is free at once and the stream stays whole; only when that cannot be
// done (a shared-memory peer copying from the buffer past the deadline) is the whole
// connection given up, failing every channel.
//
// A channel that fails (a mismatch, the peer closing its end, a give-up) lets go of its
// operations when the failure first reaches its caller, while their buffers are still
// valid: a send the connection is moving is detached, the others dropped; the link never
// touches a buffer of it again.
//
// Threading: channels may be used from different threads at once; all state, the
// connection included, is guarded by one mutex (a SpinMutex: taken by every channel call
// and released between calls; pendingSends/pendingRecvs read counters without it).
// Whoever calls progress on any channel moves every channel's messages. Threads that wait
// on the link all sleep on one epoll descriptor of its own (made by the first sleep),
// which holds the connection's descriptor (armed by the first of them) and an eventfd:
// every pass that moves something while threads sleep gives each of them a token there,
// so a thread whose message another thread's pass took wakes at once.
class Link : public std::enable_shared_from_this<Link> {
 public:
  // The largest Accumulate element size a channel takes (the smallest a transport takes).
  static constexpr size_t kMaxElementBytes = 64;

  // Takes over `connection`, which carries nothing but this link's messages from now on.
  explicit Link(std::unique_ptr<Pair> connection);
  // A link whose connection is made when a channel first needs the peer (lazy
  // connection): a send, a receive or a notice posted on any channel asks `connector` for
  // it once. Until it is attached, messages wait in the link, peeking finds nothing, and
  // hungUp() asks the connector whether the peer's process is gone; threads that sleep on
  // the link wake when it is attached or fails. `kind` and `peerDescription` are what the
  // connection is expected to be ("shm", "tcp"): kind() says the attached one's.
  Link(int peerRank, std::string peerDescription, const char* kind, std::weak_ptr<LinkConnector> connector);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Opens channel `id`: a Pair for it, through which its users (rank `selfRank` of their
  // communicator) name the peer `peerRank` and `peerDescription`. Messages of the channel
  // that arrived before are its first. Throws InvalidArgument when `id` is open already
  // on this link.
  std::unique_ptr<Pair> open(ChannelId id, int selfRank, int peerRank, std::string peerDescription);

  // The connector's side of a lazy link. attach(): the connection is made; the link takes
  // it over and wakes its sleepers. Returns false (and drops it) when the link has one
  // already or failed. connectFailed(): it cannot be made; every channel fails with
  // `error` (as a connection that broke). Ignored once a connection is attached.
  bool attach(std::unique_ptr<Pair> connection);
  void connectFailed(std::exception_ptr error);
  // Whether a connection is attached (a link made with one always has).
  bool connected() const;

  // The connection's kind ("tcp", "shm"): the attached one's, the planned one until then.
  const char* kind() const { return kind_.load(std::memory_order_acquire); }
  // The kind the link was planned with, from what both ranks know (their records): the
  // same on both ends at any time, unlike kind() (a connection may fall back to TCP, and
  // one end may be attached before the other). For decisions both ranks must take alike.
  const char* plannedKind() const { return plannedKind_; }
  // Its peer's rank and description.
  int peerRank() const { return peerRank_; }
  const std::string& peerDescription() const { return peerDescription_; }

 private:
  friend class ChannelPair;

  struct Receive {
    Envelope expected;  // channel id included
    uint8_t* data;
    size_t bytes;
    Accumulate accumulate;
    bool discard = false;    // detached: takes its message, stores nothing
    bool tentative = false;  // ChannelPair::postTentativeRecv: refuses another message
  };

  // A message taken before its receive (or while it arrives).
  struct Arrived {
    Envelope envelope;
    size_t bytes;
    std::unique_ptr<uint8_t[]> data;
    bool complete;
  };

  // What the link keeps of one channel id: what the peer sent on it, and, while a
  // ChannelPair has it open, that pair's operations.
  struct Channel {
    ChannelId id;
    bool open = false;
    // The pair's side (while open).
    int selfRank = -1;
    int peerRank = -1;
    std::string peerDescription;
    // Written under the mutex, read without it (pendingSends, pendingRecvs): a release
    // store after the operation's buffer is done with, read with acquire.
    std::atomic<uint64_t> sendsPosted{0};
    std::atomic<uint64_t> sendsRetired{0};
    std::atomic<size_t> receivesPending{0};  // receives.size()
    std::deque<Receive> receives;  // posted, unfinished; the front may be a transfer's target
    std::exception_ptr failure;    // this channel's own failure (a mismatch, given up)
    bool wantsIncoming = false;    // armed for incoming messages (armWaitForIncoming)
    bool sleeping = false;         // armed: its thread sleeps on the link
    bool closed = false;           // given up (sendNotice): its close message is sent
    bool refused = false;          // its tentative receive refused the next message
    // The peer's side.
    std::deque<Arrived> arrived;  // in arrival order

    void pushReceive(const Receive& receive) {
      receives.push_back(receive);
      receivesPending.store(receives.size(), std::memory_order_release);
    }
    void popReceive() {
      receives.pop_front();
      receivesPending.store(receives.size(), std::memory_order_release);
    }
    void clearReceives() {
      receives.clear();
      receivesPending.store(0, std::memory_order_release);
    }
    bool sendsDone() const {
      return sendsRetired.load(std::memory_order_acquire) == sendsPosted.load(std::memory_order_relaxed);
    }
    bool peerClosed = false;      // nothing arrives after `arrived`
  };

  // A message handed to (or waiting for) the connection. `channel` is null for the link's
  // own messages (a closed channel's close message).
  struct Outgoing {
    Channel* channel;
    Envelope envelope;
    const void* data;
    size_t bytes;
    std::unique_ptr<uint8_t[]> copy;  // the payload, once detached (data points here)
  };

  // Where the connection's posted receive (at most one) lands. kTentative: the first
  // receive of incomingChannel_, posted before its message was seen (Pair::
  // postTentativeRecv); refused, it is withdrawn and the message dispatched.
  enum class Incoming { kNone, kTentative, kIntoReceive, kIntoArrived, kDropped };

  // Each below runs with mutex_ held.
  // A channel needs the peer: asks the connector for the connection if there is none and
  // it was not asked yet (a link whose connector is gone fails).
  void needConnection();
  // Moves every channel's messages as far as possible without waiting; records a
  // connection failure instead of throwing. Returns whether anything moved; gives the
  // sleepers their tokens when it did.
  bool drive();
  // Decides where the connection's next message goes; false when it stays there.
  bool dispatch(const Envelope& envelope, size_t bytes);
  void finishIncoming();
  // Posts channel's first receive to the connection tentatively when nothing else is
  // posted or waiting there and nothing of the channel's arrived before: most messages are
  // then received as directly as on a connection of their own.
  void postTentatively(Channel& channel);
  // Takes the connection's receive away from `channel` (closing or detaching it): a
  // tentative one not started is withdrawn, one started is left to drop its message.
  void releaseIncoming(Channel& channel);
  // Serves the channel's receives from its arrived messages, in order; a message of
  // another shape fails the channel.
  void serve(Channel& channel);
  // Whether a channel other than `except` waits for an incoming message.
  bool anotherChannelWaits(const Channel* except) const;
  // The channel record of `id`, made (not open) when there is none.
  Channel& channelFor(ChannelId id);
  // Hands `message` to the connection (nothing in flight).
  void startSending(Outgoing message);
  // The connection threw `error` (a pass of drive(), or a take): records it as
  // connectionFailed() does, a non-network error as the connection's end.
  void connectionThrew(std::exception_ptr error);
  // The connection failed (or ended): records how, closes every channel for the peer.
  void connectionFailed(std::exception_ptr error, bool clean);
  // Gives up the connection for good (best effort notice, bounded by deadline).
  void abandonConnection(const std::string& why, net::Deadline deadline);
  // Throws the connection's failure (or its end) as `channel` names its peer, naming the
  // channel's pending operation.
  [[noreturn]] void rethrowConnectionFailure(const Channel& channel) const;
  // "the receive of 16 bytes of allreduce(seq=1, ...)": the channel's oldest pending
  // operation, "" when it has none.
  std::string pendingText(const Channel& channel) const;
  void failChannel(Channel& channel, std::exception_ptr error);
  // Gives every sleeping thread a token (wakes it), unless it has one already.
  void signalSleepers();
  // The epoll descriptor sleepers poll (made with the eventfd on first use; -1 when the
  // kernel refuses: sleepers then poll the connection, or nothing, in timed sleeps).
  int sleepDescriptor();
  // A sleeper leaves: takes back its token if it was given one.
  void takeToken();
  // The pair that armed the connection leaves it: disarmed, out of the epoll set's
  // interest, and another sleeper woken to take it over.
  void disarmConnection();
  // Drives until `done()`, the deadline, or kStallLimit without any move; releases the
  // mutex between passes. Returns done().
  template <typename Done>
  bool driveUntil(std::unique_lock<SpinMutex>& lock, net::Deadline deadline, Done done);
  // Lets go of `channel`'s operations: detaches a message of it that the connection is
  // moving (Pair::detachSends when sendBuffersValid, detachRecvs; when a send cannot be
  // detached, gives the connection up), drops its other operations and what arrived for
  // it. The link touches none of its buffers afterwards.
  void quiesce(Channel& channel, net::Deadline deadline, bool sendBuffersValid);
  // Closes `channel` (ChannelPair::sendNotice, ~ChannelPair): quiesce(), then its close
  // message is queued.
  void close(Channel& channel, net::Deadline deadline, bool sendBuffersValid);

  mutable SpinMutex mutex_;
  std::unique_ptr<Pair> connection_;  // null until attached (lazy links)
  std::atomic<const char*> kind_;
  const char* const plannedKind_;
  std::weak_ptr<LinkConnector> connector_;  // lazy links only
  bool connectionRequested_ = false;
  int peerRank_;
  std::string peerDescription_;

  std::unordered_map<ChannelId, std::unique_ptr<Channel>> channels_;
  Channel* lastChannel_ = nullptr;  // the one channelFor found last (most messages are its)
  std::unordered_set<ChannelId> closedHere_;  // their late messages are dropped

  std::deque<Outgoing> outgoing_;  // not handed to the connection yet, posting order
  bool sending_ = false;           // inFlight_ is handed to the connection, unfinished
  Outgoing inFlight_{};

  Incoming incoming_ = Incoming::kNone;
  Channel* incomingChannel_ = nullptr;       // kTentative, kIntoReceive, kIntoArrived
  std::unique_ptr<uint8_t[]> dropped_;       // kDropped's target
  // The connection's next message was looked at and left there (large, unmatched):
  // its envelope and size.
  bool headLeft_ = false;
  Envelope headEnvelope_{};
  size_t headBytes_ = 0;

  std::exception_ptr failure_;  // the connection's failure: every channel rethrows it
  bool ended_ = false;          // it ended cleanly (failure_ holds how, for who needs the peer)

  // Sleeping.
  const void* connectionArmedBy_ = nullptr;  // the pair whose thread armed the connection
  int sleepers_ = 0;                         // pairs whose threads sleep on the link
  int tokens_ = 0;                           // tokens in notify_ (a semaphore eventfd)
  net::Socket notify_;                       // eventfd, in epoll_
  net::Socket epoll_;                        // notify_, and the connection while armed
  bool connectionInEpoll_ = false;
  int connectionFd_ = -1;  // the connection's descriptor in epoll_
  bool sleepDescriptorsFailed_ = false;  // the kernel refused them once: not asked again
};

// One channel of a Link: a Pair over the link's connection whose messages are those of
// its channel only (see Link). Every call takes the link's mutex. Envelopes go out with
// the channel's id and are reported without it (peekIncoming, EnvelopeMismatch), so that
// the layers above see what they posted.
class ChannelPair final : public Pair {
 public:
  // Closes the channel (its close message tells the peer's end) unless sendNotice() did:
  // pending operations are dropped without touching their buffers; a send the connection
  // is in the middle of then gives the whole connection up (give up with sendNotice(),
  // while the buffers are valid, to keep it).
  ~ChannelPair() override;

  const char* kind() const override { return link_->kind(); }
  void postSend(const Envelope& envelope, const void* data, size_t bytes) override;
  void postRecv(const Envelope& expected, void* data, size_t bytes, const Accumulate& accumulate) override;
  bool progress() override;
  size_t pendingSends() const override;
  size_t pendingRecvs() const override;
  bool peekIncoming(Envelope* envelope, size_t* bytes) override;
  // The message peekIncoming() reported: from the channel's arrived messages, or from
  // the connection (Pair::takeIncoming) when it was left there.
  bool takeIncoming(void* data, size_t bytes) override;
  bool endedCleanly() const noexcept override;
  bool peerTookEverything() const noexcept override;
  void postTentativeRecv(const Envelope& expected, void* data, size_t bytes, const Accumulate& accumulate) override;
  bool recvRefused() const noexcept override;
  bool withdrawTentativeRecv() noexcept override;
  bool detachSends(net::Deadline deadline) override;
  void detachRecvs() override;
  void checkIncoming(const Envelope* current) override;
  bool hungUp() noexcept override;
  void armWait(pollfd* pfd) override;
  void armWaitForIncoming(pollfd* pfd) override;
  void disarmWait() override;
  // Closes the channel (Link::close: its operations dropped, a message the connection is
  // moving detached: the buffers of pending sends must still be valid, a send in flight
  // is copied), then queues `notice` and the channel's close message, and drives the link
  // until they are handed to the connection, the deadline passes, or it stops moving
  // (they then go with a later pass of any channel). The channel is failed afterwards (a
  // NetworkError saying it was abandoned), the link and its other channels are not.
  void sendNotice(const Envelope& notice, net::Deadline deadline) noexcept override;

 private:
  friend class Link;
  ChannelPair(std::shared_ptr<Link> link, Link::Channel* channel);

  Envelope stamped(const Envelope& envelope) const;
  // Throws the channel's failure, or the connection's (as the channel names the peer).
  void rethrowIfFailed();
  // Records `error` as the channel's failure (unless it has one), lets go of the
  // channel's operations (Link::quiesce: their buffers are valid until this returns) and
  // throws the channel's failure.
  [[noreturn]] void fail(std::exception_ptr error);
  // The PeerError of a channel whose peer closed its end, `doing` saying when.
  std::exception_ptr peerClosedError(const std::string& doing) const;
  void arm(pollfd* pfd, bool incoming);

  std::shared_ptr<Link> link_;
  Link::Channel* channel_;  // owned by link_, guarded by its mutex
};

}  // namespace ringtree::transport::mux
