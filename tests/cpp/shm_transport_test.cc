// Shared-memory transport: pairs built directly with shm::Listener / connect / createPair
// between two threads and between two processes (fork), exact contents over ring and
// direct-copy sizes, Accumulate across ring wrap-around and bounce-buffer boundaries,
// envelope and size mismatches, peeking and pending counts, peers that close, die
// (SIGKILL) or break the protocol, sleeping and waking. (Its latency and bandwidth
// figures: benchmarks/transport_bench.cc.)
//
// Every wait is bounded (kTimeout), children are killed by their Child handle and by an
// alarm (harness/shm_pairs.h), so a regression fails a test instead of hanging the binary.

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <fstream>
#include <future>
#include <limits>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <ringtree/error.h>

#include "common/socket.h"
#include "harness/test_util.h"
#include "transport/shm/device.h"
#include "transport/shm/pair.h"
#include "transport/shm/protocol.h"
#include "transport/shm/segment.h"
#include "transport/shm/unix_socket.h"
#include "harness/shm_pairs.h"
#include "harness/test_util.h"

namespace ringtree::transport::shm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using test::acceptChild;
using test::Child;
using test::connectThreads;
using test::devShmEntries;
using test::forkPeer;
using test::ringOnly;
using test::Role;
using test::spinIdle;
using test::sumElements;
using test::TwoPairs;
using test::waitIdle;

// Longest any single wait in a test may take.
constexpr milliseconds kTimeout = test::kPairTimeout;
// How soon a pending operation must fail after its peer closed its pair or was killed:
// at once, not at a waitIdle deadline (kTimeout).
constexpr milliseconds kGoneNotice = test::kPrompt;
constexpr size_t kMiB = size_t{1} << 20;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Envelope envelope(uint64_t sequence, uint32_t operation = 7) {
  Envelope e;
  e.sequence = sequence;
  e.operation = operation;
  e.dataType = 3;
  e.count = 1000 + sequence;
  return e;
}

// Deterministic bytes for message `index` sent by `side`.
std::vector<uint8_t> pattern(size_t bytes, int side, size_t index) {
  std::vector<uint8_t> data(bytes);
  uint64_t x = 0x9e3779b97f4a7c15ULL * (index + 1) + static_cast<uint64_t>(side) * 0x632be59bd9b4e019ULL;
  for (size_t i = 0; i < bytes; i += 8) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const uint64_t word = x ^ (x >> 29);
    std::memcpy(data.data() + i, &word, std::min<size_t>(8, bytes - i));
  }
  return data;
}

// A 12-byte element (three int32 summed lane by lane): its size divides neither the
// cache line nor the ring, so elements straddle the ring's wrap-around.
struct Triple {
  int32_t lane[3];
};
static_assert(sizeof(Triple) == 12, "Triple is 12 bytes");

void sumTriples(void* inout, const void* in, size_t count) { sumElements<int32_t>(inout, in, count * 3); }

// The threshold that sizes are chosen around (the default when direct copy is off).
size_t nominalThreshold(const PairOptions& options) {
  return options.directCopyThreshold == std::numeric_limits<size_t>::max() ? PairOptions{}.directCopyThreshold
                                                                          : options.directCopyThreshold;
}

std::vector<size_t> messageSizes(const PairOptions& options) {
  const size_t threshold = nominalThreshold(options);
  return {0, 1, 7, 4095, options.ringBytes - 1, options.ringBytes + 1, threshold - 1, threshold, 16 * kMiB + 5};
}

enum class Harness { kThreads, kProcesses };

// Runs role on both sides of a pair (side 0 here, side 1 on a thread or in a child).
void runBothSides(Harness harness, const PairOptions& options, const Role& role) {
  if (harness == Harness::kThreads) {
    TwoPairs pairs = connectThreads(options, options);
    auto other = std::async(std::launch::async, [&] { return role(*pairs.rank1, 1); });
    const bool here = role(*pairs.rank0, 0);
    EXPECT_TRUE(other.get()) << "side 1 failed";
    EXPECT_TRUE(here) << "side 0 failed";
    return;
  }
  Listener listener;
  Child child = forkPeer(listener, options, role);
  bool here = false;
  {
    auto pair = acceptChild(listener, child, options);
    here = role(*pair, 0);
  }
  EXPECT_EQ(child.wait(), 0) << "side 1 (child) failed";
  EXPECT_TRUE(here) << "side 0 failed";
}

bool sameBytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const char* what, size_t index) {
  if (got == want) return true;
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::fprintf(stderr, "%s message %zu (%zu bytes): first difference at byte %zu\n", what, index, want.size(), i);
  return false;
}

// Every size both ways at once, all sends and receives posted before any progress
// (a FIFO of mixed ring and direct messages in each direction).
bool exchangeQueued(Pair& pair, int side, const std::vector<size_t>& sizes) {
  std::vector<std::vector<uint8_t>> out;
  std::vector<std::vector<uint8_t>> in;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(pattern(sizes[i], side, i));
    in.emplace_back(sizes[i], 0xEE);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    pair.postSend(envelope(i), out[i].data(), sizes[i]);
    pair.postRecv(envelope(i), in[i].data(), sizes[i]);
  }
  waitIdle(pair);
  bool ok = true;
  for (size_t i = 0; i < sizes.size(); ++i) ok = sameBytes(in[i], pattern(sizes[i], 1 - side, i), "queued", i) && ok;
  return ok;
}

// One size at a time, both directions at once.
bool exchangeOneByOne(Pair& pair, int side, const std::vector<size_t>& sizes) {
  bool ok = true;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<uint8_t> out = pattern(sizes[i], side, i);
    std::vector<uint8_t> in(sizes[i], 0xEE);
    pair.postSend(envelope(i), out.data(), sizes[i]);
    pair.postRecv(envelope(i), in.data(), sizes[i]);
    waitIdle(pair);
    ok = sameBytes(in, pattern(sizes[i], 1 - side, i), "one-by-one", i) && ok;
  }
  return ok;
}

