// The node arena (arena/node_arena.h) on its own, and the shm_direct collectives
// between forked processes: exact results at 2 and 4 ranks, a peer killed with SIGKILL
// in the middle of a collective, and nothing left in /dev/shm.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/error.h>
#include <ringtree/store/file_store.h>

#include "arena/node_arena.h"
#include "communicator_impl.h"
#include "harness/process_harness.h"
#include "harness/test_util.h"

namespace ringtree {
namespace {

using namespace std::chrono_literals;
using transport::Envelope;
using arena::NodeArena;
using Clock = std::chrono::steady_clock;
using test::ChildResult;
using test::contains;
using test::devShmEntries;
using test::runProcesses;

// Another mapping of `arena`'s segment, as `rank` (what a peer process would have).
std::shared_ptr<NodeArena> attachCopy(const NodeArena& arena, int rank) {
  return NodeArena::attach(net::Socket(::dup(arena.descriptor())), rank, arena.size(), arena.slotBytes());
}

TEST(NodeArena, RanksShareOneSegment) {
  const auto zero = NodeArena::create(3, 96 << 10);
  ASSERT_EQ(zero->slotBytes(), size_t{96} << 10);
  ASSERT_EQ(zero->maxStepBytes(), size_t{32} << 10);
  const auto one = attachCopy(*zero, 1);
  const auto two = attachCopy(*zero, 2);
  // Distinct, aligned slots; what one rank writes the others read.
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(zero->data(r, 0)) % 4096, 0U);
    if (r > 0) {
      EXPECT_EQ(zero->data(r, 0) - zero->data(r - 1, 0), static_cast<ptrdiff_t>(zero->slotBytes()));
    }
  }
  std::memset(one->data(1, 0), 0x5a, one->slotBytes());
  EXPECT_EQ(two->data(1, 0)[0], 0x5a);
  EXPECT_EQ(zero->data(1, zero->slotBytes() - 1)[0], 0x5a);
  EXPECT_EQ(zero->data(2, 0)[0], 0);
  // Counters.
  EXPECT_EQ(zero->peerStep(1), 0U);
  EXPECT_EQ(one->publish(), 1U);
  EXPECT_EQ(one->publish(), 2U);
  EXPECT_EQ(one->lastStep(), 2U);
  EXPECT_EQ(zero->peerStep(1), 2U);
  EXPECT_EQ(two->peerStep(1), 2U);
  EXPECT_EQ(two->peerStep(2), 0U);
  // Fingerprints.
  Envelope call;
  EXPECT_FALSE(zero->peerCall(2, &call));  // none yet
  Envelope published;
  published.sequence = 7;
  published.operation = 0x0105;
  published.dataType = 3;
  published.reduceOp = 2;
  published.count = 123456789012ULL;
  published.root = -1;
  two->publishCall(published);
  ASSERT_TRUE(zero->peerCall(2, &call));
  EXPECT_TRUE(call == published);
  published.sequence = 8;
  published.root = 2;
  two->publishCall(published);
  ASSERT_TRUE(one->peerCall(2, &call));
  EXPECT_EQ(call.sequence, 8U);
  EXPECT_EQ(call.root, 2);
}

TEST(NodeArena, PiecesRotateThroughTheSlot) {
  const auto arena = NodeArena::create(2, 24 << 10);  // 6 pages, steps of 2
  ASSERT_EQ(arena->maxStepBytes(), size_t{8} << 10);
  EXPECT_EQ(arena->reserve(0), 0U);  // takes no room
  EXPECT_EQ(arena->reserve(1), 0U);
  EXPECT_EQ(arena->reserve(100), 4096U);  // whole pages
  EXPECT_EQ(arena->reserve(8192), 8192U);
  EXPECT_EQ(arena->reserve(4097), 16384U);
  EXPECT_EQ(arena->reserve(4096), 0U);  // would pass the end: back to the start
  EXPECT_EQ(arena->reserve(8192), 4096U);
}

