#include "p2p/engine.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <utility>

#include <ringtree/before_waiting.h>
#include <ringtree/error.h>
#include <ringtree/p2p.h>

#include "common/cpu.h"
#include "common/logging.h"
#include "common/validation.h"
#include "communicator_impl.h"
#include "p2p/wire.h"

// The engine's life cycle, its entry points, progress and the progress thread. Matching
// is in matching.cc, completions and failures in failures.cc.
namespace ringtree::detail {

namespace {

using Clock = net::Clock;

constexpr int kAnySource = PointToPoint::kAnySource;

std::shared_ptr<Communicator> nonNull(std::shared_ptr<Communicator> communicator) {
  if (communicator == nullptr) throw InvalidArgument("PointToPoint: the communicator is null");
  return communicator;
}

}  // namespace

PointToPointEngine::PointToPointEngine(std::shared_ptr<Communicator> communicator)
    : communicator_(nonNull(std::move(communicator))),
      rank_(communicator_->rank()),
      size_(communicator_->size()),
      timeout_(communicator_->timeout()),
      pausesBeforeYield_(pausesBeforeYield(size_)),
      spinTime_(pausesBeforeYield_ == 0 ? kOversubscribedSpinTime : kSpinTime),
      peers_(static_cast<size_t>(size_)),  // built in place: a Peer is not copyable
      engineAlive_(std::make_shared<std::atomic<bool>>(true)) {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) peers_[static_cast<size_t>(peer)].pair = &communicator_->impl().pair(peer);
  }
}

PointToPointEngine::~PointToPointEngine() {
  shutdown();
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      // Destroyed by a Work callback on the progress thread: it must not touch the
      // engine once the callback returns.
      engineAlive_->store(false);
      thread_.detach();
    } else {
      thread_.join();  // shutdown() ran on the progress thread earlier and could not join
    }
  }
}

// ---------------------------------------------------------------------------------------
// Submissions

std::unique_lock<std::mutex> PointToPointEngine::lockForCaller() {
  callersWaiting_.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) {
    BeforeWaiting::notify();  // its holder may be in a long pass (a large copy, notices)
    lock.lock();
  }
  callersWaiting_.fetch_sub(1, std::memory_order_relaxed);
  return lock;
}

size_t PointToPointEngine::checkSendArguments(const void* data, size_t count, DataType type, int peer, int tag,
                                              const char* op) const {
  const size_t bytes = validation::checkedBytes(op, count, type);
  validation::checkPeer(op, peer, rank_, size_, /*anySourceAllowed=*/false);
  validation::checkTag(op, peer, tag, /*receive=*/false);
  validation::checkBuffer(op, "buffer", data, count);
  return bytes;
}

size_t PointToPointEngine::checkReceiveArguments(const void* data, size_t count, DataType type, int peer, int tag,
                                                 const char* op) const {
  const size_t bytes = validation::checkedBytes(op, count, type);
  validation::checkPeer(op, peer, rank_, size_, /*anySourceAllowed=*/true);
  validation::checkTag(op, peer, tag, /*receive=*/true);
  validation::checkBuffer(op, "buffer", data, count);
  return bytes;
}

void PointToPointEngine::refuseCall(const char* op, bool receive, int peer, bool blocking) const {
  const auto call = [&] {
    return "rank " + std::to_string(rank_) + ": " + op +
           (receive ? " from " + p2p::peerText(peer) : " to rank " + std::to_string(peer));
  };
  if (shutDown_) throw Error(call() + " after the point-to-point engine was shut down");
  if (blocking && thread_.joinable() && thread_.get_id() == std::this_thread::get_id()) {
    throw InvalidArgument(call() + " called from a Work callback on the progress thread, which would wait for "
                                   "itself; use i" + op + " there");
  }
}

