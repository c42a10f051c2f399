#pragma once

#include <algorithm>
#include <cstddef>

#include "algorithms/blocks.h"
#include "algorithms/call.h"

// Passes over an ordered set of members (every rank of the communicator, or a subset of
// them): the two halves of the ring allreduce, shared by allreduce (flat and
// hierarchical) and reduce, which work in place on `count` elements cut into n parts
// (partition()), in n - 1 steps that each send to the right neighbour while receiving
// from the left one; and the pipelined chain of broadcast and of the hierarchical reduce.
namespace ringtree::algorithms {

// The ranks a ring runs over, in ring order: ranks[0 .. n) (communicator ranks), or every
// rank 0 .. n-1 when ranks is null; index is this rank's position among them.
struct RingMembers {
  const int* ranks = nullptr;
  int n = 0;
  int index = 0;

  int at(int position) const { return ranks == nullptr ? position : ranks[position]; }
  int right() const { return at((index + 1) % n); }
  int left() const { return at((index + n - 1) % n); }
};

// Every rank of the call's communicator.
inline RingMembers allRanks(const Call& call) { return RingMembers{nullptr, call.size(), call.rank()}; }

// After it returns, part ringOwnedPart(members.index, members.n) of buffer holds the
// reduction of every member's copy of that part; the other parts hold partial results.
void ringReduceScatter(Call& call, const RingMembers& members, void* buffer, size_t count,
                       const transport::Accumulate& accumulate);

// Spreads each member's owned part (as left by ringReduceScatter) to every member.
void ringAllgather(Call& call, const RingMembers& members, void* buffer, size_t count);

inline int ringOwnedPart(int index, int size) { return (index + 1) % size; }

// The ring allreduces' pipelining knob: runs body(slice, sliceCount) over `buffer` cut
// into slices of maxSegmentBytes worth of elements per rank (whole when 0), at least once
// (count 0: every rank still takes part in the exchange).
template <typename Body>
void forEachRingSlice(const Call& call, void* buffer, size_t count, size_t maxSegmentBytes, Body&& body) {
  const size_t es = call.elementSize;
  size_t sliceCount = count;
  if (maxSegmentBytes > 0) {
    sliceCount = std::max<size_t>(1, maxSegmentBytes / es) * static_cast<size_t>(call.size());
  }
  size_t sliceStart = 0;
  do {
    body(static_cast<char*>(buffer) + sliceStart * es, std::min(sliceCount, count - sliceStart));
    sliceStart += sliceCount;
  } while (sliceStart < count);
}

// A pipelined chain: `bytes` at `data` flow from members.at(0) to members.at(1), ... to
// members.at(n - 1) in segments of segmentBytes (a multiple of the element size when
// accumulating); each member after the first receives every segment (folding it into its
// own with accumulate, when given) and forwards it, sending segment i while segment i + 1
// arrives. members.index is this rank's position in the chain.
void chainPass(Call& call, const RingMembers& members, void* data, size_t bytes, size_t segmentBytes,
               const transport::Accumulate& accumulate = {});

inline char* elementAt(void* buffer, size_t element, size_t elementSize) {
  return static_cast<char*>(buffer) + element * elementSize;
}
inline const char* elementAt(const void* buffer, size_t element, size_t elementSize) {
  return static_cast<const char*>(buffer) + element * elementSize;
}

}  // namespace ringtree::algorithms
