#include "algorithms/shm_direct.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "algorithms/blocks.h"
#include "algorithms/shm_direct/arena_call.h"
#include "common/copy.h"

namespace ringtree::algorithms {

namespace {

using arena::NodeArena;
using shm_direct::ArenaCall;

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

void oneShotAllreduce(ArenaCall& ac, void* buffer, size_t count, size_t elementSize, ReduceFn fn) {
  NodeArena& arena = ac.arena();
  const size_t bytes = count * elementSize;
  const uint32_t step = ac.nextStep();
  const size_t offset = arena.reserve(bytes);
  ac.prepareWrite(offset, bytes, step);
  if (bytes > 0) copyBytes(arena.data(ac.rank(), offset), buffer, bytes);
  arena.publish();
  ac.waitAll(step);
  if (bytes == 0) return;
  if (ac.rank() != 0) copyBytes(buffer, arena.data(0, offset), bytes);
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
  const size_t stepElements = shm_direct::regionCapacity(capacity, n, es) / es * static_cast<size_t>(n);
  for (size_t start = 0; start < count; start += stepElements) {
    const size_t m = std::min(stepElements, count - start);
    auto* chunk = static_cast<uint8_t*>(buffer) + start * es;
    // Regions as small as this step allows (a short step takes a short piece of the
    // slot), at most regionCapacity().
    const size_t partBytesMax = (m + static_cast<size_t>(n) - 1) / static_cast<size_t>(n) * es;
    const size_t regionBytes = shm_direct::regionBytesFor(partBytesMax);

    // A: this rank's input for every other owner.
    const uint32_t a = ac.nextStep();
    const size_t blockA = arena.reserve(regionBytes * static_cast<size_t>(n));
    ac.prepareWrite(blockA, regionBytes * static_cast<size_t>(n), a);
    for (int q = 0; q < n; ++q) {
      const Range part = partition(m, n, q);
      if (q != r && part.count > 0) {
        copyBytes(arena.data(r, blockA + static_cast<size_t>(q) * regionBytes), chunk + part.offset * es,
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
        copyBytes(result + offset, own + offset, length);
      }
    } else {
      for (size_t offset = 0; offset < partBytes; offset += kFoldBlockBytes) {
        const size_t length = std::min(kFoldBlockBytes, partBytes - offset);
        copyBytes(result + offset, source(0) + offset, length);
        for (int q = 1; q < n; ++q) fn(result + offset, source(q) + offset, length / es);
        copyBytes(own + offset, result + offset, length);
      }
    }
    arena.publish();
    ac.waitAll(b);

    // C: the other owners' results.
    for (int q = 0; q < n; ++q) {
      const Range part = partition(m, n, q);
      if (q != r && part.count > 0) copyBytes(chunk + part.offset * es, arena.data(q, blockB), part.count * es);
    }
  }
}

}  // namespace

void shmDirectAllreduce(Call& call, void* buffer, size_t count, ReduceFn fn, bool commutative,
                        size_t maxSegmentBytes) {
  ArenaCall ac(call);
  const size_t es = call.elementSize;
  const size_t capacity = shm_direct::stepCapacity(ac.arena(), maxSegmentBytes);
  if (count * es <= std::min(capacity, oneShotLimit(call.size()))) {
    oneShotAllreduce(ac, buffer, count, es, fn);
  } else {
    twoShotAllreduce(ac, buffer, count, es, fn, commutative, capacity);
  }
}

}  // namespace ringtree::algorithms
