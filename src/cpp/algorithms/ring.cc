#include "algorithms/ring.h"

#include <algorithm>
#include <utility>

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

void chainPass(Call& call, const RingMembers& members, void* data, size_t bytes, size_t segmentBytes,
               const transport::Accumulate& accumulate) {
  const int previous = members.index == 0 ? -1 : members.at(members.index - 1);
  const int next = members.index == members.n - 1 ? -1 : members.at(members.index + 1);
  auto* base = static_cast<char*>(data);
  const size_t segments = bytes == 0 ? 1 : (bytes + segmentBytes - 1) / segmentBytes;
  auto segment = [&](size_t i) {
    const size_t offset = std::min(bytes, i * segmentBytes);
    return std::pair<char*, size_t>(base + offset, std::min(segmentBytes, bytes - offset));
  };
  if (previous >= 0) {
    const auto first = segment(0);
    recv(call, previous, first.first, first.second, accumulate);
  }
  for (size_t i = 0; i < segments; ++i) {
    const auto out = segment(i);
    if (next >= 0 && previous >= 0 && i + 1 < segments) {
      const auto in = segment(i + 1);
      sendRecv(call, next, out.first, out.second, previous, in.first, in.second, accumulate);
    } else if (next >= 0) {
      send(call, next, out.first, out.second);
    } else if (previous >= 0 && i + 1 < segments) {
      const auto in = segment(i + 1);
      recv(call, previous, in.first, in.second, accumulate);
    }
  }
}

}  // namespace ringtree::algorithms
