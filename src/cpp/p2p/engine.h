#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/communicator.h>
#include <ringtree/types.h>
#include <ringtree/work.h>

#include "common/inline_vector.h"
#include "common/socket.h"
#include "p2p/waiter.h"
#include "transport/pair.h"

namespace ringtree::detail {

// What runs PointToPoint (see <ringtree/p2p.h> for the public contract).
//
// Every message from one peer arrives through its pair in send order. The engine looks
// at the next one (Pair::peekIncoming) and decides where it goes:
//   - a posted receive takes it (the oldest receive with its tag, naming its sender or
//     any source): the pair receives it straight into the receive's buffer;
//   - none does, but it is small (<= kEagerBytes) or a receive that may match a later
//     message of that peer is waiting behind it: it is taken into a buffer of the
//     engine's (an "unexpected" message), which a later matching receive copies from;
//   - otherwise (large and unmatched) it stays in the pair, and its sender's send stays
//     pending, until a receive for it is posted: big messages are never copied twice.
// Sends are posted to their pair at once, in call order; a send finishes when the pair
// has taken its bytes.
//
// Failures are per peer. A broken connection fails every operation with that peer and
// every receive from any source (NetworkError). A peer that shuts down sends a notice
// first: its operations fail the same way, but receives from any source keep waiting for
// the other peers (until none is left). A type/count mismatch fails the receive
// (CollectiveMismatchError), tells the sender with a notice, and gives up the connection;
// the sender, on that notice, fails its operations with this rank the same way. An
// operation still pending after the communicator's timeout fails with TimeoutError; when
// its bytes were already handed to the pair (a send, or a receive that is arriving) the
// connection is given up too, since the pair would otherwise still touch the buffer.
// Once a peer's connection is given up, later operations with it fail at once (a
// receive may still take a message that had arrived completely before).
//
// Blocking send/recv post their operation exactly as isend/irecv do (same queues, same
// matching, same failure rules), but its outcome goes to a Waiter on the caller's stack
// instead of a Work. When the engine has nothing else pending with the peer (for a
// receive from any source: nothing at all) and the progress thread is not asleep on that
// pair, the caller claims the peer (every peer, for any source) and drives its pair
// itself until the operation completes: the progress thread leaves claimed peers alone
// (they are not active()), and the caller releases them, waking the thread if they still
// have work (operations other threads posted meanwhile, which the caller's passes
// progressed too; posting one nudges the claimer out of its poll(), as posting wakes the
// progress thread). Otherwise the caller wakes the progress thread and waits on its
// Waiter.
//
// Work::wait() on the Work of an isend/irecv drives the same way (driveWork, the Work's
// progress driver): unless the operation is done or another caller holds one of its peers,
// the waiter claims them (its peer, every peer for any source), waking the progress
// thread out of a poll() on them first, drives until the operation completes or the
// wait's deadline passes, then releases them as a blocking call does.
//
// Threading: all state, the pairs included, is guarded by mutex_. The progress thread,
// callers of isend/irecv (a caller does the work that is ready at once, so a message that
// has arrived or a send that fits completes without a thread hand-off) and callers of
// send/recv and waiters of Works that claimed peers make progress under it, releasing it
// between passes. A pair is armed for poll() by one sleeper at a time (Peer::armed).
// Works and Waiters are completed, and unexpected messages copied out, after the mutex is
// released, so that a Work callback may call isend/irecv, and send/recv unless it runs on
// the progress thread (refused there: it could wait for itself); a claimer lets go of its
// peers while callbacks run, so that the progress thread can serve such a call.
class PointToPointEngine : public std::enable_shared_from_this<PointToPointEngine> {
 public:
  // The engine's own communicator: its pairs must carry nothing but this engine's
  // messages. Throws InvalidArgument for a null communicator. Must be owned by a
  // shared_ptr: the Works it hands out reach it through weak ones.
  explicit PointToPointEngine(std::shared_ptr<Communicator> communicator);
  // shutdown(). Must not run on the progress thread (from a Work callback) unless it is
  // the last thing that callback does with the engine.
  ~PointToPointEngine();
  PointToPointEngine(const PointToPointEngine&) = delete;
  PointToPointEngine& operator=(const PointToPointEngine&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // See PointToPoint. Throw InvalidArgument for bad arguments, Error after shutdown().
  std::shared_ptr<Work> isend(const void* data, size_t count, DataType type, int peer, int tag,
                              std::shared_ptr<void> keepAlive);
  std::shared_ptr<Work> irecv(void* data, size_t count, DataType type, int peer, int tag,
                              std::shared_ptr<void> keepAlive);
  // See PointToPoint. Throw InvalidArgument for bad arguments and when called on the
  // progress thread (from a Work callback: waiting there could wait for itself), Error
  // after shutdown(), and the operation's error.
  void send(const void* data, size_t count, DataType type, int peer, int tag);
  int recv(void* data, size_t count, DataType type, int peer, int tag);

  // Fails every pending operation with Error, stops the progress thread (joined unless
  // called on it) and refuses new operations. Idempotent.
  void shutdown();

  // Unmatched messages up to this size are taken into the engine's buffers at once.
  static constexpr size_t kEagerBytes = size_t{64} << 10;
  // The progress thread, and a blocking call, spin this long after the last progress
  // before they sleep in poll(), each sleep lasting at most kMaxSleepMs (a missed wake-up
  // costs that much). When the ranks outnumber the cores every pass of the spin yields the
  // core (pausesBeforeYield), so a longer spin costs the ranks that have work little, and
  // it spares the sleeps after which a woken rank waits for a core: a 4-rank sendrecv ring
  // on 2 cores went from 6.6-10.7 us an exchange (median 8.1) to 5.0-10.6 (median 5.9).
  static constexpr std::chrono::microseconds kSpinTime{50};
  static constexpr std::chrono::microseconds kOversubscribedSpinTime{1000};
  static constexpr int kMaxSleepMs = 100;
  // An isend/irecv that cannot finish at once is left for this long to a Work::wait()
  // that drives it on the waiting thread, before the progress thread takes it over (a
  // wait() that comes sooner spares the thread's wake-up and its contention for the CPU).
  // For kIdleLinger after its last such hand-off the idle thread wakes every
  // kLingerPeriod by itself, so that new operations need not wake it (it then takes them
  // over up to kLingerPeriod late). Not every kHandOffDelay: each wake-up takes a core
  // from ranks that spin, which made blocking send/recv 30% slower at 2 ranks on 2 cores
  // while the linger lasted (10% at this period).
  static constexpr std::chrono::microseconds kHandOffDelay{200};
  static constexpr std::chrono::milliseconds kIdleLinger{20};
  static constexpr std::chrono::milliseconds kLingerPeriod{1};
  // How long a rank that gives up a connection tries to hand its notice to the pair.
  static constexpr std::chrono::milliseconds kNoticeTimeout{100};

 private:
  // A blocking send/recv's operation, on its caller's stack; also what a Work::wait()
  // that drives its Work's peers claims them with (its Waiter then only ever nudged).
  struct BlockingCall {
    Waiter waiter;
    bool completed = false;  // under mutex_: its Completion is queued (see complete())
  };

  // The engine's side of an isend/irecv's Work, shared with the Work's progress driver.
  // Under mutex_.
  struct WorkProgress {
    bool completed = false;          // its Completion is queued
    BlockingCall* driver = nullptr;  // the Work::wait() that claimed its peers, if any
  };

  // Who learns how an operation ended: its Work (isend, irecv; `progress` is the Work's)
  // or, when `call` is set, the caller of send/recv blocked on it.
  struct Owner {
    std::shared_ptr<Work> work;
    BlockingCall* call = nullptr;
    std::shared_ptr<WorkProgress> progress;
  };

  // A posted receive. Shared: it moves between the matching queues, an arriving
  // unexpected message and a peer's transfer. A blocking recv's lives on its caller's
  // stack (a ReceivePtr without ownership): every reference to it is dropped, under
  // mutex_, when it completes, which is before its caller returns.
  struct Receive {
    Owner owner;
    const char* opName;  // "irecv" or "recv", for messages
    int peer;            // or kAnySource
    int tag;
    DataType type;
    size_t count;
    uint8_t* data;
    size_t bytes;
    uint64_t order;  // posting order among all receives: the oldest match wins
    net::Deadline deadline;
  };
  using ReceivePtr = std::shared_ptr<Receive>;

  // A send posted to its pair and not finished yet.
  struct Send {
    Owner owner;
    const char* opName;  // "isend" or "send", for messages
    int tag;
    DataType type;
    size_t count;
    uint64_t sequence;  // its message number to this peer (wire.h)
    net::Deadline deadline;
  };

  // A message that arrived (or is arriving) before a receive took it.
  struct Unexpected {
    transport::Envelope envelope;  // tag, type, count, sequence as sent
    uint64_t arrival;              // engine-wide arrival order (receives from any source)
    std::unique_ptr<uint8_t[]> data;
    size_t bytes;
    bool complete = false;
    ReceivePtr taker;  // a receive that took it while it was still arriving
  };

  // What the pair's posted receive (at most one) lands in.
  enum class Transfer { kNone, kIntoReceive, kIntoUnexpected };

  // Why a connection was given up; decides the error class of the operations it fails.
  enum class FailureKind {
    kBroken,    // the pair failed (peer died, protocol error): NetworkError; receives
                // from any source fail too
    kGivenUp,   // this rank or the peer gave it up (timeout, shutdown): NetworkError
    kMismatch,  // a type/count mismatch: CollectiveMismatchError
    kShutdown,  // this engine was shut down: Error
  };

  struct Peer {
    transport::Pair* pair = nullptr;  // null for this rank
    std::deque<Send> sends;           // posting order
    std::deque<ReceivePtr> receives;  // naming this peer, unmatched, oldest first
    std::deque<Unexpected> unexpected;  // arrival order; with kIntoUnexpected the last is arriving
    Transfer transfer = Transfer::kNone;
    ReceivePtr transferReceive;  // with kIntoReceive
    // The next message is large and unmatched and was left in the pair: no need to wait
    // for it to arrive.
    bool headLeftInPair = false;
    uint64_t nextSendSequence = 1;
    uint64_t nextReceiveSequence = 1;
    bool failed = false;  // the connection was given up: failureKind, failureReason say why
    FailureKind failureKind = FailureKind::kBroken;
    std::string failureReason;
    BlockingCall* claimer = nullptr;  // the blocking send/recv that drives this pair, if any
    bool armed = false;    // the pair is armed for a poll() (by the thread or the claimer)
  };

  // An operation to complete once mutex_ is released.
  struct Completion {
    Owner owner;
    std::exception_ptr error;
    int sourceRank = -1;
    // A receive served by an unexpected message: its bytes, copied before completion.
    std::unique_ptr<uint8_t[]> copyFrom;
    uint8_t* copyTo = nullptr;
    size_t copyBytes = 0;
  };
  // A call's completions: the few of a small call without an allocation.
  using Completions = InlineVector<Completion, 4>;

  // Completes the Works and Waiters in order (copying unexpected messages out first).
  // Touches nothing of the engine: a Work callback may destroy it.
  static void finishAll(Completions* done);

  // mutex_ for a caller of isend/irecv/send/recv/shutdown: the progress thread lets it in
  // between two of its passes (std::mutex alone does not, under a busy thread).
  std::unique_lock<std::mutex> lockForCaller();

  // Check a call's arguments (throw InvalidArgument naming `op`); return its payload bytes.
  size_t checkSendArguments(const void* data, size_t count, DataType type, int peer, int tag,
                            const char* op) const;
  size_t checkReceiveArguments(const void* data, size_t count, DataType type, int peer, int tag,
                               const char* op) const;

  // Each below runs with mutex_ held.
  void startThreadIfNeeded();
  void wakeThread();
  // Throws Error after shutdown(), and for send/recv (`blocking`) on the progress thread.
  void refuseCall(const char* op, bool receive, int peer, bool blocking) const;
  // Posts a send or a receive (counted in pendingOperations_) and does what is ready at
  // once; the outcome goes to its owner, possibly through `done` already.
  void postSend(Owner owner, const char* opName, const void* data, size_t bytes, size_t count, DataType type,
                int peer, int tag, Completions* done);
  void postReceive(const ReceivePtr& receive, Completions* done);
  // Whether a blocking call with `peer` (or kAnySource) may claim it (see the class
  // comment); asked before its operation is posted.
  bool claimable(int peer) const;
  // A blocking call's operation is posted: unless it completed already, claims `claim`'s
  // peers (a peer, or kAnySource: all) and drives them until it completes, or with
  // kNoClaim leaves it to the progress thread. Releases mutex_ between passes (finishing
  // `done` then) and returns with it held; the call's Waiter may still wait for whoever
  // completed it to finish it. noexcept: leaving early would leave the call's operation,
  // which may live on the caller's stack, in the engine. Only for a Work's driver, whose
  // operation stays in the engine, may `until` end the drive before it completes.
  void completeBlocking(std::unique_lock<std::mutex>& lock, int claim, BlockingCall& call,
                        Completions* done, net::Deadline until = net::kNoDeadline) noexcept;
  static constexpr int kNoClaim = -2;
  // An isend/irecv is posted with a BlockingCall of its caller's as its owner, so that one
  // that completes at once (a small send the pair took, a message that had arrived) needs
  // no Work until it is done (Work::completed). One still pending when the call is about
  // to release mutex_ gets its Work here: `owner` (the operation's, in the engine) becomes
  // the Work's, with `peer` (or kAnySource), `keepAlive` and its progress driver set.
  // noexcept: the operation is queued with the stack owner, which must not outlive the
  // call, so an allocation failure here ends the process rather than leave it there.
  std::shared_ptr<Work> adoptPending(Owner* owner, const char* opName, int peer,
                                     std::shared_ptr<void> keepAlive) noexcept;
  // The progress driver (see the class comment): returns at once on the progress thread.
  // With Deadline::min() (a callback was added: nobody may wait) it hands the operation
  // to the progress thread at once.
  void driveWork(WorkProgress& progress, int peer, net::Deadline until) noexcept;
  // The peer indices a claim (or an operation's peer) covers: [claimBegin, claimEnd),
  // this rank included.
  int claimBegin(int claim) const;
  int claimEnd(int claim) const;
  // Sets (or clears, with null) the claimer of the peers `claim` covers.
  void setClaimer(int claim, BlockingCall* claimer);
  // An operation with `peer` (or kAnySource) was posted: wakes the claimers of the peers
  // it involves if they sleep, so that they arm their pairs for it.
  void nudgeClaimers(int peer);
  // One pass of a claiming caller: deadlines (when `checkDeadlines`: a clock read), then
  // progress on the claimed peers. Its spin checks deadlines every kDeadlinePasses passes
  // (and before it sleeps): an operation fails at most that many passes late.
  bool progressClaimed(int claim, Completions* done, bool checkDeadlines);
  static constexpr unsigned kDeadlinePasses = 8;
  // The caller's sleep: arms the claimed pairs and the Waiter, gives progress one more
  // chance, then sleeps in poll() with mutex_ released. Returns whether that pass moved.
  bool sleepClaimed(std::unique_lock<std::mutex>& lock, int claim, BlockingCall& call, net::Deadline until,
                    Completions* done);
  // Whether the progress thread has work with peer: something pending and no claimer.
  bool active(const Peer& peer) const;
  bool anyActivePeer() const;
  // Arms peer's pair for poll() (for incoming messages too when its stream is free) /
  // disarms it if armed.
  void armPeer(Peer& peer, pollfd* pfd);
  void disarmPeer(Peer& peer);
  // Whether some peer's connection is still up (a receive from any source can complete).
  bool anyPeerLive() const;
  // Everything that can move without waiting, on every active peer; fails what is past
  // its deadline. Returns whether anything moved or completed.
  bool progressAll(Completions* done);
  // Never throws: a pair error gives up the connection to that peer.
  bool progressPeer(int peer, Completions* done);
  bool retireSends(Peer& peer, Completions* done);
  bool finishTransfer(int peer, Completions* done);
  // Decides where the next message of `peer` goes (see the class comment). Returns false
  // when it stays in the pair (large and unmatched, or the peer failed on it).
  bool acceptIncoming(int peer, const transport::Envelope& envelope, size_t bytes, Completions* done);
  ReceivePtr takeMatchingReceive(int peer, int tag);
  bool receivesMayWaitBehind(const Peer& peer) const;
  // A new receive takes the oldest unexpected message it matches; returns false when
  // there is none (it then waits in a matching queue).
  bool takeUnexpected(const ReceivePtr& receive, Completions* done);
  // Gives an unexpected message that became free (its taker timed out) to the oldest
  // queued receive it matches.
  void offerUnexpected(int peer, size_t index, Completions* done);
  // Serves `receive` from unexpected message `index` of `peer` (type and count checked).
  void serveFromUnexpected(int peer, size_t index, const ReceivePtr& receive, Completions* done);
  void reportMismatch(int peer, const ReceivePtr& receive, const transport::Envelope& message, Completions* done);
  void handleNotice(int peer, const transport::Envelope& notice, Completions* done);
  // Gives up the connection to `peer`: fails every pending operation with it (and, for
  // kNetwork, every receive from any source) with `reason`, and drops what its pair
  // holds, sending `notice` first when given.
  void failPeer(int peer, FailureKind kind, const std::string& reason, const transport::Envelope* notice,
                Completions* done);
  void failDueOperations(Completions* done);
  void failAllForShutdown(Completions* done);
  // Counts the operation as done (a blocking one as completed) and queues its Completion.
  void complete(const Owner& owner, std::exception_ptr error, Completions* done, int sourceRank = -1);
  std::exception_ptr errorFor(FailureKind kind, const std::string& operation, const std::string& reason) const;
  std::string describe(const Receive& receive) const;
  std::string describe(int peer, const Send& send) const;

  // The progress thread.
  void run(const std::shared_ptr<std::atomic<bool>>& engineAlive);
  // For isend/irecv that left operations pending: starts the thread if needed and makes
  // sure it takes them over at handOffAt_ unless a Work::wait() finishes them first.
  void handOffLater(bool firstPending);
  // Whether a blocking call that let go of `claim` may take it back: no other caller
  // claimed those peers and the thread does not sleep on them.
  bool reclaimable(int claim) const;
  // Makes the thread take every pending operation that no caller drives, at once.
  void handOffNow();
  // The idle thread's sleep: until the next hand-off, or a linger period, or a wake-up.
  void sleepIdle(std::unique_lock<std::mutex>& lock);
  // Arms the active pairs and the wake-up descriptor, gives progress one more chance,
  // then sleeps in poll() with mutex_ released. Returns whether that last pass moved.
  bool sleepInPoll(std::unique_lock<std::mutex>& lock, Completions* done);
  void drainWakeFd();

  std::shared_ptr<Communicator> communicator_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const int pausesBeforeYield_;  // of its spin-waits (Backoff): all ranks may be on this host
  const std::chrono::microseconds spinTime_;  // of its spin-waits: kSpinTime or kOversubscribedSpinTime
  net::Socket wakeFd_;  // eventfd (made with the thread): a submission wakes the thread from poll()

  std::mutex mutex_;
  std::atomic<int> callersWaiting_{0};  // callers blocked on mutex_ (see lockForCaller)
  std::condition_variable idleCv_;      // the thread sleeps here while nothing is pending
  std::vector<Peer> peers_;
  std::deque<ReceivePtr> anySourceReceives_;  // unmatched, oldest first
  size_t pendingOperations_ = 0;              // sends and receives not completed yet
  uint64_t nextReceiveOrder_ = 0;
  uint64_t nextArrival_ = 0;
  net::Deadline nextDeadline_ = net::kNoDeadline;  // no pending operation is due earlier
  bool shutDown_ = false;
  enum class ThreadState { kRunning, kIdle, kPolling } threadState_ = ThreadState::kRunning;
  bool wakeSignalled_ = false;  // a byte is in wakeFd_ since the thread last drained it
  bool idleTimed_ = false;      // the idle thread wakes by itself within kLingerPeriod
  // The thread leaves pending operations to their waiters until handOffAt_; it lingers in
  // timed sleeps until lingerUntil_.
  net::Clock::time_point handOffAt_{};
  net::Clock::time_point lingerUntil_{};
  std::thread thread_;
  std::shared_ptr<std::atomic<bool>> engineAlive_;  // cleared if destroyed on the thread
};

}  // namespace ringtree::detail
