// Point-to-point messages (PointToPoint: isend/irecv, blocking send/recv) over TCP and
// shared memory between threads and processes: ping-pong of every size class, many
// messages in flight both ways at 2..4 ranks, tag matching out of order, FIFO order per
// tag, receives from any source, large messages posted before and after their receive
// (left with the sender until then), type/count mismatches, peers that shut down or are
// killed, timeouts, shutdown with pending operations, argument errors, callbacks that
// submit more work; blocking calls mixed with asynchronous ones from other threads on
// the same engines; Work::wait() driving progress (from the posting thread, from other
// threads, with timeouts, in reverse order, through a killed peer). (Latency and
// bandwidth figures: benchmarks/p2p_bench.cc.)

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include <ringtree/communicator.h>
#include <ringtree/error.h>
#include <ringtree/p2p.h>
#include <ringtree/work.h>

#include "common/socket.h"
#include "communicator_impl.h"
#include "p2p/engine.h"
#include "harness/process_harness.h"
#include "harness/test_util.h"
#include "harness/thread_harness.h"
#include "transport/pair.h"

namespace ringtree {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::contains;
using test::elapsedSince;
using test::messageOf;
using test::SetOnExit;
using test::runOnThreads;
using test::testOptions;
using test::waitForFlag;

constexpr size_t kMiB = size_t{1} << 20;
constexpr int kAny = PointToPoint::kAnySource;
// int32 elements of a message too large for the kernel's socket buffers (so a TCP send of
// it cannot finish before the receiver reads) and above shm's direct-copy threshold.
constexpr size_t kHugeCount = 12 * kMiB;

// The int32 values of message `seed`: every message and position differs.
std::vector<int32_t> values(size_t count, uint32_t seed) {
  std::vector<int32_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(seed * 2654435761u + static_cast<uint32_t>(i) * 31u);
  return v;
}

std::shared_ptr<Work> send(PointToPoint& p2p, const std::vector<int32_t>& data, int peer, int tag) {
  return p2p.isend(data.data(), data.size(), DataType::kInt32, peer, tag);
}

std::shared_ptr<Work> recv(PointToPoint& p2p, std::vector<int32_t>& data, int peer, int tag) {
  return p2p.irecv(data.data(), data.size(), DataType::kInt32, peer, tag);
}

void blockingSend(PointToPoint& p2p, const std::vector<int32_t>& data, int peer, int tag) {
  p2p.send(data.data(), data.size(), DataType::kInt32, peer, tag);
}

int blockingRecv(PointToPoint& p2p, std::vector<int32_t>& data, int peer, int tag) {
  return p2p.recv(data.data(), data.size(), DataType::kInt32, peer, tag);
}

// Runs body(rank, p2p) on `size` threads, each with a PointToPoint over a communicator of
// its own (one fresh store); the engines are destroyed when the bodies return.
void runEngines(int size, TransportKind kind, const std::function<void(int rank, PointToPoint& p2p)>& body,
                std::chrono::milliseconds timeout = 20s) {
  const auto store = test::freshStore();
  runOnThreads(size, [&](int rank) {
    PointToPoint p2p(Communicator::create(store, rank, size, testOptions(kind, timeout)));
    body(rank, p2p);
  });
}

// Runs every job on a thread of its own and joins them all; rethrows the first failure.
void inParallel(const std::vector<std::function<void()>>& jobs) {
  std::vector<std::exception_ptr> errors(jobs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < jobs.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        jobs[i]();
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// The message the operation failed with; "" (after recording a failure) when it did not
// fail with an E.
template <typename E>
std::string failureOf(const std::shared_ptr<Work>& work, std::chrono::milliseconds timeout = 10s) {
  return messageOf<E>([&] { work->wait(timeout); });
}

// ---------------------------------------------------------------------------------------
// Data movement, per transport

class P2pTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(P2pTest, PingPongOfEverySizeClass) {
  // 0 bytes, one element, 1 MiB, 16 MiB.
  const std::vector<size_t> counts = {0, 1, kMiB / 4, 4 * kMiB};
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    const int peer = 1 - rank;
    for (uint32_t round = 0; round < counts.size(); ++round) {
      const size_t count = counts[round];
      std::vector<int32_t> in(count, -1);
      if (rank == 0) {
        send(p2p, values(count, round), peer, 1)->wait();
        const auto work = recv(p2p, in, peer, 1);
        work->wait();
        EXPECT_EQ(work->sourceRank(), 1);
        EXPECT_EQ(in, values(count, round + 100)) << count << " elements";
      } else {
        const auto work = recv(p2p, in, peer, 1);
        work->wait();
        EXPECT_EQ(work->sourceRank(), 0);
        EXPECT_EQ(in, values(count, round)) << count << " elements";
        send(p2p, values(count, round + 100), peer, 1)->wait();
      }
    }
  });
}

// Every rank sends kMessages to every other rank while receiving as many from each: mixed
// sizes (every tenth above the eager and direct-copy sizes), six tags, the receives of
// even messages posted before the sends and those of odd ones after, everything waited
// for at the end. Even messages use tags 0..2, odd ones 3..5: receives of one tag are
// posted in send order, as FIFO matching requires.
void exchangeEverythingAtOnce(int rank, PointToPoint& p2p) {
  constexpr int kMessages = 60;
  const auto countOf = [](int i) { return i % 10 == 9 ? size_t{100000} : static_cast<size_t>(i % 7); };
  const auto tagOf = [](int i) { return i % 2 == 0 ? i % 3 : 3 + i % 3; };
  const auto seedOf = [](int from, int to, int i) { return static_cast<uint32_t>(from * 1000000 + to * 1000 + i); };
  const int size = p2p.size();
  std::vector<std::vector<int32_t>> out;  // moving a vector keeps its buffer where it is
  std::vector<std::vector<int32_t>> in;
  std::vector<std::shared_ptr<Work>> receives;
  std::vector<std::shared_ptr<Work>> sends;
  std::vector<std::tuple<int, int>> receiveOf;  // (peer, i) of each receive
  const auto postReceives = [&](int first) {
    for (int peer = 0; peer < size; ++peer) {
      for (int i = first; i < kMessages && peer != rank; i += 2) {
        in.emplace_back(countOf(i), -1);
        receives.push_back(recv(p2p, in.back(), peer, tagOf(i)));
        receiveOf.emplace_back(peer, i);
      }
    }
  };
  postReceives(0);
  for (int peer = 0; peer < size; ++peer) {
    for (int i = 0; i < kMessages && peer != rank; ++i) {
      out.push_back(values(countOf(i), seedOf(rank, peer, i)));
      sends.push_back(send(p2p, out.back(), peer, tagOf(i)));
    }
  }
  postReceives(1);
  for (const auto& work : sends) work->wait();
  for (size_t r = 0; r < receives.size(); ++r) {
    receives[r]->wait();
    const auto [peer, i] = receiveOf[r];
    EXPECT_EQ(receives[r]->sourceRank(), peer);
    EXPECT_EQ(in[r], values(countOf(i), seedOf(peer, rank, i)))
        << "rank " << rank << ": message " << i << " of " << peer;
  }
}

TEST_P(P2pTest, ManyMessagesInFlightBothWays) {
  for (const int size : {2, 3, 4}) {
    runEngines(size, GetParam(), exchangeEverythingAtOnce);
  }
}

TEST_P(P2pTest, TagsMatchOutOfOrder) {
  // Small messages, then messages so large that the first stays with its sender until
  // a receive waits behind it.
  for (const size_t count : {size_t{4}, 4 * kMiB}) {
    runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
      if (rank == 0) {
        const std::vector<int32_t> one = values(count, 1);
        const std::vector<int32_t> two = values(count, 2);
        const auto first = send(p2p, one, 1, 1);
        const auto second = send(p2p, two, 1, 2);
        first->wait();
        second->wait();
        return;
      }
      std::vector<int32_t> two(count);
      std::vector<int32_t> one(count);
      recv(p2p, two, 0, 2)->wait();
      recv(p2p, one, 0, 1)->wait();
      EXPECT_EQ(two, values(count, 2));
      EXPECT_EQ(one, values(count, 1));
    });
  }
}

