#pragma once

#include <cstddef>

#include <ringtree/communicator.h>
#include <ringtree/export.h>
#include <ringtree/options.h>
#include <ringtree/types.h>

// Collectives over a Communicator, on contiguous host buffers of `count` elements of one
// DataType. Every rank of the communicator must make the same calls in the same order
// with matching arguments (count, type, op, root); a mismatch detected on the wire throws
// CollectiveMismatchError naming both ranks and both calls.
//
// All calls block the calling thread until this rank's part is done (the GIL-free
// caller of the Python layer, or a worker thread for async work) and are in place.
// Throws: InvalidArgument (bad root, unsupported type/op, unknown algorithm) before any
// data moves; NetworkError when a peer dies or disconnects (names the peer);
// TimeoutError at the deadline (names the peers still waited for);
// CollectiveMismatchError. After any of these the communicator is unusable: every later
// call throws at once.
namespace ringtree {

// buffer <- op over all ranks' buffers. Every rank ends with bitwise-identical results.
// kAvg divides the sum by size() (integers: truncated); kPremulSum scales each input by
// options.premulFactor first (this rank's buffer is scaled in place before sending).
RINGTREE_API void allreduce(Communicator& comm, void* buffer, size_t count, DataType type,
                            const AllreduceOptions& options = {});

// Every rank's buffer <- root's buffer.
RINGTREE_API void broadcast(Communicator& comm, void* buffer, size_t count, DataType type,
                            const BroadcastOptions& options = {});

// root's buffer <- op over all ranks' buffers; other ranks' buffers are left unchanged.
RINGTREE_API void reduce(Communicator& comm, void* buffer, size_t count, DataType type,
                         const ReduceOptions& options = {});

// Returns once every rank has entered the barrier (dissemination, ceil(log2 n) rounds).
RINGTREE_API void barrier(Communicator& comm, const BarrierOptions& options = {});

}  // namespace ringtree
