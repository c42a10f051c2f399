// Lazy connections (RINGTREE_CONNECT=lazy, the default above 16 ranks): a communicator
// connects only to the peers a call needs, when it first needs them; ranks that dial each
// other at once end with one connection; the node arena's collectives connect nothing;
// a peer that is gone, or cannot be reached, fails the first call that needs it, named.

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/communicator.h>
#include <ringtree/error.h>
#include <ringtree/p2p.h>

#include "communicator_impl.h"
#include "harness/process_harness.h"
#include "harness/test_util.h"
#include "harness/thread_harness.h"

namespace ringtree {
namespace {

using namespace std::chrono_literals;
using test::contains;
using test::ScopedEnv;

// Returns once all `size` threads called it with the same `round` (no communication).
void threadsMeet(std::atomic<int>& arrived, int size, int round) {
  arrived.fetch_add(1);
  while (arrived.load() < size * round) std::this_thread::yield();
}

// How many of this rank's links have a connection.
int connectedLinks(Communicator& communicator) {
  const detail::Connections& connections = *communicator.impl().connections();
  int connected = 0;
  for (int index = 0; index < connections.size(); ++index) {
    if (index != connections.rank() && connections.link(index).connected()) ++connected;
  }
  return connected;
}

TEST(LazyConnect, ARingConnectsEachRankToItsTwoNeighboursOnly) {
  const ScopedEnv lazy("RINGTREE_CONNECT", "lazy");
  constexpr int kSize = 6;
  std::atomic<int> arrived{0};
  test::runCommunicators(
      kSize,
      [&](int rank, Communicator& communicator) {
        EXPECT_EQ(connectedLinks(communicator), 0);
        threadsMeet(arrived, kSize, 1);
        std::vector<int32_t> data(4096, rank + 1);
        AllreduceOptions options;
        options.algorithm = Algorithm::kRing;
        allreduce(communicator, data.data(), data.size(), DataType::kInt32, options);
        for (const int32_t value : data) ASSERT_EQ(value, kSize * (kSize + 1) / 2);
        threadsMeet(arrived, kSize, 2);  // no rank dials for the barrier below yet
        EXPECT_EQ(connectedLinks(communicator), 2);
        threadsMeet(arrived, kSize, 3);
        EXPECT_STREQ(communicator.transportTo((rank + 3) % kSize), "tcp");  // expected, not connected
        barrier(communicator);
      },
      test::testOptions(TransportKind::kTcp));
}

TEST(LazyConnect, RanksThatDialEachOtherAtOnceKeepOneConnection) {
  // An all-to-all as the first call: every pair dials both ways at the same moment.
  const ScopedEnv lazy("RINGTREE_CONNECT", "lazy");
  for (const TransportKind kind : {TransportKind::kTcp, TransportKind::kShm}) {
    SCOPED_TRACE(transportKindName(kind));
    constexpr int kSize = 5;
    constexpr size_t kCount = 1000;
    CommunicatorOptions options = test::testOptions(kind);
    test::runCommunicators(
        kSize,
        [&](int rank, Communicator& communicator) {
          for (int round = 0; round < 3; ++round) {
            std::vector<std::vector<int32_t>> in(kSize), out(kSize);
            std::vector<const void*> inputs;
            std::vector<void*> outputs;
            std::vector<size_t> counts(kSize, kCount);
            for (int peer = 0; peer < kSize; ++peer) {
              in[static_cast<size_t>(peer)].assign(kCount, rank * 1000 + peer + round);
              out[static_cast<size_t>(peer)].assign(kCount, -1);
              inputs.push_back(in[static_cast<size_t>(peer)].data());
              outputs.push_back(out[static_cast<size_t>(peer)].data());
            }
            AlltoallOptions alltoallOptions;
            alltoallOptions.algorithm = Algorithm::kPairwise;
            alltoall(communicator, inputs.data(), counts.data(), outputs.data(), counts.data(), DataType::kInt32,
                     alltoallOptions);
            for (int peer = 0; peer < kSize; ++peer) {
              for (const int32_t value : out[static_cast<size_t>(peer)]) ASSERT_EQ(value, peer * 1000 + rank + round);
            }
          }
          EXPECT_EQ(connectedLinks(communicator), kSize - 1);
          EXPECT_STREQ(communicator.transportTo((rank + 1) % kSize), transportKindName(kind));
        },
        options);
  }
}

TEST(LazyConnect, PointToPointConnectsOnFirstMessageEitherWay) {
  // Rank 0 receives from any source before anything is connected: the senders dial it.
  const ScopedEnv lazy("RINGTREE_CONNECT", "lazy");
  constexpr int kSize = 4;
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(kSize, [&](int rank) {
    CommunicatorOptions options = test::testOptions();
    options.pointToPointOnly = true;
    PointToPoint p2p(Communicator::create(store, rank, kSize, options));
    if (rank == 0) {
      std::vector<int> from;
      for (int i = 1; i < kSize; ++i) {
        int64_t value = 0;
        from.push_back(p2p.recv(&value, 1, DataType::kInt64, PointToPoint::kAnySource, 7));
        EXPECT_EQ(value, from.back() * 11);
      }
      std::sort(from.begin(), from.end());
      EXPECT_EQ(from, (std::vector<int>{1, 2, 3}));
      for (int peer = 1; peer < kSize; ++peer) p2p.send(&peer, 1, DataType::kInt32, peer, 8);
    } else {
      const int64_t value = rank * 11;
      p2p.send(&value, 1, DataType::kInt64, 0, 7);
      int32_t back = 0;
      p2p.recv(&back, 1, DataType::kInt32, 0, 8);
      EXPECT_EQ(back, rank);
    }
  });
}

TEST(LazyConnect, NodeArenaCollectivesConnectNothing) {
  const ScopedEnv lazy("RINGTREE_CONNECT", "lazy");
  constexpr int kSize = 4;
  std::atomic<int> arrived{0};
  test::runCommunicators(
      kSize,
      [&](int rank, Communicator& communicator) {
        ASSERT_NE(communicator.impl().arena(), nullptr);
        std::vector<float> data(256, static_cast<float>(rank));
        allreduce(communicator, data.data(), data.size(), DataType::kFloat32);  // shm_direct
        EXPECT_EQ(data[0], 6.0f);
        threadsMeet(arrived, kSize, 1);
        EXPECT_EQ(connectedLinks(communicator), 0);
        threadsMeet(arrived, kSize, 2);
        // A small broadcast runs as a tree over pairs: the root's and its children's only.
        int root = rank == 2 ? 17 : 0;
        BroadcastOptions options;
        options.root = 2;
        broadcast(communicator, &root, 1, DataType::kInt32, options);
        EXPECT_EQ(root, 17);
        threadsMeet(arrived, kSize, 3);
        EXPECT_LT(connectedLinks(communicator), kSize - 1 + (rank == 2 ? 1 : 0));
        threadsMeet(arrived, kSize, 4);
      },
      test::testOptions(TransportKind::kShm));
}

TEST(LazyConnect, APeerKilledBeforeItWasEverReachedIsNamedByTheFirstCallThatNeedsIt) {
  // Rank 1 dies after the rendezvous; nothing was connected to it. Over TCP, rank 0's
  // first send to it fails naming it; over shared memory (node arena, no connection),
  // the allreduce that waits for it fails the same way.
  for (const TransportKind kind : {TransportKind::kTcp, TransportKind::kShm}) {
    SCOPED_TRACE(transportKindName(kind));
    const auto results = test::runProcesses(
        3,
        [kind](int rank, std::shared_ptr<Store> store) -> std::string {
          ::setenv("RINGTREE_CONNECT", "lazy", 1);
          auto communicator = Communicator::create(store, rank, 3, test::testOptions(kind, 20s));
          store->add("created", 1);
          if (rank == 1) {
            while (store->add("created", 0) < 3) std::this_thread::sleep_for(5ms);
            store->set("rank1_ready", Bytes{1});
            ::kill(::getpid(), SIGKILL);
          }
          store->wait({"rank1_ready"}, 20s);
          std::this_thread::sleep_for(300ms);  // rank 1 is gone by now
          const auto start = std::chrono::steady_clock::now();
          std::vector<float> data(1024, 1.0f);
          try {
            allreduce(*communicator, data.data(), data.size(), DataType::kFloat32);
          } catch (const NetworkError& e) {
            const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            return std::string(e.what()) + " [after " + std::to_string(seconds) + " s]";
          }
          return "no error";
        },
        {}, 40s);
    ASSERT_EQ(results.size(), 3u);
    EXPECT_EQ(results[1].signal, SIGKILL);
    for (const int rank : {0, 2}) {
      const std::string& message = results[static_cast<size_t>(rank)].message;
      EXPECT_TRUE(contains(message, "rank 1")) << message;
      EXPECT_FALSE(contains(message, "no error")) << message;
      const size_t after = message.find("[after ");
      ASSERT_NE(after, std::string::npos) << message;
      EXPECT_LT(std::stod(message.substr(after + 7)), 10.0) << message;
    }
  }
}

TEST(LazyConnect, AnEagerRankAndALazyOneStillConnect) {
  // Rank 0 connects eagerly and waits for rank 1 to dial it; rank 1 connects lazily and
  // does not: after a second rank 0 dials it itself.
  const auto results = test::runProcesses(2, [](int rank, std::shared_ptr<Store> store) -> std::string {
    ::setenv("RINGTREE_CONNECT", rank == 0 ? "eager" : "lazy", 1);
    const auto start = std::chrono::steady_clock::now();
    auto communicator = Communicator::create(store, rank, 2, test::testOptions(TransportKind::kTcp, 20s));
    // Rank 1 needs nothing from rank 0 before rank 0's creation returned.
    if (rank == 0) store->set("rank0_created", Bytes{1});
    if (rank == 1) store->wait({"rank0_created"}, 20s);
    int32_t value = rank + 1;
    allreduce(*communicator, &value, 1, DataType::kInt32);
    const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::to_string(value) + " after " + std::to_string(seconds) + " s";
  });
  for (const auto& result : results) {
    ASSERT_TRUE(result.exited && result.code == 0) << result.message;
    EXPECT_EQ(result.message.substr(0, 2), "3 ") << result.message;
    EXPECT_LT(std::stod(result.message.substr(result.message.find("after ") + 6)), 5.0) << result.message;
  }
}

TEST(LazyConnect, APeerThatClosedBeforeItWasNeededIsNamedAtOnce) {
  // Rank 1 destroys its communicator (its listeners close; the process lives on) before
  // rank 0 ever needed it: rank 0's first send to it fails at once, saying so.
  const ScopedEnv lazy("RINGTREE_CONNECT", "lazy");
  const std::shared_ptr<Store> store = test::freshStore();
  std::atomic<bool> created{false};
  test::runOnThreads(2, [&](int rank) {
    CommunicatorOptions options = test::testOptions(TransportKind::kTcp, 3s);
    options.pointToPointOnly = true;
    auto communicator = Communicator::create(store, rank, 2, options);
    if (rank == 1) {
      communicator.reset();  // its connections (listeners) close
      created = true;
      return;
    }
    test::waitForFlag(created);
    PointToPoint p2p(communicator);
    const int32_t value = 5;
    const auto start = std::chrono::steady_clock::now();
    const std::string message = test::messageOf<NetworkError>([&] { p2p.send(&value, 1, DataType::kInt32, 1, 0); });
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1s) << message;
    EXPECT_TRUE(contains(message, "rank 0 cannot connect to rank 1 (host '")) << message;
    EXPECT_TRUE(contains(message, "it no longer accepts connections")) << message;
  });
}

}  // namespace
}  // namespace ringtree