TEST_P(P2pTest, MessagesOfOneTagArriveInSendOrder) {
  constexpr int kMessages = 40;
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 0) {
      std::vector<std::vector<int32_t>> out;
      std::vector<std::shared_ptr<Work>> sends;
      out.reserve(kMessages);
      for (int i = 0; i < kMessages; ++i) {
        out.push_back({i});
        sends.push_back(send(p2p, out.back(), 1, i % 2 == 0 ? 5 : 6));
      }
      for (const auto& work : sends) work->wait();
      return;
    }
    // All of tag 6 first (tag 5 waits in the engine), then tag 5.
    for (const int tag : {6, 5}) {
      for (int i = tag == 5 ? 0 : 1; i < kMessages; i += 2) {
        std::vector<int32_t> in(1, -1);
        recv(p2p, in, 0, tag)->wait();
        EXPECT_EQ(in[0], i) << "tag " << tag;
      }
    }
  });
}

TEST_P(P2pTest, AnySourceReceiveNamesTheSender) {
  constexpr int kPerSender = 20;
  for (const int size : {3, 4}) {
    runEngines(size, GetParam(), [&](int rank, PointToPoint& p2p) {
      if (rank != 0) {
        std::vector<std::vector<int32_t>> out;
        std::vector<std::shared_ptr<Work>> sends;
        out.reserve(kPerSender);
        for (int i = 0; i < kPerSender; ++i) {
          out.push_back({rank * 1000 + i});
          sends.push_back(send(p2p, out.back(), 0, 7));
        }
        for (const auto& work : sends) work->wait();
        return;
      }
      // Several receives from any source pending at once, then one at a time.
      const int total = (size - 1) * kPerSender;
      std::vector<std::vector<int32_t>> in(static_cast<size_t>(total), std::vector<int32_t>(1, -1));
      std::vector<std::shared_ptr<Work>> receives;
      for (int j = 0; j < total / 2; ++j) receives.push_back(recv(p2p, in[static_cast<size_t>(j)], kAny, 7));
      std::vector<int> next(static_cast<size_t>(size), 0);
      for (int j = 0; j < total; ++j) {
        if (j >= total / 2) receives.push_back(recv(p2p, in[static_cast<size_t>(j)], kAny, 7));
        receives[static_cast<size_t>(j)]->wait();
        const int source = receives[static_cast<size_t>(j)]->sourceRank();
        ASSERT_GE(source, 1);
        ASSERT_LT(source, size);
        EXPECT_EQ(in[static_cast<size_t>(j)][0], source * 1000 + next[static_cast<size_t>(source)]++)
            << "receive " << j << " from rank " << source;
      }
    });
  }
}

TEST_P(P2pTest, LargeMessagePostedBeforeItsReceive) {
  std::atomic<bool> checked{false};
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 0) {
      const SetOnExit setChecked(checked);
      const std::vector<int32_t> out = values(kHugeCount, 3);
      const auto work = send(p2p, out, 1, 1);
      // No receive yet: the message stays with the sender instead of being copied.
      std::this_thread::sleep_for(200ms);
      EXPECT_FALSE(work->isCompleted());
      checked = true;
      work->wait();
      return;
    }
    waitForFlag(checked);
    std::vector<int32_t> in(kHugeCount);
    const auto work = recv(p2p, in, 0, 1);
    work->wait();
    EXPECT_EQ(in, values(kHugeCount, 3));
  });
}

TEST_P(P2pTest, LargeMessagePostedAfterItsReceive) {
  std::atomic<bool> posted{false};
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 1) {
      std::vector<int32_t> in(kHugeCount);
      const auto work = recv(p2p, in, 0, 1);
      posted = true;
      work->wait();
      EXPECT_EQ(work->sourceRank(), 0);
      EXPECT_EQ(in, values(kHugeCount, 4));
      return;
    }
    waitForFlag(posted);
    std::this_thread::sleep_for(50ms);  // let the receiver's progress thread fall asleep
    send(p2p, values(kHugeCount, 4), 1, 1)->wait();
  });
}

// isend/irecv leave what they cannot finish at once to a wait() for a moment
// (kHandOffDelay), then to the progress thread: operations nobody waits for still finish.
TEST_P(P2pTest, OperationsNobodyWaitsForFinishOnTheProgressThread) {
  const auto finishesUnwaited = [](const std::shared_ptr<Work>& work) {
    const auto deadline = Clock::now() + 5s;
    while (!work->isCompleted() && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    return work->isCompleted() && work->isSuccess();
  };
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 0) {
      const std::vector<int32_t> out = values(kHugeCount, 5);
      EXPECT_TRUE(finishesUnwaited(send(p2p, out, 1, 1)));  // the peer blocks in recv
      std::this_thread::sleep_for(2 * detail::PointToPointEngine::kIdleLinger);  // the idle thread sleeps untimed
      std::vector<int32_t> in(kHugeCount);
      const auto received = recv(p2p, in, 1, 2);
      EXPECT_TRUE(finishesUnwaited(received));  // the peer blocks in send
      EXPECT_EQ(in, values(kHugeCount, 6));
      return;
    }
    std::vector<int32_t> in(kHugeCount);
    blockingRecv(p2p, in, 0, 1);
    EXPECT_EQ(in, values(kHugeCount, 5));
    blockingSend(p2p, values(kHugeCount, 6), 0, 2);
  });
}

