// allgather: ring (each block travels once around the ring, received straight into its
// output and forwarded from there: no copies), Bruck's doubling ("halving_doubling":
// ceil(log2 n) steps of growing runs of blocks, through a scratch copy; any n, any
// counts), shm_direct (every rank writes its block once into the node arena, every
// rank copies every other rank's) and hierarchical across hosts (hierarchical.h).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "algorithms/blocks.h"
#include "algorithms/call.h"
#include "algorithms/hierarchical.h"
#include "algorithms/ring.h"
#include "algorithms/selection.h"
#include "algorithms/shm_direct.h"
#include "common/copy.h"
#include "common/validation.h"

namespace ringtree {

namespace algorithms {

namespace {

// In step s rank r sends block r - s to rank r + 1 and receives block r - s - 1 from rank
// r - 1; after n - 1 steps every block went round. With maxSegmentBytes every block is
// cut into the same slices and the ring runs once per slice.
void ringAllgatherBlocks(Call& call, const void* input, void* const* outputs, const size_t* counts,
                   size_t maxSegmentBytes) {
  const int n = call.size();
  const int rank = call.rank();
  const size_t es = call.elementSize;
  const size_t largest = *std::max_element(counts, counts + n);
  const size_t length = sliceLength(maxSegmentBytes, es, largest);
  for (size_t start = 0;; start += length) {  // once even when every block is empty
    for (int step = 0; step < n - 1; ++step) {
      const int sent = (rank - step + n) % n;
      const int received = (rank - step - 1 + n) % n;
      const Range out = sliceOf(counts[sent], start, length);
      const Range in = sliceOf(counts[received], start, length);
      const void* source = sent == rank ? input : outputs[sent];
      sendRecv(call, (rank + 1) % n, elementAt(source, out.offset, es), out.count * es, (rank + n - 1) % n,
               elementAt(outputs[received], in.offset, es), in.count * es);
    }
    if (largest - start <= length) break;
  }
}

// Bruck: the scratch buffer holds blocks rank, rank + 1, ... (mod n) in that order. In
// the step of distance d (1, 2, 4, ...) rank r holds its first d blocks, sends its first
// min(d, n - d) to rank r - d and receives rank r + d's first ones, which are its blocks
// d, d + 1, ...: contiguous on both sides. Finally the blocks are copied out.
void bruckAllgather(Call& call, const void* input, void* const* outputs, const size_t* counts) {
  const int n = call.size();
  const int rank = call.rank();
  const size_t es = call.elementSize;
  std::vector<size_t> offset(static_cast<size_t>(n) + 1, 0);  // of the i-th block held, in bytes
  for (int i = 0; i < n; ++i) offset[i + 1] = offset[i] + counts[(rank + i) % n] * es;
  auto* held = static_cast<uint8_t*>(call.comm.scratch(offset[n]));
  if (offset[1] > 0) copyBytes(held, input, offset[1]);
  for (int distance = 1; distance < n; distance <<= 1) {
    const int blocks = std::min(distance, n - distance);
    sendRecv(call, (rank - distance + n) % n, held, offset[blocks], (rank + distance) % n, held + offset[distance],
             offset[distance + blocks] - offset[distance]);
  }
  for (int i = 1; i < n; ++i) {
    const size_t bytes = offset[i + 1] - offset[i];
    if (bytes > 0) streamingCopy(outputs[(rank + i) % n], held + offset[i], bytes);
  }
}

}  // namespace

}  // namespace algorithms

void allgather(Communicator& communicator, const void* input, void* const* outputs, const size_t* counts,
               DataType type, const AllgatherOptions& options) {
  using namespace algorithms;
  const int n = communicator.size();
  const int rank = communicator.rank();
  const size_t total = validation::checkedTotal("allgather", "counts", counts, n, type);
  validation::checkBuffers("allgather", "outputs", outputs, n, counts);
  validation::checkBuffer("allgather", "input", input, counts[rank]);
  const size_t es = elementSize(type);
  const Algorithm algorithm = selectAlgorithm(Collective::kAllgather, options.algorithm, total * es, n,
                                              communicator.impl().arena() != nullptr,
                                              communicator.impl().hosts().uniform);
  runCall(communicator, Collective::kAllgather, algorithm, type, ReduceOp::kSum, total, -1, options.timeout,
          [&](Call& call) {
            if (n > 1) {
              switch (algorithm) {
                case Algorithm::kShmDirect:
                  shmDirectAllgather(call, input, outputs, counts, options.maxSegmentBytes);
                  break;
                case Algorithm::kHalvingDoubling: bruckAllgather(call, input, outputs, counts); break;
                case Algorithm::kHierarchical: hierarchicalAllgather(call, input, outputs, counts); break;
                default: ringAllgatherBlocks(call, input, outputs, counts, options.maxSegmentBytes); break;
              }
            }
            // Last: the algorithms send this rank's block from `input`, which may be
            // outputs[rank] itself.
            if (outputs[rank] != input && counts[rank] > 0) streamingCopy(outputs[rank], input, counts[rank] * es);
          });
}

}  // namespace ringtree
