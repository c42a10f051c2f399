// Every collective algorithm x world sizes 1..8 x transports x counts x every valid
// (dtype, op), in place, over the thread harness. Inputs are small integers, so every
// result is exact and is compared bit for bit with a reference folded locally, rank by
// rank, with the same element kernels (which reduce_ops_test checks against scalar code).

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "algorithms/reduce_ops.h"
#include "arena/node_arena.h"
#include "communicator_impl.h"
#include "harness/mismatch.h"
#include "harness/test_util.h"
#include "harness/thread_harness.h"
#include "harness/typed_values.h"

namespace ringtree {
namespace {

using algorithms::reduceFunction;
using test::store;

enum class Kind { kAllreduce, kBroadcast, kReduce };

struct Case {
  Kind kind;
  Algorithm algorithm;
  DataType type;
  ReduceOp op;
  size_t count;
  int root;
  size_t maxSegmentBytes;
};

std::string describe(const Case& c) {
  const char* kinds[] = {"allreduce", "broadcast", "reduce"};
  return std::string(kinds[static_cast<int>(c.kind)]) + "/" + algorithmName(c.algorithm) + "/" +
         dataTypeName(c.type) + "/" + reduceOpName(c.op) + "/count=" + std::to_string(c.count) +
         "/root=" + std::to_string(c.root) + "/segment=" + std::to_string(c.maxSegmentBytes);
}

// Rank r's input element i for op: small values whose sums and products stay exact.
double inputValue(ReduceOp op, int rank, size_t i) {
  switch (op) {
    case ReduceOp::kProduct: return static_cast<double>((rank + i) % 2 + 1);
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: return static_cast<double>((rank * 37 + i * 11) % 128);
    default: return static_cast<double>((rank * 7 + i * 3) % 5 + 1);
  }
}

std::vector<uint8_t> input(const Case& c, int rank) {
  const size_t es = elementSize(c.type);
  std::vector<uint8_t> data(c.count * es);
  for (size_t i = 0; i < c.count; ++i) {
    store(c.type, inputValue(c.op, rank, i), data.data() + i * es);
  }
  return data;
}

// The reduction of every rank's input, folded in rank order.
std::vector<uint8_t> reduced(const Case& c, int n, double premulFactor) {
  std::vector<uint8_t> result = input(c, 0);
  if (c.op == ReduceOp::kPremulSum) algorithms::scale(result.data(), c.count, c.type, premulFactor);
  const ReduceFn fn = reduceFunction(c.type, c.op);
  for (int r = 1; r < n; ++r) {
    std::vector<uint8_t> other = input(c, r);
    if (c.op == ReduceOp::kPremulSum) algorithms::scale(other.data(), c.count, c.type, premulFactor);
    fn(result.data(), other.data(), c.count);
  }
  if (c.op == ReduceOp::kAvg) algorithms::divide(result.data(), c.count, c.type, n);
  return result;
}

// Every case for n ranks; shm adds shm_direct (which needs the node arena that an
// all-shm communicator has), with one more size that takes two-shot in a single step.
std::vector<Case> casesFor(int n, TransportKind transport) {
  const DataType types[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                            DataType::kInt8,    DataType::kUInt8,    DataType::kInt16,   DataType::kInt32,
                            DataType::kInt64,   DataType::kBool,     DataType::kComplex64, DataType::kComplex128};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg,  ReduceOp::kProduct, ReduceOp::kMin,       ReduceOp::kMax,
                          ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor,    ReduceOp::kPremulSum};
  // {count, maxSegmentBytes}: 0, 1, odd, > a segment, many segments.
  const std::pair<size_t, size_t> sizes[] = {{0, 0}, {1, 0}, {7, 0}, {1023, 0}, {5000, 256}};
  const bool shm = transport == TransportKind::kShm;
  std::vector<Case> cases;
  for (DataType type : types) {
    for (ReduceOp op : ops) {
      if (!isSupported(type, op)) continue;
      for (auto [count, segment] : sizes) {
        for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kHalvingDoubling}) {
          cases.push_back({Kind::kAllreduce, a, type, op, count, 0, segment});
        }
        if (shm) cases.push_back({Kind::kAllreduce, Algorithm::kShmDirect, type, op, count, 0, segment});
        for (Algorithm a : {Algorithm::kTree, Algorithm::kRing}) {
          cases.push_back({Kind::kReduce, a, type, op, count, static_cast<int>(count % n), segment});
        }
      }
    }
    for (auto [count, segment] : sizes) {
      for (int root = 0; root < n; ++root) {
        for (Algorithm a : {Algorithm::kTree, Algorithm::kChain}) {
          cases.push_back({Kind::kBroadcast, a, type, ReduceOp::kSum, count, root, segment});
        }
        if (shm) cases.push_back({Kind::kBroadcast, Algorithm::kShmDirect, type, ReduceOp::kSum, count, root, segment});
      }
    }
    if (shm) {
      for (ReduceOp op : ops) {
        if (isSupported(type, op)) cases.push_back({Kind::kAllreduce, Algorithm::kShmDirect, type, op, 20000, 0, 0});
      }
    }
  }
  return cases;
}