TEST_P(P2pTest, CallbacksMaySubmitMoreWork) {
  // Rank 1 answers each message from the completion callback of its receive (which runs
  // on the progress thread or inside irecv).
  constexpr int kRounds = 50;
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 0) {
      for (int i = 0; i < kRounds; ++i) {
        std::vector<int32_t> in(1, -1);
        const auto answer = recv(p2p, in, 1, 2);
        send(p2p, {i}, 1, 1)->wait();
        answer->wait();
        EXPECT_EQ(in[0], i + 1000);
      }
      return;
    }
    std::vector<std::shared_ptr<Work>> answers(kRounds);
    std::vector<int32_t> in(kRounds, -1);
    std::vector<int32_t> out(kRounds);
    std::atomic<int> answered{0};
    for (int i = 0; i < kRounds; ++i) {
      const auto work = p2p.irecv(&in[static_cast<size_t>(i)], 1, DataType::kInt32, 0, 1);
      work->addCallback([&, i](Work& done) {
        ASSERT_TRUE(done.isSuccess());
        out[static_cast<size_t>(i)] = in[static_cast<size_t>(i)] + 1000;
        answers[static_cast<size_t>(i)] = p2p.isend(&out[static_cast<size_t>(i)], 1, DataType::kInt32, 0, 2);
        ++answered;
      });
      work->wait();
      const auto deadline = Clock::now() + 10s;
      while (answered.load() <= i && Clock::now() < deadline) std::this_thread::sleep_for(100us);
    }
    ASSERT_EQ(answered.load(), kRounds);
    for (const auto& work : answers) work->wait();
  });
}


// ---------------------------------------------------------------------------------------
// Blocking send/recv, per transport

TEST_P(P2pTest, BlockingSendAndRecvOfEverySizeClass) {
  // 0 bytes, one element, 1 MiB, 16 MiB; rank 1 answers with send/recv, then with
  // isend/irecv.
  const std::vector<size_t> counts = {0, 1, kMiB / 4, 4 * kMiB};
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    const int peer = 1 - rank;
    for (uint32_t round = 0; round < 2 * counts.size(); ++round) {
      const size_t count = counts[round % counts.size()];
      std::vector<int32_t> in(count, -1);
      if (rank == 0) {
        blockingSend(p2p, values(count, round), peer, 1);
        EXPECT_EQ(blockingRecv(p2p, in, peer, 1), 1);
        EXPECT_EQ(in, values(count, round + 100)) << count << " elements";
      } else if (round < counts.size()) {
        EXPECT_EQ(blockingRecv(p2p, in, peer, 1), 0);
        EXPECT_EQ(in, values(count, round)) << count << " elements";
        blockingSend(p2p, values(count, round + 100), peer, 1);
      } else {
        recv(p2p, in, peer, 1)->wait();
        EXPECT_EQ(in, values(count, round)) << count << " elements";
        send(p2p, values(count, round + 100), peer, 1)->wait();
      }
    }
  });
}

TEST_P(P2pTest, BlockingRecvTakesTagsOutOfOrder) {
  // Small messages, then messages so large that the first stays with its sender until a
  // receive waits behind it (its sender uses isend: a blocking send would wait for it).
  for (const size_t count : {size_t{4}, 4 * kMiB}) {
    runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
      if (rank == 0) {
        const std::vector<int32_t> one = values(count, 1);
        const auto first = send(p2p, one, 1, 1);
        blockingSend(p2p, values(count, 2), 1, 2);
        first->wait();
        return;
      }
      std::vector<int32_t> two(count);
      std::vector<int32_t> one(count);
      EXPECT_EQ(blockingRecv(p2p, two, 0, 2), 0);
      EXPECT_EQ(blockingRecv(p2p, one, 0, 1), 0);
      EXPECT_EQ(two, values(count, 2));
      EXPECT_EQ(one, values(count, 1));
    });
  }
}

TEST_P(P2pTest, BlockingRecvTakesItsTurnAfterPendingReceives) {
  // Receives posted earlier (from the peer, and from any source) take the first message
  // of their tag; the blocking recv behind them the second.
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 0) {
      for (const int32_t value : {1, 2, 3, 4}) blockingSend(p2p, {value}, 1, value <= 2 ? 5 : 6);
      return;
    }
    std::vector<int32_t> first(1, -1);
    std::vector<int32_t> firstAny(1, -1);
    const auto pending = recv(p2p, first, 0, 5);
    const auto pendingAny = recv(p2p, firstAny, kAny, 6);
    std::vector<int32_t> second(1, -1);
    EXPECT_EQ(blockingRecv(p2p, second, 0, 5), 0);
    std::vector<int32_t> secondAny(1, -1);
    EXPECT_EQ(blockingRecv(p2p, secondAny, kAny, 6), 0);
    pending->wait();
    pendingAny->wait();
    EXPECT_EQ(first[0], 1);
    EXPECT_EQ(second[0], 2);
    EXPECT_EQ(firstAny[0], 3);
    EXPECT_EQ(secondAny[0], 4);
  });
}

TEST_P(P2pTest, BlockingRecvFromAnySourceNamesTheSender) {
  constexpr int kPerSender = 20;
  for (const int size : {3, 4}) {
    runEngines(size, GetParam(), [&](int rank, PointToPoint& p2p) {
      if (rank != 0) {
        for (int i = 0; i < kPerSender; ++i) blockingSend(p2p, {rank * 1000 + i}, 0, 7);
        return;
      }
      std::vector<int> next(static_cast<size_t>(size), 0);
      for (int j = 0; j < (size - 1) * kPerSender; ++j) {
        std::vector<int32_t> in(1, -1);
        const int source = blockingRecv(p2p, in, kAny, 7);
        ASSERT_GE(source, 1);
        ASSERT_LT(source, size);
        EXPECT_EQ(in[0], source * 1000 + next[static_cast<size_t>(source)]++) << "receive " << j;
      }
    });
  }
}

// Per rank, three threads on one engine at once: blocking send/recv exchanges with every
// peer (every fifth message above the eager size), exchangeEverythingAtOnce's
// asynchronous traffic, and a stream of small blocking sends that rank 0 takes with
// blocking receives from any source. The blocking calls drive their connections
// themselves or wait for the progress thread, whichever the other threads leave them.
TEST_P(P2pTest, BlockingCallsMixWithAsynchronousOnesFromOtherThreads) {
  constexpr int kRounds = 12;
  constexpr int kPerSender = 40;
  constexpr int kExchangeTag = 10;
  constexpr int kStreamTag = 11;
  const auto seedOf = [](int from, int to, int round) {
    return static_cast<uint32_t>(from * 100000 + to * 100 + round);
  };
  for (const int size : {2, 3}) {
    runEngines(size, GetParam(), [&](int rank, PointToPoint& p2p) {
      const auto exchange = [&] {
        for (int round = 0; round < kRounds; ++round) {
          for (int peer = 0; peer < size; ++peer) {
            if (peer == rank) continue;
            const size_t count = round % 5 == 4 ? size_t{100000} : static_cast<size_t>(round % 3);
            std::vector<int32_t> in(count, -1);
            // The lower rank sends first: large blocking sends wait for their receive.
            if (rank < peer) blockingSend(p2p, values(count, seedOf(rank, peer, round)), peer, kExchangeTag);
            EXPECT_EQ(blockingRecv(p2p, in, peer, kExchangeTag), peer);
            if (rank > peer) blockingSend(p2p, values(count, seedOf(rank, peer, round)), peer, kExchangeTag);
            EXPECT_EQ(in, values(count, seedOf(peer, rank, round))) << "round " << round << " with rank " << peer;
          }
        }
      };
      const auto stream = [&] {
        if (rank != 0) {
          for (int i = 0; i < kPerSender; ++i) blockingSend(p2p, {rank * 1000 + i}, 0, kStreamTag);
          return;
        }
        std::vector<int> next(static_cast<size_t>(size), 0);
        for (int j = 0; j < (size - 1) * kPerSender; ++j) {
          std::vector<int32_t> in(1, -1);
          const int source = blockingRecv(p2p, in, kAny, kStreamTag);
          ASSERT_GE(source, 1);
          ASSERT_LT(source, size);
          EXPECT_EQ(in[0], source * 1000 + next[static_cast<size_t>(source)]++) << "receive " << j;
        }
      };
      inParallel({exchange, [&] { exchangeEverythingAtOnce(rank, p2p); }, stream});
    });
  }
}