// In a slot of at least four times their room, pieces of at most kSmallPieceBytes take
// turns over the slot's first kSmallPieces pages, and larger ones go round the rest, at
// most a third of it each: a piece that wraps never lands on the one before it.
TEST(NodeArena, SmallPiecesTakeTurnsOverTheFirstPages) {
  constexpr size_t kPage = NodeArena::kPieceAlignment;
  const auto arena = NodeArena::create(2, 100 * kPage);
  const size_t small = NodeArena::kSmallPieces * kPage;
  const size_t largest = arena->maxStepBytes();
  ASSERT_EQ(largest, (100 * kPage - small) / 3 / kPage * kPage);  // 28 pages
  for (size_t turn = 0; turn < 2 * NodeArena::kSmallPieces; ++turn) {
    EXPECT_EQ(arena->reserve(turn % 2 == 0 ? 8 : NodeArena::kSmallPieceBytes), turn % NodeArena::kSmallPieces * kPage)
        << turn;
  }
  EXPECT_EQ(arena->reserve(0), small);  // takes no room
  EXPECT_EQ(arena->reserve(NodeArena::kSmallPieceBytes + 1), small);
  EXPECT_EQ(arena->reserve(kPage + 1), small + kPage);
  EXPECT_EQ(arena->reserve(8), 0U);  // small ones go on taking turns
  // Every placement of a largest piece after a piece of any size: the two never overlap.
  for (size_t pages = 1; pages <= largest / kPage; ++pages) {
    const size_t first = arena->reserve(pages * kPage);
    const size_t second = arena->reserve(largest);
    EXPECT_TRUE(second >= first + pages * kPage || second + largest <= first) << pages << " pages, then the largest";
    EXPECT_GE(second, small);
    EXPECT_LE(second + largest, arena->slotBytes());
  }
  // A slot under four times their room places every piece in turn.
  const auto tight = NodeArena::create(2, 60 * kPage);
  EXPECT_EQ(tight->maxStepBytes(), 20 * kPage);
  EXPECT_EQ(tight->reserve(2 * kPage), 0U);
  EXPECT_EQ(tight->reserve(8), 2 * kPage);
  EXPECT_EQ(tight->reserve(8), 3 * kPage);
}

TEST(NodeArena, ClaimNamesTheLastStepThatWroteThosePages) {
  const auto arena = NodeArena::create(2, 48 << 10);
  uint32_t previous = 0;
  EXPECT_FALSE(arena->claim(0, 0, 1, &previous));
  EXPECT_FALSE(arena->claim(0, 8192, 1, &previous));          // pages 0-1
  EXPECT_FALSE(arena->claim(16384, 100, 2, &previous));       // page 4
  EXPECT_TRUE(arena->claim(4096, 16384, 3, &previous));       // pages 1-4: written at 1 and 2
  EXPECT_EQ(previous, 2U);
  EXPECT_TRUE(arena->claim(0, 64, 4, &previous));             // page 0: written at 1
  EXPECT_EQ(previous, 1U);
  EXPECT_FALSE(arena->claim(44 << 10, 4096, 5, &previous));   // the last page
  EXPECT_TRUE(arena->claim(40 << 10, 8192, 6, &previous));
  EXPECT_EQ(previous, 5U);
}

TEST(NodeArena, StepComparisonWraps) {
  EXPECT_TRUE(NodeArena::reached(5, 5));
  EXPECT_TRUE(NodeArena::reached(6, 5));
  EXPECT_FALSE(NodeArena::reached(4, 5));
  EXPECT_TRUE(NodeArena::reached(2, 0xfffffffeU));  // after the wrap
  EXPECT_FALSE(NodeArena::reached(0xfffffffeU, 2));
}

TEST(NodeArena, SizesAreRoundedAndChecked) {
  EXPECT_EQ(NodeArena::create(2, 1)->slotBytes(), NodeArena::kMinSlotBytes);
  EXPECT_EQ(NodeArena::create(2, 13000)->slotBytes(), size_t{16384});
  EXPECT_GE(NodeArena::create(100, 1)->slotBytes(), size_t{256 * 100});
  EXPECT_GE(NodeArena::create(100, 1)->maxStepBytes(), size_t{16 * 100});
  EXPECT_EQ(NodeArena::create(2)->slotBytes(), NodeArena::kDefaultSlotBytes);
  EXPECT_THROW(NodeArena::create(0), InvalidArgument);
  const auto arena = NodeArena::create(2, 16 << 10);
  // A mapping of another shape, or of something that is not a sealed memfd, is refused.
  EXPECT_THROW(NodeArena::attach(net::Socket(::dup(arena->descriptor())), 1, 3, arena->slotBytes()), NetworkError);
  EXPECT_THROW(NodeArena::attach(net::Socket(::dup(arena->descriptor())), 1, 2, 32 << 10), NetworkError);
  EXPECT_THROW(NodeArena::attach(net::Socket(::dup(arena->descriptor())), 1, 2, 1000), NetworkError);
  EXPECT_THROW(NodeArena::attach(net::Socket(::dup(arena->descriptor())), 0, 1, arena->slotBytes()), NetworkError);
  EXPECT_THROW(NodeArena::attach(net::Socket(::dup(STDIN_FILENO)), 1, 2, arena->slotBytes()), NetworkError);
  EXPECT_THROW(NodeArena::attach(net::Socket(::dup(arena->descriptor())), 2, 2, arena->slotBytes()),
               InvalidArgument);
}

