// alltoall: pairwise exchange, and shm_direct through the node arena (shm_direct.h).
// Pairwise: in step k (1 .. n - 1) rank r sends its block for rank r + k and receives
// rank r - k's block for it, straight between the callers' buffers. A rank whose blocks
// are small posts every step at once (measured on 3-8 ranks of one host: 1.2-2x faster
// up to 64 KiB, slower from 256 KiB); others go step by step.

#include <string>
#include <utility>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "algorithms/batch.h"
#include "algorithms/call.h"
#include "algorithms/selection.h"
#include "algorithms/shm_direct.h"
#include "common/copy.h"
#include "common/validation.h"

namespace ringtree {

void alltoall(Communicator& communicator, const void* const* inputs, const size_t* sendCounts, void* const* outputs,
              const size_t* recvCounts, DataType type, const AlltoallOptions& options) {
  using namespace algorithms;
  const int n = communicator.size();
  const int rank = communicator.rank();
  const size_t sentBytes = validation::checkedTotal("alltoall", "sendCounts", sendCounts, n, type) * elementSize(type);
  validation::checkedTotal("alltoall", "recvCounts", recvCounts, n, type);
  validation::checkBuffers("alltoall", "inputs", inputs, n, sendCounts);
  validation::checkBuffers("alltoall", "outputs", outputs, n, recvCounts);
  if (sendCounts[rank] != recvCounts[rank]) {
    throw InvalidArgument("alltoall: rank " + std::to_string(rank) + " sends itself " +
                          std::to_string(sendCounts[rank]) + " elements (sendCounts[" + std::to_string(rank) +
                          "]) but expects " + std::to_string(recvCounts[rank]) + " (recvCounts[" +
                          std::to_string(rank) + "])");
  }
  // Ranks share no size (each knows its own row and column of the count matrix), so the
  // choice and the envelope use none; every message's size is checked on arrival.
  const Algorithm algorithm =
      selectAlgorithm(Collective::kAlltoall, options.algorithm, 0, n, communicator.impl().arena() != nullptr);
  runCall(communicator, Collective::kAlltoall, algorithm, type, ReduceOp::kSum, 0, -1, options.timeout,
          [&](Call& call) {
            const size_t es = call.elementSize;
            if (outputs[rank] != inputs[rank] && sendCounts[rank] > 0) {
              streamingCopy(outputs[rank], inputs[rank], sendCounts[rank] * es);
            }
            if (n > 1 && algorithm == Algorithm::kShmDirect) {
              shmDirectAlltoall(call, inputs, sendCounts, outputs, recvCounts, options.maxSegmentBytes);
              return;
            }
            pairwiseExchange(
                call, sentBytes <= kSmallMessageBytes,
                [&](int to) { return std::make_pair(inputs[to], sendCounts[to] * es); },
                [&](int from) { return std::make_pair(outputs[from], recvCounts[from] * es); });
          });
}

}  // namespace ringtree
