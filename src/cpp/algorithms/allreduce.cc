// allreduce: ring, tree, halving-doubling, shm_direct and hierarchical, all in place and all leaving
// every rank with bitwise-identical results (each element's final value is computed on
// one rank, or identically on several ranks by the same steps, and then copied).

#include <cstring>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "algorithms/blocks.h"
#include "algorithms/call.h"
#include "algorithms/hierarchical.h"
#include "algorithms/reduce_ops.h"
#include "algorithms/ring.h"
#include "algorithms/selection.h"
#include "algorithms/shm_direct.h"
#include "algorithms/trees.h"
#include "common/copy.h"
#include "common/validation.h"

namespace ringtree {

namespace algorithms {

namespace {

// Messages up to this size take recursive doubling (whole buffer per step) within
// halving_doubling; larger ones recursive halving + doubling (Rabenseifner).
constexpr size_t kRecursiveDoublingBytes = 16 << 10;

// Ring: reduce-scatter then allgather, 2(n-1) steps of count/n elements. With
// maxSegmentBytes the buffer is processed in slices of n segments, a full ring each.
void ringAllreduce(Call& call, void* buffer, size_t count, const transport::Accumulate& acc, size_t maxSegmentBytes) {
  forEachRingSlice(call, buffer, count, maxSegmentBytes, [&](void* slice, size_t sliceCount) {
    ringReduceScatter(call, allRanks(call), slice, sliceCount, acc);
    ringAllgather(call, allRanks(call), slice, sliceCount);
  });
}

// Tree: binomial reduce to rank 0 (children folded in one at a time, in a fixed order),
// then binomial broadcast from rank 0.
void treeAllreduce(Call& call, void* buffer, size_t count, const transport::Accumulate& acc) {
  const size_t bytes = count * call.elementSize;
  const BinomialTree tree(call.rank(), call.size(), 0);
  for (int child : tree.childrenNearestFirst()) {
    recv(call, child, buffer, bytes, acc);
  }
  if (tree.parent() >= 0) {
    send(call, tree.parent(), buffer, bytes);
    recv(call, tree.parent(), buffer, bytes);
  }
  for (int child : tree.childrenFarthestFirst()) {
    send(call, child, buffer, bytes);
  }
}

// Halving-doubling over the largest power of two p <= n: the n - p ranks above p first
// fold their data into rank - p and get the result back at the end.
void halvingDoublingAllreduce(Call& call, void* buffer, size_t count, const transport::Accumulate& acc) {
  const int n = call.size();
  const int rank = call.rank();
  const size_t es = call.elementSize;
  const size_t bytes = count * es;
  int p = 1;
  while (p * 2 <= n) {
    p *= 2;
  }
  if (rank >= p) {
    send(call, rank - p, buffer, bytes);
    recv(call, rank - p, buffer, bytes);
    return;
  }
  if (rank + p < n) {
    recv(call, rank + p, buffer, bytes, acc);
  }
  if (bytes <= kRecursiveDoublingBytes || count < static_cast<size_t>(p)) {
    // Recursive doubling: exchange the whole buffer with rank ^ mask; the copy keeps
    // what is sent stable while the received data is folded into the buffer.
    void* copy = call.comm.scratch(bytes);
    for (int mask = 1; mask < p; mask <<= 1) {
      if (bytes > 0) copyBytes(copy, buffer, bytes);  // both are null for an empty buffer
      const int partner = rank ^ mask;
      sendRecv(call, partner, copy, bytes, partner, buffer, bytes, acc);
    }
  } else {
    // Recursive halving (reduce-scatter): keep one half, send the other, fold the
    // partner's copy of the kept half in. The halves are disjoint: no copy needed.
    std::vector<Range> kept;
    Range range{0, count};
    for (int mask = p / 2; mask >= 1; mask >>= 1) {
      const int partner = rank ^ mask;
      const Range lower{range.offset, range.count / 2};
      const Range upper{range.offset + lower.count, range.count - lower.count};
      const bool keepUpper = (rank & mask) != 0;
      const Range keep = keepUpper ? upper : lower;
      const Range give = keepUpper ? lower : upper;
      sendRecv(call, partner, elementAt(buffer, give.offset, es), give.count * es, partner, elementAt(buffer, keep.offset, es),
               keep.count * es, acc);
      kept.push_back(range);
      range = keep;
    }
    // Recursive doubling (allgather): undo the halvings in reverse order.
    for (int mask = 1; mask < p; mask <<= 1) {
      const int partner = rank ^ mask;
      const Range whole = kept.back();
      kept.pop_back();
      const Range other = range.offset == whole.offset ? Range{range.offset + range.count, whole.count - range.count}
                                                       : Range{whole.offset, whole.count - range.count};
      sendRecv(call, partner, elementAt(buffer, range.offset, es), range.count * es, partner, elementAt(buffer, other.offset, es),
               other.count * es);
      range = whole;
    }
  }
  if (rank + p < n) {
    send(call, rank + p, buffer, bytes);
  }
}

}  // namespace

}  // namespace algorithms

void allreduce(Communicator& communicator, void* buffer, size_t count, DataType type, const AllreduceOptions& options) {
  using namespace algorithms;
  validation::checkReduceOp("allreduce", type, options.op);
  validation::checkBuffer("allreduce", "buffer", buffer, count);
  const ReduceFn fn = reduceFunction(type, options.op);
  const int n = communicator.size();
  const Algorithm algorithm =
      selectAlgorithm(Collective::kAllreduce, options.algorithm, validation::checkedBytes("allreduce", count, type), n,
                      communicator.impl().arena() != nullptr, communicator.impl().hosts().uniform);
  runCall(communicator, Collective::kAllreduce, algorithm, type, options.op, count, -1, options.timeout,
          [&](Call& call) {
            if (options.op == ReduceOp::kPremulSum) {
              scale(buffer, count, type, options.premulFactor);
            }
            if (n > 1) {
              const transport::Accumulate acc{fn, call.elementSize};
              switch (algorithm) {
                case Algorithm::kRing: ringAllreduce(call, buffer, count, acc, options.maxSegmentBytes); break;
                case Algorithm::kTree: treeAllreduce(call, buffer, count, acc); break;
                case Algorithm::kHierarchical:
                  hierarchicalAllreduce(call, buffer, count, acc, options.maxSegmentBytes);
                  break;
                case Algorithm::kShmDirect:
                  shmDirectAllreduce(call, buffer, count, fn,
                                     options.op != ReduceOp::kMin && options.op != ReduceOp::kMax,
                                     options.maxSegmentBytes);
                  break;
                default: halvingDoublingAllreduce(call, buffer, count, acc); break;
              }
            }
            if (options.op == ReduceOp::kAvg) {
              divide(buffer, count, type, n);
            }
          });
}

}  // namespace ringtree