// Element counts whose byte sizes are multiples of neither the ring nor the bounce
// buffer, on both sides of the direct-copy threshold.
std::vector<size_t> accumulateCounts(const PairOptions& options, size_t elementSize) {
  const size_t threshold = nominalThreshold(options);
  return {1,
          1000,
          options.ringBytes / elementSize + 3,
          threshold / elementSize - 1,
          threshold / elementSize + 1,
          3 * ShmPair::kBounceBytes / elementSize + 7,
          4 * kMiB / elementSize + 5};
}

template <typename T>
T valueOf(size_t i, int salt) {
  return static_cast<T>(static_cast<int64_t>((i * 7 + static_cast<size_t>(salt) * 13) % 1001) - 500);
}

// Every count both ways at once: dst starts at valueOf(i, 100 + message), the peer sends
// valueOf(i, side * 10 + message); the sum is exact (small integers).
template <typename T, size_t kLanes = 1>
bool accumulateQueued(Pair& pair, int side, const std::vector<size_t>& counts, ReduceFn fn) {
  std::vector<std::vector<T>> out;
  std::vector<std::vector<T>> in;
  for (size_t m = 0; m < counts.size(); ++m) {
    const size_t values = counts[m] * kLanes;
    out.emplace_back(values);
    in.emplace_back(values);
    for (size_t i = 0; i < values; ++i) {
      out[m][i] = valueOf<T>(i, side * 10 + static_cast<int>(m));
      in[m][i] = valueOf<T>(i, 100 + static_cast<int>(m));
    }
  }
  for (size_t m = 0; m < counts.size(); ++m) {
    const size_t bytes = counts[m] * kLanes * sizeof(T);
    pair.postSend(envelope(m), out[m].data(), bytes);
    pair.postRecv(envelope(m), in[m].data(), bytes, Accumulate{fn, kLanes * sizeof(T)});
  }
  waitIdle(pair);
  for (size_t m = 0; m < counts.size(); ++m) {
    for (size_t i = 0; i < in[m].size(); ++i) {
      const T want = valueOf<T>(i, 100 + static_cast<int>(m)) + valueOf<T>(i, (1 - side) * 10 + static_cast<int>(m));
      if (in[m][i] != want) {
        std::fprintf(stderr, "accumulate message %zu (%zu elements): wrong value at %zu\n", m, counts[m], i);
        return false;
      }
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// Listener and connect

TEST(ShmListenerTest, ConnectToUnusedNameGivesInvalidSocketAndError) {
  std::string name;
  {
    Listener listener;
    name = listener.name();
    EXPECT_EQ(name.rfind("ringtree-shm-", 0), 0u) << name;
  }
  std::string error;
  net::Socket socket = connect(name, net::deadlineAfter(milliseconds(500)), &error);
  EXPECT_FALSE(socket.valid());
  EXPECT_NE(error.find(name), std::string::npos) << error;
  EXPECT_NE(error.find("refused"), std::string::npos) << error;

  error.clear();
  EXPECT_FALSE(connect("", net::deadlineAfter(milliseconds(500)), &error).valid());
  EXPECT_FALSE(error.empty());
}

TEST(ShmListenerTest, ListenersGetDistinctNamesAndAcceptTimesOut) {
  Listener a;
  Listener b;
  EXPECT_NE(a.name(), b.name());
  const auto start = Clock::now();
  EXPECT_THROW(a.accept(net::deadlineAfter(milliseconds(50))), TimeoutError);
  EXPECT_GE(secondsSince(start), 0.045);
}

TEST(ShmListenerTest, HandshakeRejectsWrongRanks) {
  Listener listener;
  const auto deadline = net::deadlineAfter(kTimeout);
  auto accepted = std::async(std::launch::async, [&] {
    return createPair(listener.accept(deadline), false, 1, 0, "rank 0", PairOptions{}, deadline);
  });
  std::string error;
  net::Socket socket = connect(listener.name(), deadline, &error);
  ASSERT_TRUE(socket.valid()) << error;
  try {
    createPair(std::move(socket), true, 0, 5, "rank 5 (test)", PairOptions{}, deadline);
    ADD_FAILURE() << "expected NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 5 (test)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(accepted.get(), NetworkError);
}

TEST(ShmSegmentTest, MapRefusesUnsealedOrWrongSizedDescriptors) {
  net::Socket unsealed(::memfd_create("unsealed", MFD_CLOEXEC));
  ASSERT_TRUE(unsealed.valid());
  ASSERT_EQ(::ftruncate(unsealed.fd(), 8192), 0);
  try {
    Segment::map(std::move(unsealed), 8192);
    ADD_FAILURE() << "expected NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("sealed"), std::string::npos) << e.what();
  }
  Segment sealed = Segment::create("sealed", 8192);
  net::Socket copy(::fcntl(sealed.descriptor(), F_DUPFD_CLOEXEC, 0));
  EXPECT_THROW(Segment::map(std::move(copy), 4096), NetworkError);
  EXPECT_NE(::ftruncate(sealed.descriptor(), 0), 0) << "a created segment must refuse to shrink";
}

// ---------------------------------------------------------------------------------------
// Transfers, over threads and processes, with direct copy on, off, and a small ring

struct Config {
  const char* name;
  PairOptions options;
};

Config configs[] = {
    {"Default", PairOptions{}},
    {"RingOnly", ringOnly()},
    {"SmallRing", [] {
       PairOptions o;
       o.ringBytes = 4160;  // 65 cache lines: wraps at a position no power of two divides
       o.directCopyThreshold = 64 << 10;
       return o;
     }()},
};

class ShmTransferTest : public ::testing::TestWithParam<std::tuple<Harness, int>> {
 protected:
  Harness harness() const { return std::get<0>(GetParam()); }
  const PairOptions& options() const { return configs[std::get<1>(GetParam())].options; }
};

TEST_P(ShmTransferTest, AllSizesQueuedBothWays) {
  const std::vector<size_t> sizes = messageSizes(options());
  runBothSides(harness(), options(), [&](Pair& pair, int side) { return exchangeQueued(pair, side, sizes); });
}

TEST_P(ShmTransferTest, AllSizesOneByOneBothWays) {
  const std::vector<size_t> sizes = messageSizes(options());
  runBothSides(harness(), options(), [&](Pair& pair, int side) { return exchangeOneByOne(pair, side, sizes); });
}

TEST_P(ShmTransferTest, AccumulateInt32) {
  const auto counts = accumulateCounts(options(), sizeof(int32_t));
  runBothSides(harness(), options(), [&](Pair& pair, int side) {
    return accumulateQueued<int32_t>(pair, side, counts, sumElements<int32_t>);
  });
}

TEST_P(ShmTransferTest, AccumulateFloat64) {
  const auto counts = accumulateCounts(options(), sizeof(double));
  runBothSides(harness(), options(), [&](Pair& pair, int side) {
    return accumulateQueued<double>(pair, side, counts, sumElements<double>);
  });
}

TEST_P(ShmTransferTest, AccumulateTwelveByteElementsAcrossWrapAround) {
  const auto counts = accumulateCounts(options(), sizeof(Triple));
  runBothSides(harness(), options(), [&](Pair& pair, int side) {
    return accumulateQueued<int32_t, 3>(pair, side, counts, sumTriples);
  });
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmTransferTest,
                         ::testing::Combine(::testing::Values(Harness::kThreads, Harness::kProcesses),
                                            ::testing::Values(0, 1, 2)),
                         [](const ::testing::TestParamInfo<ShmTransferTest::ParamType>& info) {
                           return std::string(std::get<0>(info.param) == Harness::kThreads ? "Threads" : "Processes") +
                                  configs[std::get<1>(info.param)].name;
                         });

// Direct copies where the destination lies at every kind of distance from the source
// modulo a page (0, the short distances the bounce buffer takes, and long ones), over one
// chunk and several; then the same with Accumulate (int32, element-aligned distances).
// Each side sends from page offset 40 and receives at 40 + distance.
TEST(ShmPairTest, DirectCopyAtEveryPageDistance) {
  constexpr size_t kPage = ShmPair::kPageBytes;
  constexpr size_t kSourceOffset = 40;
  const std::vector<size_t> distances = {0, 1, 8, 31, 63, 64, 100, kPage - 8};
  const std::vector<size_t> sizes = {PairOptions{}.directCopyThreshold, 3 * ShmPair::kBounceBytes + 5};
  // A buffer of `bytes` starting at `pageOffset` within a page of `storage`.
  const auto placed = [](std::vector<uint8_t>& storage, size_t bytes, size_t pageOffset) {
    storage.assign(bytes + 2 * kPage, 0xEE);
    const uintptr_t start = reinterpret_cast<uintptr_t>(storage.data());
    return storage.data() + ((kPage - start % kPage) % kPage) + pageOffset;
  };
  for (Harness harness : {Harness::kThreads, Harness::kProcesses}) {
    runBothSides(harness, PairOptions{}, [&](Pair& pair, int side) {
      bool ok = true;
      uint64_t sequence = 0;
      for (size_t distance : distances) {
        for (size_t bytes : sizes) {
          std::vector<uint8_t> outStorage;
          std::vector<uint8_t> inStorage;
          uint8_t* out = placed(outStorage, bytes, kSourceOffset);
          uint8_t* in = placed(inStorage, bytes, (kSourceOffset + distance) % kPage);
          const std::vector<uint8_t> mine = pattern(bytes, side, distance);
          std::memcpy(out, mine.data(), bytes);
          pair.postSend(envelope(sequence), out, bytes);
          pair.postRecv(envelope(sequence), in, bytes);
          ++sequence;
          waitIdle(pair);
          ok = sameBytes(std::vector<uint8_t>(in, in + bytes), pattern(bytes, 1 - side, distance), "copy", distance) &&
               ok;
        }
        if (distance % sizeof(int32_t) != 0) continue;
        const size_t count = 3 * ShmPair::kBounceBytes / sizeof(int32_t) + 7;
        std::vector<uint8_t> outStorage;
        std::vector<uint8_t> inStorage;
        auto* out = reinterpret_cast<int32_t*>(placed(outStorage, count * 4, kSourceOffset));
        auto* in = reinterpret_cast<int32_t*>(placed(inStorage, count * 4, (kSourceOffset + distance) % kPage));
        for (size_t i = 0; i < count; ++i) {
          out[i] = valueOf<int32_t>(i, side);
          in[i] = valueOf<int32_t>(i, 100);
        }
        pair.postSend(envelope(sequence), out, count * 4);
        pair.postRecv(envelope(sequence), in, count * 4, Accumulate{sumElements<int32_t>, sizeof(int32_t)});
        ++sequence;
        waitIdle(pair);
        for (size_t i = 0; i < count && ok; ++i) {
          if (in[i] != valueOf<int32_t>(i, 100) + valueOf<int32_t>(i, 1 - side)) {
            std::fprintf(stderr, "accumulate at distance %zu: wrong value at %zu\n", distance, i);
            ok = false;
          }
        }
      }
      return ok;
    });
  }
}

TEST(ShmPairTest, MixedOptionsOnTheTwoSides) {
  // Each side decides for its own sends: rank 0 copies directly, rank 1 only uses its ring.
  TwoPairs pairs = connectThreads(PairOptions{}, ringOnly(64 << 10));
  const std::vector<size_t> sizes = {0, 100, (256 << 10) + 1, 3 * kMiB + 3};
  auto other = std::async(std::launch::async, [&] { return exchangeQueued(*pairs.rank1, 1, sizes); });
  EXPECT_TRUE(exchangeQueued(*pairs.rank0, 0, sizes));
  EXPECT_TRUE(other.get());
}

// Resident shared memory of this process (RssShmem in /proc/self/status), in bytes.
size_t residentSharedBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssShmem:", 0) == 0) return std::stoul(line.substr(9)) * 1024;  // kB
  }
  return 0;
}

TEST(ShmPairTest, PrefaultedRingsAreResidentWhenMadeLazyOnesWhenWritten) {
  // Both ends live in this process: each side's own ring and its mapping of the peer's.
  PairOptions lazy;
  PairOptions prefaulted;
  prefaulted.prefault = true;
  const size_t rings = 2 * PairOptions{}.ringBytes;

  const size_t beforeLazy = residentSharedBytes();
  TwoPairs lazyPairs = connectThreads(lazy, lazy);
  EXPECT_LT(residentSharedBytes() - beforeLazy, rings / 4) << "a lazy pair's rings take memory as they are written";

  const size_t beforePrefaulted = residentSharedBytes();
  TwoPairs prefaultedPairs = connectThreads(prefaulted, prefaulted);
  EXPECT_GE(residentSharedBytes() - beforePrefaulted, rings) << "both rings resident once the pair is made";
  // And they carry messages as any pair does.
  const std::vector<size_t> sizes = {0, 8, 100, 64 << 10, (256 << 10) + 1};
  auto other = std::async(std::launch::async, [&] { return exchangeQueued(*prefaultedPairs.rank1, 1, sizes); });
  EXPECT_TRUE(exchangeQueued(*prefaultedPairs.rank0, 0, sizes));
  EXPECT_TRUE(other.get());
}

TEST(ShmPairTest, InvalidArgumentsAreRejected) {
  TwoPairs pairs = connectThreads();
  char buffer[16] = {};
  EXPECT_THROW(pairs.rank0->postSend(envelope(0), nullptr, 4), InvalidArgument);
  EXPECT_THROW(pairs.rank0->postRecv(envelope(0), nullptr, 4), InvalidArgument);
  EXPECT_THROW(pairs.rank0->postRecv(envelope(0), buffer, 10, Accumulate{sumElements<int32_t>, 4}), InvalidArgument);
  EXPECT_THROW(pairs.rank0->postRecv(envelope(0), buffer, 16, Accumulate{sumElements<int32_t>, 0}), InvalidArgument);
  PairOptions tiny;
  tiny.ringBytes = 64;
  EXPECT_THROW(connectThreads(tiny, tiny), InvalidArgument);
  EXPECT_STREQ(pairs.rank0->kind(), "shm");
  EXPECT_EQ(pairs.rank0->peerRank(), 1);
  EXPECT_EQ(pairs.rank1->peerDescription(), "rank 0 (test thread)");
}

TEST(ShmPairTest, PeekAndPendingCountsAroundADirectSend) {
  // A direct send and a ring send after it: the second is in the ring at once, but both
  // count as pending until the peer has pulled the first from our memory.
  TwoPairs pairs = connectThreads();
  const std::vector<uint8_t> big = pattern(kMiB, 0, 0);
  const std::vector<uint8_t> small = pattern(10, 0, 1);
  pairs.rank0->postSend(envelope(0), big.data(), big.size());
  pairs.rank0->postSend(envelope(1), small.data(), small.size());
  EXPECT_FALSE(pairs.rank0->progress());
  EXPECT_EQ(pairs.rank0->pendingSends(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const std::vector<uint8_t>& expected = i == 0 ? big : small;
    Envelope seen;
    size_t bytes = 0;
    ASSERT_TRUE(pairs.rank1->peekIncoming(&seen, &bytes));
    EXPECT_EQ(seen, envelope(i));
    EXPECT_EQ(bytes, expected.size());
    std::vector<uint8_t> in(bytes);
    pairs.rank1->postRecv(seen, in.data(), bytes);
    EXPECT_EQ(pairs.rank1->pendingRecvs(), 1u);
    EXPECT_FALSE(pairs.rank1->peekIncoming(&seen, &bytes));
    waitIdle(*pairs.rank1);
    EXPECT_EQ(pairs.rank1->pendingRecvs(), 0u);
    EXPECT_EQ(in, expected);
  }
  waitIdle(*pairs.rank0);
  EXPECT_EQ(pairs.rank0->pendingSends(), 0u);
  Envelope none;
  size_t noBytes = 0;
  EXPECT_FALSE(pairs.rank1->peekIncoming(&none, &noBytes));
}

TEST(ShmPairTest, TakeIncomingTakesOnlyAnInlineMessageThatArrivedWhole) {
  PairOptions small;
  small.ringBytes = 4160;  // 65 lines: the payloads below wrap round its end
  TwoPairs pairs = connectThreads(small, small);
  const auto peek = [&](size_t expectedBytes, uint64_t expectedSequence) {
    Envelope seen;
    size_t bytes = 0;
    EXPECT_TRUE(pairs.rank1->peekIncoming(&seen, &bytes));
    EXPECT_EQ(seen, envelope(expectedSequence));
    EXPECT_EQ(bytes, expectedBytes);
  };
  // Messages of 1000 bytes and their headers: the fifth's payload wraps round the ring.
  for (uint64_t i = 0; i < 8; ++i) {
    const std::vector<uint8_t> out = pattern(1000, 0, static_cast<int>(i));
    pairs.rank0->postSend(envelope(i), out.data(), out.size());
    waitIdle(*pairs.rank0);  // in the ring
    peek(1000, i);
    std::vector<uint8_t> in(1000);
    EXPECT_FALSE(pairs.rank1->takeIncoming(in.data(), 999));  // not the size it has: left there
    peek(1000, i);
    ASSERT_TRUE(pairs.rank1->takeIncoming(in.data(), in.size())) << i;
    EXPECT_EQ(in, out) << i;
    EXPECT_EQ(pairs.rank0->pendingSends(), 0u);
  }
  Envelope none;
  size_t noBytes = 0;
  EXPECT_FALSE(pairs.rank1->peekIncoming(&none, &noBytes));

  // Larger than the ring: its header is there, its payload only as the reader frees room.
  const std::vector<uint8_t> big = pattern(10000, 0, 9);
  pairs.rank0->postSend(envelope(9), big.data(), big.size());
  EXPECT_FALSE(pairs.rank0->progress());
  peek(big.size(), 9);
  std::vector<uint8_t> in(big.size());
  EXPECT_FALSE(pairs.rank1->takeIncoming(in.data(), in.size()));
  pairs.rank1->postRecv(envelope(9), in.data(), in.size());
  for (bool done = false; !done;) {
    const bool sent = pairs.rank0->progress();
    done = pairs.rank1->progress() && sent;
  }
  EXPECT_EQ(in, big);

  // An empty message.
  pairs.rank0->postSend(envelope(10), nullptr, 0);
  waitIdle(*pairs.rank0);
  peek(0, 10);
  EXPECT_TRUE(pairs.rank1->takeIncoming(nullptr, 0));
  EXPECT_FALSE(pairs.rank1->peekIncoming(&none, &noBytes));
}

TEST(ShmPairTest, TakeIncomingLeavesADirectMessageToItsReceive) {
  TwoPairs pairs = connectThreads();
  const std::vector<uint8_t> big = pattern(kMiB, 0, 0);
  pairs.rank0->postSend(envelope(0), big.data(), big.size());
  EXPECT_FALSE(pairs.rank0->progress());
  Envelope seen;
  size_t bytes = 0;
  ASSERT_TRUE(pairs.rank1->peekIncoming(&seen, &bytes));
  std::vector<uint8_t> in(bytes);
  EXPECT_FALSE(pairs.rank1->takeIncoming(in.data(), bytes));
  EXPECT_EQ(pairs.rank0->pendingSends(), 1u);  // nothing was taken
  pairs.rank1->postRecv(seen, in.data(), bytes);
  waitIdle(*pairs.rank1);
  waitIdle(*pairs.rank0);
  EXPECT_EQ(in, big);
}

// ---------------------------------------------------------------------------------------
// Mismatches

void expectMismatch(size_t sentBytes, size_t postedBytes, uint64_t sentSequence, uint64_t postedSequence) {
  TwoPairs pairs = connectThreads();
  const std::vector<uint8_t> out = pattern(sentBytes, 0, 0);
  std::vector<uint8_t> in(postedBytes);
  pairs.rank0->postSend(envelope(sentSequence), out.data(), sentBytes);
  pairs.rank1->postRecv(envelope(postedSequence), in.data(), postedBytes);
  auto sender = std::async(std::launch::async, [&] {
    // A ring send finishes by itself; a direct one waits for a reader that gave up.
    try {
      waitIdle(*pairs.rank0, milliseconds(300));
    } catch (const std::exception&) {
    }
  });
  try {
    waitIdle(*pairs.rank1);
    ADD_FAILURE() << "expected EnvelopeMismatch";
  } catch (const EnvelopeMismatch& e) {
    EXPECT_EQ(e.peerRank, 0);
    EXPECT_EQ(e.expected.sequence, postedSequence);
    EXPECT_EQ(e.actual.sequence, sentSequence);
    EXPECT_EQ(e.expectedBytes, postedBytes);
    EXPECT_EQ(e.actualBytes, sentBytes);
    EXPECT_NE(std::string(e.what()).find("rank 0 (test thread)"), std::string::npos) << e.what();
  }
  // The error sticks: the byte stream is unusable.
  EXPECT_THROW(pairs.rank1->progress(), EnvelopeMismatch);
  EXPECT_THROW(pairs.rank1->postRecv(envelope(9), in.data(), 1), EnvelopeMismatch);
  sender.get();
}

TEST(ShmMismatchTest, EnvelopeMismatchNamesPeerAndBothCalls) { expectMismatch(100, 100, 5, 6); }
TEST(ShmMismatchTest, SizeMismatchRing) { expectMismatch(100, 99, 5, 5); }
TEST(ShmMismatchTest, SizeMismatchDirect) { expectMismatch(kMiB + 1, kMiB, 5, 5); }
TEST(ShmMismatchTest, EnvelopeMismatchDirect) { expectMismatch(kMiB, kMiB, 5, 8); }

// ---------------------------------------------------------------------------------------
// Peers that close or die

// Waits (spinning, or sleeping like the communicator) for the NetworkError that must
// follow the peer's departure at `gone`, naming the peer, within `notice`.
void expectPeerGone(Pair& pair, bool spinOnly, const std::string& peerName, milliseconds notice,
                    const std::function<Clock::time_point()>& gone) {
  try {
    if (spinOnly) {
      spinIdle(pair);
    } else {
      waitIdle(pair, kTimeout, 10);
    }
    ADD_FAILURE() << "expected NetworkError";
  } catch (const NetworkError& e) {
    const auto failed = Clock::now();
    EXPECT_NE(std::string(e.what()).find(peerName), std::string::npos) << e.what();
    const auto goneAt = gone();
    EXPECT_GE(failed, goneAt) << "failed before the peer left: " << e.what();
    EXPECT_LT(failed - goneAt, notice) << e.what();
  }
}

class ShmClosedPeerTest : public ::testing::TestWithParam<bool> {};

TEST_P(ShmClosedPeerTest, PendingReceiveFailsWhenPeerPairIsDestroyed) {
  TwoPairs pairs = connectThreads();
  std::vector<uint8_t> in(100);
  pairs.rank1->postRecv(envelope(0), in.data(), in.size());
  Clock::time_point gone;
  auto closer = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(milliseconds(100));
    gone = Clock::now();
    pairs.rank0.reset();
  });
  expectPeerGone(*pairs.rank1, GetParam(), "rank 0 (test thread)", kGoneNotice, [&] {
    closer.wait();  // publishes `gone`
    return gone;
  });
}

TEST_P(ShmClosedPeerTest, PendingSendFailsWhenPeerPairIsDestroyed) {
  for (const PairOptions& options : {ringOnly(64 << 10), PairOptions{}}) {
    TwoPairs pairs = connectThreads(options, options);
    const std::vector<uint8_t> out = pattern(4 * kMiB, 0, 0);
    pairs.rank0->postSend(envelope(0), out.data(), out.size());
    EXPECT_FALSE(pairs.rank0->progress());
    const auto gone = Clock::now();
    pairs.rank1.reset();
    expectPeerGone(*pairs.rank0, GetParam(), "rank 1 (test thread)", kGoneNotice, [&] { return gone; });
  }
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmClosedPeerTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Spinning" : "Sleeping");
                         });

