// reduce: binomial tree (latency), ring reduce-scatter + gather to the root (bandwidth)
// and hierarchical across hosts (hierarchical.h). Only the root's buffer changes; other
// ranks work on a scratch copy.

#include <cstring>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "algorithms/blocks.h"
#include "algorithms/call.h"
#include "algorithms/hierarchical.h"
#include "algorithms/reduce_ops.h"
#include "algorithms/ring.h"
#include "algorithms/selection.h"
#include "algorithms/trees.h"
#include "common/copy.h"
#include "common/validation.h"

namespace ringtree {

namespace algorithms {

namespace {

// The buffer this rank reduces into: the user's at the root, else a scratch copy (the
// user's buffer must stay unchanged), premultiplied for PREMUL_SUM.
void* workingBuffer(Call& call, void* buffer, size_t count, DataType type, const ReduceOptions& options,
                    bool needsCopy) {
  void* working = buffer;
  if (call.rank() != options.root && (needsCopy || options.op == ReduceOp::kPremulSum)) {
    working = call.comm.scratch(count * call.elementSize);
    // Both are null for an empty buffer, which memcpy may not be given even for 0 bytes.
    if (count > 0) copyBytes(working, buffer, count * call.elementSize);
  }
  if (options.op == ReduceOp::kPremulSum) {
    scale(working, count, type, options.premulFactor);
  }
  return working;
}

void treeReduce(Call& call, void* buffer, size_t count, DataType type, const ReduceOptions& options,
                const transport::Accumulate& acc) {
  const size_t bytes = count * call.elementSize;
  const BinomialTree tree(call.rank(), call.size(), options.root);
  const auto& children = tree.childrenNearestFirst();
  void* working = workingBuffer(call, buffer, count, type, options, !children.empty());
  for (int child : children) {
    recv(call, child, working, bytes, acc);
  }
  if (tree.parent() >= 0) {
    send(call, tree.parent(), working, bytes);
  }
}

void ringReduce(Call& call, void* buffer, size_t count, DataType type, const ReduceOptions& options,
                const transport::Accumulate& acc) {
  const int n = call.size();
  const size_t es = call.elementSize;
  void* working = workingBuffer(call, buffer, count, type, options, true);
  ringReduceScatter(call, allRanks(call), working, count, acc);
  if (call.rank() == options.root) {
    for (int peer = 0; peer < n; ++peer) {
      if (peer == call.rank()) {
        continue;
      }
      const Range part = partition(count, n, ringOwnedPart(peer, n));
      recv(call, peer, elementAt(buffer, part.offset, es), part.count * es);
    }
  } else {
    const Range part = partition(count, n, ringOwnedPart(call.rank(), n));
    send(call, options.root, elementAt(working, part.offset, es), part.count * es);
  }
}

}  // namespace

}  // namespace algorithms

void reduce(Communicator& communicator, void* buffer, size_t count, DataType type, const ReduceOptions& options) {
  using namespace algorithms;
  const int n = communicator.size();
  validation::checkReduceOp("reduce", type, options.op);
  validation::checkRoot("reduce", options.root, n);
  validation::checkBuffer("reduce", "buffer", buffer, count);
  const ReduceFn fn = reduceFunction(type, options.op);
  const size_t bytes = validation::checkedBytes("reduce", count, type);
  const Algorithm algorithm = selectAlgorithm(Collective::kReduce, options.algorithm, bytes, n, false,
                                              communicator.impl().hosts().uniform);
  runCall(communicator, Collective::kReduce, algorithm, type, options.op, count, options.root, options.timeout,
          [&](Call& call) {
            const transport::Accumulate acc{fn, call.elementSize};
            if (n == 1) {
              if (options.op == ReduceOp::kPremulSum) {
                scale(buffer, count, type, options.premulFactor);
              }
            } else if (algorithm == Algorithm::kHierarchical) {
              void* working = workingBuffer(call, buffer, count, type, options, true);
              const size_t segment = options.maxSegmentBytes > 0 ? options.maxSegmentBytes : kDefaultChainSegmentBytes;
              hierarchicalReduce(call, working, count, options.root, acc, segment);
            } else if (algorithm == Algorithm::kRing) {
              ringReduce(call, buffer, count, type, options, acc);
            } else {
              treeReduce(call, buffer, count, type, options, acc);
            }
            if (options.op == ReduceOp::kAvg && call.rank() == options.root) {
              divide(buffer, count, type, n);
            }
          });
}

}  // namespace ringtree
