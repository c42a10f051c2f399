#include "algorithms/shm_direct.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "algorithms/blocks.h"
#include "algorithms/shm_direct/arena_call.h"
#include "common/copy.h"

namespace ringtree::algorithms {

using arena::NodeArena;
using shm_direct::ArenaCall;

void shmDirectAllgather(Call& call, const void* input, void* const* outputs, const size_t* counts,
                        size_t maxSegmentBytes) {
  shm_direct::foldCountsIntoFingerprint(call, counts);
  ArenaCall ac(call);
  NodeArena& arena = ac.arena();
  const size_t capacity = shm_direct::stepCapacity(arena, maxSegmentBytes);
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
    if (ownBytes > 0) copyBytes(arena.data(r, offset), mine + start, ownBytes);
    arena.publish();
    for (int i = 1; i < n; ++i) {
      const int q = (r + i) % n;  // ranks start on different slots
      const size_t bytes = sliceOf(counts[q] * es, start, capacity).count;
      ac.waitFor(q, step);
      if (bytes > 0) copyBytes(static_cast<uint8_t*>(outputs[q]) + start, arena.data(q, offset), bytes);
    }
    arena.noteAllPublished(step);
    start += capacity;
  } while (start < largest);
}

}  // namespace ringtree::algorithms
