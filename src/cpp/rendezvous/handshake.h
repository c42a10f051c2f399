#pragma once

#include <cstdint>

#include "common/socket.h"
#include "rendezvous/peer_record.h"

// The handshake that opens every connection between two ranks (see PeerConnector): the
// dialing rank sends a Hello, the accepting rank answers with its own (same transport,
// ranks swapped), or declines when the pair gets the connection the other way (both
// dialed at once). It proves that both ends belong to this communicator (the nonce) and
// are the ranks they should be, and says which transport the pair takes.
namespace ringtree::rendezvous {

enum class HelloTransport : uint8_t {
  kTcp = 1,
  kShm = 2,
  // Shared memory is required but the connector cannot reach the peer's listener: the
  // acceptor fails too instead of waiting for its timeout.
  kShmUnreachable = 3,
  // Answers only. kDeclined: the acceptor dials the sender itself (the pair keeps the
  // connection the higher rank dialed). kTaken: the acceptor has (or gave up on) its
  // connection to the sender's rank already: a dialer that has none is not the rank the
  // acceptor's rendezvous met (a process of an earlier job that lingers reached again).
  kDeclined = 4,
  kTaken = 5,
  // Answer only: the acceptor gave up on its connection to the sender's rank (its dial
  // failed, or waiting for one timed out): the sender fails too instead of waiting.
  kGaveUp = 6,
};

// Host byte order; the ranks of one communicator run on hosts of one byte order.
struct Hello {
  static constexpr uint32_t kMagic = 0x31485452;  // "RTH1"
  static constexpr uint16_t kVersion = 1;

  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint8_t transport = 0;  // HelloTransport
  uint8_t reserved = 0;
  int32_t senderRank = -1;
  int32_t receiverRank = -1;
  Nonce nonce{};
};
static_assert(sizeof(Hello) == 32, "Hello is part of the wire format");

// A handshake that arrived on a listener before its connections were taken (while the
// node arena's setup used it), handed on with its connection.
struct EarlyHello {
  net::Socket socket;
  Hello hello;
  bool sharedMemory = false;  // arrived on the shared-memory listener
};

// The handshake `sender` sends `receiver`, asking for (or agreeing to) `transport`.
Hello makeHello(int sender, int receiver, HelloTransport transport, const Nonce& nonce);

// Whether h is a valid handshake of the communicator of `size` ranks with `nonce`, from
// `sender` (-1: any other rank) to `receiver`, naming a known transport (kDeclined only
// when `answer`).
bool validHello(const Hello& h, const Nonce& nonce, int receiver, int size, int sender, bool answer = false);

}  // namespace ringtree::rendezvous