void PointToPointEngine::postSend(Owner owner, const char* opName, const void* data, size_t bytes, size_t count,
                                  DataType type, int peer, int tag, Completions* done) {
  ++pendingOperations_;
  Peer& target = peers_[static_cast<size_t>(peer)];
  // The deadline is set if the send stays pending (most small ones finish here).
  Send send{std::move(owner), opName, tag, type, count, target.nextSendSequence, net::kNoDeadline};
  if (target.failed) {
    complete(send.owner, errorFor(target.failureKind, describe(peer, send), target.failureReason), done);
    return;
  }
  ++target.nextSendSequence;
  bool queued = false;
  try {
    target.pair->postSend(p2p::dataEnvelope(send.sequence, tag, type, count), data, bytes);
    target.sends.push_back(std::move(send));
    queued = true;
    // Hand the bytes over at once when that is all the pair has to do (a posted receive
    // may mean a large copy, which is the job of whoever drives the pair).
    if (target.pair->pendingRecvs() == 0) {
      target.pair->progress();
      retireSends(target, done);
    }
    if (!target.sends.empty()) {
      // Still pending (sends retire in order: this one is the last).
      Send& pending = target.sends.back();
      pending.deadline = net::deadlineAfter(timeout_);
      nextDeadline_ = std::min(nextDeadline_, pending.deadline);
      nudgeClaimers(peer);  // its claimer must arm for this send
    }
  } catch (const std::exception& e) {
    if (!queued) complete(send.owner, errorFor(FailureKind::kBroken, describe(peer, send), e.what()), done);
    failPeer(peer, FailureKind::kBroken, e.what(), nullptr, done);
  }
}

void PointToPointEngine::postReceive(const ReceivePtr& receive, Completions* done) {
  ++pendingOperations_;
  if (takeUnexpected(receive, done)) return;
  const int peer = receive->peer;
  const bool anySource = peer == kAnySource;
  if (!anySource && peers_[static_cast<size_t>(peer)].failed) {
    const Peer& source = peers_[static_cast<size_t>(peer)];
    complete(receive->owner, errorFor(source.failureKind, describe(*receive), source.failureReason), done);
  } else if (anySource && !anyPeerLive()) {
    complete(receive->owner,
             errorFor(FailureKind::kGivenUp, describe(*receive), "no rank can send to this rank any more"), done);
  } else {
    // Waits in a queue: due after the timeout from now (one served at once needs no clock).
    receive->deadline = net::deadlineAfter(timeout_);
    (anySource ? anySourceReceives_ : peers_[static_cast<size_t>(peer)].receives).push_back(receive);
    nextDeadline_ = std::min(nextDeadline_, receive->deadline);
    // Take the message at once if it has arrived.
    for (int source = claimBegin(peer); source < claimEnd(peer); ++source) {
      if (source != rank_) progressPeer(source, done);
    }
    nudgeClaimers(peer);  // their claimers must look again at what to arm for
  }
}

std::shared_ptr<Work> PointToPointEngine::isend(const void* data, size_t count, DataType type, int peer, int tag,
                                                std::shared_ptr<void> keepAlive) {
  const size_t bytes = checkSendArguments(data, count, type, peer, tag, "isend");
  BlockingCall atPost;  // its owner until it is found pending (see adoptPending)
  std::shared_ptr<Work> work;
  Completions done;
  {
    const auto lock = lockForCaller();
    refuseCall("isend", /*receive=*/false, peer, /*blocking=*/false);
    const bool firstPending = !anyActivePeer();
    postSend(Owner{nullptr, &atPost, nullptr}, "isend", data, bytes, count, type, peer, tag, &done);
    // Still pending: it is the last of the peer's sends.
    if (!atPost.completed) {
      work = adoptPending(&peers_[static_cast<size_t>(peer)].sends.back().owner, "isend", peer, std::move(keepAlive));
    }
    if (pendingOperations_ > 0) handOffLater(firstPending);
  }
  finishAll(&done);
  return work ? work : Work::completed("isend", atPost.waiter.error());
}

