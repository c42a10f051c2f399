#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/socket.h"
#include "transport/pair.h"
#include "transport/shm/segment.h"

namespace ringtree::arena {

// The node-wide shared segment of a communicator whose ranks are all on this host: one
// memfd segment (see transport/shm/segment.h: never named in /dev/shm, gone with the
// last process that maps it, kill -9 included), created by rank 0, handed to every other
// rank with SCM_RIGHTS at rendezvous (rendezvous/arena_setup.h) and mapped, pre-faulted,
// by all. It is no Pair: no messages, only slots and counters. The shared-memory direct
// collectives (algorithms/shm_direct.h) run over it, and the diagnostics read the calls
// the ranks announce in it (diagnostics/arena_status.h).
//
// Layout (offsets in bytes, host byte order; every rank runs the same build):
//   0                      header: magic, version, size, slotBytes, slot offset
//   kControlOffset + 1024 r rank r's control block:
//                            +0   hot line: step counter, published call fingerprint
//                            +128 cold line: which peer's counter rank r sleeps on
//                            +256 status line: when the current call started, the last
//                                 call finished and when (read by diagnostics only)
//                            +384 history: the fingerprints of rank r's last kHistory calls
//   slotOffset + slotBytes r   rank r's data slot
// Each control block is written only by its rank (single writer per line); every rank
// reads all of them. A slot is written only by its rank and read by all.
//
// Protocol (the invariants the algorithms keep):
//  - Step counter: a rank publishes steps 1, 2, 3, ... (publish(), uint32_t, wrapping;
//    compare with reached()). Publishing step s means: this rank's data for step s, if
//    any, is in its slot; and it has finished reading every peer's data of steps < s.
//    So a rank may rewrite bytes of its slot that held its data of step s once every
//    peer has published s + 1 (claim() says which step that is).
//  - Placement: every step's data goes where reserve() says, at the same offset in
//    every writer's slot. reserve() is local bookkeeping that every rank performs alike
//    (the algorithms derive the reservations from the call's arguments), so all ranks
//    agree on where each step's data is without exchanging offsets. Pieces start on
//    page boundaries. Pieces of more than a page follow each other around the slot
//    (past its small-piece pages): a writer rewrites lines only after a whole slot of
//    other data, when the readers' caches have dropped them (rewriting lines a reader
//    still holds costs 4-5x the write bandwidth on the project machine). A piece is at
//    most a third of the pages it goes round (maxStepBytes()), so a piece that wraps to
//    their start never overlaps the previous one (whose readers may still be at work; a
//    writer waiting for them there could wait for a step they publish only after
//    reading this one). Pieces of at most kSmallPieceBytes take turns over the slot's
//    first kSmallPieces pages instead (in a slot of at least four times their size): a
//    run of small calls keeps touching the same few pages, whose
//    lines and TLB entries stay warm, instead of a new page each call (the first pass
//    over a 4 MiB slot of new pages made each of the first ~2000 8 B calls ~0.5 us
//    slower). Larger pieces gain nothing from it: at 4 KiB, rewriting lines the readers
//    still hold made allreduce and allgather 15-20% slower.
//  - Ordering: data is written with plain stores before publish() (a seq_cst store,
//    release); readers load the counter with acquire (peerStep()) before reading data.
//  - Call fingerprint: at the start of every collective call, the rank publishes the
//    call's Envelope (publishCall(), a seqlock of four words) in its hot line and in its
//    history (slot sequence % kHistory, a seqlock each); peers read the latest
//    (peerCall()) to check they are in the same call before using data, and the history
//    (peerCallAt()) to check the call a peer that moved on made at their own sequence
//    number.
//  - Sleeping (no lost wake-ups): the sleeper stores which rank's counter it waits on
//    in its cold line (seq_cst), re-reads that counter and FUTEX_WAITs on it (shared, not
//    private: the word is in a MAP_SHARED mapping of several processes) while it is
//    unchanged; a publisher stores its counter (seq_cst), then reads the peers' cold
//    lines and FUTEX_WAKEs its counter when one of them sleeps on it. Either the sleeper
//    sees the new counter or the publisher sees the flag.
//
// Threading: one NodeArena object per rank and communicator, used by the thread that
// runs that communicator's collectives (like a Pair); its local bookkeeping is not
// thread-safe. Peers' words are only read, through atomics.
class NodeArena {
 public:
  // 4 MiB per rank: steps of up to 1.31 MiB. Slots of 2 to 8 MiB measured alike for 1 to
  // 64 MiB allreduce and broadcast on the project machine (n=2: 7.6-8.1 GB/s busbw at
  // 64 MiB); more only costs memory (size x slotBytes, all pre-faulted).
  static constexpr size_t kDefaultSlotBytes = size_t{4} << 20;
  // Pieces of data start on this boundary; the unit of claim()'s bookkeeping.
  static constexpr size_t kPieceAlignment = 4096;
  // Pieces of at most kSmallPieceBytes take turns over kSmallPieces pages (see Placement).
  static constexpr size_t kSmallPieceBytes = 1024;
  static constexpr size_t kSmallPieces = 16;
  // Smallest slot: steps of one page.
  static constexpr size_t kMinSlotBytes = 3 * kPieceAlignment;

