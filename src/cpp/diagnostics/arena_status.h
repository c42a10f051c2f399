#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diagnostics/peer_status.h"
#include "transport/pair.h"

namespace ringtree::arena {
class NodeArena;
}

// "Who did not arrive" through the node arena: the twin of StatusPublisher
// (peer_status.h) for communicators that have an arena. Instead of a thread publishing
// the flight recorder's latest calls to the store, every call announces itself in the
// rank's control block as it starts and finishes (a few plain stores, no system call),
// and peers read those words directly.
namespace ringtree::diagnostics {

// Publishes the call this rank enters (its envelope, the fingerprint the shm_direct
// collectives compare) and when it entered it (steady-clock nanoseconds). A no-op
// without an arena (null), so that every call of every algorithm can make it.
void announceCall(arena::NodeArena* arena, const transport::Envelope& call, int64_t startNs);

// Records that this rank finished its call `sequence` (failed or not) at endNs. A no-op
// without an arena.
void announceFinished(arena::NodeArena* arena, uint64_t sequence, bool failed, int64_t endNs);

// What every other rank was last doing, from the arena: its latest call (named with
// `describe`, the algorithm layer's describer, so that the texts match the store path's),
// when it entered it, and the last call it finished. Every peer comes back known; one
// whose announcement cannot be read (none yet, or being rewritten) has startedSequence 0.
std::vector<PeerProgress> readArenaPeers(const arena::NodeArena& arena,
                                         std::string (*describe)(const transport::Envelope&));

}  // namespace ringtree::diagnostics