TEST_P(P2pTest, OperationsOnAConnectionThatABlockingCallDrivesProgress) {
  // On rank 0, a blocking recv from rank 1 drives that connection and sleeps on it; then
  // another thread sends rank 1 a large message (blocking, then isend) and receives from
  // it, all through the connection the sleeping recv drives.
  std::atomic<bool> asleep{false};
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 1) {
      std::vector<int32_t> in(kHugeCount);
      EXPECT_EQ(blockingRecv(p2p, in, 0, 2), 0);
      EXPECT_EQ(in, values(kHugeCount, 11));
      recv(p2p, in, 0, 3)->wait();
      EXPECT_EQ(in, values(kHugeCount, 12));
      blockingSend(p2p, {5}, 0, 4);
      blockingSend(p2p, {1}, 0, 1);  // lets the sleeping recv go
      return;
    }
    inParallel({[&] {
                  std::vector<int32_t> in(1, -1);
                  asleep = true;
                  EXPECT_EQ(blockingRecv(p2p, in, 1, 1), 1);
                  EXPECT_EQ(in[0], 1);
                },
                [&] {
                  waitForFlag(asleep);
                  std::this_thread::sleep_for(50ms);  // the recv sleeps in poll() by now
                  blockingSend(p2p, values(kHugeCount, 11), 1, 2);
                  const std::vector<int32_t> out = values(kHugeCount, 12);
                  send(p2p, out, 1, 3)->wait();
                  std::vector<int32_t> in(1, -1);
                  EXPECT_EQ(blockingRecv(p2p, in, 1, 4), 1);
                  EXPECT_EQ(in[0], 5);
                }});
  });
}

TEST_P(P2pTest, BlockingRecvSleepingOnItsConnectionWakesForShutdown) {
  std::atomic<bool> done{false};
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 1) {
      waitForFlag(done);
      return;
    }
    const SetOnExit setDone(done);
    std::atomic<bool> shutDown{false};
    Clock::time_point shutdownAt;
    std::string message;
    inParallel({[&] {
                  std::vector<int32_t> in(1);
                  message = messageOf<Error>([&] { blockingRecv(p2p, in, 1, 1); });
                },
                [&] {
                  std::this_thread::sleep_for(100ms);  // the receive sleeps in poll() by now
                  shutdownAt = Clock::now();
                  p2p.shutdown();
                  shutDown = true;
                }});
    EXPECT_TRUE(shutDown.load());
    EXPECT_LT(elapsedSince(shutdownAt), test::kPrompt);  // woken by the shutdown, not its 20 s timeout
    EXPECT_TRUE(contains(message, "recv from rank 1 (tag 1, int32 x 1)")) << message;
    EXPECT_TRUE(contains(message, "shut down")) << message;
    std::vector<int32_t> in(1);
    EXPECT_TRUE(contains(messageOf<Error>([&] { blockingRecv(p2p, in, 1, 1); }), "shut down"));
    EXPECT_TRUE(contains(messageOf<Error>([&] { blockingSend(p2p, in, 1, 1); }), "shut down"));
  });
}

TEST_P(P2pTest, BlockingCallFromACallbackOnTheProgressThreadIsRefused) {
  std::atomic<bool> posted{false};
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 1) {
      waitForFlag(posted);
      blockingSend(p2p, {1}, 0, 1);
      return;
    }
    std::vector<int32_t> in(1);
    std::string message;
    std::atomic<bool> refused{false};
    const auto work = recv(p2p, in, 1, 1);
    // The message comes after the receive was posted and nobody waits on the Work (a
    // waiter would complete it itself): the progress thread completes it.
    work->addCallback([&](Work&) {
      std::vector<int32_t> out(1);
      message = messageOf<InvalidArgument>([&] { blockingSend(p2p, out, 1, 2); });
      refused = true;
    });
    posted = true;
    waitForFlag(refused);
    work->wait();
    EXPECT_TRUE(contains(message, "send to rank 1 called from a Work callback on the progress thread")) << message;
  });
}

// ---------------------------------------------------------------------------------------
// Work::wait() driving progress on the waiting thread, per transport

TEST_P(P2pTest, WaitDrivesSendRecvExchangesOnTheWaitingThread) {
  // Every rank receives from its left and sends to its right, then waits for both, for
  // messages small and large. A Work still pending when wait() starts is usually completed
  // by the waiting thread itself (its callback runs there); the progress thread may take
  // some, so only "at least one" is expected.
  constexpr int kRounds = 200;
  for (const int size : {2, 3}) {
    runEngines(size, GetParam(), [&](int rank, PointToPoint& p2p) {
      const int left = (rank + size - 1) % size;
      const int right = (rank + 1) % size;
      int completedByWaiter = 0;
      for (int round = 0; round < kRounds; ++round) {
        const size_t count = round % 50 == 49 ? kMiB / 4 : 2;
        const std::vector<int32_t> out = values(count, static_cast<uint32_t>(rank * kRounds + round));
        std::vector<int32_t> in(count);
        const auto receive = recv(p2p, in, left, round);
        const auto sent = send(p2p, out, right, round);
        const bool pending = !receive->isCompleted();
        // Owned by the callback too: one the progress thread runs may still be running
        // after wait() returned, into the next round (a waiter runs its own before).
        const auto onWaiter = std::make_shared<std::atomic<bool>>(false);
        receive->addCallback([onWaiter, waiter = std::this_thread::get_id()](Work&) {
          *onWaiter = std::this_thread::get_id() == waiter;
        });
        receive->wait();
        sent->wait();
        if (pending && *onWaiter) ++completedByWaiter;
        EXPECT_EQ(receive->sourceRank(), left);
        ASSERT_EQ(in, values(count, static_cast<uint32_t>(left * kRounds + round))) << "round " << round;
      }
      EXPECT_GT(completedByWaiter, 0) << "rank " << rank << " of " << size;
    });
  }
}

