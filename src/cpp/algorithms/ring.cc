#include "algorithms/ring.h"

namespace ringtree::algorithms {

void ringReduceScatter(Call& call, const RingMembers& members, void* buffer, size_t count,
                       const transport::Accumulate& accumulate) {
  const int n = members.n;
  const int index = members.index;
  const size_t es = call.elementSize;
  for (int step = 0; step < n - 1; ++step) {
    const Range out = partition(count, n, (index - step + n) % n);
    const Range in = partition(count, n, (index - step - 1 + 2 * n) % n);
    sendRecv(call, members.right(), elementAt(buffer, out.offset, es), out.count * es, members.left(),
             elementAt(buffer, in.offset, es), in.count * es, accumulate);
  }
}

void ringAllgather(Call& call, const RingMembers& members, void* buffer, size_t count) {
  const int n = members.n;
  const int index = members.index;
  const size_t es = call.elementSize;
  for (int step = 0; step < n - 1; ++step) {
    const Range out = partition(count, n, (index + 1 - step + 2 * n) % n);
    const Range in = partition(count, n, (index - step + 2 * n) % n);
    sendRecv(call, members.right(), elementAt(buffer, out.offset, es), out.count * es, members.left(),
             elementAt(buffer, in.offset, es), in.count * es);
  }
}

}  // namespace ringtree::algorithms