TEST(ShmPairTest, DataPublishedBeforeCloseIsStillDelivered) {
  TwoPairs pairs = connectThreads();
  const std::vector<size_t> sizes = {0, 10, 100000};
  std::vector<std::vector<uint8_t>> in;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<uint8_t> out = pattern(sizes[i], 0, i);
    pairs.rank0->postSend(envelope(i), out.data(), out.size());
    waitIdle(*pairs.rank0);  // ring sends finish once written
  }
  pairs.rank0.reset();
  for (size_t i = 0; i < sizes.size(); ++i) {
    in.emplace_back(sizes[i]);
    pairs.rank1->postRecv(envelope(i), in[i].data(), sizes[i]);
  }
  waitIdle(*pairs.rank1);
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(in[i], pattern(sizes[i], 0, i)) << i;
  std::vector<uint8_t> more(5);
  pairs.rank1->postRecv(envelope(9), more.data(), more.size());
  EXPECT_THROW(waitIdle(*pairs.rank1), NetworkError);
}

// Descriptors and mappings of ringtree segments held by this process.
int segmentsHeldHere() {
  int held = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (dirent* entry = ::readdir(dir)) {
      char target[256] = {};
      const std::string path = std::string("/proc/self/fd/") + entry->d_name;
      if (::readlink(path.c_str(), target, sizeof(target) - 1) > 0 && std::strstr(target, "ringtree-shm")) ++held;
    }
    ::closedir(dir);
  }
  if (FILE* maps = std::fopen("/proc/self/maps", "r")) {
    char line[512];
    while (std::fgets(line, sizeof(line), maps)) {
      if (std::strstr(line, "ringtree-shm")) ++held;
    }
    std::fclose(maps);
  }
  return held;
}