// A Work's callback that runs on a thread driving another Work of the same peer (in its
// wait()) may make a blocking call with that peer: the driver lets go of the peer while
// callbacks run, so the progress thread can serve the blocking call. On the progress
// thread itself blocking calls are refused (it could wait for itself); that case is
// counted and finished by the test instead.
TEST_P(P2pTest, BlockingCallInACallbackOfADrivenPeer) {
  constexpr int kRounds = 10;
  std::atomic<int> posted{0};
  std::atomic<int> servedOnDriver{0};
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    for (int round = 0; round < kRounds; ++round) {
      const int tag = 3 * round;
      if (rank == 1) {
        while (posted.load() <= round) std::this_thread::yield();
        for (const int offset : {0, 2, 1}) blockingSend(p2p, values(2, static_cast<uint32_t>(tag + offset)), 0, tag + offset);
        continue;
      }
      std::vector<int32_t> first(2), inner(2), second(2);
      std::atomic<bool> innerDone{false};
      std::atomic<bool> callbackReturned{false};
      const auto firstWork = recv(p2p, first, 1, tag);
      firstWork->addCallback([&](Work&) {
        try {
          blockingRecv(p2p, inner, 1, tag + 2);
          ++servedOnDriver;
          innerDone = true;
        } catch (const InvalidArgument&) {
          // On the progress thread: done below.
        }
        callbackReturned = true;
      });
      const auto secondWork = recv(p2p, second, 1, tag + 1);
      posted = round + 1;
      secondWork->wait();
      firstWork->wait();
      // wait() returns once the Work completed, maybe before its callback (on another
      // thread) returned: the callback uses this iteration's locals.
      while (!callbackReturned.load()) std::this_thread::yield();
      if (!innerDone) blockingRecv(p2p, inner, 1, tag + 2);
      EXPECT_EQ(first, values(2, static_cast<uint32_t>(tag)));
      EXPECT_EQ(inner, values(2, static_cast<uint32_t>(tag + 2)));
      EXPECT_EQ(second, values(2, static_cast<uint32_t>(tag + 1)));
    }
  });
  EXPECT_GT(servedOnDriver.load(), 0) << "no callback ran on the driving thread";
}

TEST_P(P2pTest, WorksWaitedFromOtherThreads) {
  // Rank 0 posts the operations; two other threads wait for them at once (one of them
  // drives the connection, the other sleeps until its Works complete).
  constexpr int kMessages = 64;
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    const int peer = 1 - rank;
    std::vector<std::vector<int32_t>> in(kMessages, std::vector<int32_t>(3));
    std::vector<std::vector<int32_t>> out;
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < kMessages; ++i) {
      out.push_back(values(3, static_cast<uint32_t>(rank * kMessages + i)));
      works.push_back(recv(p2p, in[static_cast<size_t>(i)], peer, i));
      works.push_back(send(p2p, out.back(), peer, i));
    }
    const auto waitEvery = [&](size_t first) {
      for (size_t w = first; w < works.size(); w += 2) works[w]->wait();
    };
    inParallel({[&] { waitEvery(0); }, [&] { waitEvery(1); }});
    for (int i = 0; i < kMessages; ++i) {
      EXPECT_EQ(in[static_cast<size_t>(i)], values(3, static_cast<uint32_t>(peer * kMessages + i))) << i;
    }
  });
}

TEST_P(P2pTest, WaitWithATimeoutStopsDrivingAndLeavesTheWorkToTheProgressThread) {
  std::atomic<bool> timedOut{false};
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 1) {
      waitForFlag(timedOut);
      send(p2p, {5}, 0, 1)->wait();
      return;
    }
    std::vector<int32_t> in(1);
    const auto work = recv(p2p, in, 1, 1);
    {
      const SetOnExit setTimedOut(timedOut);
      const auto start = Clock::now();
      EXPECT_TRUE(contains(messageOf<TimeoutError>([&] { work->wait(50ms); }), "irecv is still running"));
      EXPECT_GE(elapsedSince(start), 50ms);
      EXPECT_LT(elapsedSince(start), test::kPrompt);  // back at its 50 ms deadline, not at the 20 s one
      EXPECT_FALSE(work->isCompleted());
    }
    // Nobody waits now: the progress thread completes it.
    const auto deadline = Clock::now() + 10s;
    while (!work->isCompleted() && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(work->isCompleted());
    EXPECT_TRUE(work->wait(1ms));
    EXPECT_EQ(in[0], 5);
  });
}

TEST_P(P2pTest, ManyWorksWaitedInReverseOrder) {
  // Waiting for the last receive drives the connection through all the earlier ones.
  constexpr int kMessages = 200;
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 1) {
      for (int i = 0; i < kMessages; ++i) send(p2p, values(2, static_cast<uint32_t>(i)), 0, 7)->wait();
      return;
    }
    std::vector<std::vector<int32_t>> in(kMessages, std::vector<int32_t>(2));
    std::vector<std::shared_ptr<Work>> works;
    for (auto& buffer : in) works.push_back(recv(p2p, buffer, 1, 7));
    for (auto work = works.rbegin(); work != works.rend(); ++work) (*work)->wait();
    for (int i = 0; i < kMessages; ++i) {
      EXPECT_EQ(in[static_cast<size_t>(i)], values(2, static_cast<uint32_t>(i))) << "message " << i;
    }
  });
}

TEST_P(P2pTest, WorkWaitedAfterItsEngineIsGoneFailsWithShutdown) {
  const auto store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    auto p2p = std::make_unique<PointToPoint>(Communicator::create(store, rank, 2, testOptions(GetParam())));
    std::vector<int32_t> in(1);
    const auto work = recv(*p2p, in, 1 - rank, 1);
    p2p.reset();
    EXPECT_TRUE(contains(failureOf<Error>(work, test::kPrompt), "shut down"));  // at once
  });
}

// ---------------------------------------------------------------------------------------
// Failures, per transport

TEST_P(P2pTest, TypeOrCountMismatchFailsBothSides) {
  // A small message (its send finished before the receiver looked at it: the sender
  // learns at its next operation with that rank) and a large one (its send fails when
  // the receiver's notice comes first; the receiver's connection, which its other
  // channels share, may also take the refused message whole and drop it: the sender then
  // learns at its next operation, as for a small one).
  for (const bool large : {false, true}) {
    const size_t count = large ? kHugeCount : 8;
    const std::string sent = "int32 x " + std::to_string(count);
    const std::string expected = "float32 x " + std::to_string(count / 2);
    std::atomic<bool> done{false};
    runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
      if (rank == 1) {
        std::vector<float> in(count / 2);
        const auto start = Clock::now();
        const std::string message = failureOf<CollectiveMismatchError>(
            p2p.irecv(in.data(), in.size(), DataType::kFloat32, 0, 3));
        EXPECT_LT(elapsedSince(start), test::kPrompt);  // not failureOf's 10 s
        for (const std::string& part :
             {std::string("rank 0"), std::string("rank 1"), std::string("tag 3"), sent, expected}) {
          EXPECT_TRUE(contains(message, part)) << message << "\nlacks: " << part;
        }
        waitForFlag(done);  // stay connected: rank 0 must learn it from the notice
        return;
      }
      const SetOnExit setDone(done);
      const std::vector<int32_t> out = values(count, 5);
      const auto work = send(p2p, out, 1, 3);
      std::string message;
      bool sendFailed = false;
      try {
        work->wait(10s);
      } catch (const CollectiveMismatchError& e) {
        message = e.what();
        sendFailed = true;
      }
      if (!sendFailed) {
        std::vector<int32_t> in(1);
        message = failureOf<CollectiveMismatchError>(recv(p2p, in, 1, 9));
      }
      for (const std::string& part : {std::string("rank 0"), std::string("rank 1"), std::string("tag 3"), expected}) {
        EXPECT_TRUE(contains(message, part)) << message << "\nlacks: " << part;
      }
      if (sendFailed) {
        EXPECT_TRUE(contains(message, sent)) << message;
      }
      // Later operations with rank 1 fail at once, with the same diagnosis.
      std::vector<int32_t> more(1);
      EXPECT_TRUE(contains(failureOf<CollectiveMismatchError>(send(p2p, more, 1, 4), test::kPrompt), "mismatch"));
    });
  }
}

