// What one pair of ranks gets from each transport, and what this machine does without
// ringtree, measured in the same run (the machine these figures come from is shared and
// noisy: compare figures of one run only).
//
// Usage: transport_bench [pairs] [shm]   (default: both)
//   pairs  a TCP and a shared-memory pair of a Communicator between two threads: one-way
//          latency of 8-byte messages (ping-pong, waiting as the collectives do) and 64 MiB
//          streaming bandwidth
//   shm    the shared-memory pair alone, both sides spinning: memcpy and a bare atomic
//          ping-pong as the baseline; 8-byte one-way latency between threads and between
//          processes; 256 KiB messages through the ring (1 MiB ring) and the direct copy
//          (process_vm_readv) of 64 MiB and 256 KiB messages between processes, plain
//          and folded into the destination as a float32 sum. Each figure is the median
//          of several timed blocks.
//
// Prints "[ perf ] ..." and "[ shm ] ..." lines, GB/s decimal (1e9 B/s). It uses private
// headers (pairs, the shm transport), so it is built with a static libringtree only.
// Exit status 1 when a side fails.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include <ringtree/communicator.h>

#include "common/socket.h"
#include "communicator_impl.h"
#include "harness/shm_pairs.h"
#include "harness/thread_harness.h"
#include "transport/pair.h"