std::shared_ptr<Work> PointToPointEngine::irecv(void* data, size_t count, DataType type, int peer, int tag,
                                                std::shared_ptr<void> keepAlive) {
  const size_t bytes = checkReceiveArguments(data, count, type, peer, tag, "irecv");
  BlockingCall atPost;  // its owner until it is found pending (see adoptPending)
  std::shared_ptr<Work> work;
  Completions done;
  {
    const auto lock = lockForCaller();
    refuseCall("irecv", /*receive=*/true, peer, /*blocking=*/false);
    const bool firstPending = !anyActivePeer();
    const auto receive =
        std::make_shared<Receive>(Receive{Owner{nullptr, &atPost, nullptr}, "irecv", peer, tag, type, count,
                                          static_cast<uint8_t*>(data), bytes, nextReceiveOrder_++,
                                          net::kNoDeadline});  // see postReceive
    postReceive(receive, &done);
    if (!atPost.completed) work = adoptPending(&receive->owner, "irecv", peer, std::move(keepAlive));
    if (pendingOperations_ > 0) handOffLater(firstPending);
  }
  finishAll(&done);
  return work ? work : Work::completed("irecv", atPost.waiter.error(), atPost.waiter.sourceRank());
}

void PointToPointEngine::send(const void* data, size_t count, DataType type, int peer, int tag) {
  const size_t bytes = checkSendArguments(data, count, type, peer, tag, "send");
  BlockingCall call;
  Completions done;
  {
    auto lock = lockForCaller();
    refuseCall("send", /*receive=*/false, peer, /*blocking=*/true);
    const int claim = claimable(peer) ? peer : kNoClaim;
    postSend(Owner{nullptr, &call, nullptr}, "send", data, bytes, count, type, peer, tag, &done);
    completeBlocking(lock, claim, call, &done);
  }
  finishAll(&done);
  call.waiter.wait(spinTime_, pausesBeforeYield_);
  call.waiter.outcome();
}

int PointToPointEngine::recv(void* data, size_t count, DataType type, int peer, int tag) {
  const size_t bytes = checkReceiveArguments(data, count, type, peer, tag, "recv");
  BlockingCall call;
  Receive receive{Owner{nullptr, &call, nullptr}, "recv", peer, tag, type, count, static_cast<uint8_t*>(data), bytes, 0,
                  net::kNoDeadline};
  Completions done;
  {
    auto lock = lockForCaller();
    refuseCall("recv", /*receive=*/true, peer, /*blocking=*/true);
    const int claim = claimable(peer) ? peer : kNoClaim;
    receive.order = nextReceiveOrder_++;
    postReceive(ReceivePtr(ReceivePtr(), &receive), &done);  // owns nothing: see Receive
    completeBlocking(lock, claim, call, &done);
  }
  finishAll(&done);
  call.waiter.wait(spinTime_, pausesBeforeYield_);
  return call.waiter.outcome();
}

// ---------------------------------------------------------------------------------------
// Blocking calls that drive their peers

bool PointToPointEngine::claimable(int peer) const {
  // Nobody else drives it, nor sleeps on it, nor moves bytes on it.
  const auto untouched = [](const Peer& p) {
    return p.claimer == nullptr && !p.armed && p.transfer == Transfer::kNone;
  };
  if (peer == kAnySource) return pendingOperations_ == 0 && std::all_of(peers_.begin(), peers_.end(), untouched);
  const Peer& target = peers_[static_cast<size_t>(peer)];
  return untouched(target) && target.sends.empty() && target.receives.empty() && anySourceReceives_.empty();
}

int PointToPointEngine::claimBegin(int claim) const { return claim == kAnySource ? 0 : claim; }

int PointToPointEngine::claimEnd(int claim) const { return claim == kAnySource ? size_ : claim + 1; }

void PointToPointEngine::setClaimer(int claim, BlockingCall* claimer) {
  for (int index = claimBegin(claim); index < claimEnd(claim); ++index) {
    peers_[static_cast<size_t>(index)].claimer = claimer;
  }
}

void PointToPointEngine::nudgeClaimers(int peer) {
  for (int index = claimBegin(peer); index < claimEnd(peer); ++index) {
    if (BlockingCall* claimer = peers_[static_cast<size_t>(index)].claimer) claimer->waiter.nudge();
  }
}

