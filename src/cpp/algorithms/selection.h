#pragma once

#include <cstddef>

#include <ringtree/options.h>

#include "algorithms/call.h"

// Which algorithm a collective runs when the caller asks for kAuto.
//
// The choice depends only on values every rank shares (message size, world size and
// RINGTREE_ALGO), never on local state, so all ranks choose alike; a rank that was
// configured differently is caught by the envelope check as a mismatch.
namespace ringtree::algorithms {

// Resolves `requested` for `collective` on `bytes` and `worldSize` ranks (bytes: the
// buffer of allreduce, broadcast and reduce; every block of allgather, gather, scatter
// and reduce_scatter together, which every rank knows; 0 for alltoall, whose ranks share
// no size):
// an explicit algorithm is checked against the ones the collective implements
// (InvalidArgument otherwise); kAuto becomes RINGTREE_ALGO's value when that names an
// algorithm this collective implements, else the size-based choice below. The choice
// is logged at debug level (RINGTREE_LOG_LEVEL=debug).
//
// hasArena: whether the communicator has a node arena. Every rank agrees on it at
// rendezvous, so the choice stays the same on all ranks. kShmDirect needs it (or a
// single rank): asked for explicitly without it, InvalidArgument; named by RINGTREE_ALGO
// without it, ignored. Barrier returns kShmDirect with an arena, kHierarchical across
// hosts (hostsUniform), kAuto (dissemination over the pairs) otherwise.
//
// hostsUniform: whether the ranks run on several hosts with the same number (2 or more)
// on each (CommunicatorImpl::hosts(); agreed at rendezvous like hasArena). kHierarchical
// needs it, as kShmDirect needs the arena; with it, broadcast, reduce, allgather,
// reduce_scatter and barrier take kHierarchical at every size, and allreduce above
// kSmallMessageBytes (smaller ones keep the size-based choice).
Algorithm selectAlgorithm(Collective collective, Algorithm requested, size_t bytes, int worldSize,
                          bool hasArena = false, bool hostsUniform = false);

// Messages up to this size count as small: latency-bound algorithms are chosen.
constexpr size_t kSmallMessageBytes = 64 << 10;

// Default segment of the pipelined broadcast chain.
constexpr size_t kDefaultChainSegmentBytes = 1 << 20;

}  // namespace ringtree::algorithms