void runCase(Communicator& comm, const Case& c) {
  const int rank = comm.rank();
  const int n = comm.size();
  constexpr double kFactor = 2.0;
  std::vector<uint8_t> buffer = input(c, rank);
  const std::vector<uint8_t> original = buffer;
  std::vector<uint8_t> expected;
  switch (c.kind) {
    case Kind::kAllreduce: {
      AllreduceOptions o;
      o.algorithm = c.algorithm;
      o.op = c.op;
      o.premulFactor = kFactor;
      o.maxSegmentBytes = c.maxSegmentBytes;
      allreduce(comm, buffer.data(), c.count, c.type, o);
      expected = reduced(c, n, kFactor);
      break;
    }
    case Kind::kReduce: {
      ReduceOptions o;
      o.algorithm = c.algorithm;
      o.op = c.op;
      o.root = c.root;
      o.premulFactor = kFactor;
      o.maxSegmentBytes = c.maxSegmentBytes;
      reduce(comm, buffer.data(), c.count, c.type, o);
      expected = rank == c.root ? reduced(c, n, kFactor) : original;
      break;
    }
    case Kind::kBroadcast: {
      BroadcastOptions o;
      o.algorithm = c.algorithm;
      o.root = c.root;
      o.maxSegmentBytes = c.maxSegmentBytes;
      broadcast(comm, buffer.data(), c.count, c.type, o);
      expected = input(c, c.root);
      break;
    }
  }
  ASSERT_EQ(buffer, expected) << describe(c) << " on rank " << rank << " of " << n;
}

class AlgorithmGrid : public ::testing::TestWithParam<std::tuple<TransportKind, int>> {};

TEST_P(AlgorithmGrid, EveryCaseIsExact) {
  const auto [transport, n] = GetParam();
  const std::vector<Case> cases = casesFor(n, transport);
  test::runCommunicators(n, [&](int, Communicator& comm) {
    for (const Case& c : cases) {
      test::runNamedCase([&] { return describe(c); }, [&] { runCase(comm, c); });
      if (::testing::Test::HasFatalFailure()) return;
    }
    barrier(comm);
  }, test::testOptions(transport));
}

std::string gridName(const ::testing::TestParamInfo<std::tuple<TransportKind, int>>& info) {
  const auto [transport, n] = info.param;
  return std::string(transportKindName(transport)) + "_" + std::to_string(n) + "ranks";
}

INSTANTIATE_TEST_SUITE_P(Tcp, AlgorithmGrid,
                         ::testing::Combine(::testing::Values(TransportKind::kTcp), ::testing::Range(1, 9)), gridName);
INSTANTIATE_TEST_SUITE_P(Shm, AlgorithmGrid,
                         ::testing::Combine(::testing::Values(TransportKind::kShm), ::testing::Range(1, 9)), gridName);

TEST(Algorithms, UnsupportedTypeOpThrowsBeforeAnyDataMoves) {
  test::runCommunicators(2, [&](int, Communicator& comm) {
    std::vector<float> data(4, 1.0f);
    AllreduceOptions o;
    o.op = ReduceOp::kBand;
    EXPECT_THROW(allreduce(comm, data.data(), data.size(), DataType::kFloat32, o), InvalidArgument);
    o.op = ReduceOp::kMax;
    EXPECT_THROW(allreduce(comm, data.data(), 2, DataType::kComplex64, o), InvalidArgument);
    o = AllreduceOptions{};
    o.algorithm = Algorithm::kChain;
    EXPECT_THROW(allreduce(comm, data.data(), data.size(), DataType::kFloat32, o), InvalidArgument);
    BroadcastOptions b;
    b.root = 2;
    EXPECT_THROW(broadcast(comm, data.data(), data.size(), DataType::kFloat32, b), InvalidArgument);
    // Nothing was sent: the communicator still works.
    allreduce(comm, data.data(), data.size(), DataType::kFloat32);
    EXPECT_EQ(data[0], 2.0f);
  }, test::testOptions(TransportKind::kTcp));
}

