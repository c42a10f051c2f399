#pragma once

#include <cstddef>

#include "algorithms/common.h"
#include "common/reduce_fn.h"

// The shared-memory direct collectives ("shm_direct"): allreduce, broadcast and barrier
// over the communicator's node arena (transport/shm/arena.h has its layout and protocol),
// for communicators whose ranks are all on this host. Data moves through the ranks'
// arena slots instead of pairs; ranks synchronise on each other's step counters, spinning
// briefly and then sleeping on a futex in slices, between which they check the deadline
// and whether the awaited peer's connection hung up.
//
// Every function below blocks until this rank's part is done and requires
// call.comm.arena() != nullptr and call.size() > 1. Errors: TimeoutError at the deadline
// naming the ranks that have not arrived (and the last call each entered); NetworkError
// naming a peer whose connection hung up while it was awaited; EnvelopeMismatch (a
// CollectiveMismatchError; runCall's failure handling names both calls and tells the
// peer) when a peer's published call differs from this one.
namespace ringtree::algorithms {

// Publishes call's fingerprint in the arena; a no-op without one. beginCall makes it for
// every collective, whatever algorithm it runs, so that a rank in an arena algorithm can
// tell a peer in a different call from one that has not arrived yet.
void announceCall(Call& call);

// In place: buffer <- fold of every rank's buffer, in rank order (rank 0's op rank 1's op
// ...; every rank ends with the same bits). fn is the element kernel (AVG/PREMUL_SUM:
// the caller scales before and divides after). commutative: fn(a, b) and fn(b, a) give
// the same bits up to NaN payloads (true except for MIN/MAX, whose choice between -0 and
// +0 follows the order); it saves rank 1 a pass over its part. Up to a size measured per
// world size the call is one-shot (each rank copies its buffer into its slot, then folds
// every slot); above it, two-shot in steps of at most maxSegmentBytes (0: the arena's
// largest step, 1.33 MiB by default): each rank folds one part of the step from every
// slot, then copies the other parts from their owners.
void shmDirectAllreduce(Call& call, void* buffer, size_t count, ReduceFn fn, bool commutative,
                        size_t maxSegmentBytes);

// Every rank's buffer <- root's: the root copies pieces of at most maxSegmentBytes (0:
// the arena's largest step) into its slot, one step each, and the others copy each piece
// out while the root writes the next.
void shmDirectBroadcast(Call& call, void* buffer, size_t bytes, int root, size_t maxSegmentBytes);

// Returns once every rank has entered the barrier: one step each.
void shmDirectBarrier(Call& call);

}  // namespace ringtree::algorithms