class ShmKilledPeerTest : public ::testing::TestWithParam<bool> {};

// The child sends a 16 MiB message (streamed slowly through a small ring, or as one
// direct copy whose descriptor is in the ring) and is SIGKILLed mid-transfer; the parent
// must fail within ~1-2 s, and nothing may be left behind in /dev/shm or in this process
// once the pair is gone.
TEST_P(ShmKilledPeerTest, ReceiverFailsQuicklyAndNothingIsLeftBehind) {
  const bool direct = GetParam();
  const PairOptions options = direct ? PairOptions{} : ringOnly(64 << 10);
  const std::set<std::string> before = devShmEntries();
  const size_t bytes = 16 * kMiB;
  int started[2];
  ASSERT_EQ(::pipe2(started, O_CLOEXEC), 0);
  net::Socket startedRead(started[0]);
  net::Socket startedWrite(started[1]);
  {
    Listener listener;
    Child child = forkPeer(listener, options, [&](Pair& pair, int) {
      const std::vector<uint8_t> out(bytes, 0x5A);
      pair.postSend(envelope(0), out.data(), out.size());
      pair.progress();  // the header (and the first ring bytes) are published
      const char byte = 1;
      if (::write(startedWrite.fd(), &byte, 1) != 1) return false;
      for (;;) {  // feed slowly until killed
        pair.progress();
        std::this_thread::sleep_for(milliseconds(1));
      }
    });
    startedWrite.reset();
    auto pair = acceptChild(listener, child, options);
    pollfd pfd{startedRead.fd(), POLLIN, 0};
    ASSERT_EQ(::poll(&pfd, 1, static_cast<int>(kTimeout.count())), 1);
    std::vector<uint8_t> in(bytes);
    pair->postRecv(envelope(0), in.data(), in.size());
    if (!direct) {
      const auto deadline = Clock::now() + kTimeout;
      while (in[0] != 0x5A && Clock::now() < deadline) EXPECT_FALSE(pair->progress());
      ASSERT_EQ(in[0], 0x5A) << "part of the message should have arrived";
    }
    child.kill();
    const auto gone = Clock::now();
    EXPECT_EQ(child.wait(), 128 + SIGKILL);
    expectPeerGone(*pair, false, "rank 1 (child pid", kGoneNotice, [&] { return gone; });
  }
  EXPECT_EQ(devShmEntries(), before);
  EXPECT_EQ(segmentsHeldHere(), 0);
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmKilledPeerTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "DirectCopy" : "Ring");
                         });

