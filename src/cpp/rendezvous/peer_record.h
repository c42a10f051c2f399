#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include <ringtree/communicator.h>
#include <ringtree/store/store.h>

#include "common/process_identity.h"

// What every rank publishes in the store at the start of the connection phase: its
// address record under "rt/comm/addr/<rank>", and the random per-communicator nonce
// under "rt/comm/nonce" that every handshake of the phase carries.
namespace ringtree::rendezvous {

constexpr size_t kNonceBytes = 16;
using Nonce = std::array<uint8_t, kNonceBytes>;

// One rank's published record: who it is and how to reach it.
struct PeerRecord {
  // The publishing process: its host (the first half of the "same host" decision; the
  // second is the shared-memory probe, transport/shm/device.h) and what tells later
  // whether it still runs. takenAtMs is not published.
  ProcessIdentity process;
  int size = 0;
  TransportKind transport = TransportKind::kAuto;
  std::string tcpHost;
  uint16_t tcpPort = 0;
  std::string tcpOrigin;  // how the address was chosen, e.g. "interface 'eth0'"
  std::string shmName;    // empty: shared memory not offered
};

// The store key of rank's record.
std::string addressKey(int rank);

// Encoding: "RTA2", then each field as a 4-byte length (host byte order) and its bytes,
// numbers as decimal text, in the order of PeerRecord. Values may hold any byte.
Bytes encodeRecord(const PeerRecord& record);
// Returns false for a malformed record (wrong magic, field count or lengths, a number out
// of range, an unknown transport); *record is then partly overwritten.
bool decodeRecord(const Bytes& in, PeerRecord* record);

// "rank 3 (host 'node1', pid 1234, tcp 10.0.0.2:41234)", or "... shm)" when shm: how the
// connection phase and the pairs name a peer in errors.
std::string describePeer(int rank, const PeerRecord& record, bool shm);

// "host 'vm', pid 1234 ('python train.py', running for 35 s), tcp 10.0.0.2:41234": a
// record of a process that runs on this host, for errors that name a live process
// (an earlier job's that lingers).
std::string describeLiveRecord(const PeerRecord& record);

// Agrees on the communicator's nonce: offers a random one under "rt/comm/nonce" (the
// first writer wins) and returns the one stored there. Throws NetworkError when the
// kernel gives no random bytes, StoreError when the stored value is no nonce (a key of
// another program), or what the store throws.
Nonce agreeOnNonce(Store& store);

}  // namespace ringtree::rendezvous
