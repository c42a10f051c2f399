#pragma once

#include <cstddef>

#include "algorithms/call.h"
#include "common/reduce_fn.h"

// The shared-memory direct collectives ("shm_direct"): allreduce, broadcast, barrier,
// allgather, reduce_scatter and alltoall over the communicator's node arena
// (arena/node_arena.h has its layout and protocol), for communicators whose ranks are all
// on this host. Data moves through the ranks' arena slots instead of pairs; ranks
// synchronise on each other's step counters (the wait engine of
// shm_direct/arena_call.h), spinning briefly and then sleeping on a futex in slices,
// between which they check the deadline and whether the awaited peer's connection hung
// up. Each collective has its file in shm_direct/.
//
// Every function below blocks until this rank's part is done and requires
// call.comm.arena() != nullptr and call.size() > 1. Errors: TimeoutError (WaitTimeout) at
// the deadline naming the ranks that have not arrived (the call's failure handling adds
// what each was doing, from diagnostics/arena_status.h); WaitAborted after abort();
// NetworkError naming a peer whose connection hung up while it was awaited;
// EnvelopeMismatch (a CollectiveMismatchError; runCall's failure handling names both
// calls and tells the peer) when a peer's published call differs from this one.
namespace ringtree::algorithms {

// In place: buffer <- fold of every rank's buffer, in rank order (rank 0's op rank 1's op
// ...; every rank ends with the same bits). fn is the element kernel (AVG/PREMUL_SUM:
// the caller scales before and divides after). commutative: fn(a, b) and fn(b, a) give
// the same bits up to NaN payloads (true except for MIN/MAX, whose choice between -0 and
// +0 follows the order); it saves rank 1 a pass over its part. Up to a size measured per
// world size the call is one-shot (each rank copies its buffer into its slot, then folds
// every slot); above it, two-shot in steps of at most maxSegmentBytes (0: the arena's
// largest step, 1.31 MiB by default): each rank folds one part of the step from every
// slot, then copies the other parts from their owners.
void shmDirectAllreduce(Call& call, void* buffer, size_t count, ReduceFn fn, bool commutative,
                        size_t maxSegmentBytes);

// Every rank's buffer <- root's: the root copies pieces of at most maxSegmentBytes (0:
// the arena's largest step) into its slot, one step each, and the others copy each piece
// out while the root writes the next.
void shmDirectBroadcast(Call& call, void* buffer, size_t bytes, int root, size_t maxSegmentBytes);

// Returns once every rank has entered the barrier: one step each.
void shmDirectBarrier(Call& call);

// outputs[q] <- rank q's input (counts[q] elements, every rank's counts alike) for every
// q but this rank (outputs[rank] is left to the caller): each rank copies its input into
// its slot once, in pieces of at most maxSegmentBytes (0: the arena's largest step), one
// step each, and copies every other rank's piece out.
void shmDirectAllgather(Call& call, const void* input, void* const* outputs, const size_t* counts,
                        size_t maxSegmentBytes);

// output <- fold, in rank order, of every rank's inputs[rank] (counts[rank] elements;
// inputs[q] holds counts[q]). Each step carries a slice of every block: each rank copies
// the slices other ranks need into its slot, then folds its own block's slice from every
// slot (its own from inputs[rank]). fn is the element kernel (AVG/PREMUL_SUM: the caller
// scales before and divides after). output may be inputs[rank] (in place).
void shmDirectReduceScatter(Call& call, const void* const* inputs, void* output, const size_t* counts, ReduceFn fn,
                            size_t maxSegmentBytes);

// outputs[q] (recvCounts[q] elements) <- rank q's inputs[rank], for every q but this
// rank (outputs[rank] is left to the caller). Each step's block holds a piece of every
// message this rank sends, in one region per destination (a step's share of
// maxSegmentBytes, 0: the arena's largest step), read by that destination. Each region
// starts with the sizes of the two messages between writer and reader and the writer's
// largest message, so every rank learns every rank's largest (all agree on the number of
// steps) and both ranks of a pair that disagree on a message's size fail
// (EnvelopeMismatch naming the sizes).
void shmDirectAlltoall(Call& call, const void* const* inputs, const size_t* sendCounts, void* const* outputs,
                       const size_t* recvCounts, size_t maxSegmentBytes);

}  // namespace ringtree::algorithms
