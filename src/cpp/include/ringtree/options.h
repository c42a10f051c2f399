#pragma once

#include <chrono>
#include <cstddef>

#include <ringtree/types.h>

namespace ringtree {

// Which algorithm a collective uses. kAuto picks by message size, world size and
// transport (algorithms/selection.h); RINGTREE_ALGO=<name> replaces kAuto for every call.
// A collective given an algorithm it does not implement throws InvalidArgument.
//
//   allreduce:      ring, tree, halving_doubling (recursive doubling below a segment),
//                   shm_direct (one-shot or two-shot through the node arena), hierarchical
//   broadcast:      tree (binomial), chain (pipelined), shm_direct (root writes, all read)
//   reduce:         tree (binomial), ring (reduce-scatter + gather)
//   allgather:      ring, halving_doubling (Bruck's doubling: ceil(log2 n) steps, any n), shm_direct
//   reduce_scatter: ring, pairwise, shm_direct
//   alltoall:       pairwise, shm_direct
//   gather/scatter: tree (binomial), linear (root talks to every rank directly)
//
// shm_direct runs over a segment shared by every rank of the communicator, which exists
// only when all ranks are on one host and reach each other over shared memory
// (RINGTREE_SHM_ARENA=0 disables it); elsewhere asking for it throws InvalidArgument.
// With that segment, barrier runs over it too.
//
// hierarchical (allreduce) runs on jobs that span hosts with the same number (2 or more) of
// ranks on each: a ring reduce-scatter among the ranks of each host, then a ring allreduce
// of each rank's part among the ranks of the same local index on every host (so every
// rank carries 1/L of the cross-host traffic), then a ring allgather within each host.
// Elsewhere asking for it throws InvalidArgument.
enum class Algorithm { kAuto, kRing, kTree, kHalvingDoubling, kChain, kShmDirect, kPairwise, kLinear, kHierarchical };

// "auto", "ring", "tree", "halving_doubling", "chain", "shm_direct", "pairwise", "linear",
// "hierarchical".
RINGTREE_API const char* algorithmName(Algorithm algorithm);
// Inverse of algorithmName; throws InvalidArgument naming the valid names.
RINGTREE_API Algorithm parseAlgorithm(const char* name);

// Fields every collective's options share.
struct CollectiveOptions {
  Algorithm algorithm = Algorithm::kAuto;
  // Deadline of this call; zero means the communicator's timeout.
  std::chrono::milliseconds timeout{0};
  // Largest piece a pipelined algorithm moves per step (0: the algorithm's default).
  // Small values are a test knob that make multi-segment paths cheap to reach.
  size_t maxSegmentBytes = 0;
};

struct AllreduceOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;
  // kPremulSum: each rank's input is multiplied by this before the sum.
  double premulFactor = 1.0;
};

struct BroadcastOptions : CollectiveOptions {
  int root = 0;
};

struct ReduceOptions : CollectiveOptions {
  int root = 0;
  ReduceOp op = ReduceOp::kSum;
  double premulFactor = 1.0;
};

struct AllgatherOptions : CollectiveOptions {};

struct GatherOptions : CollectiveOptions {
  int root = 0;
};

struct ScatterOptions : CollectiveOptions {
  int root = 0;
};

struct ReduceScatterOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;
  double premulFactor = 1.0;
};

struct AlltoallOptions : CollectiveOptions {};

struct BarrierOptions {
  std::chrono::milliseconds timeout{0};
};

}  // namespace ringtree