TEST(NodeArena, SegmentIsAnonymousMemory) {
  const auto before = devShmEntries();
  const auto arena = NodeArena::create(4);
  EXPECT_EQ(devShmEntries(), before);
  std::ifstream maps("/proc/self/maps");
  const std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "/memfd:ringtree-arena")) << "the segment is a memfd";
}

TEST(NodeArena, SleeperWakesWhenThePeerPublishes) {
  const auto zero = NodeArena::create(2);
  const auto one = attachCopy(*zero, 1);
  // Without a publication the sleep lasts its timeout.
  auto start = Clock::now();
  zero->sleepWhile(1, 0, 100ms);
  EXPECT_GE(Clock::now() - start, 90ms);
  // A publication wakes it long before its timeout (20 s: far beyond the bound).
  std::atomic<bool> asleep{false};
  std::thread publisher([&] {
    while (!asleep.load()) std::this_thread::yield();
    std::this_thread::sleep_for(50ms);
    one->publish();
  });
  start = Clock::now();
  asleep = true;
  while (zero->peerStep(1) == 0 && Clock::now() - start < 20s) zero->sleepWhile(1, 0, 20s);
  publisher.join();
  EXPECT_EQ(zero->peerStep(1), 1U);
  EXPECT_LT(Clock::now() - start, test::kPrompt);
  // A value that already changed does not sleep.
  start = Clock::now();
  zero->sleepWhile(1, 0, 20s);
  EXPECT_LT(Clock::now() - start, test::kPrompt);
}

// ---------------------------------------------------------------------------------------
// Processes.

CommunicatorOptions shmOptions() {
  CommunicatorOptions options;
  options.transport = TransportKind::kShm;
  options.timeout = 20s;
  return options;
}

// Rank r's input element i.
float inputValue(int rank, size_t i) { return static_cast<float>((i * 7 + static_cast<size_t>(rank) * 3) % 1001); }

// allreduce one-shot and two-shot (several steps), broadcast of several steps and
// barriers, checked element by element; throws naming the first wrong element.
std::string runCollectives(Communicator& comm) {
  if (comm.impl().arena() == nullptr) throw std::runtime_error("no node arena");
  const int n = comm.size();
  const int rank = comm.rank();
  for (const size_t count : {size_t{0}, size_t{5}, size_t{4000}, (size_t{9} << 20) / 4 + 5}) {
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = inputValue(rank, i);
    AllreduceOptions o;
    o.algorithm = Algorithm::kShmDirect;
    allreduce(comm, data.data(), count, DataType::kFloat32, o);
    for (size_t i = 0; i < count; ++i) {
      float expected = 0;
      for (int r = 0; r < n; ++r) expected += inputValue(r, i);
      if (data[i] != expected) {
        throw std::runtime_error("allreduce of " + std::to_string(count) + ": element " + std::to_string(i) +
                                 " is " + std::to_string(data[i]) + ", expected " + std::to_string(expected));
      }
    }
    for (size_t i = 0; i < count; ++i) data[i] = rank == n - 1 ? inputValue(n - 1, i) : -1.0f;
    BroadcastOptions b;
    b.algorithm = Algorithm::kShmDirect;
    b.root = n - 1;
    broadcast(comm, data.data(), count, DataType::kFloat32, b);
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != inputValue(n - 1, i)) {
        throw std::runtime_error("broadcast of " + std::to_string(count) + ": element " + std::to_string(i) +
                                 " is wrong");
      }
    }
    for (int i = 0; i < 100; ++i) barrier(comm);
  }
  return "";
}