std::shared_ptr<Work> PointToPointEngine::adoptPending(Owner* owner, const char* opName, int peer,
                                                       std::shared_ptr<void> keepAlive) noexcept {
  *owner = Owner{std::make_shared<Work>(opName, std::move(keepAlive)), nullptr, std::make_shared<WorkProgress>()};
  // Weak: a Work may outlive the engine (it is done by then: shutdown() fails the rest).
  owner->work->setProgressDriver([engine = weak_from_this(), progress = owner->progress, peer](net::Deadline until) {
    if (const auto alive = engine.lock()) alive->driveWork(*progress, peer, until);
  });
  return owner->work;
}

void PointToPointEngine::driveWork(WorkProgress& progress, int peer, net::Deadline until) noexcept {
  BlockingCall call;
  Completions done;
  {
    auto lock = lockForCaller();
    if (thread_.joinable() && thread_.get_id() == std::this_thread::get_id()) return;
    if (until == net::Deadline::min()) {  // nobody will wait: the thread's at once
      if (!progress.completed && !shutDown_) handOffNow();
      return;
    }
    // The progress thread may sleep on the peers in poll(): wake it, and claim them once it
    // let go of them; give up after a spin (it is then busy with them: leave them to it).
    Backoff backoff(spinTime_, pausesBeforeYield_);
    for (;;) {
      if (progress.completed || progress.driver != nullptr || shutDown_) return;
      bool claimedElsewhere = false;
      bool polledByThread = false;
      for (int index = claimBegin(peer); index < claimEnd(peer); ++index) {
        const Peer& target = peers_[static_cast<size_t>(index)];
        claimedElsewhere = claimedElsewhere || target.claimer != nullptr;
        polledByThread = polledByThread || target.armed;
      }
      if (claimedElsewhere || (until != net::kNoDeadline && Clock::now() >= until)) return;
      if (!polledByThread) break;
      if (backoff.spunOut()) return;
      wakeThread();
      lock.unlock();
      backoff.pause();
      lock = lockForCaller();
    }
    progress.driver = &call;
    completeBlocking(lock, peer, call, &done, until);
    progress.driver = nullptr;
  }
  finishAll(&done);
}

void PointToPointEngine::completeBlocking(std::unique_lock<std::mutex>& lock, int claim, BlockingCall& call,
                                          Completions* done, net::Deadline until) noexcept {
  if (call.completed) return;
  if (claim == kNoClaim) {
    handOffNow();  // the call waits for the thread: no hand-off delay
    return;
  }
  setClaimer(claim, &call);
  bool claimed = true;
  Backoff backoff(spinTime_, pausesBeforeYield_);
  for (unsigned pass = 1;; ++pass) {
    bool moved = progressClaimed(claim, done, pass % kDeadlinePasses == 0);
    if (moved) {
      backoff.restart();
    } else if (!call.completed && backoff.spunOut()) {
      moved = sleepClaimed(lock, claim, call, until, done);
      backoff.restart();
    }
    if (call.completed || (until != net::kNoDeadline && Clock::now() >= until)) break;
    // Other threads get their turn, and Works this pass completed their callbacks. The
    // claim is let go while callbacks run: one may make a blocking call with these peers,
    // which then waits for the progress thread (that thread skips claimed peers).
    if (!done->empty()) {
      setClaimer(claim, nullptr);
      claimed = false;
    }
    lock.unlock();
    finishAll(done);
    if (!moved) backoff.pause();
    lock = lockForCaller();
    if (call.completed) break;  // by another thread (shutdown, a deadline, its own pass)
    if (!claimed) {
      if (!reclaimable(claim)) break;  // the thread (or another caller) has them: wait for it
      setClaimer(claim, &call);
      claimed = true;
    }
  }
  if (claimed) setClaimer(claim, nullptr);
  // Operations other threads posted with the claimed peers meanwhile, and what a wait()
  // that gave up leaves, are the thread's now.
  if (anyActivePeer()) handOffNow();
}

