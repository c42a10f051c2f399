// BeforeWaiting: the hook a front installs to learn, once, that a call goes from a short
// spin to a real wait (the Python bindings release the GIL there). On its own (install,
// nesting, once, a hook that is not done, per thread), then in the calls that wait: a
// blocking receive and a collective run it only when they wait for a peer that is not
// about to answer, and never when the data had arrived.

#include <ringtree/before_waiting.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/communicator.h>
#include <ringtree/p2p.h>

#include "harness/test_util.h"
#include "harness/thread_harness.h"

namespace ringtree {
namespace {

using namespace std::chrono_literals;

// A hook that counts its runs and says it is done unless told otherwise.
struct Counter {
  int runs = 0;
  bool done = true;
  static bool hook(void* self) {
    auto* counter = static_cast<Counter*>(self);
    ++counter->runs;
    return counter->done;
  }
};

TEST(BeforeWaitingTest, RunsOnceThenNotAgainAndNothingWithoutAnInstall) {
  BeforeWaiting::notify();  // none installed: nothing happens
  Counter counter;
  {
    const BeforeWaiting hook(&Counter::hook, &counter);
    BeforeWaiting::notify();
    BeforeWaiting::notify();
    EXPECT_EQ(counter.runs, 1);
  }
  BeforeWaiting::notify();
  EXPECT_EQ(counter.runs, 1);
}

TEST(BeforeWaitingTest, AHookThatIsNotDoneStaysForTheNextWait) {
  Counter counter;
  counter.done = false;
  const BeforeWaiting hook(&Counter::hook, &counter);
  BeforeWaiting::notify();
  BeforeWaiting::notify();
  counter.done = true;
  BeforeWaiting::notify();
  BeforeWaiting::notify();
  EXPECT_EQ(counter.runs, 3);
}

TEST(BeforeWaitingTest, InstallsNestAndAreThreadLocal) {
  Counter outer;
  Counter inner;
  Counter other;
  const BeforeWaiting outerHook(&Counter::hook, &outer);
  {
    const BeforeWaiting innerHook(&Counter::hook, &inner);
    std::thread([&] {
      const BeforeWaiting otherHook(&Counter::hook, &other);
      BeforeWaiting::notify();
    }).join();
    BeforeWaiting::notify();
  }
  EXPECT_EQ(inner.runs, 1);
  EXPECT_EQ(other.runs, 1);
  EXPECT_EQ(outer.runs, 0);  // restored, not run
  BeforeWaiting::notify();
  EXPECT_EQ(outer.runs, 1);
}

class BeforeWaitingCallTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(BeforeWaitingCallTest, ABlockingReceiveRunsItOnlyWhenItWaits) {
  // Rank 1 receives a message that has arrived (no hook run), then one that rank 0 sends
  // half a second later (one run, long before the message comes).
  std::atomic<bool> firstSent{false};
  std::atomic<bool> hookRan{false};
  const auto store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    PointToPoint p2p(Communicator::create(store, rank, 2, test::testOptions(GetParam(), 20s)));
    std::vector<int32_t> data(4, rank);
    if (rank == 0) {
      p2p.send(data.data(), data.size(), DataType::kInt32, 1, 0);
      firstSent = true;
      std::this_thread::sleep_for(500ms);
      EXPECT_TRUE(hookRan.load());  // rank 1 has been waiting for a while
      p2p.send(data.data(), data.size(), DataType::kInt32, 1, 0);
      return;
    }
    test::waitForFlag(firstSent);
    Counter counter;
    const auto hook = [](void* self) {
      Counter::hook(self);
      return true;
    };
    {
      const BeforeWaiting installed(hook, &counter);
      std::this_thread::sleep_for(50ms);  // the message is there
      p2p.recv(data.data(), data.size(), DataType::kInt32, 0, 0);
    }
    EXPECT_EQ(counter.runs, 0);
    const BeforeWaiting installed(
        [](void* flag) {
          static_cast<std::atomic<bool>*>(flag)->store(true);
          return true;
        },
        &hookRan);
    p2p.recv(data.data(), data.size(), DataType::kInt32, 0, 0);
    EXPECT_EQ(data, std::vector<int32_t>(4, 0));
  });
}

TEST_P(BeforeWaitingCallTest, ACollectiveRunsItOnlyWhenItWaits) {
  // Rank 0 enters its first allreduce half a second after rank 1 (rank 1 waits: one run),
  // its second after rank 1 has long been waiting in it (rank 0 finds the data there: no
  // run there, one on rank 1).
  std::vector<int> runs(2, 0);
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    const auto hook = [](void* self) {
      ++*static_cast<int*>(self);
      return true;
    };
    std::vector<float> data(16, 1.0f);
    if (rank == 0) std::this_thread::sleep_for(500ms);
    {
      const BeforeWaiting installed(hook, &runs[static_cast<size_t>(rank)]);
      allreduce(comm, data.data(), data.size(), DataType::kFloat32);
    }
    EXPECT_EQ(runs[static_cast<size_t>(rank)], rank == 1 ? 1 : 0) << "rank " << rank;
    if (rank == 0) std::this_thread::sleep_for(500ms);
    int second = 0;
    {
      const BeforeWaiting installed(hook, &second);
      allreduce(comm, data.data(), data.size(), DataType::kFloat32);
    }
    EXPECT_EQ(second, rank == 1 ? 1 : 0) << "rank " << rank;
    EXPECT_EQ(data, std::vector<float>(16, 4.0f));
  }, test::testOptions(GetParam(), 20s));
}

INSTANTIATE_TEST_SUITE_P(Transports, BeforeWaitingCallTest, ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         [](const ::testing::TestParamInfo<TransportKind>& info) { return transportKindName(info.param); });

}  // namespace
}  // namespace ringtree