TEST(Algorithms, MismatchedCallsFailOnBothRanksNamingBothCalls) {
  std::vector<std::string> messages(2);
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    std::vector<float> data(16, 1.0f);
    try {
      if (rank == 0) {
        allreduce(comm, data.data(), data.size(), DataType::kFloat32);
      } else {
        BroadcastOptions o;
        broadcast(comm, data.data(), data.size(), DataType::kFloat32, o);
      }
      ADD_FAILURE() << "rank " << rank << " did not detect the mismatch";
    } catch (const CollectiveMismatchError& e) {
      messages[rank] = e.what();
    }
    // The communicator is unusable afterwards, and says why.
    EXPECT_THROW(barrier(comm), Error);
  }, test::testOptions(TransportKind::kTcp));
  for (const auto& m : messages) {
    EXPECT_NE(m.find("allreduce(seq=1"), std::string::npos) << m;
    EXPECT_NE(m.find("broadcast(seq=1"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
  }
}

TEST(Algorithms, CountMismatchIsReported) {
  std::vector<std::string> messages(2);
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    std::vector<int32_t> data(16, 1);
    try {
      allreduce(comm, data.data(), rank == 0 ? 16 : 8, DataType::kInt32);
      ADD_FAILURE() << "rank " << rank << " did not detect the mismatch";
    } catch (const CollectiveMismatchError& e) {
      messages[rank] = e.what();
    }
  }, test::testOptions(TransportKind::kTcp));
  for (const auto& m : messages) {
    EXPECT_NE(m.find("count=16"), std::string::npos) << m;
    EXPECT_NE(m.find("count=8"), std::string::npos) << m;
  }
}

TEST(Algorithms, TimeoutNamesThePeerAndComesBackInTime) {
  std::atomic<bool> timedOut{false};
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    if (rank == 1) {
      const test::SetOnExit setTimedOut(timedOut);
      std::vector<float> data(4, 1.0f);
      AllreduceOptions o;
      o.timeout = std::chrono::milliseconds(300);
      const auto start = std::chrono::steady_clock::now();
      try {
        allreduce(comm, data.data(), data.size(), DataType::kFloat32, o);
        ADD_FAILURE() << "no timeout";
      } catch (const TimeoutError& e) {
        const auto elapsed = std::chrono::steady_clock::now() - start;
        // At its deadline, not before, and not much later.
        EXPECT_GE(elapsed, std::chrono::milliseconds(290));
        EXPECT_LT(elapsed, std::chrono::milliseconds(300) + test::kLateBy);
        EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
      }
    } else {
      // Rank 0 never enters the collective but stays connected until rank 1 timed out.
      test::waitForFlag(timedOut);
    }
  }, test::testOptions(TransportKind::kTcp));
}

// ---------------------------------------------------------------------------------------
// shm_direct and the node arena.

using test::contains;
using test::expectMismatchOnBothRanks;
using test::ScopedEnv;

TEST(ShmDirect, ArenaExistsExactlyWhenEveryPairIsShm) {
  for (int n : {2, 3}) {
    test::runCommunicators(n, [&](int, Communicator& comm) {
      ASSERT_NE(comm.impl().arena(), nullptr);
      EXPECT_EQ(comm.impl().arena()->size(), n);
      EXPECT_EQ(comm.impl().arena()->rank(), comm.rank());
    }, test::testOptions(TransportKind::kShm));
  }
  test::runCommunicators(2, [&](int, Communicator& comm) { EXPECT_EQ(comm.impl().arena(), nullptr); },
                         test::testOptions(TransportKind::kTcp));
  test::runCommunicators(1, [&](int, Communicator& comm) { EXPECT_EQ(comm.impl().arena(), nullptr); },
                         test::testOptions(TransportKind::kShm));
  {
    ScopedEnv off("RINGTREE_SHM_ARENA", "0");
    test::runCommunicators(2, [&](int, Communicator& comm) {
      EXPECT_EQ(comm.impl().arena(), nullptr);
      barrier(comm);  // dissemination over the pairs
    }, test::testOptions(TransportKind::kShm));
  }
  {
    ScopedEnv bad("RINGTREE_SHM_ARENA", "yes");
    EXPECT_THROW(test::runCommunicators(2, [&](int, Communicator&) {}, test::testOptions(TransportKind::kShm)),
                 test::RankFailure);
  }
}

