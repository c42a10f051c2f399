// broadcast: binomial tree (latency: ceil(log2 n) steps), a pipelined chain
// (bandwidth: root -> root+1 -> ... in segments, each rank forwarding segment i while it
// receives segment i+1), shm_direct (the root writes each piece once into the node
// arena, every other rank reads it) and hierarchical across hosts (hierarchical.h).

#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "algorithms/call.h"
#include "algorithms/hierarchical.h"
#include "algorithms/ring.h"
#include "algorithms/selection.h"
#include "algorithms/shm_direct.h"
#include "algorithms/trees.h"
#include "common/validation.h"

namespace ringtree {

namespace algorithms {

namespace {

void treeBroadcast(Call& call, void* buffer, size_t bytes, int root) {
  const BinomialTree tree(call.rank(), call.size(), root);
  if (tree.parent() >= 0) {
    recv(call, tree.parent(), buffer, bytes);
  }
  for (int child : tree.childrenFarthestFirst()) {
    send(call, child, buffer, bytes);
  }
}

// The chain root, root + 1, ..., root - 1 (mod n).
void chainBroadcast(Call& call, void* buffer, size_t bytes, int root, size_t segmentBytes) {
  const int n = call.size();
  std::vector<int> order(static_cast<size_t>(n));
  for (int position = 0; position < n; ++position) order[static_cast<size_t>(position)] = (root + position) % n;
  chainPass(call, RingMembers{order.data(), n, (call.rank() - root + n) % n}, buffer, bytes, segmentBytes);
}

}  // namespace

}  // namespace algorithms

void broadcast(Communicator& communicator, void* buffer, size_t count, DataType type, const BroadcastOptions& options) {
  using namespace algorithms;
  const int n = communicator.size();
  validation::checkRoot("broadcast", options.root, n);
  validation::checkBuffer("broadcast", "buffer", buffer, count);
  const size_t bytes = validation::checkedBytes("broadcast", count, type);
  const Algorithm algorithm =
      selectAlgorithm(Collective::kBroadcast, options.algorithm, bytes, n, communicator.impl().arena() != nullptr,
                      communicator.impl().hosts().uniform);
  runCall(communicator, Collective::kBroadcast, algorithm, type, ReduceOp::kSum, count, options.root,
          options.timeout, [&](Call& call) {
            if (n == 1) {
              return;
            }
            size_t segment = options.maxSegmentBytes > 0 ? options.maxSegmentBytes : kDefaultChainSegmentBytes;
            segment = std::max(call.elementSize, segment / call.elementSize * call.elementSize);
            if (algorithm == Algorithm::kShmDirect) {
              shmDirectBroadcast(call, buffer, bytes, options.root, options.maxSegmentBytes);
            } else if (algorithm == Algorithm::kHierarchical) {
              hierarchicalBroadcast(call, buffer, bytes, options.root, segment);
            } else if (algorithm == Algorithm::kChain) {
              chainBroadcast(call, buffer, bytes, options.root, segment);
            } else {
              treeBroadcast(call, buffer, bytes, options.root);
            }
          });
}

}  // namespace ringtree