namespace {

using namespace ringtree;
using Clock = std::chrono::steady_clock;
using transport::Envelope;
using transport::Pair;
using transport::shm::Listener;
using transport::shm::PairOptions;

constexpr size_t kMiB = size_t{1} << 20;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

Envelope numbered(uint64_t sequence) {
  Envelope e;
  e.sequence = sequence;
  e.operation = 1;
  return e;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// --- pairs of a Communicator -----------------------------------------------------------

void waitAll(Communicator& c, Pair& pair) { c.impl().waitIdle({&pair}, net::deadlineAfter(std::chrono::seconds(20))); }

// 3000 8-byte round trips (after 200 untimed), then 5 timed 64 MiB messages (after one
// untimed) and an 8-byte acknowledgement, so that the sender's clock covers the last
// delivery.
void communicatorPair(TransportKind kind) {
  double oneWayUs = 0;
  double gbPerS = 0;
  test::runCommunicators(
      2,
      [&](int rank, Communicator& c) {
        Pair& pair = c.impl().pair(1 - rank);
        uint64_t value = 0;
        constexpr int kWarmup = 200;
        constexpr int kIterations = 3000;
        Clock::time_point start;
        for (int i = 0; i < kWarmup + kIterations; ++i) {
          if (i == kWarmup) start = Clock::now();
          if (rank == 0) {
            pair.postSend(numbered(static_cast<uint64_t>(i)), &value, 8);
            pair.postRecv(numbered(static_cast<uint64_t>(i)), &value, 8);
          } else {
            pair.postRecv(numbered(static_cast<uint64_t>(i)), &value, 8);
            waitAll(c, pair);
            pair.postSend(numbered(static_cast<uint64_t>(i)), &value, 8);
          }
          waitAll(c, pair);
        }
        if (rank == 0) oneWayUs = secondsSince(start) * 1e6 / kIterations / 2;
        std::vector<uint8_t> buffer(64 * kMiB, 1);
        constexpr int kRounds = 6;
        for (int round = 0; round < kRounds; ++round) {
          if (round == 1) start = Clock::now();
          if (rank == 0) {
            pair.postSend(numbered(1000 + static_cast<uint64_t>(round)), buffer.data(), buffer.size());
          } else {
            pair.postRecv(numbered(1000 + static_cast<uint64_t>(round)), buffer.data(), buffer.size());
          }
          waitAll(c, pair);
        }
        if (rank == 0) {
          pair.postRecv(numbered(2000), &value, 8);
        } else {
          pair.postSend(numbered(2000), &value, 8);
        }
        waitAll(c, pair);
        if (rank == 0) gbPerS = static_cast<double>(buffer.size()) * (kRounds - 1) / secondsSince(start) / 1e9;
      },
      test::testOptions(kind));
  std::printf("[ perf ] %s pair, 2 threads: 8-byte one-way latency %.2f us, 64 MiB streaming %.2f GB/s\n",
              transportKindName(kind), oneWayUs, gbPerS);
}

// --- the shared-memory pair alone ------------------------------------------------------

// Ping-pong of 8-byte messages, both sides spinning; returns the median one-way latency
// in us over blocks of 1000 round trips.
double pingPongMicros(Pair& pair, int side, int blocks) {
  constexpr int kRounds = 1000;
  uint64_t value = 0;
  std::vector<double> oneWay;
  for (int block = -1; block < blocks; ++block) {  // one warm-up block
    const auto start = Clock::now();
    for (int i = 0; i < kRounds; ++i) {
      for (int step = 0; step < 2; ++step) {
        if ((step == 0) == (side == 0)) {
          pair.postSend(numbered(0), &value, sizeof(value));
        } else {
          pair.postRecv(numbered(0), &value, sizeof(value));
        }
        test::spinIdle(pair);
      }
    }
    if (block >= 0) oneWay.push_back(secondsSince(start) * 1e6 / (2.0 * kRounds));
  }
  return median(oneWay);
}

// Streams batches of `depth` messages of `bytes` from side 1 to side 0 (spinning,
// sleeping only after long stalls); side 0 returns the median GB/s of a batch.
double streamGBps(Pair& pair, int side, size_t bytes, int batches, int depth, ReduceFn fn = nullptr) {
  std::vector<uint8_t> buffer(bytes);
  std::memset(buffer.data(), side == 1 ? 0x3f : 0, bytes);  // pre-faulted; small float32 values
  transport::Accumulate accumulate{fn, 4};
  std::vector<double> rates;
  for (int batch = -1; batch < batches; ++batch) {  // one warm-up batch
    const auto start = Clock::now();
    for (int k = 0; k < depth; ++k) {
      if (side == 1) {
        pair.postSend(numbered(0), buffer.data(), bytes);
      } else {
        pair.postRecv(numbered(0), buffer.data(), bytes, accumulate);
      }
    }
    test::waitIdle(pair, test::kPairTimeout, 20000);
    if (batch >= 0) rates.push_back(static_cast<double>(bytes) * depth / secondsSince(start) / 1e9);
  }
  return median(rates);
}

// One-way latency of a bare atomic ping-pong between two threads, in us.
double bareSpinMicros() {
  constexpr int kRounds = 20000;
  std::atomic<int> turn{0};
  auto other = std::async(std::launch::async, [&] {
    for (int i = 0; i < kRounds; ++i) {
      while (turn.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      turn.store(2 * i + 2, std::memory_order_release);
    }
  });
  const auto start = Clock::now();
  for (int i = 0; i < kRounds; ++i) {
    turn.store(2 * i + 1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 2 * i + 2) {
    }
  }
  const double micros = secondsSince(start) * 1e6 / (2.0 * kRounds);
  other.get();
  return micros;
}

double memcpyGBps(size_t bytes) {
  std::vector<uint8_t> from(bytes, 1);
  std::vector<uint8_t> to(bytes, 2);
  std::vector<double> rates;
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    std::memcpy(to.data(), from.data(), bytes);
    rates.push_back(static_cast<double>(bytes) / secondsSince(start) / 1e9);
  }
  return median(rates);
}

// Runs role on both sides of a pair between this process (side 0) and a forked child;
// returns side 0's figure. Throws when the child fails.
double inProcesses(const PairOptions& options, const std::function<double(Pair&, int)>& role) {
  Listener listener;
  test::Child child = test::forkPeer(listener, options, [&](Pair& pair, int side) {
    role(pair, side);
    return true;
  });
  double result = 0;
  {
    auto pair = test::acceptChild(listener, child, options);
    result = role(*pair, 0);
  }
  if (const int code = child.wait(); code != 0) {
    throw std::runtime_error("the child side exited with " + std::to_string(code));
  }
  return result;
}

void shmPair() {
  std::printf("[ shm ] this machine now: memcpy 64 MiB %.2f GB/s, bare spin ping-pong %.3f us one way\n",
              memcpyGBps(64 * kMiB), bareSpinMicros());
  {
    test::TwoPairs pairs = test::connectThreads();
    auto other = std::async(std::launch::async, [&] { return pingPongMicros(*pairs.rank1, 1, 9); });
    const double threads = pingPongMicros(*pairs.rank0, 0, 9);
    other.get();
    const double processes =
        inProcesses(PairOptions{}, [](Pair& pair, int side) { return pingPongMicros(pair, side, 9); });
    std::printf("[ shm ] one-way latency, 8 B, both spinning: threads %.3f us, processes %.3f us\n", threads,
                processes);
  }
  const double ring256k = inProcesses(test::ringOnly(), [](Pair& pair, int side) {
    return streamGBps(pair, side, 256 << 10, 15, 16);
  });
  const double ring256kSum = inProcesses(test::ringOnly(), [](Pair& pair, int side) {
    return streamGBps(pair, side, 256 << 10, 15, 16, test::sumElements<float>);
  });
  std::printf("[ shm ] ring, 256 KiB messages (1 MiB ring), processes: copy %.2f GB/s, float32 sum %.2f GB/s\n",
              ring256k, ring256kSum);
  const double direct64m =
      inProcesses(PairOptions{}, [](Pair& pair, int side) { return streamGBps(pair, side, 64 * kMiB, 5, 1); });
  const double direct64mSum = inProcesses(PairOptions{}, [](Pair& pair, int side) {
    return streamGBps(pair, side, 64 * kMiB, 5, 1, test::sumElements<float>);
  });
  const double direct256k =
      inProcesses(PairOptions{}, [](Pair& pair, int side) { return streamGBps(pair, side, 256 << 10, 15, 16); });
  std::printf("[ shm ] direct copy (process_vm_readv), processes: 64 MiB copy %.2f GB/s, 64 MiB float32 sum "
              "%.2f GB/s, 256 KiB copy %.2f GB/s\n",
              direct64m, direct64mSum, direct256k);
}

}  // namespace

int main(int argc, char** argv) {
  bool pairs = argc == 1;
  bool shm = argc == 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "pairs") {
      pairs = true;
    } else if (arg == "shm") {
      shm = true;
    } else {
      std::fprintf(stderr, "usage: transport_bench [pairs] [shm]\n");
      return 2;
    }
  }
  try {
    if (pairs) {
      communicatorPair(ringtree::TransportKind::kTcp);
      communicatorPair(ringtree::TransportKind::kShm);
    }
    if (shm) shmPair();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transport_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
