#include "algorithms/shm_direct.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ringtree/error.h>

#include "algorithms/blocks.h"
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

// A call whose ranks pass per-rank counts (allgather, reduce_scatter): folds a hash of
// the counts into its fingerprint (Envelope::extra, never 0 then) and publishes it again,
// so that ranks that agree on the total but not on the split fail as a mismatch instead
// of exchanging wrong pieces. Before the call's first step: peers compare fingerprints
// with sameCall(), which takes a peer still at extra 0 for one that has not got here yet.
void foldCountsIntoFingerprint(Call& call, const size_t* counts) {
  uint32_t hash = 2166136261u;  // FNV-1a over the counts' bytes
  for (int q = 0; q < call.size(); ++q) {
    uint64_t value = counts[q];
    for (int i = 0; i < 8; ++i, value >>= 8) hash = (hash ^ static_cast<uint8_t>(value)) * 16777619u;
  }
  call.envelope.extra = hash != 0 ? hash : 1;
  NodeArena& arena = *call.comm.arena();
  arena.publishCall(call.envelope, arena.peerStatus(arena.rank()).startNs);
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

  // Whether a peer's fingerprint is this call's; one without a counts hash yet (see
  // foldCountsIntoFingerprint) is compared without it.
  bool sameCall(const Envelope& theirs) const {
    if (theirs.extra != 0) return theirs == call_.envelope;
    Envelope withHash = theirs;
    withHash.extra = call_.envelope.extra;
    return withHash == call_.envelope;
  }

  // Whether peer has published target and may be relied on. Throws EnvelopeMismatch for
  // a peer that reached a step of this call in another call.
  bool ready(int peer, uint32_t target) {
    if (!NodeArena::reached(arena_.peerStep(peer), target)) return false;
    if (!inThisCall(target)) return true;
    Envelope theirs;
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
  bool movedOnFromThisCall(int peer) {
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

  // Between sleeps: abort(), `peer` in another call, a hung-up connection, the deadline.
  void checkWhileWaiting(int peer, uint32_t target, Clock::time_point start) {
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
    // A rank that gave up on a call says why in a notice on its pair before it hangs up
    // (checkIncoming throws it): its cause is reported rather than the messenger.
    std::string gone;
    int goneCount = 0;
    int firstGone = -1;
    for (int other = 0; other < size(); ++other) {
      if (other == rank() || NodeArena::reached(arena_.peerStep(other), target)) continue;
      transport::Pair& pair = call_.comm.pair(other);
      if (hungUp(pair) && !NodeArena::reached(arena_.peerStep(other), target)) {
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

  [[noreturn]] void throwMismatch(int peer, const Envelope& theirs) const {
    throw transport::EnvelopeMismatch(peer, call_.envelope, 0, theirs, 0,
                                      "collective mismatch between rank " + std::to_string(rank()) + " and rank " +
                                          std::to_string(peer) + ": rank " + std::to_string(rank()) + " called " +
                                          describe(call_.envelope) + " but rank " + std::to_string(peer) +
                                          " called " + describe(theirs));
  }

  // The peers that have not published target, described.
  std::string waitingFor(uint32_t target) const {
    std::string waiting;
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == rank() || NodeArena::reached(arena_.peerStep(peer), target)) continue;
      waiting += (waiting.empty() ? "" : ", ") + call_.comm.pair(peer).peerDescription();
    }
    return waiting;
  }

  // What the peers were doing is added by the call's failure handling (arenaPeerProgress).
  [[noreturn]] void throwTimeout(uint32_t target, Clock::time_point start) const {
    throw detail::WaitTimeout(rank(), std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start),
                              waitingFor(target));
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

    // B: this rank's part, folded in rank order into block B and copied out, a piece of
    // kFoldBlockBytes at a time so that each piece stays in L1 from the first copy to the
    // last.
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

void announceCall(Call& call, int64_t startNs) {
  if (NodeArena* arena = call.comm.arena()) arena->publishCall(call.envelope, startNs);
}

void announceFinished(Call& call, bool failed, int64_t endNs) {
  if (NodeArena* arena = call.comm.arena()) arena->noteFinished(call.envelope.sequence, failed, endNs);
}

std::vector<diagnostics::PeerProgress> arenaPeerProgress(const Call& call) {
  const NodeArena& arena = *call.comm.arena();
  const int64_t now = diagnostics::steadyNowNs();
  std::vector<diagnostics::PeerProgress> peers;
  for (int peer = 0; peer < call.size(); ++peer) {
    if (peer == call.rank()) continue;
    diagnostics::PeerProgress p;
    p.rank = peer;
    p.known = true;
    Envelope latest;
    if (arena.peerCall(peer, &latest)) {
      const NodeArena::PeerStatus status = arena.peerStatus(peer);
      p.startedSequence = latest.sequence;
      p.started = describe(latest);
      p.startedSecondsAgo = static_cast<double>(now - status.startNs) / 1e9;
      p.finishedSequence = status.finishedSequence;
      p.finishedFailed = status.finishedFailed;
      p.finishedSecondsAgo = status.finishedSequence > 0 ? static_cast<double>(now - status.finishedNs) / 1e9 : -1;
    }
    peers.push_back(p);
  }
  return peers;
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

void shmDirectAllgather(Call& call, const void* input, void* const* outputs, const size_t* counts,
                        size_t maxSegmentBytes) {
  foldCountsIntoFingerprint(call, counts);
  ArenaCall ac(call);
  NodeArena& arena = ac.arena();
  const size_t capacity = stepCapacity(arena, maxSegmentBytes);
  const int n = ac.size();
  const int r = ac.rank();
  const size_t es = call.elementSize;
  size_t largest = 0;
  for (int q = 0; q < n; ++q) largest = std::max(largest, counts[q] * es);
  const auto* mine = static_cast<const uint8_t*>(input);
  size_t start = 0;
  do {  // once even when every block is empty: every rank still takes part
    // Every rank reserves room for the largest piece of the step, so that all agree on
    // where each piece lies; each writes its own.
    const uint32_t step = ac.nextStep();
    const size_t offset = arena.reserve(std::min(capacity, largest - start));
    const size_t ownBytes = sliceOf(counts[r] * es, start, capacity).count;
    ac.prepareWrite(offset, ownBytes, step);
    if (ownBytes > 0) std::memcpy(arena.data(r, offset), mine + start, ownBytes);
    arena.publish();
    for (int i = 1; i < n; ++i) {
      const int q = (r + i) % n;  // ranks start on different slots
      const size_t bytes = sliceOf(counts[q] * es, start, capacity).count;
      ac.waitFor(q, step);
      if (bytes > 0) std::memcpy(static_cast<uint8_t*>(outputs[q]) + start, arena.data(q, offset), bytes);
    }
    arena.noteAllPublished(step);
    start += capacity;
  } while (start < largest);
}

void shmDirectReduceScatter(Call& call, const void* const* inputs, void* output, const size_t* counts, ReduceFn fn,
                            size_t maxSegmentBytes) {
  foldCountsIntoFingerprint(call, counts);
  ArenaCall ac(call);
  NodeArena& arena = ac.arena();
  const int n = ac.size();
  const int r = ac.rank();
  const size_t es = call.elementSize;
  // Regions as in twoShotAllreduce: a slice of every block per step, block q's in region
  // q (whole cache lines when a slice has 64 bytes or more).
  size_t regionCapacity = stepCapacity(arena, maxSegmentBytes) / static_cast<size_t>(n) / es * es;
  if (regionCapacity >= 64) regionCapacity = regionCapacity / 64 * 64;  // element sizes divide 64
  regionCapacity = std::max(regionCapacity, es);
  const size_t sliceCount = regionCapacity / es;
  size_t largest = 0;
  for (int q = 0; q < n; ++q) largest = std::max(largest, counts[q]);
  size_t start = 0;
  do {  // once even when every block is empty: every rank still takes part
    const size_t sliceBytesMax = std::min(sliceCount, largest - start) * es;
    const size_t regionBytes = sliceBytesMax >= 64 ? (sliceBytesMax + 63) / 64 * 64 : sliceBytesMax;
    const uint32_t step = ac.nextStep();
    const size_t block = arena.reserve(regionBytes * static_cast<size_t>(n));
    ac.prepareWrite(block, regionBytes * static_cast<size_t>(n), step);
    for (int q = 0; q < n; ++q) {
      const Range slice = sliceOf(counts[q], start, sliceCount);
      if (q != r && slice.count > 0) {
        std::memcpy(arena.data(r, block + static_cast<size_t>(q) * regionBytes),
                    static_cast<const uint8_t*>(inputs[q]) + slice.offset * es, slice.count * es);
      }
    }
    arena.publish();
    ac.waitAll(step);
    const Range own = sliceOf(counts[r], start, sliceCount);
    const auto source = [&](int q) -> const void* {
      return q == r ? static_cast<const uint8_t*>(inputs[r]) + own.offset * es
                    : arena.data(q, block + static_cast<size_t>(r) * regionBytes);
    };
    foldInRankOrder(static_cast<uint8_t*>(output) + own.offset * es, n, source, own.count, es, fn);
    start += sliceCount;
  } while (start < largest);
}

void shmDirectAlltoall(Call& call, const void* const* inputs, const size_t* sendCounts, void* const* outputs,
                       const size_t* recvCounts, size_t maxSegmentBytes) {
  ArenaCall ac(call);
  NodeArena& arena = ac.arena();
  const int n = ac.size();
  const int r = ac.rank();
  const auto ranks = static_cast<size_t>(n);
  const size_t es = call.elementSize;
  const auto sent = [&](int q) { return sendCounts[q] * es; };
  const auto expected = [&](int q) { return recvCounts[q] * es; };
  // This rank's row and column of the count matrix, in bytes: the first step's header.
  std::vector<uint64_t> sizes(2 * ranks);
  for (int q = 0; q < n; ++q) {
    sizes[static_cast<size_t>(q)] = sent(q);
    sizes[ranks + static_cast<size_t>(q)] = expected(q);
  }
  const size_t headerBytes = (sizes.size() * sizeof(uint64_t) + 63) / 64 * 64;
  // A step holds the header and a region per rank (at least a byte each, whatever
  // maxSegmentBytes says; the header takes 16 bytes per rank, far below a step).
  const size_t capacity = std::max(stepCapacity(arena, maxSegmentBytes), headerBytes + ranks);
  size_t regionBytes = (capacity - headerBytes) / ranks;
  if (regionBytes >= 64) regionBytes = regionBytes / 64 * 64;

  // Both directions between this rank and q, as q sees them: a size they disagree on
  // fails both of them.
  const auto check = [&](int q, const uint64_t* theirs) {
    const uint64_t toMe = theirs[r];
    const uint64_t fromMe = theirs[ranks + static_cast<size_t>(r)];
    if (toMe == expected(q) && fromMe == sent(q)) return;
    const bool inbound = toMe != expected(q);
    const size_t wanted = inbound ? expected(q) : fromMe;
    const size_t got = inbound ? toMe : sent(q);
    throw transport::EnvelopeMismatch(
        q, call.envelope, wanted, call.envelope, got,
        "rank " + std::to_string(r) + " and rank " + std::to_string(q) + " disagree on the size of the message " +
            (inbound ? "from rank " : "to rank ") + std::to_string(q) + " in " + describe(call.envelope) + ": " +
            std::to_string(got) + " bytes where " + std::to_string(wanted) + " were expected");
  };
  // The largest message between two ranks, from every rank's row (the same on all).
  size_t largest = 0;
  const auto account = [&](const uint64_t* row, int sender) {
    for (int q = 0; q < n; ++q) {
      if (q != sender) largest = std::max<size_t>(largest, row[q]);
    }
  };

  size_t steps = 1;  // until the first step tells every rank every size
  for (size_t i = 0; i < steps; ++i) {
    const bool first = i == 0;
    const size_t offset = i * regionBytes;
    const size_t regions = first ? headerBytes : 0;  // where region 0 starts in the block
    const uint32_t step = ac.nextStep();
    const size_t block = arena.reserve(regions + regionBytes * ranks);
    const auto region = [&](int q) { return block + regions + static_cast<size_t>(q) * regionBytes; };
    size_t written = regions;  // up to the end of the last piece
    for (int q = 0; q < n; ++q) {
      const size_t bytes = sliceOf(sent(q), offset, regionBytes).count;
      if (q != r && bytes > 0) written = region(q) + bytes - block;
    }
    ac.prepareWrite(block, written, step);
    if (first) std::memcpy(arena.data(r, block), sizes.data(), sizes.size() * sizeof(uint64_t));
    for (int q = 0; q < n; ++q) {
      const size_t bytes = sliceOf(sent(q), offset, regionBytes).count;
      if (q != r && bytes > 0) {
        std::memcpy(arena.data(r, region(q)), static_cast<const uint8_t*>(inputs[q]) + offset, bytes);
      }
    }
    arena.publish();
    for (int k = 1; k < n; ++k) {
      const int q = (r + k) % n;  // ranks start on different slots
      ac.waitFor(q, step);
      if (first) {
        std::vector<uint64_t> theirs(2 * ranks);
        std::memcpy(theirs.data(), arena.data(q, block), theirs.size() * sizeof(uint64_t));
        check(q, theirs.data());
        account(theirs.data(), q);
      }
      const size_t bytes = sliceOf(expected(q), offset, regionBytes).count;
      if (bytes > 0) std::memcpy(static_cast<uint8_t*>(outputs[q]) + offset, arena.data(q, region(r)), bytes);
    }
    arena.noteAllPublished(step);
    if (first) {
      account(sizes.data(), r);
      steps = std::max<size_t>(1, (largest + regionBytes - 1) / regionBytes);
    }
  }
}

}  // namespace ringtree::algorithms
