#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "algorithms/call.h"
#include "arena/node_arena.h"
#include "common/cpu.h"
#include "common/socket.h"
#include "transport/pair.h"

// What the shm_direct collectives (algorithms/shm_direct.h) share: the wait engine each
// of them runs its steps with (ArenaCall), the call fingerprint's counts hash, and how a
// step is cut into per-rank regions of the arena's slots.
namespace ringtree::algorithms::shm_direct {

// One shm_direct call on one rank: waits on peers' step counters, spinning briefly, then
// sleeping on a futex in slices, between which it checks abort(), the deadline, a peer
// in another call (its published fingerprint) and whether the awaited peer's connection
// hung up. Its waits throw as the contract in shm_direct.h says. One per call, on the
// thread that runs it.
class ArenaCall {
 public:
  explicit ArenaCall(Call& call)
      : call_(call),
        arena_(*call.comm.arena()),
        base_(arena_.lastStep()),
        pauseIterations_(pausesBeforeYield(call.size())) {}

  arena::NodeArena& arena() { return arena_; }
  int rank() const { return call_.rank(); }
  int size() const { return call_.size(); }

  // The step this rank publishes next.
  uint32_t nextStep() const { return arena_.lastStep() + 1; }

  // Before this rank writes its data of step `step` at [offset, offset + bytes) of its
  // slot: waits until every peer has finished reading what this rank wrote there before.
  void prepareWrite(size_t offset, size_t bytes, uint32_t step) {
    uint32_t previous = 0;
    if (arena_.claim(offset, bytes, step, &previous) &&
        !arena::NodeArena::reached(arena_.allPublished(), previous + 1)) {
      waitAll(previous + 1);
    }
  }

  // Waits until every peer has published `target`.
  void waitAll(uint32_t target) {
    const int n = size();
    for (int i = 1; i < n; ++i) waitFor((rank() + i) % n, target);
    arena_.noteAllPublished(target);
  }

  // Waits until `peer` has published `target` and, when target is a step of this call,
  // is in this call (or past it).
  void waitFor(int peer, uint32_t target) {
    if (!ready(peer, target)) waitSlowly(peer, target);
  }

 private:
  bool inThisCall(uint32_t step) const { return arena::NodeArena::reached(step, base_ + 1); }

  // Whether a peer's fingerprint is this call's; one without a counts hash yet (see
  // foldCountsIntoFingerprint) is compared without it.
  bool sameCall(const transport::Envelope& theirs) const {
    if (theirs.countsHash != 0) return theirs == call_.envelope;
    transport::Envelope withHash = theirs;
    withHash.countsHash = call_.envelope.countsHash;
    return withHash == call_.envelope;
  }

  // Whether peer has published target and may be relied on. Throws EnvelopeMismatch for
  // a peer that reached a step of this call in another call.
  bool ready(int peer, uint32_t target) {
    if (!arena::NodeArena::reached(arena_.peerStep(peer), target)) return false;
    if (!inThisCall(target)) return true;
    transport::Envelope theirs;
    if (!arena_.peerCall(peer, &theirs)) return false;  // rewritten right now: it moved on
    if (theirs.sequence > call_.envelope.sequence) return movedOnFromThisCall(peer);
    if (!sameCall(theirs)) throwMismatch(peer, theirs);
    return true;
  }

  // For a peer whose latest call is past this one: whether the call it made at this
  // sequence number was this one, from its history (a peer that made another call there,
  // say a pair-based reduce, and then published steps in a later arena call must not be
  // taken for a peer of this call). Throws EnvelopeMismatch when it was another call;
  // false while the history entry is being rewritten. A peer kHistory calls ahead is
  // accepted: it can only have got there through calls that need nothing from this rank
  // (a root's sends), after this call.
  bool movedOnFromThisCall(int peer);

  void waitSlowly(int peer, uint32_t target);

  // Between sleeps: abort(), `peer` in another call, a hung-up connection, the deadline.
  void checkWhileWaiting(int peer, uint32_t target, net::Clock::time_point start);

  [[noreturn]] void throwMismatch(int peer, const transport::Envelope& theirs) const;

  // The peers that have not published target, described.
  std::string waitingFor(uint32_t target) const;

  // What the peers were doing is added by the call's failure handling.
  [[noreturn]] void throwTimeout(uint32_t target, net::Clock::time_point start) const;

  Call& call_;
  arena::NodeArena& arena_;
  const uint32_t base_;  // the last step before this call
  const int pauseIterations_;
  // When checkWhileWaiting next looks for peers that left (a scan of every peer not
  // arrived: a syscall each, or a /proc read for one never connected to): set at its
  // first call, then every kHangUpCheckInterval.
  net::Clock::time_point nextHangUpCheck_{};
};

// A call whose ranks pass per-rank counts (allgather, reduce_scatter): folds a hash of
// the counts into its fingerprint (Envelope::countsHash, never 0 then) and publishes it again,
// so that ranks that agree on the total but not on the split fail as a mismatch instead
// of exchanging wrong pieces. Before the call's first step: peers compare fingerprints
// with ArenaCall's check, which takes a peer still without a hash for one that has not
// got here yet.
void foldCountsIntoFingerprint(Call& call, const size_t* counts);

// The most one step places: the arena's largest step, or maxSegmentBytes when that is
// smaller (0: no limit).
inline size_t stepCapacity(const arena::NodeArena& arena, size_t maxSegmentBytes) {
  return maxSegmentBytes > 0 ? std::min(arena.maxStepBytes(), maxSegmentBytes) : arena.maxStepBytes();
}

// The largest region of a step of `capacity` bytes cut into one region per rank: whole
// elements, whole cache lines when a region has 64 bytes or more (element sizes divide
// 64), at least one element.
inline size_t regionCapacity(size_t capacity, int ranks, size_t elementSize) {
  size_t bytes = capacity / static_cast<size_t>(ranks) / elementSize * elementSize;
  if (bytes >= 64) bytes = bytes / 64 * 64;
  return std::max(bytes, elementSize);
}

// A region holding `bytes`: whole cache lines when that is 64 bytes or more.
inline size_t regionBytesFor(size_t bytes) { return bytes >= 64 ? (bytes + 63) / 64 * 64 : bytes; }

}  // namespace ringtree::algorithms::shm_direct
