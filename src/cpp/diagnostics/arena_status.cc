#include "diagnostics/arena_status.h"

#include "arena/node_arena.h"
#include "diagnostics/flight_recorder.h"

namespace ringtree::diagnostics {

void announceCall(arena::NodeArena* arena, const transport::Envelope& call, int64_t startNs) {
  if (arena != nullptr) arena->publishCall(call, startNs);
}

void announceFinished(arena::NodeArena* arena, uint64_t sequence, bool failed, int64_t endNs) {
  if (arena != nullptr) arena->noteFinished(sequence, failed, endNs);
}

std::vector<PeerProgress> readArenaPeers(const arena::NodeArena& arena,
                                         std::string (*describe)(const transport::Envelope&)) {
  const int64_t now = steadyNowNs();
  std::vector<PeerProgress> peers;
  for (int peer = 0; peer < arena.size(); ++peer) {
    if (peer == arena.rank()) continue;
    PeerProgress p;
    p.rank = peer;
    p.known = true;
    transport::Envelope latest;
    if (arena.peerCall(peer, &latest)) {
      const arena::NodeArena::PeerStatus status = arena.peerStatus(peer);
      p.startedSequence = latest.sequence;
      p.started = describe(latest);
      p.startedSecondsAgo = static_cast<double>(now - status.startNs) / 1e9;
      p.finishedSequence = status.finishedSequence;
      p.finishedFailed = status.finishedFailed;
      p.finishedSecondsAgo = status.finishedSequence > 0 ? static_cast<double>(now - status.finishedNs) / 1e9 : -1;
    }
    peers.push_back(p);
  }
  return peers;
}

}  // namespace ringtree::diagnostics
