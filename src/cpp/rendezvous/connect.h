#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ringtree/communicator.h>
#include <ringtree/store/store.h>

#include "arena/node_arena.h"
#include "transport/pair.h"
#include "transport/shm/device.h"
#include "transport/tcp/device.h"

// Where store and transport meet: each rank publishes how to reach it, reads how to
// reach the others, and connects a full mesh of pairs.
namespace ringtree::rendezvous {

struct ConnectOptions {
  TransportKind transport = TransportKind::kAuto;
  // Interface whose address the TCP listener binds and publishes. Empty: the address the
  // host name resolves to when that is bindable and not loopback; otherwise all
  // interfaces, publishing the first address of an interface that is up and not
  // loopback (127.0.0.1 when there is none).
  std::string interface;
  // Deadline of the whole connection phase.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  transport::tcp::PairOptions tcp;
  transport::shm::PairOptions shm;
  // Whether this rank lets the communicator have a node arena (see connectFullMesh).
  bool arena = true;
};

// options with the environment applied: RINGTREE_TRANSPORT (auto|tcp|shm) replaces the
// transport, RINGTREE_SOCKET_IFNAME fills an empty interface, RINGTREE_SHM_ARENA=0 clears
// arena. Throws InvalidArgument for an unknown RINGTREE_TRANSPORT value, a
// RINGTREE_SHM_ARENA other than 0 or 1, or a negative timeout.
ConnectOptions connectOptionsFrom(const CommunicatorOptions& options);

// Collective over `size` ranks sharing store: returns one connected pair per peer, indexed
// by peer rank (null at `rank`). size 1 returns at once without touching the store.
//
// Protocol (keys under "rt/comm/"): every rank binds a TCP listener to port 0 (and, when
// shared memory is allowed, opens a shm::Listener), publishes one address record under
// "addr/<rank>" and agrees on a random per-communicator nonce ("nonce", first writer
// wins). For each pair of ranks lo < hi, hi connects to lo: ranks connect to every lower
// rank first, in ascending order, then accept from every higher rank; the listen backlog
// holds early connections, and a connector only waits on lower ranks, so this cannot
// deadlock. Every connection starts with a handshake carrying the nonce and both ranks;
// connections that fail it are closed and accepting goes on.
//
// The connector chooses the transport: shared memory when both ranks allow it, both
// records name one host (host name and boot id) and the connector reaches the peer's
// shm::Listener; TCP otherwise. It says so in its handshake, which always travels over
// TCP (so that the acceptor waits on one socket only); a shared-memory connection then
// carries the same handshake, which lets the acceptor pair it with the TCP one.
//
// Blocks until every pair is connected or options.timeout passes. Throws StoreError
// naming the ranks that never published their record, NetworkError naming the peer
// (rank, host, pid, address:port) and the interface when a connection cannot be made or
// shared memory is required but impossible, InvalidArgument when the ranks disagree on
// the world size or ask for incompatible transports (one tcp, the other shm).
//
// Node arena (when `arena` is not null; size > 1): if every record names one host and
// offers shared memory and none asks for tcp, the ranks then vote through the store
// ("arena/<rank>": 1 when options.arena is set and every one of its pairs is shm). When
// all vote 1, rank 0 creates a NodeArena and hands its memfd to every other rank over a
// fresh connection to its shm::Listener (a handshake with the nonce, then the segment
// with SCM_RIGHTS); *arena receives it on every rank. Otherwise *arena stays null on
// every rank. Failures throw as above (NetworkError naming rank 0 for the hand-over).
//
// hostOf (when not null) receives, for every rank, the index of the host it runs on, as
// the records name hosts (host name and boot id): hosts are numbered in the order of
// their lowest rank, so every rank computes the same map.
std::vector<std::unique_ptr<transport::Pair>> connectFullMesh(
    Store& store, int rank, int size, const ConnectOptions& options,
    std::shared_ptr<arena::NodeArena>* arena = nullptr, std::vector<int>* hostOf = nullptr);

}  // namespace ringtree::rendezvous