// ---------------------------------------------------------------------------------------
// Sleeping and waking

// Arms, checks progress once more, then poll()s with a long timeout (20 s); returns how
// long the poll took in seconds (a lost wake-up makes it the whole timeout).
double sleepOnce(Pair& pair) {
  pollfd pfd{};
  pair.armWait(&pfd);
  if (pair.progress()) {
    pair.disarmWait();
    return 0;
  }
  const auto start = Clock::now();
  const int rc = ::poll(&pfd, 1, 20000);
  const double slept = secondsSince(start);
  pair.disarmWait();
  EXPECT_EQ(rc, 1);
  EXPECT_NE(pfd.revents & POLLIN, 0);
  return slept;
}

// How long a woken sleeper may have slept (seconds): the peer comes after 200 ms; a lost
// wake-up would sleep the whole 20 s.
const double kWokenWithin = std::chrono::duration<double>(test::kPrompt).count();

TEST(ShmWakeTest, SleepingReceiverIsWokenByDelayedSender) {
  for (size_t bytes : {size_t{8}, 2 * kMiB}) {  // ring, then direct copy
    TwoPairs pairs = connectThreads();
    const std::vector<uint8_t> out = pattern(bytes, 0, 1);
    std::vector<uint8_t> in(bytes);
    pairs.rank1->postRecv(envelope(1), in.data(), bytes);
    auto sender = std::async(std::launch::async, [&] {
      std::this_thread::sleep_for(milliseconds(200));
      pairs.rank0->postSend(envelope(1), out.data(), bytes);
      waitIdle(*pairs.rank0);
    });
    const double slept = sleepOnce(*pairs.rank1);
    EXPECT_GT(slept, 0.1);  // it slept until the sender came
    EXPECT_LT(slept, kWokenWithin);
    waitIdle(*pairs.rank1);
    sender.get();
    EXPECT_EQ(in, out);
  }
}

