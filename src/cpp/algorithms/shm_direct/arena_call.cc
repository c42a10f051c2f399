#include "algorithms/shm_direct/arena_call.h"

#include <poll.h>
#include <sched.h>

#include <ringtree/before_waiting.h>
#include <ringtree/error.h>

#include "common/cpu.h"

namespace ringtree::algorithms::shm_direct {

namespace {

using arena::NodeArena;
using transport::Envelope;
using Clock = net::Clock;

// Waiting for a peer's counter spins this long before it sleeps (like
// CommunicatorImpl::waitIdle): long enough to catch a peer on another core, short enough
// to give the core away when ranks outnumber cores.
constexpr auto kSpinTime = std::chrono::microseconds(50);
// The spin reads the clock every this many iterations: an iteration that finds the peer
// not ready costs little more than a clock read, and the peer's answer is seen that much
// sooner.
constexpr int kClockIterations = 8;
// Longest futex sleep: the deadline and the peers' connections are checked between sleeps.
constexpr auto kSleepSlice = std::chrono::milliseconds(50);
// How often a waiting rank looks for peers that left: with many ranks per core the wait
// loop turns every few microseconds, and a scan of 63 peers cost more than the wait.
constexpr auto kHangUpCheckInterval = std::chrono::milliseconds(20);

}  // namespace

bool ArenaCall::movedOnFromThisCall(int peer) {
  Envelope then;
  switch (arena_.peerCallAt(peer, call_.envelope.sequence, &then)) {
    case NodeArena::History::kFound:
      if (!sameCall(then)) throwMismatch(peer, then);
      return true;
    case NodeArena::History::kRewriting:
      return false;
    case NodeArena::History::kAbsent:
      return true;
  }
  return false;
}

void ArenaCall::waitSlowly(int peer, uint32_t target) {
  const auto start = Clock::now();
  for (auto spinEnd = start + kSpinTime;; spinEnd = Clock::now() + kSpinTime) {
    for (int i = 1;; ++i) {
      if (ready(peer, target)) return;
      // Once every iteration yields, its system call dwarfs the clock read.
      if ((i % kClockIterations == 0 || i > pauseIterations_) && Clock::now() >= spinEnd) break;
      cpuRelax();
      if (i > pauseIterations_) yieldCore();
    }
    BeforeWaiting::notify();
    const uint32_t seen = arena_.peerStep(peer);
    if (ready(peer, target)) return;
    checkWhileWaiting(peer, target, start);
    if (NodeArena::reached(seen, target)) {
      sched_yield();  // only its fingerprint is being rewritten
    } else {
      const auto left = call_.deadline - Clock::now();
      arena_.sleepWhile(peer, seen, std::min<Clock::duration>(kSleepSlice, left));
    }
  }
}

void ArenaCall::checkWhileWaiting(int peer, uint32_t target, Clock::time_point start) {
  if (call_.comm.aborted()) throw detail::WaitAborted(rank(), waitingFor(target));
  Envelope theirs;
  if (inThisCall(target) && arena_.peerCall(peer, &theirs)) {
    if (theirs.sequence == call_.envelope.sequence && !sameCall(theirs)) throwMismatch(peer, theirs);
    if (theirs.sequence > call_.envelope.sequence) {
      // It moved on: what it called at this call's sequence number must be this call.
      Envelope then;
      const bool known = arena_.peerCallAt(peer, call_.envelope.sequence, &then) == NodeArena::History::kFound;
      if (known && !sameCall(then)) throwMismatch(peer, then);
      // Past this call without having published all of its steps: it ran another one.
      // (Its counter is loaded after its fingerprint: a peer that finished this call
      // published the step before it entered the next call.)
      if (!NodeArena::reached(arena_.peerStep(peer), target)) throwMismatch(peer, theirs);
    }
  }
  // Every rank takes part in every call, so a rank that has not published target and
  // is gone fails the call, whichever peer this rank waits for first. All such ranks
  // are named: one that failed because another died may be gone too by now.
  // A rank whose communicator is gone has departed from the arena, though no connection to
  // it may exist (lazy connections) to report it.
  // A rank that gave up on a call says why in a notice on its pair before it hangs up
  // (checkIncoming throws it): its cause is reported rather than the messenger.
  const auto now = Clock::now();
  if (nextHangUpCheck_ == Clock::time_point{}) nextHangUpCheck_ = now + kHangUpCheckInterval;
  if (now < nextHangUpCheck_) {
    if (now >= call_.deadline) throwTimeout(target, start);
    return;
  }
  nextHangUpCheck_ = now + kHangUpCheckInterval;
  std::string gone;
  int goneCount = 0;
  int firstGone = -1;
  for (int other = 0; other < size(); ++other) {
    if (other == rank() || NodeArena::reached(arena_.peerStep(other), target)) continue;
    transport::Pair& pair = call_.comm.pair(other);
    if ((arena_.peerDeparted(other) || pair.hungUp()) && !NodeArena::reached(arena_.peerStep(other), target)) {
      pair.checkIncoming(nullptr);
      gone += (gone.empty() ? "" : " and ") + pair.peerDescription();
      if (goneCount++ == 0) firstGone = other;
    }
  }
  if (goneCount > 0) {
    throw transport::PeerError(firstGone, "rank " + std::to_string(rank()) + ": " + gone +
                       (goneCount > 1 ? " closed their connections" : " closed its connection") +
                       " (exited or failed) during " + describe(call_.envelope) + ", which " +
                       (goneCount > 1 ? "they" : "it") + " had not finished");
  }
  if (Clock::now() >= call_.deadline) throwTimeout(target, start);
}

void ArenaCall::throwMismatch(int peer, const Envelope& theirs) const {
  throw transport::EnvelopeMismatch(peer, call_.envelope, 0, theirs, 0,
                                    "collective mismatch between rank " + std::to_string(rank()) + " and rank " +
                                        std::to_string(peer) + ": rank " + std::to_string(rank()) + " called " +
                                        describe(call_.envelope) + " but rank " + std::to_string(peer) +
                                        " called " + describe(theirs));
}

std::string ArenaCall::waitingFor(uint32_t target) const {
  std::string waiting;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank() || NodeArena::reached(arena_.peerStep(peer), target)) continue;
    waiting += (waiting.empty() ? "" : ", ") + call_.comm.pair(peer).peerDescription();
  }
  return waiting;
}

void ArenaCall::throwTimeout(uint32_t target, Clock::time_point start) const {
  throw detail::WaitTimeout(rank(), std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start),
                            waitingFor(target));
}

void foldCountsIntoFingerprint(Call& call, const size_t* counts) {
  uint32_t hash = 2166136261u;  // FNV-1a over the counts' bytes
  for (int q = 0; q < call.size(); ++q) {
    uint64_t value = counts[q];
    for (int i = 0; i < 8; ++i, value >>= 8) hash = (hash ^ static_cast<uint8_t>(value)) * 16777619u;
  }
  call.envelope.countsHash = hash != 0 ? hash : 1;
  NodeArena& arena = *call.comm.arena();
  arena.publishCall(call.envelope, arena.peerStatus(arena.rank()).startNs);
}

}  // namespace ringtree::algorithms::shm_direct
