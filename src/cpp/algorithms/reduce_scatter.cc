// reduce_scatter: ring (block b's partial result travels b + 1 -> b + 2 -> ... -> b, each
// rank folding its own contribution in as the data arrives), pairwise (every rank sends
// each peer that peer's block directly and folds its own block from all ranks in rank
// order) and shm_direct (the same fold, through the node arena). Each output element is
// computed by one rank in an order fixed by the rank count, so results are the same in
// every run; pairwise and shm_direct fold in rank order, as the one-shot shm_direct
// allreduce does. Across hosts, hierarchical (hierarchical.h).

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "algorithms/batch.h"
#include "algorithms/blocks.h"
#include "algorithms/call.h"
#include "algorithms/hierarchical.h"
#include "algorithms/reduce_ops.h"
#include "algorithms/ring.h"
#include "algorithms/selection.h"
#include "algorithms/shm_direct.h"
#include "common/copy.h"
#include "common/validation.h"

namespace ringtree {

namespace algorithms {

namespace {

// Scratch the ring needs: two slices of the largest block (one being sent while the next
// one arrives). A single slice per step goes straight into the output on two ranks.
size_t ringWorkspaceBytes(int n, size_t sliceCount, size_t largest, size_t es) {
  return n > 2 ? 2 * std::min(sliceCount, largest) * es : 0;
}

// In step s rank r sends its partial result of block r - s - 1 to rank r + 1 and receives
// rank r - 1's of block r - s - 2, into a copy of its own contribution that the transport
// folds the arriving data into (own op incoming); in the last step that block is r's
// own, received into output. With maxSegmentBytes every block is cut into the same
// slices and the ring runs once per slice.
void ringReduceScatterBlocks(Call& call, const std::vector<const void*>& inputs, void* output, const size_t* counts,
                             const transport::Accumulate& acc, size_t sliceCount, char* workspace) {
  const int n = call.size();
  const int rank = call.rank();
  const size_t es = call.elementSize;
  const size_t largest = *std::max_element(counts, counts + n);
  const size_t stride = std::min(sliceCount, largest) * es;
  for (size_t start = 0;; start += sliceCount) {  // once even when every block is empty
    const int first = (rank - 1 + n) % n;
    const void* sending = elementAt(inputs[first], sliceOf(counts[first], start, sliceCount).offset, es);
    for (int step = 0; step < n - 1; ++step) {
      const int sent = (rank - step - 1 + 2 * n) % n;
      const int received = (rank - step - 2 + 2 * n) % n;
      const Range out = sliceOf(counts[sent], start, sliceCount);
      const Range in = sliceOf(counts[received], start, sliceCount);
      void* into = received == rank ? elementAt(output, in.offset, es) : workspace + (step % 2) * stride;
      const void* own = elementAt(inputs[received], in.offset, es);
      if (into != own && in.count > 0) copyBytes(into, own, in.count * es);
      sendRecv(call, (rank + 1) % n, sending, out.count * es, (rank + n - 1) % n, into, in.count * es, acc);
      sending = into;
    }
    if (largest - start <= sliceCount) break;
  }
}

// Scratch pairwise needs: a slice of this rank's block from each peer.
size_t pairwiseWorkspaceBytes(int n, size_t sliceCount, size_t ownCount, size_t es) {
  return static_cast<size_t>(n - 1) * std::min(sliceCount, ownCount) * es;
}

// In step k rank r sends block r + k to rank r + k and receives rank r - k's
// contribution to block r; then it folds block r from every rank in rank order. Calls of
// at most kSmallMessageBytes per rank post every step at once (pairwiseExchange):
// measured over shm pairs on 3-8 ranks, 1.5-2.4x faster than one step at a time at 1 KiB,
// about even at 64 KiB.
void pairwiseReduceScatter(Call& call, const std::vector<const void*>& inputs, void* output, const size_t* counts,
                           ReduceFn fn, size_t sliceCount, char* workspace) {
  const int n = call.size();
  const int rank = call.rank();
  const size_t es = call.elementSize;
  const size_t largest = *std::max_element(counts, counts + n);
  const size_t stride = std::min(sliceCount, counts[rank]) * es;
  const bool allInFlight = std::accumulate(counts, counts + n, size_t{0}) * es <= kSmallMessageBytes;
  const auto received = [&](int peer) {
    return workspace + static_cast<size_t>(peer < rank ? peer : peer - 1) * stride;
  };
  for (size_t start = 0;; start += sliceCount) {  // once even when every block is empty
    const Range own = sliceOf(counts[rank], start, sliceCount);
    pairwiseExchange(
        call, allInFlight,
        [&](int to) {
          const Range out = sliceOf(counts[to], start, sliceCount);
          return std::make_pair(elementAt(inputs[to], out.offset, es), out.count * es);
        },
        [&](int from) { return std::make_pair(received(from), own.count * es); });
    const auto source = [&](int q) -> const void* {
      return q == rank ? elementAt(inputs[rank], own.offset, es) : received(q);
    };
    foldInRankOrder(elementAt(output, own.offset, es), n, source, own.count, es, fn);
    if (largest - start <= sliceCount) break;
  }
}

}  // namespace

}  // namespace algorithms

void reduceScatter(Communicator& communicator, const void* const* inputs, void* output, const size_t* counts,
                   DataType type, const ReduceScatterOptions& options) {
  using namespace algorithms;
  validation::checkReduceOp("reduce_scatter", type, options.op);
  const ReduceFn fn = reduceFunction(type, options.op);
  if (options.op == ReduceOp::kPremulSum) {
    scale(nullptr, 0, type, options.premulFactor);  // throws for a factor the type cannot take
  }
  const int n = communicator.size();
  const int rank = communicator.rank();
  const size_t total = validation::checkedTotal("reduce_scatter", "counts", counts, n, type);
  validation::checkBuffers("reduce_scatter", "inputs", inputs, n, counts);
  validation::checkBuffer("reduce_scatter", "output", output, counts[rank]);
  const size_t es = elementSize(type);
  const Algorithm algorithm = selectAlgorithm(Collective::kReduceScatter, options.algorithm, total * es, n,
                                              communicator.impl().arena() != nullptr,
                                              communicator.impl().hosts().uniform);
  runCall(communicator, Collective::kReduceScatter, algorithm, type, options.op, total, -1, options.timeout,
          [&](Call& call) {
            const size_t largest = *std::max_element(counts, counts + n);
            const size_t sliceCount = sliceLength(options.maxSegmentBytes, es, largest);
            size_t workspaceBytes = 0;
            if (n > 1 && algorithm == Algorithm::kRing) {
              workspaceBytes = ringWorkspaceBytes(n, sliceCount, largest, es);
            } else if (n > 1 && algorithm == Algorithm::kPairwise) {
              workspaceBytes = pairwiseWorkspaceBytes(n, sliceCount, counts[rank], es);
            } else if (n > 1 && algorithm == Algorithm::kHierarchical) {
              workspaceBytes = total * es;
            }
            // Scratch: [every input premultiplied (PREMUL_SUM only) | the algorithm's].
            const size_t premulBytes = options.op == ReduceOp::kPremulSum ? (total * es + 63) / 64 * 64 : 0;
            auto* scratch = static_cast<char*>(call.comm.scratch(premulBytes + workspaceBytes));
            std::vector<const void*> sources(inputs, inputs + n);
            if (options.op == ReduceOp::kPremulSum) {
              char* scaled = scratch;
              for (int q = 0; q < n; ++q) {
                if (counts[q] > 0) copyBytes(scaled, inputs[q], counts[q] * es);
                scale(scaled, counts[q], type, options.premulFactor);
                sources[static_cast<size_t>(q)] = scaled;
                scaled += counts[q] * es;
              }
            }
            if (n == 1) {
              if (output != sources[0] && counts[0] > 0) streamingCopy(output, sources[0], counts[0] * es);
            } else {
              switch (algorithm) {
                case Algorithm::kShmDirect:
                  shmDirectReduceScatter(call, sources.data(), output, counts, fn, options.maxSegmentBytes);
                  break;
                case Algorithm::kPairwise:
                  pairwiseReduceScatter(call, sources, output, counts, fn, sliceCount, scratch + premulBytes);
                  break;
                case Algorithm::kHierarchical:
                  hierarchicalReduceScatter(call, sources.data(), output, counts, transport::Accumulate{fn, es},
                                            scratch + premulBytes);
                  break;
                default:
                  ringReduceScatterBlocks(call, sources, output, counts, transport::Accumulate{fn, es},
                                          sliceCount, scratch + premulBytes);
                  break;
              }
            }
            if (options.op == ReduceOp::kAvg) divide(output, counts[rank], type, n);
          });
}

}  // namespace ringtree