TEST(ShmWakeTest, SleepingSenderIsWokenByReceiver) {
  // A full ring (space) and a direct send (completion).
  for (const PairOptions& options : {ringOnly(4096), PairOptions{}}) {
    TwoPairs pairs = connectThreads(options, options);
    const std::vector<uint8_t> out = pattern(kMiB, 0, 2);
    std::vector<uint8_t> in(kMiB);
    pairs.rank0->postSend(envelope(2), out.data(), out.size());
    EXPECT_FALSE(pairs.rank0->progress());
    auto receiver = std::async(std::launch::async, [&] {
      std::this_thread::sleep_for(milliseconds(200));
      pairs.rank1->postRecv(envelope(2), in.data(), in.size());
      waitIdle(*pairs.rank1);
    });
    const double slept = sleepOnce(*pairs.rank0);
    EXPECT_GT(slept, 0.1);  // it slept until the receiver came
    EXPECT_LT(slept, kWokenWithin);
    waitIdle(*pairs.rank0, kTimeout, 0);  // sleep between every refill
    receiver.get();
    EXPECT_EQ(in, out);
  }
}

// Four threads on two cores pass a token round a ring of pairs, each sleeping after a
// few spins: a single lost wake-up stalls the ring until the timeout.
TEST(ShmWakeTest, OversubscribedTokenRingNeverLosesAWakeUp) {
  constexpr int kRanks = 4;
  constexpr int kRounds = 300;
  std::vector<TwoPairs> links;  // links[r]: rank r (rank0 side) to rank r+1 (rank1 side)
  for (int r = 0; r < kRanks; ++r) links.push_back(connectThreads(ringOnly(4096), ringOnly(4096)));
  const auto start = Clock::now();
  std::vector<std::future<bool>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      Pair& right = *links[r].rank0;
      Pair& left = *links[(r + kRanks - 1) % kRanks].rank1;
      uint64_t token = 0;
      for (int round = 0; round < kRounds; ++round) {
        if (r != 0 || round > 0) {
          left.postRecv(envelope(round), &token, sizeof(token));
          waitIdle(left, kTimeout, 50);
        }
        ++token;
        right.postSend(envelope(round + (r == kRanks - 1 ? 1 : 0)), &token, sizeof(token));
        waitIdle(right, kTimeout, 50);
      }
      if (r == 0) {
        left.postRecv(envelope(kRounds), &token, sizeof(token));
        waitIdle(left, kTimeout, 50);
        return token == static_cast<uint64_t>(kRanks * kRounds);
      }
      return true;
    }));
  }
  for (auto& rank : ranks) EXPECT_TRUE(rank.get());
  std::printf("[ shm ] token ring, %d ranks on %u cpus, sleeping after 50 spins: %.1f us per hop\n", kRanks,
              std::thread::hardware_concurrency(), secondsSince(start) * 1e6 / (kRanks * kRounds));
}