  // Creates the segment for `size` ranks as rank 0: slotBytes is rounded up to a whole
  // number of pages and to at least kMinSlotBytes and 256 bytes per rank (so that a
  // step holds 16 bytes per rank). With Prefault::kYes (a communicator's first arena:
  // its data path never takes a page fault) allocates and faults in the whole segment;
  // with kNo (a group's: made fast, memory taken as the collectives first touch it) only
  // the header. Throws NetworkError (with the errno text) when the kernel refuses,
  // InvalidArgument for size < 1.
  static std::shared_ptr<NodeArena> create(int size, size_t slotBytes = kDefaultSlotBytes,
                                           transport::shm::Prefault prefault = transport::shm::Prefault::kYes);

  // Maps a segment received from rank 0 (takes ownership of the descriptor) as `rank`,
  // faulting its pages in or not as `prefault` says. slotBytes is the value of rank 0's
  // slotBytes(). Throws NetworkError when the descriptor is not a sealed memfd of the
  // expected size or its header does not describe `size` ranks of slotBytes.
  static std::shared_ptr<NodeArena> attach(net::Socket descriptor, int rank, int size, size_t slotBytes,
                                           transport::shm::Prefault prefault = transport::shm::Prefault::kYes);

  ~NodeArena();
  NodeArena(const NodeArena&) = delete;
  NodeArena& operator=(const NodeArena&) = delete;

  // The memfd to hand to the other ranks (rank 0); invalid after closeDescriptor().
  int descriptor() const { return segment_.descriptor(); }
  // Closes the descriptor; the mapping stays.
  void closeDescriptor() { segment_.closeDescriptor(); }

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slotBytes() const { return slotBytes_; }
  // The most one step may place: a third of the pages larger pieces go round (the slot
  // past its small-piece pages), in whole pages (see Placement).
  size_t maxStepBytes() const { return (slotBytes_ - smallRegion_) / 3 / kPieceAlignment * kPieceAlignment; }

  // `rank`'s data at `offset` (from reserve()) in its slot; page-aligned.
  uint8_t* data(int rank, size_t offset) const { return slots_ + static_cast<size_t>(rank) * slotBytes_ + offset; }

  // Whether counter value `value` is at or past `target` (modulo 2^32).
  static bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

  // The last step this rank published (0 before the first).
  uint32_t lastStep() const { return step_; }
  // Publishes step lastStep() + 1 (seq_cst store: every write before it is visible to a
  // peer that reads the new value), wakes the peers sleeping on it and returns it.
  uint32_t publish();
  // `rank`'s counter (acquire). May be called for this rank too.
  uint32_t peerStep(int rank) const;

  // How many of its latest calls' fingerprints each rank keeps in its history.
  static constexpr int kHistory = 16;

  // Publishes the fingerprint of the call this rank enters (envelope.sequence != 0) and
  // when it entered it (steady-clock nanoseconds: CLOCK_MONOTONIC, one time base for
  // every process of the host; 0: unknown).
  void publishCall(const transport::Envelope& envelope, int64_t startNs = 0);
  // Reads `rank`'s published fingerprint into *envelope. Returns false when the rank is
  // rewriting it right now (try again) or has not published one yet (sequence 0).
  bool peerCall(int rank, transport::Envelope* envelope) const;