TEST_P(P2pTest, PeerThatShutsDownFailsOperationsWithItButNotWithOthers) {
  std::atomic<bool> posted{false};
  std::atomic<bool> checked{false};
  runEngines(3, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 1) {
      waitForFlag(posted);
      std::this_thread::sleep_for(20ms);  // let rank 0's progress thread fall asleep
      p2p.shutdown();
      // Stay connected until rank 0 has checked: closing a connection with unread data
      // resets it, which fails rank 0's receive from any source as a broken connection.
      waitForFlag(checked);
      return;
    }
    if (rank == 2) {
      waitForFlag(checked);
      send(p2p, {42}, 0, 2)->wait();
      return;
    }
    const SetOnExit setChecked(checked);
    std::vector<int32_t> fromOne(1);
    std::vector<int32_t> fromAny(1, -1);
    const std::vector<int32_t> huge = values(kHugeCount, 6);
    const auto receive = recv(p2p, fromOne, 1, 1);
    const auto anySource = recv(p2p, fromAny, kAny, 2);
    const auto hugeSend = send(p2p, huge, 1, 1);
    posted = true;
    const auto start = Clock::now();
    for (const auto& work : {receive, hugeSend}) {
      const std::string message = failureOf<NetworkError>(work);
      EXPECT_TRUE(contains(message, "rank 1")) << message;
    }
    EXPECT_LT(elapsedSince(start), test::kPrompt);  // not failureOf's 10 s
    // Nothing more comes from rank 1, which said so: a receive from any source waits for
    // the others.
    EXPECT_FALSE(anySource->isCompleted());
    checked = true;
    anySource->wait();
    EXPECT_EQ(anySource->sourceRank(), 2);
    EXPECT_EQ(fromAny[0], 42);
    EXPECT_THROW(recv(p2p, fromOne, 1, 1)->wait(), NetworkError);  // at once
  });
}

TEST_P(P2pTest, TimeoutNamesTheOperationAndKeepsAnUnmatchedPeerUsable) {
  std::atomic<bool> timedOut{false};
  std::atomic<bool> done{false};
  runEngines(
      2, GetParam(),
      [&](int rank, PointToPoint& p2p) {
        if (rank == 1) {
          waitForFlag(timedOut);
          send(p2p, {7}, 0, 5)->wait();
          waitForFlag(done);
          return;
        }
        const SetOnExit setDone(done);
        {
          const SetOnExit setTimedOut(timedOut);
          std::vector<int32_t> in(1);
          const auto start = Clock::now();
          const std::string message = failureOf<TimeoutError>(recv(p2p, in, 1, 4));
          const auto elapsed = elapsedSince(start);
          // At the 1000 ms deadline, not before, and not much later.
          EXPECT_GE(elapsed, 1000ms);
          EXPECT_LT(elapsed, 1000ms + test::kLateBy) << message;
          EXPECT_TRUE(contains(message, "irecv from rank 1 (tag 4, int32 x 1)")) << message;
          EXPECT_TRUE(contains(message, "timed out after 1000 ms")) << message;
        }
        // The receive never reached the connection: rank 1 is still reachable.
        std::vector<int32_t> in(1, -1);
        recv(p2p, in, 1, 5)->wait();
        EXPECT_EQ(in[0], 7);
        // A send that times out had its bytes in the connection: it is given up.
        const std::vector<int32_t> huge = values(kHugeCount, 8);
        const std::string message = failureOf<TimeoutError>(send(p2p, huge, 1, 6));
        EXPECT_TRUE(contains(message, "isend to rank 1 (tag 6")) << message;
        const std::string later = failureOf<NetworkError>(send(p2p, {1}, 1, 7), test::kPrompt);
        EXPECT_TRUE(contains(later, "given up after the isend to rank 1 (tag 6")) << later;
      },
      1000ms);
}

TEST_P(P2pTest, BlockingCallsReportMismatchesLikeTheirWorks) {
  // As TypeOrCountMismatchFailsBothSides, with send/recv on both sides.
  for (const bool large : {false, true}) {
    const size_t count = large ? kHugeCount : 8;
    const std::string expected = "float32 x " + std::to_string(count / 2);
    std::atomic<bool> done{false};
    runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
      if (rank == 1) {
        std::vector<float> in(count / 2);
        const std::string message = messageOf<CollectiveMismatchError>(
            [&] { p2p.recv(in.data(), in.size(), DataType::kFloat32, 0, 3); });
        for (const std::string& part : {std::string("rank 1's recv from rank 0 with tag 3 expects ") + expected,
                                        "rank 0 sent int32 x " + std::to_string(count)}) {
          EXPECT_TRUE(contains(message, part)) << message << "\nlacks: " << part;
        }
        waitForFlag(done);  // stay connected: rank 0 must learn it from the notice
        return;
      }
      const SetOnExit setDone(done);
      std::string message;
      if (large) {
        message = messageOf<CollectiveMismatchError>([&] { blockingSend(p2p, values(count, 5), 1, 3); });
      } else {
        blockingSend(p2p, values(count, 5), 1, 3);
        std::vector<int32_t> in(1);
        message = messageOf<CollectiveMismatchError>([&] { blockingRecv(p2p, in, 1, 9); });
      }
      EXPECT_TRUE(contains(message, "rank 1's receive for it expects " + expected) ||
                  contains(message, "rank 1's receive for rank 0's message number 1 with tag 3"))
          << message;
      std::vector<int32_t> more(1);
      EXPECT_TRUE(contains(messageOf<CollectiveMismatchError>([&] { blockingSend(p2p, more, 1, 4); }), "mismatch"));
    });
  }
}