// ---------------------------------------------------------------------------------------
// A peer that breaks the protocol (garbage in shared memory) must get NetworkError or
// EnvelopeMismatch, never crash us.

struct FakePeer {
  std::unique_ptr<Pair> real;  // rank 0, built by createPair
  net::Socket socket;          // the fake rank 1's end
  Segment tx;                  // the fake's ring (the real pair reads it)
  Segment rx;                  // the real pair's ring
  RingControl* txControl() const { return reinterpret_cast<RingControl*>(tx.data()); }
  RingControl* rxControl() const { return reinterpret_cast<RingControl*>(rx.data()); }
  uint8_t* txRing() const { return tx.data() + kRingOffset; }
  uint8_t* rxRing() const { return rx.data() + kRingOffset; }
};

constexpr size_t kFakeRingBytes = 4096;

// Runs the handshake by hand as rank 1; `readsDirect` is the fake's probe answer.
FakePeer connectFake(bool readsDirect) {
  Listener listener;
  const auto deadline = net::deadlineAfter(kTimeout);
  auto real = std::async(std::launch::async, [&] {
    return createPair(listener.accept(deadline), false, 0, 1, "rank 1 (fake peer)", PairOptions{}, deadline);
  });
  FakePeer fake;
  std::string error;
  fake.socket = connect(listener.name(), deadline, &error);
  if (!fake.socket.valid()) throw std::runtime_error(error);
  const int one = 1;
  ::setsockopt(fake.socket.fd(), SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
  fake.tx = Segment::create("fake", kRingOffset + kFakeRingBytes);
  RingControl* control = new (fake.tx.data()) RingControl;
  control->magic = kMagic;
  control->version = kProtocolVersion;
  control->ringBytes = kFakeRingBytes;
  volatile uint64_t probeWord = 0x1234567;
  Hello hello{};
  hello.magic = kMagic;
  hello.version = kProtocolVersion;
  hello.rank = 1;
  hello.peerRank = 0;
  hello.ringBytes = kFakeRingBytes;
  hello.probeAddress = reinterpret_cast<uintptr_t>(&probeWord);
  hello.probeValue = probeWord;
  if (!sendWithDescriptor(fake.socket.fd(), &hello, sizeof(hello), fake.tx.descriptor(), deadline).ok()) {
    throw std::runtime_error("fake: send hello");
  }
  Hello theirs{};
  Ancillary ancillary;
  if (!recvWithDescriptor(fake.socket.fd(), &theirs, sizeof(theirs), deadline, &ancillary).ok()) {
    throw std::runtime_error("fake: receive hello");
  }
  fake.rx = Segment::map(std::move(ancillary.descriptor), kRingOffset + theirs.ringBytes);
  const uint8_t answer = readsDirect ? 1 : 0;
  uint8_t theirAnswer = 0;
  if (!net::sendAll(fake.socket.fd(), &answer, 1, deadline).ok() ||
      !net::recvAll(fake.socket.fd(), &theirAnswer, 1, deadline).ok()) {
    throw std::runtime_error("fake: probe answers");
  }
  fake.real = real.get();
  return fake;
}

void publishHeader(FakePeer& fake, const MessageHeader& header) {
  std::memcpy(fake.txRing(), &header, sizeof(header));
  fake.txControl()->head.store(sizeof(header), std::memory_order_release);
}

MessageHeader validHeader(size_t bytes, MessageKind kind) {
  MessageHeader header{};
  header.envelope = envelope(0);
  header.bytes = bytes;
  header.kind = static_cast<uint32_t>(kind);
  header.marker = kHeaderMarker;
  return header;
}

template <typename Error>
void expectReceiveFails(FakePeer& fake, const char* expectedText) {
  std::vector<uint8_t> in(100);
  fake.real->postRecv(envelope(0), in.data(), in.size());
  try {
    waitIdle(*fake.real);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expectedText), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1 (fake peer)"), std::string::npos) << e.what();
  }
}

