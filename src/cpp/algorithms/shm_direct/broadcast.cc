#include "algorithms/shm_direct.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "algorithms/shm_direct/arena_call.h"
#include "common/copy.h"

namespace ringtree::algorithms {

using arena::NodeArena;
using shm_direct::ArenaCall;

void shmDirectBroadcast(Call& call, void* buffer, size_t bytes, int root, size_t maxSegmentBytes) {
  ArenaCall ac(call);
  NodeArena& arena = ac.arena();
  const size_t capacity = shm_direct::stepCapacity(arena, maxSegmentBytes);
  auto* data = static_cast<uint8_t*>(buffer);
  const uint32_t first = ac.nextStep();
  size_t offset = 0;
  do {  // once even for 0 bytes: every rank still takes part
    const size_t length = std::min(capacity, bytes - offset);
    const uint32_t step = ac.nextStep();
    const size_t piece = arena.reserve(length);
    if (ac.rank() == root) {
      ac.prepareWrite(piece, length, step);
      if (length > 0) copyBytes(arena.data(root, piece), data + offset, length);
      arena.publish();
    } else {
      ac.waitFor(root, step);
      arena.publish();  // done with the root's earlier pieces: it may rewrite them
      if (length > 0) copyBytes(data + offset, arena.data(root, piece), length);
    }
    offset += length;
  } while (offset < bytes);
  // Every rank entered this call (and its fingerprint matches), so that a rank that
  // sees a peer past this call may rely on that peer having checked it.
  ac.waitAll(first);
}

}  // namespace ringtree::algorithms