bool PointToPointEngine::reclaimable(int claim) const {
  for (int index = claimBegin(claim); index < claimEnd(claim); ++index) {
    const Peer& peer = peers_[static_cast<size_t>(index)];
    if (peer.claimer != nullptr || peer.armed) return false;
  }
  return true;
}

bool PointToPointEngine::progressClaimed(int claim, Completions* done, bool checkDeadlines) {
  if (checkDeadlines) failDueOperations(done);
  bool moved = false;
  for (int index = claimBegin(claim); index < claimEnd(claim); ++index) {
    if (index != rank_) moved = progressPeer(index, done) || moved;
  }
  return moved || !done->empty();
}

bool PointToPointEngine::sleepClaimed(std::unique_lock<std::mutex>& lock, int claim, BlockingCall& call,
                                      net::Deadline until, Completions* done) {
  std::vector<pollfd> fds;
  for (int index = claimBegin(claim); index < claimEnd(claim); ++index) {
    Peer& peer = peers_[static_cast<size_t>(index)];
    if (peer.pair == nullptr || peer.failed) continue;
    fds.emplace_back();
    armPeer(peer, &fds.back());
  }
  // Something may have arrived between the last pass and arming.
  const bool moved = progressClaimed(claim, done, /*checkDeadlines=*/true);
  pollfd wake;
  if (!moved && !call.completed && call.waiter.prepareToSleep(&wake)) {
    fds.push_back(wake);
    int timeoutMs = net::pollTimeoutMs(std::min(nextDeadline_, until));
    if (timeoutMs < 0 || timeoutMs > kMaxSleepMs) timeoutMs = kMaxSleepMs;
    if (wake.fd < 0) timeoutMs = std::min(timeoutMs, Waiter::kNoWakeSleepMs);
    lock.unlock();
    BeforeWaiting::notify();
    if (::poll(fds.data(), fds.size(), timeoutMs) < 0 && errno != EINTR) {
      RINGTREE_WARN("rank " << rank_ << ": point-to-point: poll failed: " << net::errnoText(errno));
    }
    call.waiter.wokeUp();
    lock = lockForCaller();
  }
  for (int index = claimBegin(claim); index < claimEnd(claim); ++index) disarmPeer(peers_[static_cast<size_t>(index)]);
  return moved;
}

void PointToPointEngine::shutdown() {
  Completions done;
  std::thread toJoin;
  {
    const auto lock = lockForCaller();
    if (shutDown_) return;
    shutDown_ = true;
    // Tell every peer that nothing more comes from this rank (its receives from any source
    // keep waiting for the others): best effort and bounded. The pairs drop what they hold
    // then, while the operations' buffers are still valid (their Works are failed next,
    // which lets their owners free them).
    const transport::Envelope closed = p2p::notice(p2p::MessageKind::kClosedNotice);
    for (Peer& peer : peers_) {
      if (peer.pair != nullptr && !peer.failed) peer.pair->sendNotice(closed, net::deadlineAfter(kNoticeTimeout));
    }
    failAllForShutdown(&done);
    wakeThread();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) toJoin = std::move(thread_);
  }
  finishAll(&done);
  if (toJoin.joinable()) toJoin.join();
}

// ---------------------------------------------------------------------------------------
// Progress

bool PointToPointEngine::active(const Peer& peer) const {
  return peer.pair != nullptr && !peer.failed && peer.claimer == nullptr &&
         (!peer.sends.empty() || peer.transfer != Transfer::kNone || !peer.receives.empty() ||
          !anySourceReceives_.empty());
}

bool PointToPointEngine::anyActivePeer() const {
  return std::any_of(peers_.begin(), peers_.end(), [this](const Peer& peer) { return active(peer); });
}

void PointToPointEngine::armPeer(Peer& peer, pollfd* pfd) {
  if (peer.transfer == Transfer::kNone && !peer.headLeftInPair) {
    peer.pair->armWaitForIncoming(pfd);
  } else {
    peer.pair->armWait(pfd);
  }
  peer.armed = true;
}