TEST_P(P2pTest, BlockingCallsTimeOutLikeTheirWorks) {
  std::atomic<bool> timedOut{false};
  std::atomic<bool> done{false};
  runEngines(
      2, GetParam(),
      [&](int rank, PointToPoint& p2p) {
        if (rank == 1) {
          waitForFlag(timedOut);
          blockingSend(p2p, {7}, 0, 5);
          waitForFlag(done);
          return;
        }
        const SetOnExit setDone(done);
        {
          const SetOnExit setTimedOut(timedOut);
          std::vector<int32_t> in(1);
          const auto start = Clock::now();
          const std::string message = messageOf<TimeoutError>([&] { blockingRecv(p2p, in, 1, 4); });
          const auto elapsed = elapsedSince(start);
          // At the 1000 ms deadline, not before, and not much later.
          EXPECT_GE(elapsed, 1000ms);
          EXPECT_LT(elapsed, 1000ms + test::kLateBy) << message;
          EXPECT_TRUE(contains(message, "recv from rank 1 (tag 4, int32 x 1) timed out after 1000 ms")) << message;
        }
        // The receive never reached the connection: rank 1 is still reachable.
        std::vector<int32_t> in(1, -1);
        EXPECT_EQ(blockingRecv(p2p, in, 1, 5), 1);
        EXPECT_EQ(in[0], 7);
        // A send that times out had its bytes in the connection: it is given up.
        const std::string message = messageOf<TimeoutError>([&] { blockingSend(p2p, values(kHugeCount, 8), 1, 6); });
        EXPECT_TRUE(contains(message, "send to rank 1 (tag 6")) << message;
        const std::string later = messageOf<NetworkError>([&] { blockingSend(p2p, {1}, 1, 7); });
        EXPECT_TRUE(contains(later, "given up after the send to rank 1 (tag 6")) << later;
      },
      1000ms);
}

TEST_P(P2pTest, ShutdownFailsPendingOperationsAndRefusesNewOnes) {
  std::atomic<bool> done{false};
  runEngines(2, GetParam(), [&](int rank, PointToPoint& p2p) {
    if (rank == 1) {
      waitForFlag(done);
      return;
    }
    const SetOnExit setDone(done);
    std::vector<int32_t> in(1);
    const std::vector<int32_t> huge = values(kHugeCount, 9);
    const std::vector<std::shared_ptr<Work>> pending = {recv(p2p, in, 1, 1), recv(p2p, in, kAny, 2),
                                                        send(p2p, huge, 1, 3)};
    std::this_thread::sleep_for(20ms);  // let the progress thread fall asleep
    const auto start = Clock::now();
    p2p.shutdown();
    EXPECT_LT(elapsedSince(start), test::kPrompt);  // it waits for no pending operation
    for (const auto& work : pending) {
      ASSERT_TRUE(work->isCompleted());
      EXPECT_TRUE(contains(failureOf<Error>(work), "shut down"));
    }
    EXPECT_TRUE(contains(messageOf<Error>([&] { send(p2p, {1}, 1, 1); }), "shut down"));
    EXPECT_TRUE(contains(messageOf<Error>([&] { recv(p2p, in, 1, 1); }), "shut down"));
    p2p.shutdown();  // idempotent
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, P2pTest, ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         [](const auto& info) { return std::string(transportKindName(info.param)); });

// ---------------------------------------------------------------------------------------
// Arguments

TEST(P2pArguments, AreCheckedBeforeAnythingMoves) {
  EXPECT_THROW({ PointToPoint p2p(nullptr); }, InvalidArgument);
  runEngines(2, TransportKind::kTcp, [&](int rank, PointToPoint& p2p) {
    EXPECT_EQ(p2p.rank(), rank);
    EXPECT_EQ(p2p.size(), 2);
    const int peer = 1 - rank;
    int32_t value = 0;
    const auto isend = [&](const void* data, size_t count, DataType type, int to, int tag) {
      return messageOf<InvalidArgument>([&] { p2p.isend(data, count, type, to, tag); });
    };
    const auto irecv = [&](void* data, size_t count, DataType type, int from, int tag) {
      return messageOf<InvalidArgument>([&] { p2p.irecv(data, count, type, from, tag); });
    };
    EXPECT_TRUE(contains(isend(&value, 1, DataType::kInt32, 2, 0), "peer 2 is not a rank of this group [0, 2)"));
    EXPECT_TRUE(contains(isend(&value, 1, DataType::kInt32, kAny, 0), "peer -1"));
    EXPECT_TRUE(contains(isend(&value, 1, DataType::kInt32, rank, 0), "is this rank"));
    EXPECT_TRUE(contains(isend(&value, 1, DataType::kInt32, peer, -1), "tag -1 is negative"));
    EXPECT_TRUE(contains(isend(nullptr, 3, DataType::kInt32, peer, 0), "buffer is null but should hold 3 elements"));
    EXPECT_FALSE(isend(&value, 1, static_cast<DataType>(99), peer, 0).empty());
    EXPECT_TRUE(contains(isend(&value, SIZE_MAX / 2, DataType::kInt64, peer, 0), "do not fit"));
    EXPECT_TRUE(contains(irecv(&value, 1, DataType::kInt32, -2, 0), "nor kAnySource"));
    EXPECT_TRUE(contains(irecv(&value, 1, DataType::kInt32, rank, 0), "is this rank"));
    EXPECT_TRUE(contains(irecv(&value, 1, DataType::kInt32, kAny, -5), "tag -5 is negative"));
    EXPECT_TRUE(contains(irecv(nullptr, 2, DataType::kInt32, peer, 0), "buffer is null but should hold 2 elements"));
    // The blocking forms check the same, naming themselves.
    EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { p2p.send(&value, 1, DataType::kInt32, 2, 0); }),
                         "send: peer 2 is not a rank of this group [0, 2)"));
    EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { p2p.send(&value, 1, DataType::kInt32, rank, 0); }),
                         "is this rank"));
    EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { p2p.send(nullptr, 3, DataType::kInt32, peer, 0); }),
                         "send: buffer is null but should hold 3 elements"));
    EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { p2p.recv(&value, 1, DataType::kInt32, -2, 0); }),
                         "recv: peer -2 is not a rank of this group [0, 2) nor kAnySource (-1)"));
    EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { p2p.recv(&value, 1, DataType::kInt32, kAny, -5); }),
                         "recv from any source: tag -5 is negative"));
    // Empty messages need no buffer.
    if (rank == 0) {
      p2p.isend(nullptr, 0, DataType::kFloat32, peer, 0)->wait();
      p2p.send(nullptr, 0, DataType::kFloat32, peer, 0);
    } else {
      p2p.irecv(nullptr, 0, DataType::kFloat32, kAny, 0)->wait();
      EXPECT_EQ(p2p.recv(nullptr, 0, DataType::kFloat32, kAny, 0), 0);
    }
  });
}

// ---------------------------------------------------------------------------------------
// Processes

class P2pProcessTest : public ::testing::TestWithParam<TransportKind> {};

// Rank 1 of the killed-peer tests, once it has taken rank 0's go-ahead: gives rank 0 200 ms
// to post (or block in) the operations it waits in, then dies by SIGKILL.
std::string dieSoon() {
  std::this_thread::sleep_for(200ms);
  ::raise(SIGKILL);
  return "not killed";
}