class ArenaProcesses : public ::testing::TestWithParam<int> {};

TEST_P(ArenaProcesses, CollectivesAreExactAndLeaveNothingBehind) {
  const int size = GetParam();
  const auto before = devShmEntries();
  const auto results = runProcesses(size, [size](int rank, std::shared_ptr<Store> store) {
    const auto comm = Communicator::create(store, rank, size, shmOptions());
    return runCollectives(*comm);
  });
  for (int rank = 0; rank < size; ++rank) {
    const ChildResult& r = results[static_cast<size_t>(rank)];
    EXPECT_TRUE(r.exited && r.code == 0) << "rank " << rank << " (signal " << r.signal << "): " << r.message;
  }
  EXPECT_EQ(devShmEntries(), before);
}

// A rank killed with SIGKILL while all loop over collectives: every other rank fails with
// NetworkError naming it, within seconds (test::kPrompt; their timeout is 20 s).
TEST_P(ArenaProcesses, SigkilledPeerFailsTheOthersQuickly) {
  const int size = GetParam();
  const int victim = size - 1;
  const auto before = devShmEntries();
  Clock::time_point killedAt;
  const auto results = runProcesses(
      size,
      [size](int rank, std::shared_ptr<Store> store) {
        const auto comm = Communicator::create(store, rank, size, shmOptions());
        std::vector<float> data((size_t{8} << 20) / 4, 1.0f);
        AllreduceOptions large;
        large.algorithm = Algorithm::kShmDirect;
        BroadcastOptions b;
        b.algorithm = Algorithm::kShmDirect;
        try {
          for (uint64_t i = 0;; ++i) {
            std::fill(data.begin(), data.end(), 1.0f);
            allreduce(*comm, data.data(), data.size(), DataType::kFloat32, large);
            allreduce(*comm, data.data(), 3, DataType::kFloat32, large);
            broadcast(*comm, data.data(), data.size(), DataType::kFloat32, b);
            barrier(*comm);
          }
        } catch (const NetworkError& e) {
          return std::to_string(Clock::now().time_since_epoch().count()) + " " + e.what();
        }
      },
      [&](const std::vector<pid_t>& pids) {
        std::this_thread::sleep_for(1500ms);  // rendezvous and a good number of iterations
        killedAt = Clock::now();
        ::kill(pids[static_cast<size_t>(victim)], SIGKILL);
      });
  ASSERT_EQ(results[static_cast<size_t>(victim)].signal, SIGKILL) << results[static_cast<size_t>(victim)].message;
  for (int rank = 0; rank < victim; ++rank) {
    const ChildResult& r = results[static_cast<size_t>(rank)];
    ASSERT_TRUE(r.exited && r.code == 0) << "rank " << rank << ": " << r.message;
    const Clock::time_point failedAt{Clock::duration(std::stoll(r.message))};
    const auto latency = std::chrono::duration_cast<std::chrono::milliseconds>(failedAt - killedAt);
    EXPECT_LT(latency, test::kPrompt) << r.message;
    EXPECT_TRUE(contains(r.message, "rank " + std::to_string(victim) + " (")) << r.message;
    std::printf("[ info ] rank %d of %d noticed the killed rank after %lld ms: %s\n", rank, size,
                static_cast<long long>(latency.count()), r.message.substr(r.message.find(' ') + 1).c_str());
  }
  EXPECT_EQ(devShmEntries(), before);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ArenaProcesses, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// One rank's RINGTREE_SHM_ARENA=0 keeps every rank from having the arena; they still agree
// (the barrier goes over the pairs everywhere).
TEST(ArenaRendezvous, OneRankCanDisableItForAll) {
  const auto results = runProcesses(3, [](int rank, std::shared_ptr<Store> store) {
    if (rank == 1) ::setenv("RINGTREE_SHM_ARENA", "0", 1);
    const auto comm = Communicator::create(store, rank, 3, shmOptions());
    if (comm->impl().arena() != nullptr) throw std::runtime_error("an arena although rank 1 disabled it");
    for (int i = 0; i < 10; ++i) barrier(*comm);
    return std::string();
  });
  for (const ChildResult& r : results) EXPECT_TRUE(r.exited && r.code == 0) << r.message;
}

}  // namespace
}  // namespace ringtree
