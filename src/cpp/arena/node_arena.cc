#include "arena/node_arena.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include <ringtree/error.h>

namespace ringtree::arena {

namespace {

using transport::Envelope;
using transport::shm::Prefault;
using transport::shm::Segment;

// How arena segments appear in /proc/<pid>/maps ("/memfd:ringtree-arena (deleted)").
constexpr const char* kSegmentName = "ringtree-arena";
// First word of the header ("rtarena1" in ASCII, little-endian).
constexpr uint64_t kArenaMagic = 0x31616e6572617472ULL;
// Bumped on any change to the layout or the protocol of node_arena.h.
constexpr uint32_t kArenaVersion = 3;
constexpr size_t kPageBytes = 4096;
// Control blocks start on their own line after the header.
constexpr size_t kControlOffset = 256;
constexpr size_t kControlBlockBytes = 1024;

// Written once by rank 0 before the segment is shared; read-only afterwards.
struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t size;
  uint64_t slotBytes;
  uint64_t slotOffset;
};
static_assert(sizeof(Header) <= kControlOffset, "the header fits before the control blocks");

size_t roundUp(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

size_t slotOffsetFor(int size) {
  return roundUp(kControlOffset + static_cast<size_t>(size) * kControlBlockBytes, kPageBytes);
}

// A fingerprint in four words, a seqlock: [0] sequence, 0 while being rewritten; [1]
// count; [2] operation | root << 32; [3] dataType | reduceOp << 8 | countsHash << 32. The
// other envelope fields (point-to-point's and the notices') are never a call's.
void storeFingerprint(std::atomic<uint64_t>* words, const Envelope& envelope) {
  words[0].store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  words[1].store(envelope.count, std::memory_order_relaxed);
  words[2].store(uint64_t{envelope.operation} | uint64_t{static_cast<uint32_t>(envelope.root)} << 32,
                 std::memory_order_relaxed);
  words[3].store(uint64_t{envelope.dataType} | uint64_t{envelope.reduceOp} << 8 | uint64_t{envelope.countsHash} << 32,
                 std::memory_order_relaxed);
  words[0].store(envelope.sequence, std::memory_order_release);
}

// Reads a fingerprint stored by storeFingerprint. Returns false while it is being
// rewritten or before one was stored (sequence 0).
bool loadFingerprint(const std::atomic<uint64_t>* words, Envelope* envelope) {
  const uint64_t sequence = words[0].load(std::memory_order_acquire);
  const uint64_t count = words[1].load(std::memory_order_relaxed);
  const uint64_t operationRoot = words[2].load(std::memory_order_relaxed);
  const uint64_t typeOp = words[3].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (sequence == 0 || words[0].load(std::memory_order_relaxed) != sequence) return false;
  *envelope = Envelope{};
  envelope->sequence = sequence;
  envelope->count = count;
  envelope->operation = static_cast<uint16_t>(operationRoot);
  envelope->root = static_cast<int32_t>(static_cast<uint32_t>(operationRoot >> 32));
  envelope->dataType = static_cast<uint8_t>(typeOp);
  envelope->reduceOp = static_cast<uint8_t>(typeOp >> 8);
  envelope->countsHash = static_cast<uint32_t>(typeOp >> 32);
  return true;
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex word is a plain uint32_t");
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

// One rank's control block. The hot line changes with every step and call; the cold line
// only when the rank goes to sleep or wakes, so that a publisher's check of the peers'
// cold lines after every step hits its own cache. 128 bytes apart: the adjacent-line
// prefetcher does not pair them.
struct NodeArena::ControlBlock {
  // Hot line.
  std::atomic<uint32_t> step;  // the futex word; last published step
  // Fingerprint of the call the rank is in (see storeFingerprint).
  std::atomic<uint64_t> call[4];
  // Cold line: 1 + the rank whose counter this rank sleeps on; 0 when awake.
  alignas(128) std::atomic<uint32_t> sleepingOn;
  // Status line, written once at the start and once at the end of each call; read by the
  // peers only to explain a timeout. Steady-clock nanoseconds.
  alignas(128) std::atomic<int64_t> startNs;
  std::atomic<uint64_t> finished;  // sequence << 1 | failed, of the last call finished
  std::atomic<int64_t> finishedNs;
  std::atomic<uint32_t> departed;  // 1 once the rank's NodeArena is destroyed
  // Fingerprints of the last kHistory calls, at sequence % kHistory (see storeFingerprint).
  alignas(128) std::atomic<uint64_t> history[kHistory][4];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory words must be lock-free (address-free)");

NodeArena::NodeArena(Segment segment, int rank, int size, size_t slotBytes, size_t slotOffset)
    : segment_(std::move(segment)),
      rank_(rank),
      size_(size),
      slotBytes_(slotBytes),
      slots_(segment_.data() + slotOffset),
      pageWritten_(slotBytes / kPieceAlignment),
      pageStep_(slotBytes / kPieceAlignment) {
  const size_t small = kSmallPieces * kPieceAlignment;
  if (slotBytes_ >= 4 * small) smallRegion_ = small;
  cursor_ = smallRegion_;
}

NodeArena::~NodeArena() { block(rank_).departed.store(1, std::memory_order_release); }

NodeArena::ControlBlock& NodeArena::block(int rank) const {
  static_assert(sizeof(ControlBlock) <= kControlBlockBytes, "control block layout");
  return *reinterpret_cast<ControlBlock*>(segment_.data() + kControlOffset +
                                          static_cast<size_t>(rank) * kControlBlockBytes);
}

std::shared_ptr<NodeArena> NodeArena::create(int size, size_t slotBytes, Prefault prefault) {
  if (size < 1) throw InvalidArgument("NodeArena::create: size must be >= 1, got " + std::to_string(size));
  slotBytes = std::max({slotBytes, kMinSlotBytes, size_t{256} * static_cast<size_t>(size)});
  slotBytes = roundUp(slotBytes, kPageBytes);
  const size_t slotOffset = slotOffsetFor(size);
  if (slotBytes > (SIZE_MAX - slotOffset) / static_cast<size_t>(size)) {
    throw InvalidArgument("NodeArena::create: " + std::to_string(size) + " slots of " + std::to_string(slotBytes) +
                          " bytes do not fit in memory");
  }
  Segment segment = Segment::create(kSegmentName, slotOffset + static_cast<size_t>(size) * slotBytes, prefault);
  new (segment.data()) Header{kArenaMagic, kArenaVersion, static_cast<uint32_t>(size), slotBytes, slotOffset};
  for (int r = 0; r < size; ++r) {
    new (segment.data() + kControlOffset + static_cast<size_t>(r) * kControlBlockBytes) ControlBlock();
  }
  auto arena = std::shared_ptr<NodeArena>(new NodeArena(std::move(segment), 0, size, slotBytes, slotOffset));
  if (prefault == Prefault::kYes) arena->warmSlot();
  return arena;
}

std::shared_ptr<NodeArena> NodeArena::attach(net::Socket descriptor, int rank, int size, size_t slotBytes,
                                             Prefault prefault) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgument("NodeArena::attach: rank " + std::to_string(rank) + " is not in [0, " +
                          std::to_string(size) + ")");
  }
  const size_t slotOffset = slotOffsetFor(size);
  if (slotBytes < kMinSlotBytes || slotBytes % kPageBytes != 0 ||
      slotBytes > (SIZE_MAX - slotOffset) / static_cast<size_t>(size)) {
    throw NetworkError("the node arena's slot size " + std::to_string(slotBytes) + " is invalid");
  }
  Segment segment = Segment::map(std::move(descriptor), slotOffset + static_cast<size_t>(size) * slotBytes, prefault);
  const auto* header = reinterpret_cast<const Header*>(segment.data());
  if (header->magic != kArenaMagic || header->version != kArenaVersion ||
      header->size != static_cast<uint32_t>(size) || header->slotBytes != slotBytes ||
      header->slotOffset != slotOffset) {
    throw NetworkError("the node arena segment does not hold an arena (version " + std::to_string(kArenaVersion) +
                       ") of " + std::to_string(size) + " slots of " + std::to_string(slotBytes) + " bytes");
  }
  auto arena = std::shared_ptr<NodeArena>(new NodeArena(std::move(segment), rank, size, slotBytes, slotOffset));
  if (prefault == Prefault::kYes) arena->warmSlot();
  return arena;
}

void NodeArena::warmSlot() {
  // Nobody reads the slot before this rank publishes a step; it holds zeros until then.
  std::memset(data(rank_, 0), 0, slotBytes_);
}

size_t NodeArena::reserve(size_t bytes) {
  const size_t length = roundUp(bytes, kPieceAlignment);
  if (bytes > 0 && bytes <= kSmallPieceBytes && smallRegion_ > 0) {
    const size_t offset = smallCursor_;
    smallCursor_ = offset + kPieceAlignment == smallRegion_ ? 0 : offset + kPieceAlignment;
    return offset;
  }
  if (cursor_ + length > slotBytes_) cursor_ = smallRegion_;
  const size_t offset = cursor_;
  cursor_ += length;
  return offset;
}

bool NodeArena::claim(size_t offset, size_t bytes, uint32_t step, uint32_t* previous) {
  bool found = false;
  for (size_t page = offset / kPieceAlignment; page * kPieceAlignment < offset + bytes; ++page) {
    // A page claimed for this step already (another piece of it) needs no wait.
    const bool earlier = pageWritten_[page] != 0 && pageStep_[page] != step;
    if (earlier && (!found || reached(pageStep_[page], *previous))) {
      *previous = pageStep_[page];
      found = true;
    }
    pageWritten_[page] = 1;
    pageStep_[page] = step;
  }
  return found;
}

uint32_t NodeArena::publish() {
  const uint32_t step = step_ + 1;
  ControlBlock& mine = block(rank_);
  mine.step.store(step, std::memory_order_seq_cst);
  step_ = step;
  const uint32_t me = static_cast<uint32_t>(rank_) + 1;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && block(r).sleepingOn.load(std::memory_order_seq_cst) == me) {
      futex(&mine.step, FUTEX_WAKE, INT_MAX, nullptr);
      break;
    }
  }
  return step;
}

