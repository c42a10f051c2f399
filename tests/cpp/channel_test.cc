// Channels: communicators over one set of connections (Communicator::createOver,
// transport/mux/link.h), and the transport calls the links rest on (tentative receives,
// detaching a message from its buffer); over TCP and shared memory, ranks on threads.

#include <sys/socket.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
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
#include "harness/test_util.h"
#include "harness/thread_harness.h"
#include "common/socket.h"
#include "transport/shm/device.h"
#include "transport/tcp/device.h"
#include "transport/mux/link.h"
#include "transport/pair.h"

namespace ringtree {
namespace {

using namespace std::chrono_literals;
using test::contains;
using test::messageOf;
using transport::Envelope;
using transport::Pair;

constexpr size_t kMiB = size_t{1} << 20;

std::string kindName(const ::testing::TestParamInfo<TransportKind>& info) { return transportKindName(info.param); }

Envelope message(uint64_t sequence, size_t count) {
  Envelope envelope;
  envelope.sequence = sequence;
  envelope.count = count;
  envelope.dataType = static_cast<uint8_t>(DataType::kUInt8);
  return envelope;
}

std::vector<uint8_t> pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 12));
  return data;
}

// Drives pair until it is idle, or throws at the deadline.
void drive(Pair& pair, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pair.progress()) {
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("the pair did not become idle");
    std::this_thread::yield();
  }
}

// ---------------------------------------------------------------------------------------
// The transport calls of a multiplexer, on bare connections.

