#include "algorithms/ring.h"

namespace ringtree::algorithms {

void ringReduceScatter(Call& call, void* buffer, size_t count, const transport::Accumulate& accumulate) {
  const int n = call.size();
  const int rank = call.rank();
  const size_t es = call.elementSize;
  for (int step = 0; step < n - 1; ++step) {
    const Range out = partition(count, n, (rank - step + n) % n);
    const Range in = partition(count, n, (rank - step - 1 + 2 * n) % n);
    sendRecv(call, (rank + 1) % n, elementAt(buffer, out.offset, es), out.count * es, (rank + n - 1) % n,
             elementAt(buffer, in.offset, es), in.count * es, accumulate);
  }
}

void ringAllgather(Call& call, void* buffer, size_t count) {
  const int n = call.size();
  const int rank = call.rank();
  const size_t es = call.elementSize;
  for (int step = 0; step < n - 1; ++step) {
    const Range out = partition(count, n, (rank + 1 - step + 2 * n) % n);
    const Range in = partition(count, n, (rank - step + 2 * n) % n);
    sendRecv(call, (rank + 1) % n, elementAt(buffer, out.offset, es), out.count * es, (rank + n - 1) % n,
             elementAt(buffer, in.offset, es), in.count * es);
  }
}

}  // namespace ringtree::algorithms