TEST(ShmHostilePeerTest, HeadBeyondTheRing) {
  FakePeer fake = connectFake(false);
  fake.txControl()->head.store(3 * kFakeRingBytes, std::memory_order_release);
  expectReceiveFails<NetworkError>(fake, "head of its ring");
}

TEST(ShmHostilePeerTest, GarbageHeader) {
  FakePeer fake = connectFake(false);
  std::memset(fake.txRing(), 0xAB, kFakeRingBytes);
  fake.txControl()->head.store(kFakeRingBytes, std::memory_order_release);
  expectReceiveFails<NetworkError>(fake, "corrupt message header");
}

TEST(ShmHostilePeerTest, GarbageHeaderIsRefusedByPeek) {
  FakePeer fake = connectFake(false);
  std::memset(fake.txRing(), 0xAB, kFakeRingBytes);
  fake.txControl()->head.store(kFakeRingBytes, std::memory_order_release);
  Envelope seen;
  size_t bytes = 0;
  try {
    fake.real->peekIncoming(&seen, &bytes);
    ADD_FAILURE() << "expected NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt message header"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1 (fake peer)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fake.real->peekIncoming(&seen, &bytes), NetworkError);  // failed for good
}

TEST(ShmHostilePeerTest, HugeSizeIsAMismatch) {
  FakePeer fake = connectFake(false);
  publishHeader(fake, validHeader(uint64_t{1} << 62, MessageKind::kInline));
  expectReceiveFails<EnvelopeMismatch>(fake, "4611686018427387904 bytes");
}

TEST(ShmHostilePeerTest, DirectCopyFromAnUnmappedAddress) {
  FakePeer fake = connectFake(false);
  const MessageHeader header = validHeader(100, MessageKind::kDirect);
  std::memcpy(fake.txRing(), &header, sizeof(header));
  auto* descriptor = reinterpret_cast<DirectDescriptor*>(fake.txRing() + sizeof(header));
  descriptor->address.store(0x10);
  descriptor->state.store(kDirectPosted);
  fake.txControl()->head.store(sizeof(header) + sizeof(DirectDescriptor), std::memory_order_release);
  expectReceiveFails<NetworkError>(fake, "cannot read its send buffer");
}

TEST(ShmHostilePeerTest, DirectHeaderWithoutItsDescriptor) {
  FakePeer fake = connectFake(false);
  publishHeader(fake, validHeader(100, MessageKind::kDirect));  // head stops after the header
  expectReceiveFails<NetworkError>(fake, "without its descriptor");
}

TEST(ShmHostilePeerTest, TailMovedBeyondHead) {
  FakePeer fake = connectFake(true);
  const std::vector<uint8_t> out(kMiB, 1);
  fake.real->postSend(envelope(0), out.data(), out.size());  // direct: waits for the tail
  EXPECT_FALSE(fake.real->progress());
  fake.rxControl()->tail.store(uint64_t{1} << 40, std::memory_order_release);
  try {
    waitIdle(*fake.real);
    ADD_FAILURE() << "expected NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("tail of this rank's ring"), std::string::npos) << e.what();
  }
}

TEST(ShmHostilePeerTest, PeerThatCannotReadUsGetsRingMessages) {
  for (bool readsDirect : {false, true}) {
    FakePeer fake = connectFake(readsDirect);
    const std::vector<uint8_t> out(kMiB, 1);
    fake.real->postSend(envelope(0), out.data(), out.size());
    EXPECT_FALSE(fake.real->progress());
    ASSERT_GE(fake.rxControl()->head.load(std::memory_order_acquire), sizeof(MessageHeader));
    MessageHeader header;
    std::memcpy(&header, fake.rxRing(), sizeof(header));
    EXPECT_EQ(header.kind, static_cast<uint32_t>(readsDirect ? MessageKind::kDirect : MessageKind::kInline));
    EXPECT_EQ(header.bytes, kMiB);
  }
}

}  // namespace
}  // namespace ringtree::transport::shm
