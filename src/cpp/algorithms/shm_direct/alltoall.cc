#include "algorithms/shm_direct.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/blocks.h"
#include "algorithms/shm_direct/arena_call.h"
#include "common/copy.h"

namespace ringtree::algorithms {

using arena::NodeArena;
using shm_direct::ArenaCall;

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
  const size_t capacity = std::max(shm_direct::stepCapacity(arena, maxSegmentBytes), headerBytes + ranks);
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
        copyBytes(arena.data(r, region(q)), static_cast<const uint8_t*>(inputs[q]) + offset, bytes);
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
      if (bytes > 0) copyBytes(static_cast<uint8_t*>(outputs[q]) + offset, arena.data(q, region(r)), bytes);
    }
    arena.noteAllPublished(step);
    if (first) {
      account(sizes.data(), r);
      steps = std::max<size_t>(1, (largest + regionBytes - 1) / regionBytes);
    }
  }
}

}  // namespace ringtree::algorithms
