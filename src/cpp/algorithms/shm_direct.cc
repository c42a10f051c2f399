#include "algorithms/shm_direct.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include <ringtree/error.h>

#include "common/cpu.h"
#include "transport/shm/arena.h"

namespace ringtree::algorithms {

namespace {

using transport::Envelope;
using transport::shm::NodeArena;
using Clock = net::Clock;

// Waiting for a peer's counter spins this long before it sleeps (like
// CommunicatorImpl::waitIdle): long enough to catch a peer on another core, short enough
// to give the core away when ranks outnumber cores.
constexpr auto kSpinTime = std::chrono::microseconds(50);
// Spin iterations (~60 ns each: a pause and a clock read) that only pause the core before
// each further one also yields it: a peer on another core answers within a microsecond or
// two, and a sched_yield costs ~0.5 us on the project machine. With more ranks than
// cores the peer may need this core: every iteration yields.
constexpr int kPauseIterations = 32;
// Longest futex sleep: the deadline and the peers' connections are checked between sleeps.
constexpr auto kSleepSlice = std::chrono::milliseconds(50);

// kPauseIterations, or 0 when `ranks` outnumber the cores this process may run on.
int pauseIterations(int ranks) {
  static const int cores = [] {
    cpu_set_t set;
    return ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  }();
  return ranks > cores ? 0 : kPauseIterations;
}

// The two-shot reduction works through its part in pieces of this size (a multiple of
// every element size) that stay in L1: the copy of rank 0's piece, the folds into it and
// the copy of the result into the caller's buffer all hit the cache.
constexpr size_t kFoldBlockBytes = size_t{16} << 10;

// One-shot allreduce (every rank reads every slot: n x the bytes, one synchronisation)
// while the message is at most this large; two-shot (each rank reads 1/n of every slot,
// twice, two synchronisations) above. Measured on the project machine (2 vCPUs,
// processes, float32, best of 11-15 runs), one-shot / two-shot in us:
//   n=2: 1 KiB 0.27 / 0.36, 2 KiB 0.40 / 0.43, 4 KiB 0.81 / 0.57, 8 KiB 3.5 / 1.05
//   n=3: 2 KiB 3.6 / 4.4, 4 KiB 4.7 / 4.9, 8 KiB 7.0 / 6.2, 16 KiB 8.0 / 6.9
//   n=4: 4 KiB 4.5 / 7.0, 8 KiB 6.1 / 8.4, 16 KiB 10.0 / 11.8, 32 KiB 16.6 / 16.3
size_t oneShotLimit(int worldSize) {
  if (worldSize <= 2) return size_t{2} << 10;
  if (worldSize == 3) return size_t{4} << 10;
  return size_t{16} << 10;
}


// Whether pair's connection reports a hang-up (the peer closed it or died). Never blocks.
bool hungUp(transport::Pair& pair) {
  pollfd pfd{};
  pair.armWait(&pfd);
  pfd.events = static_cast<short>(pfd.events | POLLRDHUP);
  const int rc = ::poll(&pfd, 1, 0);
  pair.disarmWait();
  return rc > 0 && (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0;
}

// One shm_direct call on one rank: waits on peers' counters with the checks of the
// contract in shm_direct.h.
class ArenaCall {
 public:
  explicit ArenaCall(Call& call)
      : call_(call),
        arena_(*call.comm.arena()),
        base_(arena_.lastStep()),
        pauseIterations_(pauseIterations(call.size())) {}

  NodeArena& arena() { return arena_; }
  int rank() const { return call_.rank(); }
  int size() const { return call_.size(); }

  // The step this rank publishes next.
  uint32_t nextStep() const { return arena_.lastStep() + 1; }

  // Before this rank writes its data of step `step` at [offset, offset + bytes) of its
  // slot: waits until every peer has finished reading what this rank wrote there before.
  void prepareWrite(size_t offset, size_t bytes, uint32_t step) {
    uint32_t previous = 0;
    if (arena_.claim(offset, bytes, step, &previous) && !NodeArena::reached(arena_.allPublished(), previous + 1)) {
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
  bool inThisCall(uint32_t step) const { return NodeArena::reached(step, base_ + 1); }

  // Whether peer has published target and may be relied on. Throws EnvelopeMismatch for
  // a peer that reached a step of this call in another call.
  bool ready(int peer, uint32_t target) {
    if (!NodeArena::reached(arena_.peerStep(peer), target)) return false;
    if (!inThisCall(target)) return true;
    Envelope theirs;
    if (!arena_.peerCall(peer, &theirs)) return false;  // rewritten right now: it moved on
    // Past this call: it checked this rank's call when it waited for it in that call.
    if (theirs.sequence > call_.envelope.sequence) return true;
    if (theirs != call_.envelope) throwMismatch(peer, theirs);
    return true;
  }

  void waitSlowly(int peer, uint32_t target) {
    const auto start = Clock::now();
    for (;;) {
      const auto spinEnd = Clock::now() + kSpinTime;
      for (int i = 0;; ++i) {
        if (ready(peer, target)) return;
        if (Clock::now() >= spinEnd) break;
        cpuRelax();
        if (i >= pauseIterations_) sched_yield();
      }
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

  // Between sleeps: `peer` in another call, a hung-up connection, the deadline.
  void checkWhileWaiting(int peer, uint32_t target, Clock::time_point start) {
    Envelope theirs;
    if (inThisCall(target) && arena_.peerCall(peer, &theirs)) {
      if (theirs.sequence == call_.envelope.sequence && theirs != call_.envelope) throwMismatch(peer, theirs);
      // Past this call without having published all of its steps: it ran another one.
      // (Its counter is loaded after its fingerprint: a peer that finished this call
      // published the step before it entered the next call.)
      if (theirs.sequence > call_.envelope.sequence && !NodeArena::reached(arena_.peerStep(peer), target)) {
        throwMismatch(peer, theirs);
      }
    }
    // Every rank takes part in every call, so a rank that has not published target and
    // is gone fails the call, whichever peer this rank waits for first. All such ranks
    // are named: one that failed because another died may be gone too by now.
    std::string gone;
    int goneCount = 0;
    for (int other = 0; other < size(); ++other) {
      if (other == rank() || NodeArena::reached(arena_.peerStep(other), target)) continue;
      transport::Pair& pair = call_.comm.pair(other);
      if (hungUp(pair) && !NodeArena::reached(arena_.peerStep(other), target)) {
        gone += (gone.empty() ? "" : " and ") + pair.peerDescription();
        ++goneCount;
      }
    }
    if (goneCount > 0) {
      throw NetworkError("rank " + std::to_string(rank()) + ": " + gone +
                         (goneCount > 1 ? " closed their connections" : " closed its connection") +
                         " (exited or failed) during " + describe(call_.envelope) + ", which " +
                         (goneCount > 1 ? "they" : "it") + " had not finished");
    }
    if (Clock::now() >= call_.deadline) throwTimeout(target, start);
  }

  [[noreturn]] void throwMismatch(int peer, const Envelope& theirs) const {
    throw transport::EnvelopeMismatch(peer, call_.envelope, 0, theirs, 0,
                                      "collective mismatch between rank " + std::to_string(rank()) + " and rank " +
                                          std::to_string(peer) + ": rank " + std::to_string(rank()) + " called " +
                                          describe(call_.envelope) + " but rank " + std::to_string(peer) +
                                          " called " + describe(theirs));
  }

  [[noreturn]] void throwTimeout(uint32_t target, Clock::time_point start) const {
    std::string waiting;
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == rank() || NodeArena::reached(arena_.peerStep(peer), target)) continue;
      Envelope theirs;
      waiting += (waiting.empty() ? "" : ", ") + call_.comm.pair(peer).peerDescription() +
                 (arena_.peerCall(peer, &theirs) ? " (last entered " + describe(theirs) + ")"
                                                 : " (has not entered a collective yet)");
    }
    throw TimeoutError(
        "rank " + std::to_string(rank()) + ": timed out after " +
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()) +
        " ms in " + describe(call_.envelope) + " waiting for " + waiting);
  }

  Call& call_;
  NodeArena& arena_;
  const uint32_t base_;  // the last step before this call
  const int pauseIterations_;
};

void oneShotAllreduce(ArenaCall& ac, void* buffer, size_t count, size_t elementSize, ReduceFn fn) {
  NodeArena& arena = ac.arena();
  const size_t bytes = count * elementSize;
  const uint32_t step = ac.nextStep();
  const size_t offset = arena.reserve(bytes);
  ac.prepareWrite(offset, bytes, step);
  if (bytes > 0) std::memcpy(arena.data(ac.rank(), offset), buffer, bytes);
  arena.publish();
  ac.waitAll(step);
  if (bytes == 0) return;
  if (ac.rank() != 0) std::memcpy(buffer, arena.data(0, offset), bytes);
  for (int q = 1; q < ac.size(); ++q) fn(buffer, arena.data(q, offset), count);
}

// Each step of at most `capacity` bytes is cut into n parts (partition()), placed in
// regions of equal size (whole cache lines when a part has 64 bytes or more).
// Step A: every rank places the parts of its input that the other owners need in block A
// of its slot (part q at region q). Step B: owner r folds part r from every rank in rank
// order (its own from its buffer) into block B of its slot and into its buffer. Then each
// rank copies the other parts from their owners' block B.
void twoShotAllreduce(ArenaCall& ac, void* buffer, size_t count, size_t es, ReduceFn fn, bool commutative,
                      size_t capacity) {
  NodeArena& arena = ac.arena();
  const int n = ac.size();
  const int r = ac.rank();
  size_t regionCapacity = capacity / static_cast<size_t>(n) / es * es;
  if (regionCapacity >= 64) regionCapacity = regionCapacity / 64 * 64;  // element sizes divide 64
  regionCapacity = std::max(regionCapacity, es);
  const size_t stepElements = regionCapacity / es * static_cast<size_t>(n);
  for (size_t start = 0; start < count; start += stepElements) {
    const size_t m = std::min(stepElements, count - start);
    auto* chunk = static_cast<uint8_t*>(buffer) + start * es;
    // Regions as small as this step allows (a short step takes a short piece of the
    // slot), at most regionCapacity.
    const size_t partBytesMax = (m + static_cast<size_t>(n) - 1) / static_cast<size_t>(n) * es;
    const size_t regionBytes = partBytesMax >= 64 ? (partBytesMax + 63) / 64 * 64 : partBytesMax;

    // A: this rank's input for every other owner.
    const uint32_t a = ac.nextStep();
    const size_t blockA = arena.reserve(regionBytes * static_cast<size_t>(n));
    ac.prepareWrite(blockA, regionBytes * static_cast<size_t>(n), a);
    for (int q = 0; q < n; ++q) {
      const Range part = partition(m, n, q);
      if (q != r && part.count > 0) {
        std::memcpy(arena.data(r, blockA + static_cast<size_t>(q) * regionBytes), chunk + part.offset * es,
                    part.count * es);
      }
    }
    arena.publish();
    ac.waitAll(a);

    // B: this rank's part, folded in rank order into block B and copied out, a piece at
    // a time so that each piece stays in L1 from the first copy to the last.
    const uint32_t b = ac.nextStep();
    const size_t blockB = arena.reserve(regionBytes);
    ac.prepareWrite(blockB, regionBytes, b);
    const Range mine = partition(m, n, r);
    uint8_t* own = chunk + mine.offset * es;
    uint8_t* result = arena.data(r, blockB);
    const auto source = [&](int q) -> const uint8_t* {
      return q == r ? own : arena.data(q, blockA + static_cast<size_t>(r) * regionBytes);
    };
    const size_t partBytes = mine.count * es;
    if (r == 0 || (r == 1 && commutative)) {
      // own op= the others: rank order as it is for rank 0, and for rank 1 the same bits
      // (own op rank 0's == rank 0's op own); one pass fewer.
      for (size_t offset = 0; offset < partBytes; offset += kFoldBlockBytes) {
        const size_t length = std::min(kFoldBlockBytes, partBytes - offset);
        for (int q = 0; q < n; ++q) {
          if (q != r) fn(own + offset, source(q) + offset, length / es);
        }
        std::memcpy(result + offset, own + offset, length);
      }
    } else {
      for (size_t offset = 0; offset < partBytes; offset += kFoldBlockBytes) {
        const size_t length = std::min(kFoldBlockBytes, partBytes - offset);
        std::memcpy(result + offset, source(0) + offset, length);
        for (int q = 1; q < n; ++q) fn(result + offset, source(q) + offset, length / es);
        std::memcpy(own + offset, result + offset, length);
      }
    }
    arena.publish();
    ac.waitAll(b);

    // C: the other owners' results.
    for (int q = 0; q < n; ++q) {
      const Range part = partition(m, n, q);
      if (q != r && part.count > 0) std::memcpy(chunk + part.offset * es, arena.data(q, blockB), part.count * es);
    }
  }
}

size_t stepCapacity(const NodeArena& arena, size_t maxSegmentBytes) {
  return maxSegmentBytes > 0 ? std::min(arena.maxStepBytes(), maxSegmentBytes) : arena.maxStepBytes();
}

}  // namespace

void announceCall(Call& call) {
  if (NodeArena* arena = call.comm.arena()) arena->publishCall(call.envelope);
}

void shmDirectAllreduce(Call& call, void* buffer, size_t count, ReduceFn fn, bool commutative,
                        size_t maxSegmentBytes) {
  ArenaCall ac(call);
  const size_t es = call.elementSize;
  const size_t capacity = stepCapacity(ac.arena(), maxSegmentBytes);
  if (count * es <= std::min(capacity, oneShotLimit(call.size()))) {
    oneShotAllreduce(ac, buffer, count, es, fn);
  } else {
    twoShotAllreduce(ac, buffer, count, es, fn, commutative, capacity);
  }
}

void shmDirectBroadcast(Call& call, void* buffer, size_t bytes, int root, size_t maxSegmentBytes) {
  ArenaCall ac(call);
  NodeArena& arena = ac.arena();
  const size_t capacity = stepCapacity(arena, maxSegmentBytes);
  auto* data = static_cast<uint8_t*>(buffer);
  const uint32_t first = ac.nextStep();
  size_t offset = 0;
  do {  // once even for 0 bytes: every rank still takes part
    const size_t length = std::min(capacity, bytes - offset);
    const uint32_t step = ac.nextStep();
    const size_t piece = arena.reserve(length);
    if (ac.rank() == root) {
      ac.prepareWrite(piece, length, step);
      if (length > 0) std::memcpy(arena.data(root, piece), data + offset, length);
      arena.publish();
    } else {
      ac.waitFor(root, step);
      arena.publish();  // done with the root's earlier pieces: it may rewrite them
      if (length > 0) std::memcpy(data + offset, arena.data(root, piece), length);
    }
    offset += length;
  } while (offset < bytes);
  // Every rank entered this call (and its fingerprint matches), so that a rank that
  // sees a peer past this call may rely on that peer having checked it.
  ac.waitAll(first);
}

void shmDirectBarrier(Call& call) {
  ArenaCall ac(call);
  ac.waitAll(ac.arena().publish());
}

}  // namespace ringtree::algorithms
