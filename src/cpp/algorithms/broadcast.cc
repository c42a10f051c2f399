// broadcast: binomial tree (latency: ceil(log2 n) steps), a pipelined chain
// (bandwidth: root -> root+1 -> ... in segments, each rank forwarding segment i while it
// receives segment i+1) and shm_direct (the root writes each piece once into the node
// arena, every other rank reads it).

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "algorithms/call.h"
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

void chainBroadcast(Call& call, void* buffer, size_t bytes, int root, size_t segmentBytes) {
  const int n = call.size();
  const int position = (call.rank() - root + n) % n;
  const int previous = position == 0 ? -1 : (call.rank() + n - 1) % n;
  const int next = position == n - 1 ? -1 : (call.rank() + 1) % n;
  auto* data = static_cast<char*>(buffer);
  const size_t segments = bytes == 0 ? 1 : (bytes + segmentBytes - 1) / segmentBytes;
  auto segment = [&](size_t i) {
    const size_t offset = i * segmentBytes;
    return std::pair<char*, size_t>(data + offset, std::min(segmentBytes, bytes - std::min(bytes, offset)));
  };
  if (previous >= 0) {
    const auto first = segment(0);
    recv(call, previous, first.first, first.second);
  }
  for (size_t i = 0; i < segments; ++i) {
    const auto out = segment(i);
    if (next >= 0 && previous >= 0 && i + 1 < segments) {
      const auto in = segment(i + 1);
      sendRecv(call, next, out.first, out.second, previous, in.first, in.second);
    } else if (next >= 0) {
      send(call, next, out.first, out.second);
    } else if (previous >= 0 && i + 1 < segments) {
      const auto in = segment(i + 1);
      recv(call, previous, in.first, in.second);
    }
  }
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
      selectAlgorithm(Collective::kBroadcast, options.algorithm, bytes, n, communicator.impl().arena() != nullptr);
  runCall(communicator, Collective::kBroadcast, algorithm, type, ReduceOp::kSum, count, options.root,
          options.timeout, [&](Call& call) {
            if (n == 1) {
              return;
            }
            if (algorithm == Algorithm::kShmDirect) {
              shmDirectBroadcast(call, buffer, bytes, options.root, options.maxSegmentBytes);
            } else if (algorithm == Algorithm::kChain) {
              size_t segment = options.maxSegmentBytes > 0 ? options.maxSegmentBytes : kDefaultChainSegmentBytes;
              segment = std::max(call.elementSize, segment / call.elementSize * call.elementSize);
              chainBroadcast(call, buffer, bytes, options.root, segment);
            } else {
              treeBroadcast(call, buffer, bytes, options.root);
            }
          });
}

}  // namespace ringtree
