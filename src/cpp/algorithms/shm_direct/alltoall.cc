#include "algorithms/shm_direct.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "algorithms/blocks.h"
#include "algorithms/shm_direct/arena_call.h"
#include "common/copy.h"

namespace ringtree::algorithms {

using arena::NodeArena;
using shm_direct::ArenaCall;

namespace {

// What a writer puts before its data in the region a reader takes it from, in every step
// (read in the first): the sizes both ranks of the pair must agree on, and the writer's
// largest message, from which every rank counts the steps. In the data's line: a small
// call's reader loads one line per peer, as in an allgather.
struct Header {
  uint64_t largest;     // the writer's largest message to any rank, in bytes
  uint64_t toReader;    // bytes the writer sends the reader
  uint64_t fromReader;  // bytes the writer expects from the reader
  uint64_t unused;      // 0
};
constexpr size_t kHeaderBytes = sizeof(Header);

}  // namespace

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
  // The largest message this rank sends: every rank learns every rank's, so all agree on
  // the number of steps.
  size_t largest = 0;
  for (int q = 0; q < n; ++q) {
    if (q != r) largest = std::max(largest, sent(q));
  }
  // A step holds a region per destination (at least a byte of data each, whatever
  // maxSegmentBytes says): the header, then the data.
  const size_t capacity = std::max(shm_direct::stepCapacity(arena, maxSegmentBytes), ranks * (kHeaderBytes + 1));
  size_t regionBytes = capacity / ranks;
  if (regionBytes >= 64) regionBytes = regionBytes / 64 * 64;
  const size_t dataBytes = regionBytes - kHeaderBytes;

  // Both directions between this rank and q, as q sees them (its header for this rank):
  // a size they disagree on fails both of them.
  const auto check = [&](int q, const Header& theirs) {
    if (theirs.toReader == expected(q) && theirs.fromReader == sent(q)) return;
    const bool inbound = theirs.toReader != expected(q);
    const size_t wanted = inbound ? expected(q) : theirs.fromReader;
    const size_t got = inbound ? theirs.toReader : sent(q);
    throw transport::EnvelopeMismatch(
        q, call.envelope, wanted, call.envelope, got,
        "rank " + std::to_string(r) + " and rank " + std::to_string(q) + " disagree on the size of the message " +
            (inbound ? "from rank " : "to rank ") + std::to_string(q) + " in " + describe(call.envelope) + ": " +
            std::to_string(got) + " bytes where " + std::to_string(wanted) + " were expected");
  };

  size_t steps = 1;  // until the first step tells every rank every rank's largest message
  size_t everyLargest = largest;
  for (size_t i = 0; i < steps; ++i) {
    const size_t offset = i * dataBytes;
    const uint32_t step = ac.nextStep();
    const size_t block = arena.reserve(regionBytes * ranks);
    const auto region = [&](int q) { return block + static_cast<size_t>(q) * regionBytes; };
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const size_t bytes = sliceOf(sent(q), offset, dataBytes).count;
      // Only the lines written are claimed: a small call touches a line or two of each
      // region, not the pages between them.
      ac.prepareWrite(region(q), kHeaderBytes + bytes, step);
      uint8_t* mine = arena.data(r, region(q));
      const Header header{largest, sent(q), expected(q), 0};
      std::memcpy(mine, &header, sizeof(header));
      if (bytes > 0) copyBytes(mine + kHeaderBytes, static_cast<const uint8_t*>(inputs[q]) + offset, bytes);
    }
    arena.publish();
    for (int k = 1; k < n; ++k) {
      const int q = (r + k) % n;  // ranks start on different slots
      ac.waitFor(q, step);
      const uint8_t* theirs = arena.data(q, region(r));
      if (i == 0) {
        Header header;
        std::memcpy(&header, theirs, sizeof(header));
        check(q, header);
        everyLargest = std::max<size_t>(everyLargest, header.largest);
      }
      const size_t bytes = sliceOf(expected(q), offset, dataBytes).count;
      if (bytes > 0) copyBytes(static_cast<uint8_t*>(outputs[q]) + offset, theirs + kHeaderBytes, bytes);
    }
    arena.noteAllPublished(step);
    if (i == 0) steps = std::max<size_t>(1, (everyLargest + dataBytes - 1) / dataBytes);
  }
}

}  // namespace ringtree::algorithms
