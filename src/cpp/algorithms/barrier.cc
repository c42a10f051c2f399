// barrier: over the node arena when the communicator has one (every rank publishes one
// step and waits for all: shm_direct.h); across hosts, hierarchical (hierarchical.h);
// else dissemination: in round k every rank signals rank + 2^k and waits for rank - 2^k;
// after ceil(log2 n) rounds every rank has heard, transitively, from all.

#include <ringtree/collectives.h>

#include "algorithms/call.h"
#include "algorithms/hierarchical.h"
#include "algorithms/selection.h"
#include "algorithms/shm_direct.h"

namespace ringtree {

void barrier(Communicator& communicator, const BarrierOptions& options) {
  using namespace algorithms;
  const Algorithm algorithm = selectAlgorithm(Collective::kBarrier, Algorithm::kAuto, 0, communicator.size(),
                                              communicator.impl().arena() != nullptr,
                                              communicator.impl().hosts().uniform);
  runCall(communicator, Collective::kBarrier, algorithm, DataType::kUInt8, ReduceOp::kSum, 0, -1, options.timeout,
          [&](Call& call) {
            if (algorithm == Algorithm::kShmDirect) {
              shmDirectBarrier(call);
              return;
            }
            if (algorithm == Algorithm::kHierarchical) {
              hierarchicalBarrier(call);
              return;
            }
            const int n = call.size();
            for (int distance = 1; distance < n; distance <<= 1) {
              sendRecv(call, (call.rank() + distance) % n, nullptr, 0, (call.rank() - distance + n) % n, nullptr, 0);
            }
          });
}

}  // namespace ringtree