void PointToPointEngine::disarmPeer(Peer& peer) {
  if (!peer.armed) return;
  peer.pair->disarmWait();
  peer.armed = false;
}

bool PointToPointEngine::retireSends(Peer& peer, Completions* done) {
  const size_t pending = peer.pair->pendingSends();
  bool retired = false;
  while (peer.sends.size() > pending) {
    complete(peer.sends.front().owner, nullptr, done);
    peer.sends.pop_front();
    retired = true;
  }
  return retired;
}

bool PointToPointEngine::finishTransfer(int index, Completions* done) {
  Peer& peer = peers_[static_cast<size_t>(index)];
  if (peer.transfer == Transfer::kNone || peer.pair->pendingRecvs() > 0) return false;
  const Transfer transfer = peer.transfer;
  peer.transfer = Transfer::kNone;
  if (transfer == Transfer::kIntoReceive) {
    complete(peer.transferReceive->owner, nullptr, done, index);
    peer.transferReceive.reset();
    return true;
  }
  Unexpected& arrived = peer.unexpected.back();
  arrived.complete = true;
  if (arrived.taker) {
    ReceivePtr taker = std::move(arrived.taker);
    serveFromUnexpected(index, peer.unexpected.size() - 1, taker, done);
  }
  return true;
}

bool PointToPointEngine::progressPeer(int index, Completions* done) {
  Peer& peer = peers_[static_cast<size_t>(index)];
  if (peer.failed) return false;
  bool moved = false;
  try {
    if (!peer.sends.empty() || peer.transfer != Transfer::kNone) peer.pair->progress();
    moved = retireSends(peer, done);
    moved = finishTransfer(index, done) || moved;
    peer.headLeftInPair = false;
    while (!peer.failed && peer.transfer == Transfer::kNone) {
      transport::Envelope envelope;
      size_t bytes = 0;
      if (!peer.pair->peekIncoming(&envelope, &bytes)) break;
      // A notice or mismatch completes operations (and so counts as progress) by itself.
      if (!acceptIncoming(index, envelope, bytes, done)) break;
      moved = true;
      if (peer.transfer != Transfer::kNone) {
        peer.pair->progress();  // a small message is usually complete already
        retireSends(peer, done);
        finishTransfer(index, done);
      }
    }
  } catch (const std::exception& e) {
    failPeer(index, FailureKind::kBroken, e.what(), nullptr, done);
    moved = true;
  }
  return moved;
}

bool PointToPointEngine::progressAll(Completions* done) {
  failDueOperations(done);
  bool moved = false;
  for (int index = 0; index < size_; ++index) {
    if (active(peers_[static_cast<size_t>(index)])) moved = progressPeer(index, done) || moved;
  }
  return moved || !done->empty();
}

// ---------------------------------------------------------------------------------------
// The progress thread

void PointToPointEngine::startThreadIfNeeded() {
  if (thread_.joinable() || shutDown_) return;
  if (!wakeFd_.valid()) {
    wakeFd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wakeFd_.valid()) {
      RINGTREE_WARN("rank " << rank_ << ": point-to-point: cannot create an eventfd (" << net::errnoText(errno)
                            << "); the progress thread wakes by itself every " << kMaxSleepMs << " ms instead");
    }
  }
  threadState_ = ThreadState::kRunning;
  thread_ = std::thread([this, alive = engineAlive_] { run(alive); });
}

void PointToPointEngine::wakeThread() {
  if (threadState_ == ThreadState::kIdle) {
    idleCv_.notify_one();
  } else if (threadState_ == ThreadState::kPolling && !wakeSignalled_ && wakeFd_.valid()) {
    const uint64_t one = 1;
    if (::write(wakeFd_.fd(), &one, sizeof(one)) == static_cast<ssize_t>(sizeof(one))) wakeSignalled_ = true;
  }
}

