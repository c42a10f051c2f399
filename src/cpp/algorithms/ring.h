#pragma once

#include <cstddef>

#include "algorithms/blocks.h"
#include "algorithms/call.h"

// The two halves of the ring allreduce, shared by allreduce and reduce. Both work in
// place on `count` elements cut into size() parts (partition()), in n - 1 steps that
// each send to the right neighbour while receiving from the left one.
namespace ringtree::algorithms {

// After it returns, part ringOwnedPart(rank, n) of buffer holds the reduction of every
// rank's copy of that part; the other parts hold partial results.
void ringReduceScatter(Call& call, void* buffer, size_t count, const transport::Accumulate& accumulate);

// Spreads each rank's owned part (as left by ringReduceScatter) to every rank.
void ringAllgather(Call& call, void* buffer, size_t count);

inline int ringOwnedPart(int rank, int size) { return (rank + 1) % size; }

inline char* elementAt(void* buffer, size_t element, size_t elementSize) {
  return static_cast<char*>(buffer) + element * elementSize;
}
inline const char* elementAt(const void* buffer, size_t element, size_t elementSize) {
  return static_cast<const char*>(buffer) + element * elementSize;
}

}  // namespace ringtree::algorithms
