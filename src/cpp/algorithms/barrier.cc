// barrier: dissemination. In round k every rank signals rank + 2^k and waits for
// rank - 2^k; after ceil(log2 n) rounds every rank has heard, transitively, from all.

#include <ringtree/collectives.h>

#include "algorithms/common.h"

namespace ringtree {

void barrier(Communicator& communicator, const BarrierOptions& options) {
  using namespace algorithms;
  runCall(communicator, Collective::kBarrier, Algorithm::kAuto, DataType::kUInt8, ReduceOp::kSum, 0, -1,
          options.timeout, [&](Call& call) {
            const int n = call.size();
            for (int distance = 1; distance < n; distance <<= 1) {
              sendRecv(call, (call.rank() + distance) % n, nullptr, 0, (call.rank() - distance + n) % n, nullptr, 0);
            }
          });
}

}  // namespace ringtree
