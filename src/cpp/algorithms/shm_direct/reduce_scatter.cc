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

void shmDirectReduceScatter(Call& call, const void* const* inputs, void* output, const size_t* counts, ReduceFn fn,
                            size_t maxSegmentBytes) {
  shm_direct::foldCountsIntoFingerprint(call, counts);
  ArenaCall ac(call);
  NodeArena& arena = ac.arena();
  const int n = ac.size();
  const int r = ac.rank();
  const size_t es = call.elementSize;
  // Regions as in twoShotAllreduce: a slice of every block per step, block q's in region
  // q (whole cache lines when a slice has 64 bytes or more).
  const size_t sliceCount = shm_direct::regionCapacity(shm_direct::stepCapacity(arena, maxSegmentBytes), n, es) / es;
  size_t largest = 0;
  for (int q = 0; q < n; ++q) largest = std::max(largest, counts[q]);
  size_t start = 0;
  do {  // once even when every block is empty: every rank still takes part
    const size_t sliceBytesMax = std::min(sliceCount, largest - start) * es;
    const size_t regionBytes = shm_direct::regionBytesFor(sliceBytesMax);
    const uint32_t step = ac.nextStep();
    const size_t block = arena.reserve(regionBytes * static_cast<size_t>(n));
    ac.prepareWrite(block, regionBytes * static_cast<size_t>(n), step);
    for (int q = 0; q < n; ++q) {
      const Range slice = sliceOf(counts[q], start, sliceCount);
      if (q != r && slice.count > 0) {
        copyBytes(arena.data(r, block + static_cast<size_t>(q) * regionBytes),
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

}  // namespace ringtree::algorithms