void PointToPointEngine::handOffLater(bool firstPending) {
  const auto now = Clock::now();
  if (firstPending) handOffAt_ = now + kHandOffDelay;  // older pending ones keep theirs
  lingerUntil_ = now + kIdleLinger;
  startThreadIfNeeded();
  // A thread polling other operations' peers would not see these until a wake-up; an idle
  // one in a timed sleep wakes by itself in time.
  if (threadState_ == ThreadState::kPolling || (threadState_ == ThreadState::kIdle && !idleTimed_)) wakeThread();
}

void PointToPointEngine::handOffNow() {
  handOffAt_ = Clock::now();
  startThreadIfNeeded();
  wakeThread();
}

void PointToPointEngine::sleepIdle(std::unique_lock<std::mutex>& lock) {
  const auto now = Clock::now();
  const bool active = anyActivePeer();
  if (active && now >= handOffAt_) return;  // the thread's to progress now
  threadState_ = ThreadState::kIdle;
  if (active) {
    idleTimed_ = true;
    idleCv_.wait_until(lock, handOffAt_);
  } else if (now < lingerUntil_) {
    idleTimed_ = true;
    idleCv_.wait_until(lock, std::min(lingerUntil_, now + kLingerPeriod));
  } else {
    idleCv_.wait(lock);
  }
  idleTimed_ = false;
  threadState_ = ThreadState::kRunning;
}

void PointToPointEngine::drainWakeFd() {
  if (!wakeSignalled_) return;
  uint64_t count = 0;
  if (::read(wakeFd_.fd(), &count, sizeof(count)) < 0 && errno != EAGAIN) {
    RINGTREE_WARN("rank " << rank_ << ": point-to-point: reading the wake-up eventfd failed: "
                          << net::errnoText(errno));
  }
  wakeSignalled_ = false;
}

void PointToPointEngine::run(const std::shared_ptr<std::atomic<bool>>& engineAlive) {
  Backoff backoff(spinTime_, pausesBeforeYield_);
  Completions done;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (shutDown_) return;
    // Pending operations with claimed peers are their claimers' to drive; new ones are
    // left to their waiters until handOffAt_.
    if (!anyActivePeer() || Clock::now() < handOffAt_) {
      sleepIdle(lock);
      backoff.restart();
      continue;
    }
    bool moved = progressAll(&done);
    if (moved) {
      backoff.restart();
    } else if (backoff.spunOut()) {
      moved = sleepInPoll(lock, &done);
      backoff.restart();  // woken: spin again before the next sleep
    }
    // The mutex is released between passes, so that callers of isend/irecv get their turn.
    lock.unlock();
    finishAll(&done);
    if (!engineAlive->load()) return;  // a Work callback destroyed the engine
    if (!moved) {
      backoff.pause();
    } else if (callersWaiting_.load(std::memory_order_relaxed) > 0) {
      sched_yield();
    }
    lock.lock();
  }
}

bool PointToPointEngine::sleepInPoll(std::unique_lock<std::mutex>& lock, Completions* done) {
  std::vector<pollfd> fds;
  std::vector<Peer*> armed;
  for (Peer& peer : peers_) {
    if (!active(peer)) continue;
    fds.emplace_back();
    armPeer(peer, &fds.back());
    armed.push_back(&peer);
  }
  fds.push_back(pollfd{wakeFd_.fd(), POLLIN, 0});
  // Something may have arrived between the last pass and arming.
  const bool moved = progressAll(done);
  if (!moved) {
    int timeoutMs = net::pollTimeoutMs(nextDeadline_);
    if (timeoutMs < 0 || timeoutMs > kMaxSleepMs) timeoutMs = kMaxSleepMs;
    threadState_ = ThreadState::kPolling;
    lock.unlock();
    if (::poll(fds.data(), fds.size(), timeoutMs) < 0 && errno != EINTR) {
      RINGTREE_WARN("rank " << rank_ << ": point-to-point: poll failed: " << net::errnoText(errno));
    }
    lock.lock();
    threadState_ = ThreadState::kRunning;
  }
  drainWakeFd();
  for (Peer* peer : armed) disarmPeer(*peer);
  return moved;
}

}  // namespace ringtree::detail