// Checks a killed-peer run: rank 1 died by SIGKILL, every other rank exited 0. Returns
// rank 0's report, how many milliseconds it took to see the failure; -1 after recording a
// failure.
long killedPeerSeenAfterMs(const std::vector<test::ChildResult>& results) {
  if (results[1].signal != SIGKILL) {
    ADD_FAILURE() << "rank 1 was not killed: " << results[1].message;
    return -1;
  }
  for (size_t rank = 2; rank < results.size(); ++rank) {
    EXPECT_TRUE(results[rank].exited && results[rank].code == 0) << "rank " << rank << ": " << results[rank].message;
  }
  const test::ChildResult& r = results[0];
  if (!(r.exited && r.code == 0)) {
    ADD_FAILURE() << "rank 0: " << r.message;
    return -1;
  }
  return std::stol(r.message);
}

TEST_P(P2pProcessTest, KilledPeerFailsEveryPendingOperationQuickly) {
  // Rank 1 is SIGKILLed while rank 0 waits for a message from it, for a message from any
  // source, and for a large send to it to finish; rank 2 stays alive. Rank 1 dies only
  // once rank 0 has posted them: a receive from any source posted after the connection
  // broke waits for the ranks still alive.
  const TransportKind kind = GetParam();
  const auto results = test::runProcesses(3, [kind](int rank, std::shared_ptr<Store> store) {
    PointToPoint p2p(Communicator::create(store, rank, 3, testOptions(kind)));
    std::vector<int32_t> in(1);
    if (rank == 1) {
      recv(p2p, in, 0, 1)->wait();
      store->get("test/posted");
      ::raise(SIGKILL);
      return std::string("not killed");
    }
    if (rank == 2) {
      recv(p2p, in, 0, 2)->wait();  // rank 0 is done
      return std::string();
    }
    // Rank 1 dies a little after this message, with no receive posted: the large send
    // below stays with rank 0.
    send(p2p, {1}, 1, 1)->wait();
    std::vector<int32_t> fromOne(1);
    std::vector<int32_t> fromAny(1);
    const std::vector<int32_t> huge = values(kHugeCount, 10);
    const std::vector<std::shared_ptr<Work>> pending = {recv(p2p, fromOne, 1, 5), recv(p2p, fromAny, kAny, 6),
                                                        send(p2p, huge, 1, 7)};
    store->set("test/posted", {});
    const auto start = Clock::now();
    std::string report;
    for (const auto& work : pending) {
      try {
        work->wait(10s);
        report += "completed; ";
      } catch (const NetworkError& e) {
        if (!contains(e.what(), "rank 1")) report += std::string("unnamed peer: ") + e.what() + "; ";
      }
    }
    // Measured from the kill, roughly: the operations were posted just before it.
    const long ms = static_cast<long>(elapsedSince(start).count());
    send(p2p, {2}, 2, 2)->wait();
    if (!report.empty()) throw std::runtime_error(report);
    return std::to_string(ms);
  });
  const long ms = killedPeerSeenAfterMs(results);
  EXPECT_LT(ms, test::kPrompt.count());  // not at a 10 s or 20 s timeout
  std::printf("[ info ] %s: killed peer failed every pending operation after %ld ms\n", transportKindName(kind), ms);
}

TEST_P(P2pProcessTest, KilledPeerFailsBlockingCallsQuickly) {
  // Rank 1 is SIGKILLed while rank 0 waits in a blocking recv from it and, on another
  // thread, in a blocking recv from any source; rank 2 stays alive.
  const TransportKind kind = GetParam();
  const auto results = test::runProcesses(3, [kind](int rank, std::shared_ptr<Store> store) {
    PointToPoint p2p(Communicator::create(store, rank, 3, testOptions(kind)));
    std::vector<int32_t> in(1);
    if (rank == 1) {
      blockingRecv(p2p, in, 0, 1);
      return dieSoon();
    }
    if (rank == 2) {
      blockingRecv(p2p, in, 0, 2);  // rank 0 is done
      blockingSend(p2p, {2}, 0, 3);
      return std::string();
    }
    blockingSend(p2p, {1}, 1, 1);
    std::string report;
    const auto expectNetworkError = [&](const char* what, const std::function<void()>& call) {
      try {
        call();
        report += std::string(what) + " completed; ";
      } catch (const NetworkError& e) {
        if (!contains(e.what(), "rank 1")) report += std::string(what) + " named no peer: " + e.what() + "; ";
      }
    };
    const auto start = Clock::now();
    std::vector<int32_t> fromOne(1);
    std::vector<int32_t> fromAny(1);
    inParallel({[&] { expectNetworkError("recv from rank 1", [&] { blockingRecv(p2p, fromOne, 1, 5); }); },
                [&] { expectNetworkError("recv from any source", [&] { blockingRecv(p2p, fromAny, kAny, 6); }); }});
    // Measured from the kill, roughly: the receives were posted just before it.
    const long ms = static_cast<long>(elapsedSince(start).count());
    expectNetworkError("send to rank 1", [&] { blockingSend(p2p, values(kHugeCount, 10), 1, 7); });
    // The others are still reachable.
    blockingSend(p2p, {2}, 2, 2);
    if (blockingRecv(p2p, fromAny, kAny, 3) != 2 || fromAny[0] != 2) report += "no message from rank 2; ";
    if (!report.empty()) throw std::runtime_error(report);
    return std::to_string(ms);
  });
  const long ms = killedPeerSeenAfterMs(results);
  EXPECT_LT(ms, test::kPrompt.count());  // not at a 10 s or 20 s timeout
  std::printf("[ info ] %s: killed peer failed the blocking receives after %ld ms\n", transportKindName(kind), ms);
}

TEST_P(P2pProcessTest, KilledPeerFailsAWaitThatDrivesItsConnection) {
  // Rank 0 waits (without a timeout) for a message from rank 1, which is SIGKILLed
  // meanwhile: the waiting thread, driving the connection itself, sees it break.
  const TransportKind kind = GetParam();
  const auto results = test::runProcesses(2, [kind](int rank, std::shared_ptr<Store> store) {
    PointToPoint p2p(Communicator::create(store, rank, 2, testOptions(kind)));
    std::vector<int32_t> in(1);
    if (rank == 1) {
      recv(p2p, in, 0, 1)->wait();
      return dieSoon();
    }
    const auto work = recv(p2p, in, 1, 2);
    send(p2p, {1}, 1, 1)->wait();
    const auto start = Clock::now();
    const std::string message = messageOf<NetworkError>([&] { work->wait(); });
    if (!contains(message, "irecv from rank 1")) throw std::runtime_error("unexpected error: " + message);
    return std::to_string(elapsedSince(start).count());
  });
  EXPECT_LT(killedPeerSeenAfterMs(results), test::kPrompt.count());  // not at the 20 s timeout
}

INSTANTIATE_TEST_SUITE_P(Processes, P2pProcessTest, ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         [](const auto& info) { return std::string(transportKindName(info.param)); });

}  // namespace
}  // namespace ringtree