TEST(ShmDirect, NeedsTheArena) {
  test::runCommunicators(2, [&](int, Communicator& comm) {
    std::vector<float> data(4, 1.0f);
    AllreduceOptions o;
    o.algorithm = Algorithm::kShmDirect;
    try {
      allreduce(comm, data.data(), data.size(), DataType::kFloat32, o);
      ADD_FAILURE() << "shm_direct ran without an arena";
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(contains(e.what(), "shm_direct needs every rank on one host with shared memory")) << e.what();
    }
    BroadcastOptions b;
    b.algorithm = Algorithm::kShmDirect;
    EXPECT_THROW(broadcast(comm, data.data(), data.size(), DataType::kFloat32, b), InvalidArgument);
    ReduceOptions r;
    r.algorithm = Algorithm::kShmDirect;
    EXPECT_THROW(reduce(comm, data.data(), data.size(), DataType::kFloat32, r), InvalidArgument);
    EXPECT_EQ(data[0], 1.0f);  // the refused calls left the buffer alone
  }, test::testOptions(TransportKind::kTcp));
  {
    // Named by RINGTREE_ALGO it is ignored where it cannot run. Set before the ranks
    // start: a rank thread's setenv would race with the other's getenv.
    ScopedEnv algo("RINGTREE_ALGO", "shm_direct");
    test::runCommunicators(2, [&](int, Communicator& comm) {
      std::vector<float> data(4, 1.0f);
      allreduce(comm, data.data(), data.size(), DataType::kFloat32);
      EXPECT_EQ(data[0], 2.0f);
    }, test::testOptions(TransportKind::kTcp));
  }
  // A single rank needs no arena.
  test::runCommunicators(1, [&](int, Communicator& comm) {
    std::vector<float> data(4, 3.0f);
    AllreduceOptions o;
    o.algorithm = Algorithm::kShmDirect;
    allreduce(comm, data.data(), data.size(), DataType::kFloat32, o);
    EXPECT_EQ(data[0], 3.0f);
  }, test::testOptions(TransportKind::kTcp));
  EXPECT_EQ(parseAlgorithm("shm_direct"), Algorithm::kShmDirect);
  EXPECT_STREQ(algorithmName(Algorithm::kShmDirect), "shm_direct");
}

TEST(ShmDirect, BarrierWaitsForEveryRank) {
  constexpr int kRounds = 200;
  for (int n : {2, 4, 5}) {
    std::vector<std::atomic<int>> arrived(kRounds);
    test::runCommunicators(n, [&](int rank, Communicator& comm) {
      ASSERT_NE(comm.impl().arena(), nullptr);
      for (int round = 0; round < kRounds; ++round) {
        // A different rank is late in each round (sometimes long enough to sleep).
        if ((round + rank) % n == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(round % 7 == 0 ? 2000 : 20));
        }
        arrived[static_cast<size_t>(round)].fetch_add(1);
        barrier(comm);
        ASSERT_EQ(arrived[static_cast<size_t>(round)].load(), n) << "round " << round << " on rank " << rank;
      }
    }, test::testOptions(TransportKind::kShm));
  }
}

