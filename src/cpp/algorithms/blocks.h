#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/copy.h"
#include "common/reduce_fn.h"

// Cutting buffers into blocks: balanced parts of one buffer (partition), and, for
// collectives over per-rank blocks of different sizes (allgather, reduce_scatter,
// alltoall), the same sequence of slices of every block, so that all ranks agree on each
// step's messages; folding blocks in rank order.
namespace ringtree::algorithms {

// A range of elements [offset, offset + count).
struct Range {
  size_t offset = 0;
  size_t count = 0;
};

// Part `index` of `count` elements cut into `parts` nearly equal, contiguous parts (the
// first count % parts parts have one element more).
inline Range partition(size_t count, int parts, int index) {
  const size_t n = static_cast<size_t>(parts);
  const size_t i = static_cast<size_t>(index);
  const size_t base = count / n;
  const size_t extra = count % n;
  return Range{i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

// Slice [start, start + length) of a block of `count` elements, clipped to the block
// (empty past its end).
inline Range sliceOf(size_t count, size_t start, size_t length) {
  const size_t offset = std::min(start, count);
  return Range{offset, std::min(length, count - offset)};
}

// Elements per slice: maxSegmentBytes worth (at least one element), or every element of
// the largest block (one slice) when maxSegmentBytes is 0.
inline size_t sliceLength(size_t maxSegmentBytes, size_t elementSize, size_t largestCount) {
  if (maxSegmentBytes == 0) return std::max<size_t>(largestCount, 1);
  return std::max<size_t>(maxSegmentBytes / elementSize, 1);
}

// Folds are done in pieces of this size (a multiple of every element size), which stay
// in L1 from the first source to the last.
constexpr size_t kFoldBlockBytes = size_t{16} << 10;

// out[0 .. count) <- source(0) op source(1) op ... op source(n - 1), folded left to
// right (rank order) with fn, whose elements are elementSize bytes. source(q) returns the
// address of the q-th operand. `out` may be one of the operands (in place).
template <typename Source>
void foldInRankOrder(void* out, int n, Source&& source, size_t count, size_t elementSize, ReduceFn fn) {
  alignas(64) uint8_t piece[kFoldBlockBytes];
  const size_t pieceCount = kFoldBlockBytes / elementSize;
  auto* destination = static_cast<uint8_t*>(out);
  for (size_t done = 0; done < count; done += pieceCount) {
    const size_t length = std::min(pieceCount, count - done);
    const size_t offset = done * elementSize;
    copyBytes(piece, static_cast<const uint8_t*>(source(0)) + offset, length * elementSize);
    for (int q = 1; q < n; ++q) fn(piece, static_cast<const uint8_t*>(source(q)) + offset, length);
    copyBytes(destination + offset, piece, length * elementSize);
  }
}

}  // namespace ringtree::algorithms
