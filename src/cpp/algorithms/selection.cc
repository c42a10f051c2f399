#include "algorithms/selection.h"

#include <cstring>
#include <string>

#include <ringtree/error.h>

#include "common/env.h"
#include "common/logging.h"

namespace ringtree {

const char* algorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kTree: return "tree";
    case Algorithm::kHalvingDoubling: return "halving_doubling";
    case Algorithm::kChain: return "chain";
    case Algorithm::kShmDirect: return "shm_direct";
  }
  return "unknown";
}

Algorithm parseAlgorithm(const char* name) {
  for (auto algorithm : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kTree, Algorithm::kHalvingDoubling,
                         Algorithm::kChain, Algorithm::kShmDirect}) {
    if (std::strcmp(name, algorithmName(algorithm)) == 0) {
      return algorithm;
    }
  }
  throw InvalidArgument(std::string("unknown algorithm '") + name +
                        "'; expected one of auto, ring, tree, halving_doubling, chain, shm_direct");
}

namespace algorithms {

namespace {


bool implements(Collective collective, Algorithm algorithm) {
  switch (collective) {
    case Collective::kAllreduce:
      return algorithm == Algorithm::kRing || algorithm == Algorithm::kTree ||
             algorithm == Algorithm::kHalvingDoubling || algorithm == Algorithm::kShmDirect;
    case Collective::kBroadcast:
      return algorithm == Algorithm::kTree || algorithm == Algorithm::kChain || algorithm == Algorithm::kShmDirect;
    case Collective::kReduce:
      return algorithm == Algorithm::kTree || algorithm == Algorithm::kRing;
    case Collective::kBarrier:
      return false;
  }
  return false;
}

const char* implementedNames(Collective collective) {
  switch (collective) {
    case Collective::kAllreduce: return "ring, tree, halving_doubling, shm_direct";
    case Collective::kBroadcast: return "tree, chain, shm_direct";
    case Collective::kReduce: return "tree, ring";
    case Collective::kBarrier: return "(none: barrier has one algorithm)";
  }
  return "";
}

// Whether shm_direct beats the pair algorithms on a communicator with a node arena.
// Measured on the project machine (2 vCPUs; forked processes, run under SCHED_FIFO to keep
// other users' load out; the pair algorithms over shm pairs of a communicator made with
// RINGTREE_SHM_ARENA=0; float32; median time per op of 5-9 runs, in us):
//  allreduce (shm_direct / halving_doubling / ring):
//    n=2: 8 B 0.19 / 0.31 / 0.59; 8 KiB 0.62 / 1.24 / 1.59; 64 KiB 3.7 / 6.5 / 6.5;
//         256 KiB 13.4 / 17.4 / 17.5; 1 MiB 52 / 161 / 152; 64 MiB 7.3k / 15.8k / 15.5k
//         (busbw 9.2 / 4.3 / 4.3 GB/s)
//    n=4 (two ranks per core): 8 B 3.7 / 7.7 / 18.0; 8 KiB 8.0 / 5.7 / 22.0 (6.1 / 6.2
//         in other runs); 64 KiB 21.7 / 29.9 / 31.3; 1 MiB 210 / 450 / 375;
//         64 MiB 21.4k / 47.0k / 45.5k
//    so shm_direct at every size.
//  broadcast (shm_direct / tree / chain): every rank checks that all others entered the
//  call before it leaves (a round trip), while the tree's root only posts its sends:
//    n=2: 8 B 0.21 / 0.20 / 0.18; 1 KiB 0.23 / 0.33 / 0.31; 8 KiB 0.38 / 1.03 / 1.01;
//         1 MiB 32 / 109 / 107; 64 MiB 5.2k / 12.8k / 14.2k (12.9 / 5.2 / 4.7 GB/s)
//    n=3 (best of 9): 64 KiB 7.3 / 4.2 / 5.6; 128 KiB 11.5 / 7.9 / 11.0;
//         256 KiB 19.1 / 46.5 / 70.3
//    n=4: 8 B 5.3 / 0.59 / 0.40; 64 KiB 10.8 / 8.0 / 7.8; 128 KiB 18.5 / 15.7 / 11.0;
//         256 KiB 31.3 / 89.2 / 65.1; 64 MiB 11.4k / 25.8k / 19.2k
//    so shm_direct from 1 KiB on two ranks (a tie below), from 256 KiB on more.
//  barrier (arena / dissemination): n=2 0.11 / 0.24 us, n=4 2.2 / 6.6 us: always.
constexpr size_t kShmDirectBroadcastMinBytesTwoRanks = size_t{1} << 10;
constexpr size_t kShmDirectBroadcastMinBytes = size_t{256} << 10;

bool preferShmDirect(Collective collective, size_t bytes, int worldSize) {
  switch (collective) {
    case Collective::kAllreduce: return true;
    case Collective::kBroadcast:
      return bytes >= (worldSize == 2 ? kShmDirectBroadcastMinBytesTwoRanks : kShmDirectBroadcastMinBytes);
    case Collective::kReduce:
    case Collective::kBarrier: return false;
  }
  return false;
}

// Whether kShmDirect can run: it needs the arena, except on a single rank (nothing moves).
bool usable(Algorithm algorithm, bool hasArena, int worldSize) {
  return algorithm != Algorithm::kShmDirect || hasArena || worldSize == 1;
}

Algorithm bySize(Collective collective, size_t bytes, int worldSize, bool hasArena) {
  if (hasArena && preferShmDirect(collective, bytes, worldSize)) {
    return Algorithm::kShmDirect;
  }
  const bool small = bytes <= kSmallMessageBytes;
  switch (collective) {
    case Collective::kAllreduce:
      // Recursive doubling needs log2(n) steps of the whole buffer; the ring needs
      // 2(n-1) steps of 1/n of it, so it wins once bandwidth dominates.
      return small || worldSize == 2 ? Algorithm::kHalvingDoubling : Algorithm::kRing;
    case Collective::kBroadcast:
      return small || worldSize <= 2 ? Algorithm::kTree : Algorithm::kChain;
    case Collective::kReduce:
      return small || worldSize <= 2 ? Algorithm::kTree : Algorithm::kRing;
    case Collective::kBarrier:
      return Algorithm::kAuto;
  }
  return Algorithm::kAuto;
}

}  // namespace

Algorithm selectAlgorithm(Collective collective, Algorithm requested, size_t bytes, int worldSize, bool hasArena) {
  if (collective == Collective::kBarrier) {
    return hasArena ? Algorithm::kShmDirect : Algorithm::kAuto;
  }
  if (requested != Algorithm::kAuto) {
    if (!implements(collective, requested)) {
      throw InvalidArgument(std::string("algorithm '") + algorithmName(requested) + "' is not available for " +
                            collectiveName(collective) + "; choose one of " + implementedNames(collective));
    }
    if (!usable(requested, hasArena, worldSize)) {
      throw InvalidArgument(std::string(collectiveName(collective)) +
                            ": shm_direct needs every rank on one host with shared memory (this communicator "
                            "has no node arena: some ranks are elsewhere or reached over TCP, or "
                            "RINGTREE_SHM_ARENA=0)");
    }
    return requested;
  }
  Algorithm chosen = Algorithm::kAuto;
  const std::string fromEnv = env::algorithm();
  if (!fromEnv.empty()) {
    const Algorithm named = parseAlgorithm(fromEnv.c_str());
    if (implements(collective, named) && usable(named, hasArena, worldSize)) {
      chosen = named;
    }
  }
  if (chosen == Algorithm::kAuto) {
    chosen = bySize(collective, bytes, worldSize, hasArena);
  }
  RINGTREE_DEBUG(collectiveName(collective) << " of " << bytes << " bytes on " << worldSize << " ranks: "
                                            << algorithmName(chosen)
                                            << (fromEnv.empty() ? "" : " (RINGTREE_ALGO=" + fromEnv + ")"));
  return chosen;
}

}  // namespace algorithms

}  // namespace ringtree
