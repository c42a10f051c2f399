#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ringtree/communicator.h>
#include <ringtree/store/store.h>

#include "arena/node_arena.h"
#include "transport/mux/link.h"
#include "transport/pair.h"
#include "transport/shm/device.h"
#include "transport/tcp/device.h"

// Where store and transport meet: each rank publishes how to reach it, reads how to
// reach the others, and gets one link per peer, connected now or when first used.
namespace ringtree::rendezvous {

// When the pairs connect. kEager: all of them before the communicator is returned (a peer
// that cannot be reached fails the rendezvous). kLazy: each when a channel first needs it
// (a send, a receive or a notice to that peer): a job whose algorithms use a few peers
// per rank opens a few connections. kAuto: eager up to kEagerUpTo ranks, lazy above.
enum class ConnectMode { kAuto, kEager, kLazy };
constexpr int kEagerUpTo = 16;

// Up to this many ranks on a host, their shared-memory rings are faulted in when their
// pairs are made (transport::shm::PairOptions::prefault): at most 28 pairs of two 1 MiB
// rings on the host.
constexpr int kPrefaultRingsUpTo = 8;

struct ConnectOptions {
  TransportKind transport = TransportKind::kAuto;
  // Interface whose address the TCP listener binds and publishes. Empty: the address the
  // host name resolves to when that is bindable and not loopback; otherwise all
  // interfaces, publishing the first address of an interface that is up and not
  // loopback (127.0.0.1 when there is none).
  std::string interface;
  // Deadline of the connection phase, and of each connection made later.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  transport::tcp::PairOptions tcp;
  transport::shm::PairOptions shm;
  // Whether this rank lets the communicator have a node arena (see connectMesh).
  bool arena = true;
  ConnectMode connect = ConnectMode::kAuto;
};

// options with the environment applied: RINGTREE_TRANSPORT (auto|tcp|shm) replaces the
// transport, RINGTREE_SOCKET_IFNAME fills an empty interface, RINGTREE_SHM_ARENA=0 clears
// arena, RINGTREE_CONNECT (auto|eager|lazy) sets connect. Throws InvalidArgument for an
// unknown RINGTREE_TRANSPORT or RINGTREE_CONNECT value, a RINGTREE_SHM_ARENA other than 0
// or 1, or a negative timeout.
ConnectOptions connectOptionsFrom(const CommunicatorOptions& options);

// What connectMesh gives each rank.
struct Mesh {
  // One per peer, indexed by rank (null at this rank): connected (eager), or connecting
  // when a channel first needs the peer (lazy).
  std::vector<std::shared_ptr<transport::mux::Link>> links;
  // What makes and accepts the links' connections (two threads): keep it as long as the
  // links may connect. Null at size 1.
  std::shared_ptr<transport::mux::LinkConnector> connector;
  std::shared_ptr<arena::NodeArena> arena;  // see below; null when there is none
  // For every rank, the index of the host it runs on, as the records name hosts (host
  // name and boot id): hosts are numbered in the order of their lowest rank, so every
  // rank computes the same map.
  std::vector<int> hostOf;
};

// Collective over `size` ranks sharing store. size 1 returns at once without touching the
// store.
//
// Protocol (keys under "rt/comm/"): every rank binds a TCP listener to port 0 (and, when
// shared memory is allowed, opens a shm::Listener), publishes one address record under
// "addr/<rank>" and agrees on a random per-communicator nonce ("nonce", first writer
// wins), then reads every record. Records of processes that have exited count as not yet
// published, unless that process said under "gaveup/<rank>" that it gave up this
// rendezvous (every rank whose rendezvous fails after publishing says so, with its
// error): the others then fail at once quoting it. The ranks' options are checked
// against each other (every rank sees every record, so incompatible transports fail on
// every rank at once).
//
// Connections (rendezvous/peer_connector.h): the listeners stay open for the links'
// lifetime. A connection starts with a handshake carrying the nonce and both ranks, over
// the peer's shared-memory listener when both ranks allow shared memory, both records
// name one host (host name and boot id) and the listener is reachable, over TCP
// otherwise; connections that fail it are closed. When both ranks dial each other at
// once, the connection the higher rank dialed is kept. Eager: every rank dials its lower
// ranks, then waits for its higher ones.
//
// Throws StoreError naming the ranks that never published their record, NetworkError
// naming the peer (rank, host, pid, address:port) and the interface when a connection
// cannot be made (eager) or shared memory is required but impossible, InvalidArgument
// when the ranks disagree on the world size or ask for incompatible transports (one tcp,
// the other shm). Lazy connections fail the same way, through their link: every channel
// of it throws that error.
//
// Node arena (when `arena`; size > 1): if every record names one host and offers shared
// memory and none asks for tcp, the ranks then vote through the store ("arena/<rank>": 1
// when options.arena is set). When all vote 1, rank 0 creates a NodeArena and hands its
// memfd to every other rank over a fresh connection to its shm::Listener (a handshake
// with the nonce, then the segment with SCM_RIGHTS); Mesh::arena receives it on every
// rank. Otherwise it stays null on every rank. Failures throw as above (NetworkError
// naming rank 0 for the hand-over).
Mesh connectMesh(const std::shared_ptr<Store>& store, int rank, int size, const ConnectOptions& options, bool arena);

}  // namespace ringtree::rendezvous
