#pragma once

#include <memory>
#include <vector>

#include <ringtree/store/store.h>

#include "arena/node_arena.h"
#include "rendezvous/handshake.h"
#include "rendezvous/peer_record.h"
#include "rendezvous/phase.h"
#include "transport/shm/device.h"

// The node arena's setup, part of the connection phase (see connectMesh):
// whether the communicator gets one, decided by a vote through the store, and the
// hand-over of rank 0's segment to every other rank.
namespace ringtree::rendezvous {

// Whether the records alone allow a node arena: every rank on one host, offering shared
// memory and not asking for tcp. The same answer on every rank.
bool arenaPossible(const std::vector<PeerRecord>& records);

// What the setup needs of the connection phase. `listener` is this rank's shared-memory
// listener (there is one on every rank when arenaPossible() holds); rank 0 takes the
// other ranks' requests on it, and keeps in `early` the connections of ranks that dial it
// for their pairs meanwhile (the connector answers them).
struct ArenaSetup {
  Store& store;
  const Phase& phase;
  const std::vector<PeerRecord>& records;
  const Nonce& nonce;
  transport::shm::Listener& listener;
  std::vector<EarlyHello>* early;
};

// Collective over every rank, once arenaPossible() holds. Each rank publishes its vote
// under "rt/comm/arena/<rank>" (1: it allows an arena and reaches every peer over shared
// memory) and reads every rank's. When all voted 1, rank 0 creates the arena and hands
// its memfd to every other rank over a fresh connection to its listener (an ArenaHello
// with the nonce, answered by an ArenaGrant carrying the memfd with SCM_RIGHTS); returns
// the arena on every rank. Returns null on every rank when any voted 0.
//
// Blocks until the phase's deadline at most. Throws StoreError naming the vote keys when
// not every rank voted in time, NetworkError (naming the ranks that did not ask for it,
// or rank 0) when the arena cannot be created, handed over or mapped.
std::shared_ptr<arena::NodeArena> setUpNodeArena(const ArenaSetup& setup, bool vote);

// For a listener whose connection phase is over (rendezvous/peer_connector.h): whether a
// connection's first four bytes are a node arena request, and the answer to one, which
// tells the asking rank that this rank's rendezvous ended long ago (receiveArena's
// error names the process). Best effort; closes the connection.
bool isArenaRequest(uint32_t magic);
void refuseLateArenaRequest(net::Socket socket);

}  // namespace ringtree::rendezvous