  // What `rank`'s history says of its call with `sequence`.
  enum class History {
    kFound,      // *envelope holds it
    kRewriting,  // its slot is being rewritten, or was never written: ask again when the
                 // rank's latest call (peerCall) is at or past `sequence`
    kAbsent,     // its slot holds another call: an older one (the rank has not made this
                 // call yet) or a later one (it made kHistory more calls since)
  };
  History peerCallAt(int rank, uint64_t sequence, transport::Envelope* envelope) const;

  // Records that this rank finished its call `sequence` (failed or not) at `endNs`
  // (steady clock), for the peers' diagnostics.
  void noteFinished(uint64_t sequence, bool failed, int64_t endNs);
  // What `rank` last recorded with publishCall() and noteFinished() (relaxed reads: for
  // diagnostics, where the rank is usually stuck).
  struct PeerStatus {
    int64_t startNs = 0;  // when its latest call started (steady clock)
    uint64_t finishedSequence = 0;
    bool finishedFailed = false;
    int64_t finishedNs = 0;
  };
  PeerStatus peerStatus(int rank) const;

  // Whether `rank`'s communicator has let go of the arena (destroyed or aborted: its
  // NodeArena is gone), for waits on a peer that no connection would report (lazy
  // connections). Set by the destructor.
  bool peerDeparted(int rank) const;

  // Sleeps in FUTEX_WAIT on `rank`'s counter while it still holds `seen`, at most
  // `timeout` (spurious and early returns happen: the caller re-checks).
  void sleepWhile(int rank, uint32_t seen, std::chrono::nanoseconds timeout);

  // Local bookkeeping for the algorithms (see the protocol above).
  // The offset, in every writer's slot, of the next piece of `bytes` (at most
  // maxStepBytes()): for a small piece the next of the small-piece pages; otherwise the
  // page boundary after the previous piece, or the first page past the small-piece pages
  // when the piece would not fit before the end of the slot. A piece of 0 bytes takes no
  // room.
  size_t reserve(size_t bytes);
  // Records that this rank writes its data of `step` at [offset, offset + bytes) of its
  // slot (a reserve()d piece, or part of one: a step may claim its piece in parts).
  // Returns false when nothing of an earlier step was written there; otherwise true with
  // the latest step whose data this rank wrote in those pages in *previous: every peer
  // must have published *previous + 1 before the write.
  bool claim(size_t offset, size_t bytes, uint32_t step, uint32_t* previous);
  // The highest step that every peer was seen to have published.
  uint32_t allPublished() const { return allPublished_; }
  void noteAllPublished(uint32_t step) {
    if (reached(step, allPublished_)) allPublished_ = step;
  }

 private:
  struct ControlBlock;

  NodeArena(transport::shm::Segment segment, int rank, int size, size_t slotBytes, size_t slotOffset);
  ControlBlock& block(int rank) const;
  // Writes this rank's slot once (a prefaulted arena's): its lines come back from the
  // shared cache instead of memory and its TLB entries are warm when the first calls
  // go round the slot (the first pass over a cold 4 MiB slot made each of the first ~1000
  // 2 KiB allreduces ~0.6 us slower).
  void warmSlot();

  transport::shm::Segment segment_;
  int rank_;
  int size_;
  size_t slotBytes_;
  uint8_t* slots_;
  uint32_t step_ = 0;
  uint32_t allPublished_ = 0;
  // Bytes at the start of the slot for pieces of at most kSmallPieceBytes; 0 when the slot
  // is too small to set them apart (every piece then follows the others around the slot).
  size_t smallRegion_ = 0;
  size_t smallCursor_ = 0;  // where reserve() places the next small piece
  size_t cursor_ = 0;       // where reserve() places the next larger piece
  // Per page of this rank's slot: whether it was written, and the last step that did.
  std::vector<uint8_t> pageWritten_;
  std::vector<uint32_t> pageStep_;
};

}  // namespace ringtree::arena
