#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/pair.h"

// What the two processes of a shared-memory pair agree on: the layout of each direction's
// segment, the record that precedes every message in a ring, and the handshake message.
// Both ends are the same build of ringtree on one host, so everything is in host byte
// order; everything read from a peer is still validated before use (see ShmPair).
namespace ringtree::transport::shm {

constexpr size_t kCacheLineBytes = 64;

// First word of the control block and of the handshake message ("ringtree" in ASCII).
constexpr uint64_t kMagic = 0x65657274676e6972ULL;
// Bumped on any change to this file's layouts.
constexpr uint32_t kProtocolVersion = 3;

// Ring sizes are multiples of a cache line within these bounds (the smallest holds one
// MessageHeader and one cache line of payload).
constexpr size_t kMinRingBytes = 2 * kCacheLineBytes;
constexpr size_t kMaxRingBytes = size_t{1} << 30;

// Offset of the ring's bytes in a segment: the control block gets a page of its own.
constexpr size_t kRingOffset = 4096;

// The control block at offset 0 of one direction's segment. The segment is created,
// initialised and sealed by the direction's writer (the sending side), passed to the
// reader with SCM_RIGHTS, and mapped read-write by both.
//
// head and tail count bytes since the pair was created and never wrap (2^64 bytes); a
// ring offset is position % ringBytes. The writer owns head, the reader owns tail:
//   writer: fill bytes below the new head, then head.store(release);
//   reader: head.load(acquire), then read bytes below head; after the last read of the
//           bytes below the new tail, tail.store(release);
//   writer: tail.load(acquire) before reusing the bytes below tail.
// Invariant (validated by each side on every load): tail <= head <= tail + ringBytes.
//
// The sleeping flags implement an eventcount (no lost wake-ups):
//   sleeper: flag = 1; seq_cst fence; check the counter it waits on; poll() the socket;
//   waker:   publish the counter; seq_cst fence; if flag.exchange(0) was 1, write one byte
//            to the socket.
// Either the sleeper's check sees the new counter or the waker sees the flag.
struct RingControl {
  // Written once by the creator before the segment is shared; read-only afterwards.
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  uint64_t ringBytes;

  // Written by the writer after every message or chunk; polled by the reader.
  alignas(kCacheLineBytes) std::atomic<uint64_t> head;
  // Written by the reader after every message or chunk.
  alignas(kCacheLineBytes) std::atomic<uint64_t> tail;
  // Written only when a side goes to sleep or wakes the other, so that the waker's check
  // after every publication reads a line that stays in its cache.
  alignas(kCacheLineBytes) std::atomic<uint32_t> readerSleeping;  // reader waits for head (data)
  std::atomic<uint32_t> writerSleeping;  // writer waits for tail (space or completion)
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory counters must be lock-free (address-free)");
static_assert(sizeof(RingControl) <= kRingOffset, "the control block fits in its page");

enum class MessageKind : uint32_t {
  // The payload follows the header in the ring (streamed through it when larger than the
  // free space).
  kInline = 1,
  // The payload stays in the sender's memory; the header is followed by a
  // DirectDescriptor saying where. The reader copies the payload with process_vm_readv
  // and moves tail past the descriptor only once it has finished reading, which is what
  // completes the sender's send.
  kDirect = 2,
};

// Precedes every message in a ring, at a cache-line-aligned position (so it never wraps,
// ring sizes being multiples of a cache line). An inline payload starts right after it;
// the next header starts at the next cache-line boundary after the payload.
struct MessageHeader {
  Envelope envelope;
  uint64_t bytes;     // payload bytes
  uint32_t kind;      // MessageKind
  uint32_t marker;    // kHeaderMarker: catches a reader that lost its place
};
static_assert(sizeof(MessageHeader) == kCacheLineBytes, "MessageHeader is one cache line");

// The cache line after a kDirect message's header, in the sender's ring: where the
// payload is, and who has it. `state` is the one word of a ring that its reader writes:
// the reader moves it from kDirectPosted to kDirectTaken (compare-exchange) before it
// reads `address` and pulls. A sender that must free the caller's buffer early
// (Pair::detachSends) first points `address` at a copy, then moves `state` from
// kDirectPosted to kDirectMoved: the first exchange wins, and a sender that loses waits
// for the pull to end (the reader's tail passing the message).
struct DirectDescriptor {
  std::atomic<uint64_t> address;  // of the payload in the sender's address space
  std::atomic<uint32_t> state;
  uint32_t reserved;
  uint64_t reserved2[6];
};
static_assert(sizeof(DirectDescriptor) == kCacheLineBytes, "DirectDescriptor is one cache line");
constexpr uint32_t kDirectPosted = 1;
constexpr uint32_t kDirectTaken = 2;
constexpr uint32_t kDirectMoved = 3;

constexpr uint32_t kHeaderMarker = 0x6d736721;

// Sent by each side right after connecting, with its segment's memfd attached
// (SCM_RIGHTS) and, the socket having SO_PASSCRED, the kernel-attested pid and uid of the
// sending process (SCM_CREDENTIALS). Then each side tries process_vm_readv of the peer's
// probe word and answers with one byte: 1 when it read probeValue (it will pull the
// peer's large messages directly), 0 otherwise.
struct Hello {
  uint64_t magic;
  uint32_t version;
  int32_t rank;           // the sender's rank
  int32_t peerRank;       // the rank the sender expects at the other end
  uint32_t reserved;
  uint64_t ringBytes;     // ring bytes of the attached segment (after the control page)
  uint64_t probeAddress;  // an 8-byte word in the sender's memory holding probeValue
  uint64_t probeValue;
};
static_assert(sizeof(Hello) == 48, "Hello is part of the wire format");

inline uint64_t alignToCacheLine(uint64_t position) {
  return (position + kCacheLineBytes - 1) & ~uint64_t{kCacheLineBytes - 1};
}

}  // namespace ringtree::transport::shm