// A random sequence of arena and pair collectives (the same on every rank): arena slots
// are reused across calls of different kinds and sizes, and ranks run ahead of each other.
TEST(ShmDirect, MixedSequencesStayExact) {
  for (int n : {2, 3, 4, 7}) {
    test::runCommunicators(n, [&](int rank, Communicator& comm) {
      std::mt19937 random(1234);  // same seed: every rank draws the same calls
      for (int i = 0; i < 200; ++i) {
        const size_t counts[] = {0, 1, 5, 1000, 20000, 150000};
        Case c;
        const unsigned kind = random() % 5;
        c.kind = kind < 2 ? Kind::kAllreduce : kind < 4 ? Kind::kBroadcast : Kind::kReduce;
        c.algorithm = random() % 4 != 0 ? Algorithm::kShmDirect
                      : c.kind == Kind::kBroadcast ? Algorithm::kChain : Algorithm::kRing;
        if (c.kind == Kind::kReduce) c.algorithm = Algorithm::kTree;
        c.type = random() % 2 == 0 ? DataType::kFloat32 : DataType::kInt16;
        c.op = random() % 2 == 0 ? ReduceOp::kSum : ReduceOp::kMax;
        c.count = counts[random() % 6];
        c.root = static_cast<int>(random() % static_cast<unsigned>(n));
        c.maxSegmentBytes = random() % 3 == 0 ? 4096 : 0;
        if (random() % 8 == 0) barrier(comm);
        if ((random() + static_cast<unsigned>(rank)) % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
        test::runNamedCase([&] { return describe(c); }, [&] { runCase(comm, c); });
        if (::testing::Test::HasFatalFailure()) return;
      }
    }, test::testOptions(TransportKind::kShm));
  }
}

// Large enough for two-shot and broadcast to take several steps of half a default slot.
TEST(ShmDirect, MessagesOfSeveralSlotsAreExact) {
  for (int n : {2, 3}) {
    test::runCommunicators(n, [&](int rank, Communicator& comm) {
      const size_t count = (size_t{5} << 20) / 4 + 3;  // 5 MiB of float32 and 3 elements
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>((i + static_cast<size_t>(rank)) % 1000);
      AllreduceOptions o;
      o.algorithm = Algorithm::kShmDirect;
      allreduce(comm, data.data(), count, DataType::kFloat32, o);
      for (size_t i = 0; i < count; ++i) {
        float expected = 0;
        for (int r = 0; r < n; ++r) expected += static_cast<float>((i + static_cast<size_t>(r)) % 1000);
        ASSERT_EQ(data[i], expected) << "element " << i;
      }
      for (size_t i = 0; i < count; ++i) data[i] = rank == 1 ? static_cast<float>(i % 4099) : -1.0f;
      BroadcastOptions b;
      b.algorithm = Algorithm::kShmDirect;
      b.root = 1;
      broadcast(comm, data.data(), count, DataType::kFloat32, b);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], static_cast<float>(i % 4099)) << "element " << i;
    }, test::testOptions(TransportKind::kShm));
  }
}

// A broadcast whose first piece wraps to the start of the slot's rotating pages right
// after a piece that ended near their end: the two must not overlap (a root waiting there
// for readers of the step before would wait for a step they publish only after reading
// this one). Every length of a preceding piece that leaves the cursor near the end.
TEST(ShmDirect, BroadcastAfterAPieceOfAnyLengthDoesNotWaitForItself) {
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    const size_t largest = comm.impl().arena()->maxStepBytes();
    const size_t page = arena::NodeArena::kPieceAlignment;
    std::vector<uint8_t> data(2 * largest);
    BroadcastOptions o;
    o.algorithm = Algorithm::kShmDirect;
    for (size_t pages = largest / page - 24; pages <= largest / page; pages += 2) {
      for (const size_t bytes : {pages * page, 2 * largest}) {
        std::fill(data.begin(), data.end(), rank == 0 ? static_cast<uint8_t>(pages) : uint8_t{0});
        broadcast(comm, data.data(), bytes, DataType::kUInt8, o);
        ASSERT_EQ(data[bytes - 1], static_cast<uint8_t>(pages)) << bytes << " bytes after " << pages << " pages";
      }
    }
  }, test::testOptions(TransportKind::kShm, std::chrono::seconds(5)));
}

// MIN/MAX pick between -0 and +0 by operand order: every part, whichever rank owns it,
// must be folded in rank order (the other ops may be folded in either order).
TEST(ShmDirect, MinAndMaxFoldInRankOrder) {
  for (int n : {2, 3}) {
    test::runCommunicators(n, [&](int rank, Communicator& comm) {
      for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
        for (size_t count : {size_t{3}, size_t{40000}}) {  // one-shot, two-shot
          std::vector<float> data(count, rank % 2 == 0 ? -0.0f : 0.0f);
          std::vector<float> expected(count, -0.0f);
          const ReduceFn fn = reduceFunction(DataType::kFloat32, op);
          for (int r = 1; r < n; ++r) {
            const std::vector<float> other(count, r % 2 == 0 ? -0.0f : 0.0f);
            fn(expected.data(), other.data(), count);
          }
          AllreduceOptions o;
          o.algorithm = Algorithm::kShmDirect;
          o.op = op;
          allreduce(comm, data.data(), count, DataType::kFloat32, o);
          ASSERT_EQ(std::memcmp(data.data(), expected.data(), count * sizeof(float)), 0)
              << reduceOpName(op) << " of " << count << " on rank " << rank << " of " << n;
        }
      }
    }, test::testOptions(TransportKind::kShm));
  }
}