// The two ends of one connection of `kind` (tcp, shm) between ranks 0 and 1 of this
// process, made with the transports' own calls (no rendezvous).
std::vector<std::unique_ptr<Pair>> bareConnection(TransportKind kind) {
  std::vector<std::unique_ptr<Pair>> ends(2);
  const net::Deadline deadline = net::deadlineAfter(20s);
  net::Socket dialed;
  net::Socket accepted;
  std::unique_ptr<transport::shm::Listener> shmListener;
  if (kind == TransportKind::kShm) {
    shmListener = std::make_unique<transport::shm::Listener>();
    std::string error;
    dialed = transport::shm::connect(shmListener->name(), deadline, &error);
    if (!dialed.valid()) throw NetworkError("shm connect: " + error);
    accepted = shmListener->accept(deadline);
    std::thread other([&] {
      ends[1] = transport::shm::createPair(std::move(accepted), false, 1, 0, "rank 0", {}, deadline);
    });
    ends[0] = transport::shm::createPair(std::move(dialed), true, 0, 1, "rank 1", {}, deadline);
    other.join();
    return ends;
  }
  const net::Socket listener = net::listenTcp("127.0.0.1", 0);
  std::string error;
  const auto addresses = net::resolve("127.0.0.1", net::localPort(listener.fd()), &error);
  if (addresses.empty() || net::connectTo(addresses.front(), deadline, &dialed) != 0) {
    throw NetworkError("tcp connect failed " + error);
  }
  accepted = net::Socket(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
  ends[0] = transport::tcp::createPair(std::move(dialed), 0, 1, "rank 1", {});
  ends[1] = transport::tcp::createPair(std::move(accepted), 1, 0, "rank 0", {});
  return ends;
}

class ConnectionTest : public ::testing::TestWithParam<TransportKind> {
 protected:
  // body(rank, pair to the other rank) on two threads over bare connections.
  void runPair(const std::function<void(int rank, Pair& pair)>& body) {
    std::vector<std::unique_ptr<Pair>> ends = bareConnection(GetParam());
    test::runOnThreads(2, [&](int rank) { body(rank, *ends[static_cast<size_t>(rank)]); });
  }
};

TEST_P(ConnectionTest, TentativeReceiveTakesOnlyTheMessageItExpects) {
  std::atomic<bool> sent{false};
  runPair([&](int rank, Pair& pair) {
    const std::vector<uint8_t> first = pattern(8, 1);
    const std::vector<uint8_t> second = pattern(8, 2);
    if (rank == 0) {
      pair.postSend(message(1, 8), first.data(), 8);
      pair.postSend(message(2, 8), second.data(), 8);
      drive(pair);
      sent = true;
      return;
    }
    std::vector<uint8_t> in(8, 0);
    // Nothing arrived yet: a tentative receive can be taken back.
    pair.postTentativeRecv(message(2, 8), in.data(), 8, {});
    EXPECT_TRUE(pair.withdrawTentativeRecv());
    EXPECT_EQ(pair.pendingRecvs(), 0u);
    test::waitForFlag(sent);
    // The next message is seq 1: refused, left for whoever takes it.
    pair.postTentativeRecv(message(2, 8), in.data(), 8, {});
    ASSERT_TRUE(test::eventually([&] { return pair.progress() || pair.recvRefused(); }));
    EXPECT_TRUE(pair.recvRefused());
    EXPECT_EQ(pair.pendingRecvs(), 1u);
    EXPECT_EQ(in, std::vector<uint8_t>(8, 0));
    EXPECT_TRUE(pair.withdrawTentativeRecv());
    EXPECT_FALSE(pair.recvRefused());
    Envelope seen;
    size_t bytes = 0;
    ASSERT_TRUE(pair.peekIncoming(&seen, &bytes));
    EXPECT_EQ(seen, message(1, 8));
    pair.postRecv(message(1, 8), in.data(), 8);
    drive(pair);
    EXPECT_EQ(in, first);
    // The next one is seq 2: taken.
    pair.postTentativeRecv(message(2, 8), in.data(), 8, {});
    drive(pair);
    EXPECT_EQ(in, second);
    EXPECT_FALSE(pair.recvRefused());
  });
}

TEST_P(ConnectionTest, ATentativeReceiveThatStartedCannotBeWithdrawn) {
  // Larger than the socket buffers: rank 0 hands over what its connection takes, then
  // waits until rank 1 has started the receive with it (TCP); shared memory pulls the
  // whole direct-copy message in the call that takes its header.
  constexpr size_t kBytes = 64 * kMiB;
  std::atomic<bool> partlySent{false};
  std::atomic<bool> started{false};
  runPair([&](int rank, Pair& pair) {
    if (rank == 0) {
      const std::vector<uint8_t> out = pattern(kBytes, 3);
      pair.postSend(message(1, kBytes), out.data(), kBytes);
      EXPECT_FALSE(pair.progress());
      partlySent = true;
      test::waitForFlag(started);
      drive(pair, 20s);
      return;
    }
    test::waitForFlag(partlySent);
    std::vector<uint8_t> in(kBytes, 0);
    pair.postTentativeRecv(message(1, kBytes), in.data(), kBytes, {});
    const bool finished = pair.progress();
    EXPECT_FALSE(pair.recvRefused());
    EXPECT_FALSE(pair.withdrawTentativeRecv());  // taken (TCP: taking), not withdrawn
    EXPECT_TRUE(finished || GetParam() == TransportKind::kTcp);
    started = true;
    drive(pair, 20s);
    EXPECT_EQ(pair.pendingRecvs(), 0u);
    EXPECT_TRUE(in == pattern(kBytes, 3));
  });
}

TEST_P(ConnectionTest, ADetachedSendArrivesWholeFromThePairsCopy) {
  // Larger than the socket buffers and the ring, and (shm) a direct-copy message: the
  // sender detaches it while the peer reads nothing, then overwrites its buffer.
  constexpr size_t kBytes = 64 * kMiB;
  std::atomic<bool> detached{false};
  runPair([&](int rank, Pair& pair) {
    if (rank == 0) {
      std::vector<uint8_t> out = pattern(kBytes, 4);
      pair.postSend(message(1, kBytes), out.data(), kBytes);
      EXPECT_FALSE(pair.progress());
      ASSERT_TRUE(pair.detachSends(net::deadlineAfter(5s)));
      std::fill(out.begin(), out.end(), uint8_t{0xab});
      detached = true;
      drive(pair, 20s);
      return;
    }
    test::waitForFlag(detached);
    std::vector<uint8_t> in(kBytes, 0);
    pair.postRecv(message(1, kBytes), in.data(), kBytes);
    drive(pair, 20s);
    EXPECT_TRUE(in == pattern(kBytes, 4)) << "the payload changed after it was detached";
  });
}

TEST_P(ConnectionTest, ADetachedReceiveTakesItsMessageAndStoresNothing) {
  constexpr size_t kBytes = 16 * kMiB;
  std::atomic<bool> sent{false};
  runPair([&](int rank, Pair& pair) {
    const std::vector<uint8_t> small = pattern(8, 5);
    if (rank == 0) {
      const std::vector<uint8_t> out = pattern(kBytes, 6);
      pair.postSend(message(1, kBytes), out.data(), kBytes);
      pair.postSend(message(2, 8), small.data(), 8);
      sent = true;
      drive(pair, 20s);
      return;
    }
    test::waitForFlag(sent);
    std::vector<uint8_t> in(kBytes, 0);
    pair.postRecv(message(1, kBytes), in.data(), kBytes);
    pair.detachRecvs();
    std::vector<uint8_t> next(8, 0);
    pair.postRecv(message(2, 8), next.data(), 8);
    drive(pair, 20s);
    EXPECT_TRUE(std::all_of(in.begin(), in.end(), [](uint8_t b) { return b == 0; }));
    EXPECT_EQ(next, small);
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, ConnectionTest, ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         kindName);

// ---------------------------------------------------------------------------------------
// Links: channels over one connection, driven by hand.

// body(rank, link to the other rank) on two threads.
void runLinks(TransportKind kind, const std::function<void(int rank, std::shared_ptr<transport::mux::Link>)>& body) {
  std::vector<std::unique_ptr<Pair>> ends = bareConnection(kind);
  test::runOnThreads(2, [&](int rank) {
    body(rank, std::make_shared<transport::mux::Link>(std::move(ends[static_cast<size_t>(rank)])));
  });
}

class LinkTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(LinkTest, AChannelThatGivesUpWhileItsMessageArrivesLetsGoOfIt) {
  // Rank 0's channel b waits, so channel a's large message is taken into a buffer of a's
  // as it arrives; a gives up and is destroyed in the middle of it; b then gets its own.
  constexpr size_t kBytes = 64 * kMiB;
  std::atomic<bool> destroyed{false};
  runLinks(GetParam(), [&](int rank, std::shared_ptr<transport::mux::Link> link) {
    auto a = link->open(11, rank, 1 - rank, "rank " + std::to_string(1 - rank));
    auto b = link->open(22, rank, 1 - rank, "rank " + std::to_string(1 - rank));
    const std::vector<uint8_t> small = pattern(8, 9);
    if (rank == 1) {
      const std::vector<uint8_t> big = pattern(kBytes, 8);
      a->postSend(message(1, kBytes), big.data(), kBytes);
      test::waitForFlag(destroyed);  // (a's send went on meanwhile, from rank 0's drives)
      b->postSend(message(1, 8), small.data(), 8);
      drive(*b, 20s);
      a.reset();
      return;
    }
    std::vector<uint8_t> in(8, 0);
    b->postRecv(message(1, 8), in.data(), 8);
    const auto until = std::chrono::steady_clock::now() + 100ms;
    while (std::chrono::steady_clock::now() < until) b->progress();  // a's message starts arriving
    Envelope notice = message(1, kBytes);
    notice.noticeKind = transport::kAbandonNotice;
    a->sendNotice(notice, net::deadlineAfter(1s));
    a.reset();
    destroyed = true;
    drive(*b, 20s);
    EXPECT_EQ(in, small);
  });
}

TEST_P(LinkTest, AFailedChannelLetsGoOfItsSendsBeforeItsCallerFreesThem) {
  // Rank 1's channel a gives up (a notice, its end closed); rank 0's send on a, larger
  // than the connection takes at once, fails with that notice, and rank 0 frees the
  // buffer at once, as a failed call's caller would. Channel b goes on over the link.
  constexpr size_t kBytes = 64 * kMiB;
  std::atomic<bool> freed{false};
  runLinks(GetParam(), [&](int rank, std::shared_ptr<transport::mux::Link> link) {
    auto a = link->open(11, rank, 1 - rank, "rank " + std::to_string(1 - rank));
    auto b = link->open(22, rank, 1 - rank, "rank " + std::to_string(1 - rank));
    const std::vector<uint8_t> small = pattern(8, 10);
    if (rank == 1) {
      Envelope notice = message(1, 0);
      notice.noticeKind = transport::kAbandonNotice;
      a->sendNotice(notice, net::deadlineAfter(1s));
      test::waitForFlag(freed);
      std::vector<uint8_t> in(8, 0);
      b->postRecv(message(1, 8), in.data(), 8);  // drives the link: a's message is dropped as it comes
      drive(*b, 20s);
      EXPECT_EQ(in, small);
      return;
    }
    std::unique_ptr<uint8_t[]> big(new uint8_t[kBytes]);
    std::memset(big.get(), 3, kBytes);
    a->postSend(message(1, kBytes), big.get(), kBytes);
    const std::string text = messageOf<CollectiveMismatchError>([&] {
      const auto deadline = std::chrono::steady_clock::now() + 10s;
      while (std::chrono::steady_clock::now() < deadline) {
        a->progress();
        if (a->pendingRecvs() == 0) a->checkIncoming(nullptr);
        std::this_thread::yield();
      }
    });
    EXPECT_TRUE(contains(text, "where no message was expected")) << text;
    EXPECT_EQ(a->pendingSends(), 0u);  // let go of: the connection sends on from its own copy
    big.reset();
    freed = true;
    b->postSend(message(1, 8), small.data(), 8);
    drive(*b, 20s);
    EXPECT_THROW(a->progress(), CollectiveMismatchError);  // failed for good
  });
}

TEST_P(LinkTest, TakeIncomingServesWhatAChannelWasSentInOrder) {
  // Rank 1 sends a, a, b on two channels. Rank 0's a takes its first message: left in the
  // connection (taken from there over shared memory; TCP takes nothing, a receive does).
  // Then b waits with a receive posted behind a's second message, which the link takes
  // into a buffer of a's: a takes it from there on either transport.
  std::atomic<bool> sent{false};
  std::atomic<bool> received{false};
  runLinks(GetParam(), [&](int rank, std::shared_ptr<transport::mux::Link> link) {
    auto a = link->open(11, rank, 1 - rank, "rank " + std::to_string(1 - rank));
    auto b = link->open(22, rank, 1 - rank, "rank " + std::to_string(1 - rank));
    const std::vector<uint8_t> first = pattern(8, 1);
    const std::vector<uint8_t> second = pattern(16, 2);
    const std::vector<uint8_t> third = pattern(24, 3);
    if (rank == 1) {
      a->postSend(message(1, 8), first.data(), 8);
      a->postSend(message(2, 24), third.data(), 24);
      b->postSend(message(1, 16), second.data(), 16);
      drive(*a);
      drive(*b);
      sent = true;
      test::waitForFlag(received);  // its channels close with it
      return;
    }
    const test::SetOnExit setReceived(received);
    test::waitForFlag(sent);
    Envelope seen;
    size_t bytes = 0;
    ASSERT_TRUE(test::eventually([&] { return a->peekIncoming(&seen, &bytes); }));
    EXPECT_EQ(seen, message(1, 8));
    std::vector<uint8_t> in(8, 0);
    EXPECT_FALSE(a->takeIncoming(in.data(), 7));  // another size: left there
    if (a->takeIncoming(in.data(), 8)) {
      EXPECT_EQ(GetParam(), TransportKind::kShm);
    } else {
      EXPECT_EQ(GetParam(), TransportKind::kTcp);
      a->postRecv(seen, in.data(), 8);
      drive(*a);
    }
    EXPECT_EQ(in, first);
    // b's message is behind a's second one, which the link takes for a as it passes.
    std::vector<uint8_t> inB(16, 0);
    b->postRecv(message(1, 16), inB.data(), 16);
    drive(*b);
    EXPECT_EQ(inB, second);
    ASSERT_TRUE(test::eventually([&] { return a->peekIncoming(&seen, &bytes); }));
    EXPECT_EQ(seen, message(2, 24));
    std::vector<uint8_t> inA(24, 0);
    ASSERT_TRUE(test::eventually([&] { return a->takeIncoming(inA.data(), 24); }));  // from a's buffer
    EXPECT_EQ(inA, third);
    EXPECT_FALSE(a->peekIncoming(&seen, &bytes));
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, LinkTest, ::testing::Values(TransportKind::kTcp, TransportKind::kShm), kindName);

// ---------------------------------------------------------------------------------------
// Communicators over shared connections.

class ChannelTest : public ::testing::TestWithParam<TransportKind> {
 protected:
  CommunicatorOptions options(std::chrono::milliseconds timeout = 20s) const {
    return test::testOptions(GetParam(), timeout);
  }
};

// Every rank's value r + 1 + i, summed over `ranks`.
std::vector<int32_t> contribution(int worldRank, size_t count) {
  std::vector<int32_t> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = worldRank + 1 + static_cast<int32_t>(i % 1000);
  return data;
}

void expectSum(const std::vector<int32_t>& data, const std::vector<int>& worldRanks) {
  int32_t base = 0;
  for (const int r : worldRanks) base += r + 1;
  for (size_t i = 0; i < data.size(); ++i) {
    const int32_t expected = base + static_cast<int32_t>(worldRanks.size()) * static_cast<int32_t>(i % 1000);
    if (data[i] != expected) {
      ADD_FAILURE() << "element " << i << " is " << data[i] << ", expected " << expected;
      return;
    }
  }
}

TEST_P(ChannelTest, CommunicatorsOverOneConnectionRunAtOnceFromThreads) {
  // Three ranks; on each, the world and two communicators over its connections run
  // allreduces of every size at once, each from a thread of its own, ring and tree.
  constexpr int kRounds = 3;  // enough to interleave every size of the three; each round takes ~3 s on 2 cores
  test::runCommunicators(3, [&](int rank, Communicator& world) {
    const std::vector<int> all{0, 1, 2};
    const std::vector<int> pair{0, 2};
    auto a = Communicator::createOver(world, all, "a", options());
    std::shared_ptr<Communicator> b;
    if (rank != 1) b = Communicator::createOver(world, pair, "b", options());
    EXPECT_EQ(a->rank(), rank);
    EXPECT_EQ(a->size(), 3);
    const auto loop = [&](Communicator& comm, const std::vector<int>& members, Algorithm algorithm) {
      for (int round = 0; round < kRounds; ++round) {
        for (const size_t count : {size_t{1}, size_t{1000}, size_t{300000}, 2 * kMiB}) {
          std::vector<int32_t> data = contribution(rank, count);
          AllreduceOptions o;
          o.algorithm = algorithm;
          o.maxSegmentBytes = 256 << 10;
          allreduce(comm, data.data(), count, DataType::kInt32, o);
          expectSum(data, members);
        }
      }
    };
    std::thread worldThread([&] { loop(world, all, Algorithm::kRing); });
    std::thread bThread;
    if (b) bThread = std::thread([&] { loop(*b, pair, Algorithm::kTree); });
    loop(*a, all, Algorithm::kRing);
    worldThread.join();
    if (bThread.joinable()) bThread.join();
  }, options());
}

TEST_P(ChannelTest, PointToPointAndCollectivesShareTheConnections) {
  constexpr int kRounds = 8;
  test::runCommunicators(2, [&](int rank, Communicator& world) {
    auto overP2p = Communicator::createOver(world, {0, 1}, "p2p", options());
    PointToPoint p2p(overP2p);
    std::thread messages([&] {
      for (int round = 0; round < kRounds; ++round) {
        for (const size_t bytes : {size_t{8}, size_t{100000}, 4 * kMiB}) {
          const std::vector<uint8_t> out = pattern(bytes, static_cast<uint8_t>(rank + round));
          std::vector<uint8_t> in(bytes, 0);
          auto receiving = p2p.irecv(in.data(), bytes, DataType::kUInt8, 1 - rank, round);
          p2p.send(out.data(), bytes, DataType::kUInt8, 1 - rank, round);
          receiving->wait();
          EXPECT_TRUE(in == pattern(bytes, static_cast<uint8_t>(1 - rank + round)));
        }
      }
    });
    for (int round = 0; round < kRounds; ++round) {
      std::vector<int32_t> data = contribution(rank, kMiB);
      allreduce(world, data.data(), data.size(), DataType::kInt32);
      expectSum(data, {0, 1});
    }
    messages.join();
  }, options());
}

TEST_P(ChannelTest, MessagesThatArriveBeforeTheirCommunicatorAreKept) {
  test::runCommunicators(2, [&](int rank, Communicator& world) {
    if (rank == 1) std::this_thread::sleep_for(300ms);  // rank 0's messages arrive first
    auto late = Communicator::createOver(world, {0, 1}, "late", options());
    for (const size_t count : {size_t{4}, 2 * kMiB}) {
      std::vector<int32_t> data = contribution(rank, count);
      allreduce(*late, data.data(), count, DataType::kInt32);
      expectSum(data, {0, 1});
    }
  }, options());
}

TEST_P(ChannelTest, AMismatchFailsItsCommunicatorAlone) {
  test::runCommunicators(2, [&](int rank, Communicator& world) {
    auto group = Communicator::createOver(world, {0, 1}, "mismatched", options());
    std::vector<int32_t> data = contribution(rank, 64);
    const std::string text = messageOf<CollectiveMismatchError>([&] {
      if (rank == 0) {
        allreduce(*group, data.data(), data.size(), DataType::kInt32);
      } else {
        BroadcastOptions o;
        o.algorithm = Algorithm::kTree;
        broadcast(*group, data.data(), data.size(), DataType::kInt32, o);
      }
    });
    EXPECT_TRUE(contains(text, "collective mismatch")) << text;
    // The group is unusable; the world over the same connections is not.
    EXPECT_THROW(allreduce(*group, data.data(), data.size(), DataType::kInt32), CollectiveMismatchError);
    for (const size_t count : {size_t{64}, kMiB}) {
      std::vector<int32_t> fresh = contribution(rank, count);
      allreduce(world, fresh.data(), count, DataType::kInt32);
      expectSum(fresh, {0, 1});
    }
  }, options());
}

TEST_P(ChannelTest, ATimedOutLargeSendIsDetachedAndTheConnectionLives) {
  // Rank 0 gives up on a group call whose large message rank 1 is not reading (rank 1 is
  // in no call of that group), then overwrites its buffer. The world over the same
  // connections goes on; rank 1's call in the group, when it comes, fails naming why.
  constexpr size_t kCount = 16 * kMiB / sizeof(int32_t);
  std::atomic<bool> gaveUp{false};
  test::runCommunicators(2, [&](int rank, Communicator& world) {
    auto group = Communicator::createOver(world, {0, 1}, "slow", options(1s));
    std::vector<int32_t> data = contribution(rank, kCount);
    if (rank == 0) {
      BroadcastOptions o;
      o.algorithm = Algorithm::kChain;
      const std::string text =
          messageOf<TimeoutError>([&] { broadcast(*group, data.data(), kCount, DataType::kInt32, o); });
      EXPECT_TRUE(contains(text, "timed out")) << text;
      std::fill(data.begin(), data.end(), -1);
      gaveUp = true;
    } else {
      test::waitForFlag(gaveUp);
    }
    for (const size_t count : {size_t{16}, kMiB}) {
      std::vector<int32_t> fresh = contribution(rank, count);
      allreduce(world, fresh.data(), count, DataType::kInt32);
      expectSum(fresh, {0, 1});
    }
    if (rank == 1) {
      // Rank 0's detached message arrived whole (with its content from before rank 0
      // overwrote it), its notice after it: the broadcast gets the message, or the notice
      // if rank 0 had not sent all of it; the next call gets the notice.
      BroadcastOptions o;
      o.algorithm = Algorithm::kChain;
      std::string text;
      try {
        broadcast(*group, data.data(), kCount, DataType::kInt32, o);
        EXPECT_TRUE(data == contribution(0, kCount));
        text = messageOf<Error>([&] { allreduce(*group, data.data(), 16, DataType::kInt32); });
      } catch (const Error& e) {
        text = e.what();
      }
      EXPECT_TRUE(contains(text, "rank 0")) << text;
    }
  }, options());
}

TEST_P(ChannelTest, ADestroyedCommunicatorIsReportedToThePeerWaitingOnIt) {
  std::atomic<bool> waiting{false};
  test::runCommunicators(2, [&](int rank, Communicator& world) {
    auto group = Communicator::createOver(world, {0, 1}, "left", options());
    if (rank == 1) {
      test::waitForFlag(waiting);
      std::this_thread::sleep_for(200ms);
      group.reset();  // rank 0 waits in the group's allreduce
    } else {
      std::vector<int32_t> data = contribution(rank, 16);
      const auto start = std::chrono::steady_clock::now();
      waiting = true;
      const std::string text =
          messageOf<NetworkError>([&] { allreduce(*group, data.data(), data.size(), DataType::kInt32); });
      EXPECT_LT(test::elapsedSince(start), test::kPrompt);
      EXPECT_TRUE(contains(text, "rank 1")) << text;
      EXPECT_TRUE(contains(text, "closed")) << text;
      EXPECT_TRUE(contains(text, "allreduce(seq=1")) << text;
    }
    std::vector<int32_t> fresh = contribution(rank, 16);
    allreduce(world, fresh.data(), fresh.size(), DataType::kInt32);
    expectSum(fresh, {0, 1});
  }, options());
}

TEST_P(ChannelTest, ARecreatedCommunicatorGetsAChannelOfItsOwn) {
  // A communicator destroyed with a message of it still unread, then made again under the
  // same name: the new one never sees the old one's message.
  test::runCommunicators(2, [&](int rank, Communicator& world) {
    {
      auto first = Communicator::createOver(world, {0, 1}, "again", options());
      if (rank == 0) {
        PointToPoint p2p(first);
        const int32_t stale = 7;
        p2p.send(&stale, 1, DataType::kInt32, 1, 0);
      }
      barrier(world);
    }
    barrier(world);
    auto second = Communicator::createOver(world, {0, 1}, "again", options());
    PointToPoint p2p(second);
    int32_t value = rank == 0 ? 42 : 0;
    if (rank == 0) {
      p2p.send(&value, 1, DataType::kInt32, 1, 0);
    } else {
      p2p.recv(&value, 1, DataType::kInt32, 0, 0);
      EXPECT_EQ(value, 42);
    }
  }, options());
}

TEST_P(ChannelTest, SubgroupRanksAndHostsFollowTheMembers) {
  test::runCommunicators(4, [&](int rank, Communicator& world) {
    if (rank == 0) return;
    const std::vector<int> members{3, 1, 2};
    auto group = Communicator::createOver(world, members, "order", options());
    const int expected = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    EXPECT_EQ(group->rank(), expected);
    EXPECT_EQ(group->size(), 3);
    EXPECT_STREQ(group->transportTo(expected), "self");
    const int next = (expected + 1) % 3;
    EXPECT_STREQ(group->transportTo(next), world.transportTo(members[static_cast<size_t>(next)]));
    // On one host over shared memory, a node arena of its own, as the world has.
    EXPECT_EQ(group->impl().arena() != nullptr, GetParam() == TransportKind::kShm);
    EXPECT_EQ(world.impl().arena() != nullptr, GetParam() == TransportKind::kShm);
    std::vector<int32_t> data = contribution(rank, 1000);
    allreduce(*group, data.data(), data.size(), DataType::kInt32);
    expectSum(data, {1, 2, 3});
  }, options());
}

INSTANTIATE_TEST_SUITE_P(Transports, ChannelTest, ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         kindName);

TEST(ChannelArguments, CreateOverRefusesBadRankLists) {
  test::runCommunicators(2, [&](int rank, Communicator& world) {
    EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { Communicator::createOver(world, {}, "x"); }), "empty"));
    EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { Communicator::createOver(world, {0, 0}, "x"); }),
                         "listed twice"));
    EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { Communicator::createOver(world, {0, 5}, "x"); }),
                         "rank 5 is not a rank"));
    EXPECT_TRUE(contains(messageOf<InvalidArgument>([&] { Communicator::createOver(world, {1 - rank}, "x"); }),
                         "not one of the ranks"));
    // Size one: no peer, works at once.
    auto alone = Communicator::createOver(world, {rank}, "alone");
    std::vector<int32_t> data{5};
    allreduce(*alone, data.data(), 1, DataType::kInt32);
    EXPECT_EQ(data[0], 5);
  });
}

}  // namespace
}  // namespace ringtree
