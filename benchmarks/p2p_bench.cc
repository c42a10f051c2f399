// Point-to-point ping-pong between two forked processes: the one-way latency of 8-byte
// messages and the bandwidth of 64 MiB ones through PointToPoint's blocking send/recv,
// through isend/irecv + wait, and, as the baseline, through the bare pair with the
// caller's thread waiting (what collectives do). Each figure is the best of 3 runs (the
// machine may be shared). Rank 0 prints one line per transport.
//
// Usage: p2p_bench [tcp] [shm]   (default: both)
//
// It uses private headers (the communicator's pairs), so it is built with a static
// libringtree only. Exit status 1 when a rank fails.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <ringtree/communicator.h>
#include <ringtree/p2p.h>

#include "common/socket.h"
#include "communicator_impl.h"
#include "harness/process_harness.h"
#include "harness/thread_harness.h"
#include "transport/pair.h"

namespace {

using namespace ringtree;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;
constexpr int kRepeats = 3;

// Rank `rank` of the ping-pong over `kind`; rank 0 returns the report line's figures.
std::string pingPong(int rank, const std::shared_ptr<Store>& store, TransportKind kind) {
  auto communicator = Communicator::create(store, rank, 2, test::testOptions(kind));
  const int peer = 1 - rank;
  // Seconds per one-way trip of `bytes`, the best of kRepeats averages over `iterations`
  // round trips; step(sending, buffer, bytes) moves one message.
  const auto timeOneWay = [&](size_t bytes, int iterations, const auto& step) {
    std::vector<uint8_t> buffer(bytes, 1);
    double best = 1e9;
    for (int repeat = 0; repeat < kRepeats; ++repeat) {
      Clock::time_point start;
      const int warmup = iterations / 10 + 1;
      for (int i = 0; i < warmup + iterations; ++i) {
        if (i == warmup) start = Clock::now();
        step(rank == 0, buffer.data(), bytes);
        step(rank != 0, buffer.data(), bytes);
      }
      best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count() / iterations / 2);
    }
    return best;
  };
  const auto gbPerS = [](double seconds) { return 64.0 * kMiB / seconds / 1e9; };
  std::string report;
  const auto measure = [&](const char* name, const auto& step) {
    const double small = timeOneWay(8, 3000, step);
    const double large = timeOneWay(64 * kMiB, 4, step);
    char text[160];
    std::snprintf(text, sizeof(text), "%s%s %.2f us, %.2f GB/s", report.empty() ? "" : "; ", name, small * 1e6,
                  gbPerS(large));
    report += text;
  };
  transport::Pair& pair = communicator->impl().pair(peer);
  const transport::Envelope envelope;
  measure("pair", [&](bool sending, uint8_t* data, size_t bytes) {
    if (sending) {
      pair.postSend(envelope, data, bytes);
    } else {
      pair.postRecv(envelope, data, bytes);
    }
    communicator->impl().waitIdle({&pair}, net::deadlineAfter(20s));
  });
  // Every pair message was consumed: the engine starts on clean connections.
  PointToPoint p2p(std::move(communicator));
  measure("send/recv", [&](bool sending, uint8_t* data, size_t bytes) {
    if (sending) {
      p2p.send(data, bytes, DataType::kUInt8, peer, 0);
    } else {
      p2p.recv(data, bytes, DataType::kUInt8, peer, 0);
    }
  });
  measure("isend/irecv+wait", [&](bool sending, uint8_t* data, size_t bytes) {
    if (sending) {
      p2p.isend(data, bytes, DataType::kUInt8, peer, 0)->wait();
    } else {
      p2p.irecv(data, bytes, DataType::kUInt8, peer, 0)->wait();
    }
  });
  return report;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<TransportKind> kinds;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "tcp") {
      kinds.push_back(TransportKind::kTcp);
    } else if (arg == "shm") {
      kinds.push_back(TransportKind::kShm);
    } else {
      std::fprintf(stderr, "usage: p2p_bench [tcp] [shm]\n");
      return 2;
    }
  }
  if (kinds.empty()) kinds = {TransportKind::kTcp, TransportKind::kShm};
  int status = 0;
  for (const TransportKind kind : kinds) {
    const auto results = test::runProcesses(
        2, [kind](int rank, std::shared_ptr<Store> store) { return pingPong(rank, store, kind); }, {}, 120s);
    bool ok = true;
    for (size_t rank = 0; rank < results.size(); ++rank) {
      if (!(results[rank].exited && results[rank].code == 0)) {
        std::fprintf(stderr, "p2p_bench %s rank %zu failed: %s\n", transportKindName(kind), rank,
                     results[rank].message.c_str());
        ok = false;
      }
    }
    if (!ok) {
      status = 1;
      continue;
    }
    std::printf("[ perf ] %s point-to-point, 2 processes, 8-byte one-way latency and 64 MiB bandwidth (best of %d): "
                "%s\n",
                transportKindName(kind), kRepeats, results[0].message.c_str());
    std::fflush(stdout);
  }
  return status;
}