TEST(ShmDirect, MismatchedCollectivesFailOnBothRanksNamingBothCalls) {
  expectMismatchOnBothRanks(TransportKind::kShm, [](int rank, Communicator& comm) {
    std::vector<float> data(16, 1.0f);
    if (rank == 0) {
      AllreduceOptions o;
      o.algorithm = Algorithm::kShmDirect;
      allreduce(comm, data.data(), data.size(), DataType::kFloat32, o);
    } else {
      BroadcastOptions o;
      o.algorithm = Algorithm::kShmDirect;
      broadcast(comm, data.data(), data.size(), DataType::kFloat32, o);
    }
  }, {"allreduce(seq=1", "broadcast(seq=1", "shm_direct"});
}

TEST(ShmDirect, CountMismatchIsReported) {
  expectMismatchOnBothRanks(TransportKind::kShm, [](int rank, Communicator& comm) {
    std::vector<int32_t> data(16, 1);
    AllreduceOptions o;
    o.algorithm = Algorithm::kShmDirect;
    allreduce(comm, data.data(), rank == 0 ? 16 : 8, DataType::kInt32, o);
  }, {"count=16", "count=8"});
}

TEST(ShmDirect, BarrierAgainstAllreduceIsReported) {
  expectMismatchOnBothRanks(TransportKind::kShm, [](int rank, Communicator& comm) {
    std::vector<float> data(3, 1.0f);
    if (rank == 0) {
      barrier(comm);
    } else {
      AllreduceOptions o;
      o.algorithm = Algorithm::kShmDirect;
      allreduce(comm, data.data(), data.size(), DataType::kFloat32, o);
    }
  }, {"barrier(seq=1", "allreduce(seq=1"});
}

// One rank over the arena, the other over the pairs: the arena side sees the other's
// published call and tells it over the pair.
TEST(ShmDirect, ArenaAgainstPairAlgorithmIsReported) {
  expectMismatchOnBothRanks(TransportKind::kShm, [](int rank, Communicator& comm) {
    std::vector<float> data(64, 1.0f);
    AllreduceOptions o;
    o.algorithm = rank == 0 ? Algorithm::kShmDirect : Algorithm::kRing;
    allreduce(comm, data.data(), data.size(), DataType::kFloat32, o);
  }, {"algorithm=shm_direct", "algorithm=ring"});
}

TEST(ShmDirect, TimeoutNamesTheRankThatDidNotArrive) {
  test::Arrivals timedOut;
  test::runCommunicators(3, [&](int rank, Communicator& comm) {
    if (rank == 0) {
      // Never enters the collective but stays connected until the others timed out.
      timedOut.waitFor(2);
      return;
    }
    std::vector<float> data(4, 1.0f);
    AllreduceOptions o;
    o.algorithm = Algorithm::kShmDirect;
    o.timeout = std::chrono::milliseconds(300);
    const auto start = std::chrono::steady_clock::now();
    try {
      allreduce(comm, data.data(), data.size(), DataType::kFloat32, o);
      ADD_FAILURE() << "no timeout";
    } catch (const TimeoutError& e) {
      const auto elapsed = std::chrono::steady_clock::now() - start;
      // At its deadline, not before, and not much later.
      EXPECT_GE(elapsed, std::chrono::milliseconds(290));
      EXPECT_LT(elapsed, std::chrono::milliseconds(300) + test::kLateBy);
      EXPECT_TRUE(contains(e.what(), "rank 0 (")) << e.what();
      EXPECT_FALSE(contains(e.what(), rank == 1 ? "rank 2 (" : "rank 1 (")) << e.what();
      EXPECT_TRUE(contains(e.what(), "allreduce(seq=1")) << e.what();
    }
    timedOut.arrive();
  }, test::testOptions(TransportKind::kShm));
}

TEST(ShmDirect, PeerThatLeavesFailsTheOthersQuickly) {
  test::runCommunicators(3, [&](int rank, Communicator& comm) {
    if (rank == 2) return;  // closes its connections without entering the collective
    std::vector<float> data(1 << 20, 1.0f);
    AllreduceOptions o;
    o.algorithm = Algorithm::kShmDirect;
    const auto start = std::chrono::steady_clock::now();
    try {
      allreduce(comm, data.data(), data.size(), DataType::kFloat32, o);
      ADD_FAILURE() << "no error";
    } catch (const NetworkError& e) {
      EXPECT_LT(std::chrono::steady_clock::now() - start, test::kPrompt);  // not at the 20 s timeout
      EXPECT_TRUE(contains(e.what(), "rank 2 (")) << e.what();
    }
  }, test::testOptions(TransportKind::kShm));
}

}  // namespace
}  // namespace ringtree
