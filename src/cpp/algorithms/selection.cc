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
    case Algorithm::kPairwise: return "pairwise";
    case Algorithm::kLinear: return "linear";
    case Algorithm::kHierarchical: return "hierarchical";
  }
  return "unknown";
}

Algorithm parseAlgorithm(const char* name) {
  for (auto algorithm : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kTree, Algorithm::kHalvingDoubling,
                         Algorithm::kChain, Algorithm::kShmDirect, Algorithm::kPairwise, Algorithm::kLinear,
                         Algorithm::kHierarchical}) {
    if (std::strcmp(name, algorithmName(algorithm)) == 0) {
      return algorithm;
    }
  }
  throw InvalidArgument(std::string("unknown algorithm '") + name +
                        "'; expected one of auto, ring, tree, halving_doubling, chain, shm_direct, pairwise, linear, "
                        "hierarchical");
}

namespace algorithms {

namespace {


bool implements(Collective collective, Algorithm algorithm) {
  switch (collective) {
    case Collective::kAllreduce:
      return algorithm == Algorithm::kRing || algorithm == Algorithm::kTree ||
             algorithm == Algorithm::kHalvingDoubling || algorithm == Algorithm::kShmDirect ||
             algorithm == Algorithm::kHierarchical;
    case Collective::kBroadcast:
      return algorithm == Algorithm::kTree || algorithm == Algorithm::kChain || algorithm == Algorithm::kShmDirect ||
             algorithm == Algorithm::kHierarchical;
    case Collective::kReduce:
      return algorithm == Algorithm::kTree || algorithm == Algorithm::kRing || algorithm == Algorithm::kHierarchical;
    case Collective::kBarrier:
      return false;
    case Collective::kAllgather:
      return algorithm == Algorithm::kRing || algorithm == Algorithm::kHalvingDoubling ||
             algorithm == Algorithm::kShmDirect || algorithm == Algorithm::kHierarchical;
    case Collective::kReduceScatter:
      return algorithm == Algorithm::kRing || algorithm == Algorithm::kPairwise || algorithm == Algorithm::kShmDirect ||
             algorithm == Algorithm::kHierarchical;
    case Collective::kAlltoall:
      return algorithm == Algorithm::kPairwise || algorithm == Algorithm::kShmDirect;
    case Collective::kGather:
    case Collective::kScatter:
      return algorithm == Algorithm::kTree || algorithm == Algorithm::kLinear;
  }
  return false;
}

const char* implementedNames(Collective collective) {
  switch (collective) {
    case Collective::kAllreduce: return "ring, tree, halving_doubling, shm_direct, hierarchical";
    case Collective::kBroadcast: return "tree, chain, shm_direct, hierarchical";
    case Collective::kReduce: return "tree, ring, hierarchical";
    case Collective::kBarrier: return "(none: barrier chooses by the layout)";
    case Collective::kAllgather: return "ring, halving_doubling, shm_direct, hierarchical";
    case Collective::kReduceScatter: return "ring, pairwise, shm_direct, hierarchical";
    case Collective::kAlltoall: return "pairwise, shm_direct";
    case Collective::kGather:
    case Collective::kScatter: return "tree, linear";
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
//  allgather (shm_direct / ring over the same communicator; bytes = the whole output;
//  best of 3-5 runs of 20-40 ops, which swung up to 3x with the machine's other load):
//    n=2: 64 KiB 6.5 / 15.5; 256 KiB 20 / 77; 512 KiB 25 / 32; 1 MiB 43-182 / 59-99;
//         4 MiB 177-975 / 239-278; 16 MiB 2.9k-3.0k / 1.5k-1.8k
//    n=3: 64 KiB 16 / 29; 1 MiB 288 / 396; 4 MiB 460-1315 / 816-1407; 64 MiB 10.5k / 19.0k
//    n=4: 64 KiB 15 / 18; 256 KiB 42 / 34; 1 MiB 173 / 205; 4 MiB 840 / 1006
//  reduce_scatter (shm_direct / ring; bytes = one rank's input; same runs):
//    n=2: 16 KiB 3.4 / 4.1; 64 KiB 10.5 / 19.2; 256 KiB 59 / 98; 1 MiB 206-350 / 116;
//         4 MiB 975-1448 / 358-405; 16 MiB 4.0k / 3.4k
//    n=3: 64 KiB 24 / 33; 256 KiB 106 / 154; 1 MiB 469 / 487; 4 MiB 2.06k / 1.96k
//    n=4: 64 KiB 30 / 77; 256 KiB 126 / 152; 1 MiB 574 / 958; 4 MiB 2.59k / 3.25k
//  so both take shm_direct, except on two ranks from 1 MiB, where the ring's single-copy
//  transfers win (on more ranks than cores the ring's n - 1 dependent steps cost more).
//  alltoall (shm_direct / pairwise; bytes = what one rank sends; its ranks share no size,
//  so the choice cannot depend on it; best of 3 runs of 40):
//    n=2: 1 KiB 0.54 / 0.56; 64 KiB 7.9 / 4.6; 512 KiB 27 / 29; 4 MiB 268 / 319
//    n=3: 1 KiB 3.1 / 4.1; 64 KiB 11.7 / 16.2; 512 KiB 102 / 58; 4 MiB 1.36k / 0.94k
//    n=4: 1 KiB 5.2 / 5.8; 64 KiB 20 / 21; 512 KiB 62 / 75; 4 MiB 1.49k / 1.58k
//    n=8: 1 KiB 18 / 27; 64 KiB 35 / 83; 512 KiB 225 / 426; 4 MiB 4.14k / 4.02k
//    so shm_direct (up to 2.4x faster, up to 1.7x slower at some sizes).
constexpr size_t kShmDirectBroadcastMinBytesTwoRanks = size_t{1} << 10;
constexpr size_t kShmDirectBroadcastMinBytes = size_t{256} << 10;
// allgather and reduce_scatter on two ranks take the ring from this size.
constexpr size_t kRingFromBytesTwoRanks = size_t{1} << 20;

bool preferShmDirect(Collective collective, size_t bytes, int worldSize) {
  switch (collective) {
    case Collective::kAllreduce: return true;
    case Collective::kBroadcast:
      return bytes >= (worldSize == 2 ? kShmDirectBroadcastMinBytesTwoRanks : kShmDirectBroadcastMinBytes);
    case Collective::kAllgather:
    case Collective::kReduceScatter: return worldSize > 2 || bytes < kRingFromBytesTwoRanks;
    case Collective::kAlltoall: return true;
    case Collective::kReduce:
    case Collective::kBarrier:
    case Collective::kGather:
    case Collective::kScatter: return false;
  }
  return false;
}

// reduce_scatter over pairs: pairwise up to this many bytes per rank (on 3 ranks or more).
constexpr size_t kPairwiseReduceScatterMaxBytes = size_t{16} << 10;
// gather/scatter: linear at every size up to this many ranks (measured), see bySize.
constexpr int kLinearGatherMaxRanks = 16;

// Whether kShmDirect can run: it needs the arena, except on a single rank (nothing moves).
// kHierarchical needs a job over several hosts with the same number (2+) of ranks on each.
bool usable(Algorithm algorithm, bool hasArena, int worldSize, bool hostsUniform) {
  if (algorithm == Algorithm::kHierarchical) return hostsUniform;
  return algorithm != Algorithm::kShmDirect || hasArena || worldSize == 1;
}

Algorithm bySize(Collective collective, size_t bytes, int worldSize, bool hasArena, bool hostsUniform) {
  if (hasArena && preferShmDirect(collective, bytes, worldSize)) {
    return Algorithm::kShmDirect;
  }
  // Across hosts the topology-aware algorithms send each byte over the network once per
  // host and small messages over it in the fewest rounds (see hierarchical.h).
  if (hostsUniform && (collective == Collective::kBroadcast || collective == Collective::kReduce ||
                       collective == Collective::kAllgather || collective == Collective::kReduceScatter)) {
    return Algorithm::kHierarchical;
  }
  const bool small = bytes <= kSmallMessageBytes;
  switch (collective) {
    case Collective::kAllreduce:
      // Across hosts the links are the bottleneck: the hierarchical ring moves the
      // fewest bytes over them (each host sends 2(H-1)/H of the buffer, against 2(n-1)/n
      // for the flat ring's crossings, n = H x L).
      if (hostsUniform && !small) return Algorithm::kHierarchical;
      // Recursive doubling needs log2(n) steps of the whole buffer; the ring needs
      // 2(n-1) steps of 1/n of it, so it wins once bandwidth dominates.
      return small || worldSize == 2 ? Algorithm::kHalvingDoubling : Algorithm::kRing;
    case Collective::kBroadcast:
      return small || worldSize <= 2 ? Algorithm::kTree : Algorithm::kChain;
    case Collective::kReduce:
      return small || worldSize <= 2 ? Algorithm::kTree : Algorithm::kRing;
    case Collective::kBarrier:
      return Algorithm::kAuto;
    case Collective::kAllgather:
      // Bruck's ceil(log2 n) steps against the ring's n - 1 (same count on 2 and 3 ranks,
      // where the ring needs no copies). Measured over tcp, ring / halving_doubling in us:
      // n=4: 64 B 54 / 34, 64 KiB 76 / 54, 256 KiB 157 / 246; n=8: 64 B 218 / 142,
      // 64 KiB 263 / 175, 256 KiB 425 / 620 (shm pairs alike on 8 ranks).
      return small && worldSize >= 4 ? Algorithm::kHalvingDoubling : Algorithm::kRing;
    case Collective::kReduceScatter:
      // pairwise posts every message at once (one latency instead of n - 1) but needs
      // a fold pass. Over shm pairs, ring / pairwise in us: n=3: 1 KiB 5.2 / 4.3,
      // 64 KiB 18 / 22; n=4: 1 KiB 8.2 / 5.1, 16 KiB 14.0 / 9.2, 256 KiB 50 / 81;
      // n=8: 1 KiB 41 / 22, 256 KiB 170 / 196. On two ranks the ring is one exchange.
      return bytes <= kPairwiseReduceScatterMaxBytes && worldSize >= 3 ? Algorithm::kPairwise : Algorithm::kRing;
    case Collective::kAlltoall:
      return Algorithm::kPairwise;
    case Collective::kGather:
    case Collective::kScatter:
      // The root exchanging with every rank at once beat the binomial tree at every size
      // measured, on 3 to 16 ranks, over shm and tcp (tree / linear in us, gather: n=8
      // shm 1 KiB 5.1 / 3.3, 1 MiB 486 / 119; n=8 tcp 1 KiB 51 / 38; n=16 shm 4 KiB
      // 10.5 / 4.8; scatter alike): the tree's extra hops and copies cost more than the
      // root's n - 1 messages. Beyond 16 ranks (not measured) the tree's log2(n) depth
      // is taken for small messages.
      return small && worldSize > kLinearGatherMaxRanks ? Algorithm::kTree : Algorithm::kLinear;
  }
  return Algorithm::kAuto;
}

}  // namespace

Algorithm selectAlgorithm(Collective collective, Algorithm requested, size_t bytes, int worldSize, bool hasArena,
                          bool hostsUniform) {
  if (collective == Collective::kBarrier) {
    return hasArena ? Algorithm::kShmDirect : (hostsUniform ? Algorithm::kHierarchical : Algorithm::kAuto);
  }
  if (requested != Algorithm::kAuto) {
    if (!implements(collective, requested)) {
      throw InvalidArgument(std::string("algorithm '") + algorithmName(requested) + "' is not available for " +
                            collectiveName(collective) + "; choose one of " + implementedNames(collective));
    }
    if (requested == Algorithm::kHierarchical && !hostsUniform) {
      throw InvalidArgument(std::string(collectiveName(collective)) +
                            ": hierarchical needs ranks on several hosts, the same number (2 or more) on each");
    }
    if (!usable(requested, hasArena, worldSize, hostsUniform)) {
      throw InvalidArgument(std::string(collectiveName(collective)) +
                            ": shm_direct needs every rank on one host with shared memory (this communicator "
                            "has no node arena: some ranks are elsewhere or reached over TCP, or "
                            "RINGTREE_SHM_ARENA=0)");
    }
    return requested;
  }
  Algorithm chosen = Algorithm::kAuto;
  const std::string& fromEnv = env::algorithm();
  if (!fromEnv.empty()) {
    const Algorithm named = parseAlgorithm(fromEnv.c_str());
    if (implements(collective, named) && usable(named, hasArena, worldSize, hostsUniform)) {
      chosen = named;
    }
  }
  if (chosen == Algorithm::kAuto) {
    chosen = bySize(collective, bytes, worldSize, hasArena, hostsUniform);
  }
  RINGTREE_DEBUG(collectiveName(collective) << " of " << bytes << " bytes on " << worldSize << " ranks: "
                                            << algorithmName(chosen)
                                            << (fromEnv.empty() ? "" : " (RINGTREE_ALGO=" + fromEnv + ")"));
  return chosen;
}

}  // namespace algorithms

}  // namespace ringtree