uint32_t NodeArena::peerStep(int rank) const { return block(rank).step.load(std::memory_order_acquire); }

bool NodeArena::peerDeparted(int rank) const { return block(rank).departed.load(std::memory_order_acquire) != 0; }

void NodeArena::publishCall(const Envelope& envelope, int64_t startNs) {
  ControlBlock& mine = block(rank_);
  // History first: a peer that sees the new latest fingerprint finds it there too.
  storeFingerprint(mine.history[envelope.sequence % kHistory], envelope);
  storeFingerprint(mine.call, envelope);
  mine.startNs.store(startNs, std::memory_order_relaxed);
}

bool NodeArena::peerCall(int rank, Envelope* envelope) const { return loadFingerprint(block(rank).call, envelope); }

NodeArena::History NodeArena::peerCallAt(int rank, uint64_t sequence, Envelope* envelope) const {
  if (!loadFingerprint(block(rank).history[sequence % kHistory], envelope)) return History::kRewriting;
  return envelope->sequence == sequence ? History::kFound : History::kAbsent;
}

void NodeArena::noteFinished(uint64_t sequence, bool failed, int64_t endNs) {
  ControlBlock& mine = block(rank_);
  mine.finishedNs.store(endNs, std::memory_order_relaxed);
  mine.finished.store(sequence << 1 | (failed ? 1 : 0), std::memory_order_relaxed);
}

NodeArena::PeerStatus NodeArena::peerStatus(int rank) const {
  const ControlBlock& theirs = block(rank);
  PeerStatus status;
  status.startNs = theirs.startNs.load(std::memory_order_relaxed);
  const uint64_t finished = theirs.finished.load(std::memory_order_relaxed);
  status.finishedSequence = finished >> 1;
  status.finishedFailed = (finished & 1) != 0;
  status.finishedNs = theirs.finishedNs.load(std::memory_order_relaxed);
  return status;
}

void NodeArena::sleepWhile(int rank, uint32_t seen, std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  ControlBlock& mine = block(rank_);
  std::atomic<uint32_t>& word = block(rank).step;
  mine.sleepingOn.store(static_cast<uint32_t>(rank) + 1, std::memory_order_seq_cst);
  if (word.load(std::memory_order_seq_cst) == seen) {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout);
    const timespec relative{static_cast<time_t>(seconds.count()), static_cast<long>((timeout - seconds).count())};
    // EAGAIN (the value changed), EINTR and ETIMEDOUT all return to the caller's checks.
    futex(&word, FUTEX_WAIT, seen, &relative);
  }
  mine.sleepingOn.store(0, std::memory_order_relaxed);
}

}  // namespace ringtree::arena
