#include "algorithms/shm_direct.h"

#include "algorithms/shm_direct/arena_call.h"

namespace ringtree::algorithms {

using shm_direct::ArenaCall;

void shmDirectBarrier(Call& call) {
  ArenaCall ac(call);
  ac.waitAll(ac.arena().publish());
}

}  // namespace ringtree::algorithms
