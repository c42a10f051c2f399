// gather and scatter: linear (the root exchanges with every rank directly, all messages
// in flight at once: n - 1 messages through the root, no copies) and tree (binomial:
// ceil(log2 n) rounds; every inner node forwards its subtree's blocks as one message,
// assembled in or cut from scratch).

#include <cstdint>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "algorithms/batch.h"
#include "algorithms/call.h"
#include "algorithms/selection.h"
#include "algorithms/trees.h"
#include "common/copy.h"
#include "common/validation.h"

namespace ringtree {

namespace algorithms {

namespace {

void copyBlock(void* destination, const void* source, size_t bytes) {
  if (destination != source && bytes > 0) streamingCopy(destination, source, bytes);
}

void linearGather(Call& call, const void* input, void* const* outputs, size_t blockBytes, int root) {
  if (call.rank() != root) {
    send(call, root, input, blockBytes);
    return;
  }
  Batch batch(call);
  for (int peer = 0; peer < call.size(); ++peer) {
    if (peer != root) batch.recv(peer, outputs[peer], blockBytes);
  }
  copyBlock(outputs[root], input, blockBytes);
  batch.wait();
}

void linearScatter(Call& call, const void* const* inputs, void* output, size_t blockBytes, int root) {
  if (call.rank() != root) {
    recv(call, root, output, blockBytes);
    return;
  }
  Batch batch(call);
  for (int peer = 0; peer < call.size(); ++peer) {
    if (peer != root) batch.send(peer, inputs[peer], blockBytes);
  }
  copyBlock(output, inputs[root], blockBytes);
  batch.wait();
}

// An inner node's subtree buffer holds the blocks of the ranks it spans in relative-rank
// order (its own first); each child's subtree is a contiguous run of it.
void treeGather(Call& call, const void* input, void* const* outputs, size_t blockBytes, int root) {
  const int n = call.size();
  const BinomialTree tree(call.rank(), n, root);
  const auto& children = tree.childrenNearestFirst();
  if (children.empty()) {
    send(call, tree.parent(), input, blockBytes);
    return;
  }
  const int self = tree.relativeRank(call.rank());
  const size_t spanned = static_cast<size_t>(tree.subtreeSize(call.rank()));
  auto* subtree = static_cast<uint8_t*>(call.comm.scratch(spanned * blockBytes));
  Batch batch(call);
  for (int child : children) {
    batch.recv(child, subtree + static_cast<size_t>(tree.relativeRank(child) - self) * blockBytes,
               static_cast<size_t>(tree.subtreeSize(child)) * blockBytes);
  }
  if (call.rank() == root) {
    copyBlock(outputs[root], input, blockBytes);
  } else {
    copyBlock(subtree, input, blockBytes);
  }
  batch.wait();
  if (call.rank() != root) {
    send(call, tree.parent(), subtree, spanned * blockBytes);
    return;
  }
  for (int v = 1; v < n; ++v) {
    copyBlock(outputs[(root + v) % n], subtree + static_cast<size_t>(v) * blockBytes, blockBytes);
  }
}

void treeScatter(Call& call, const void* const* inputs, void* output, size_t blockBytes, int root) {
  const int n = call.size();
  const BinomialTree tree(call.rank(), n, root);
  const std::vector<int> children = tree.childrenFarthestFirst();
  if (children.empty()) {
    recv(call, tree.parent(), output, blockBytes);
    return;
  }
  const int self = tree.relativeRank(call.rank());
  const size_t spanned = static_cast<size_t>(tree.subtreeSize(call.rank()));
  auto* subtree = static_cast<uint8_t*>(call.comm.scratch(spanned * blockBytes));
  if (call.rank() == root) {
    for (int v = 1; v < n; ++v) {
      copyBlock(subtree + static_cast<size_t>(v) * blockBytes, inputs[(root + v) % n], blockBytes);
    }
  } else {
    recv(call, tree.parent(), subtree, spanned * blockBytes);
  }
  Batch batch(call);
  for (int child : children) {
    batch.send(child, subtree + static_cast<size_t>(tree.relativeRank(child) - self) * blockBytes,
               static_cast<size_t>(tree.subtreeSize(child)) * blockBytes);
  }
  copyBlock(output, call.rank() == root ? inputs[root] : subtree, blockBytes);
  batch.wait();
}

}  // namespace

}  // namespace algorithms

void gather(Communicator& communicator, const void* input, void* const* outputs, size_t count, DataType type,
            const GatherOptions& options) {
  using namespace algorithms;
  const int n = communicator.size();
  validation::checkRoot("gather", options.root, n);
  const size_t blockBytes = validation::checkedBytes("gather", count, type);
  const size_t total = validation::checkedBlocksTotal("gather", count, n, type);
  validation::checkBuffer("gather", "input", input, count);
  if (communicator.rank() == options.root) validation::checkBuffers("gather", "outputs", outputs, n, nullptr, count);
  const Algorithm algorithm = selectAlgorithm(Collective::kGather, options.algorithm, total * elementSize(type), n);
  runCall(communicator, Collective::kGather, algorithm, type, ReduceOp::kSum, total, options.root, options.timeout,
          [&](Call& call) {
            if (n == 1) {
              copyBlock(outputs[0], input, blockBytes);
            } else if (algorithm == Algorithm::kLinear) {
              linearGather(call, input, outputs, blockBytes, options.root);
            } else {
              treeGather(call, input, outputs, blockBytes, options.root);
            }
          });
}

void scatter(Communicator& communicator, const void* const* inputs, void* output, size_t count, DataType type,
             const ScatterOptions& options) {
  using namespace algorithms;
  const int n = communicator.size();
  validation::checkRoot("scatter", options.root, n);
  const size_t blockBytes = validation::checkedBytes("scatter", count, type);
  const size_t total = validation::checkedBlocksTotal("scatter", count, n, type);
  validation::checkBuffer("scatter", "output", output, count);
  if (communicator.rank() == options.root) validation::checkBuffers("scatter", "inputs", inputs, n, nullptr, count);
  const Algorithm algorithm = selectAlgorithm(Collective::kScatter, options.algorithm, total * elementSize(type), n);
  runCall(communicator, Collective::kScatter, algorithm, type, ReduceOp::kSum, total, options.root, options.timeout,
          [&](Call& call) {
            if (n == 1) {
              copyBlock(output, inputs[0], blockBytes);
            } else if (algorithm == Algorithm::kLinear) {
              linearScatter(call, inputs, output, blockBytes, options.root);
            } else {
              treeScatter(call, inputs, output, blockBytes, options.root);
            }
          });
}

}  // namespace ringtree
