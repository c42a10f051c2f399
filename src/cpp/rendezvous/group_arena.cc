#include "rendezvous/group_arena.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <thread>

#include <ringtree/error.h>
#include <ringtree/types.h>

#include "common/logging.h"
#include "common/text.h"

namespace ringtree::rendezvous {

namespace {

// The exchange's messages, host byte order, with an envelope of their own (no collective
// or point-to-point code uses it): rank 0's offer to each rank, each rank's answer, rank
// 0's decision.
constexpr uint16_t kArenaExchangeOperation = 0x7201;
constexpr uint32_t kOfferMagic = 0x314f5452;  // "RTO1"

struct Offer {
  uint32_t magic = kOfferMagic;
  int32_t size = 0;
  uint64_t slotBytes = 0;
  int32_t pid = 0;
  int32_t descriptor = -1;
  uint64_t inode = 0;
  uint64_t device = 0;
};
static_assert(sizeof(Offer) == 40, "Offer is part of the wire format");

enum Step : uint64_t { kOffer = 1, kAnswer = 2, kDecision = 3 };

transport::Envelope envelopeOf(Step step, size_t bytes) {
  transport::Envelope envelope;
  envelope.operation = kArenaExchangeOperation;
  envelope.sequence = step;
  envelope.count = bytes;
  envelope.dataType = static_cast<uint8_t>(DataType::kUInt8);
  return envelope;
}

// Drives `pairs` until none has an operation pending; throws TimeoutError at deadline
// naming the ranks still waited for. A setup step: spins briefly, then sleeps in short
// steps (members may arrive seconds apart).
void awaitIdle(const std::vector<transport::Pair*>& pairs, int rank, net::Deadline deadline) {
  const auto start = net::Clock::now();
  for (int pass = 0;; ++pass) {
    std::vector<int> busy;
    for (size_t r = 0; r < pairs.size(); ++r) {
      if (pairs[r] != nullptr && !pairs[r]->progress()) busy.push_back(static_cast<int>(r));
    }
    if (busy.empty()) return;
    if (net::Clock::now() >= deadline) {
      throw TimeoutError("rank " + std::to_string(rank) + ": " + text::rankList(busy) +
                         " did not take part in setting up the group's node arena within " +
                         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(net::Clock::now() -
                                                                                              start).count()) +
                         " ms (did every member create the group?)");
    }
    if (pass < 256) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

// The arena rank 0 offers, opened through /proc and checked; null when this process may
// not open it (logged), or it is not the file offered.
std::shared_ptr<arena::NodeArena> openOffered(const Offer& offer, int rank) {
  const std::string path = "/proc/" + std::to_string(offer.pid) + "/fd/" + std::to_string(offer.descriptor);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    RINGTREE_INFO("rank " << rank << ": cannot open the group's node arena at " << path << " ("
                          << net::errnoText(errno) << "); the group runs without one");
    return nullptr;
  }
  net::Socket descriptor(fd);
  struct stat info{};
  if (::fstat(fd, &info) != 0 || static_cast<uint64_t>(info.st_ino) != offer.inode ||
      static_cast<uint64_t>(info.st_dev) != offer.device) {
    RINGTREE_INFO("rank " << rank << ": " << path << " is not the node arena rank 0 offered (another process or "
                          "pid namespace?); the group runs without one");
    return nullptr;
  }
  try {
    std::shared_ptr<arena::NodeArena> arena =
        arena::NodeArena::attach(std::move(descriptor), rank, offer.size, offer.slotBytes,
                                 transport::shm::Prefault::kNo);
    arena->closeDescriptor();  // the mapping stays
    return arena;
  } catch (const Error& e) {
    RINGTREE_INFO("rank " << rank << ": cannot map the group's node arena: " << e.what()
                          << "; the group runs without one");
    return nullptr;
  }
}

}  // namespace

namespace {

std::shared_ptr<arena::NodeArena> exchange(const std::vector<transport::Pair*>& pairs, int rank, int size,
                                           bool allowed, net::Deadline deadline);

}  // namespace

std::shared_ptr<arena::NodeArena> shareNodeArena(const std::vector<transport::Pair*>& pairs, int rank, int size,
                                                 bool allowed, net::Deadline deadline) {
  try {
    return exchange(pairs, rank, size, allowed, deadline);
  } catch (...) {
    // The exchange's buffers live on its stack: the pairs let go of them before it unwinds.
    for (transport::Pair* pair : pairs) {
      if (pair == nullptr) continue;
      pair->detachRecvs();
      pair->detachSends(net::deadlineAfter(std::chrono::seconds(1)));
    }
    throw;
  }
}

namespace {

std::shared_ptr<arena::NodeArena> exchange(const std::vector<transport::Pair*>& pairs, int rank, int size,
                                           bool allowed, net::Deadline deadline) {
  if (rank != 0) {
    Offer offer;
    pairs[0]->postRecv(envelopeOf(kOffer, sizeof(offer)), &offer, sizeof(offer));
    awaitIdle(pairs, rank, deadline);
    std::shared_ptr<arena::NodeArena> arena;
    if (allowed && offer.magic == kOfferMagic && offer.size == size) arena = openOffered(offer, rank);
    const uint8_t answer = arena != nullptr ? 1 : 0;
    uint8_t decision = 0;
    pairs[0]->postSend(envelopeOf(kAnswer, 1), &answer, 1);
    pairs[0]->postRecv(envelopeOf(kDecision, 1), &decision, 1);
    awaitIdle(pairs, rank, deadline);
    return decision == 1 ? arena : nullptr;
  }
  std::shared_ptr<arena::NodeArena> arena;
  try {
    // Not faulted in: a group is made fast, and takes memory as its collectives use it.
    if (allowed) arena = arena::NodeArena::create(size, arena::NodeArena::kDefaultSlotBytes, transport::shm::Prefault::kNo);
  } catch (const Error& e) {
    RINGTREE_INFO("rank 0: cannot create the group's node arena (" << e.what() << "); the group runs without one");
  }
  Offer offer;
  offer.size = size;
  struct stat info{};
  if (arena != nullptr && ::fstat(arena->descriptor(), &info) == 0) {
    offer.slotBytes = arena->slotBytes();
    offer.pid = static_cast<int32_t>(::getpid());
    offer.descriptor = arena->descriptor();
    offer.inode = static_cast<uint64_t>(info.st_ino);
    offer.device = static_cast<uint64_t>(info.st_dev);
  } else {
    offer.magic = 0;  // nothing to offer: every rank answers no
  }
  std::vector<uint8_t> answers(static_cast<size_t>(size), 0);
  for (int r = 1; r < size; ++r) {
    pairs[static_cast<size_t>(r)]->postSend(envelopeOf(kOffer, sizeof(offer)), &offer, sizeof(offer));
    pairs[static_cast<size_t>(r)]->postRecv(envelopeOf(kAnswer, 1), &answers[static_cast<size_t>(r)], 1);
  }
  awaitIdle(pairs, rank, deadline);
  uint8_t decision = arena != nullptr ? 1 : 0;
  for (int r = 1; r < size; ++r) {
    if (answers[static_cast<size_t>(r)] != 1) decision = 0;
  }
  for (int r = 1; r < size; ++r) pairs[static_cast<size_t>(r)]->postSend(envelopeOf(kDecision, 1), &decision, 1);
  awaitIdle(pairs, rank, deadline);
  if (arena != nullptr) arena->closeDescriptor();
  return decision == 1 ? arena : nullptr;
}

}  // namespace

}  // namespace ringtree::rendezvous
