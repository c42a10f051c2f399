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

// The gather/scatter family. Per-rank buffers are arrays of size() pointers (one buffer
// per rank of the communicator, in rank order) with their element counts; all buffers of
// one call hold the same DataType. Counts must agree across ranks (rank r's view of
// counts[q] equals rank q's); the call's envelope carries their total, and a message of
// a size other than expected is a CollectiveMismatchError. Inputs are never written
// (except where an output aliases them as stated). A buffer of count 0 may be null.

// outputs[r] (counts[r] elements) <- rank r's input (counts[rank] elements), on every
// rank. `input` may be outputs[rank] itself (in place); other overlaps are undefined.
RINGTREE_API void allgather(Communicator& comm, const void* input, void* const* outputs, const size_t* counts,
                            DataType type, const AllgatherOptions& options = {});

// On root: outputs[r] (count elements) <- rank r's input (count elements). On the other
// ranks `outputs` is not used (may be null). Root's input may be outputs[root].
RINGTREE_API void gather(Communicator& comm, const void* input, void* const* outputs, size_t count, DataType type,
                         const GatherOptions& options = {});

// output (count elements) <- root's inputs[rank]. `inputs` is read on root only (may be
// null elsewhere). Root's output may be inputs[root].
RINGTREE_API void scatter(Communicator& comm, const void* const* inputs, void* output, size_t count, DataType type,
                          const ScatterOptions& options = {});

// output (counts[rank] elements) <- op over every rank's inputs[rank] (inputs[r] holds
// counts[r] elements). Same op semantics and bitwise-identical-across-ranks guarantee as
// allreduce (AVG, PREMUL_SUM included). output may be inputs[rank] (in place).
RINGTREE_API void reduceScatter(Communicator& comm, const void* const* inputs, void* output, const size_t* counts,
                                DataType type, const ReduceScatterOptions& options = {});

// outputs[r] (recvCounts[r] elements) <- rank r's inputs[rank]. This rank sends
// inputs[p] (sendCounts[p] elements) to every rank p; sendCounts[p] on this rank must
// equal recvCounts[rank] on rank p. Inputs and outputs must not overlap, except
// inputs[rank] == outputs[rank] (the local part is copied when they differ).
RINGTREE_API void alltoall(Communicator& comm, const void* const* inputs, const size_t* sendCounts,
                           void* const* outputs, const size_t* recvCounts, DataType type,
                           const AlltoallOptions& options = {});

// The coalesced forms: several buffers as one operation. `n` buffers of one DataType;
// counts agree across ranks.

// buffers[i] (counts[i] elements) <- op over every rank's buffers[i], for every i < n.
// Buffers under 256 KiB are packed into one scratch buffer reduced by one allreduce (one
// round of latency for all of them); larger ones are reduced in place one by one, where
// packing would only add two copies. Same op semantics as allreduce.
RINGTREE_API void allreduceCoalesced(Communicator& comm, void* const* buffers, const size_t* counts, size_t n,
                                     DataType type, const AllreduceOptions& options = {});

// outputs[r * n + i] (outputCounts[r * n + i] elements) <- rank r's inputs[i], for every
// rank r and i < n: one allgather of every rank's inputs packed end to end. This rank's
// inputs[i] holds outputCounts[rank * n + i] elements.
RINGTREE_API void allgatherCoalesced(Communicator& comm, const void* const* inputs, size_t n, void* const* outputs,
                                     const size_t* outputCounts, DataType type, const AllgatherOptions& options = {});

// outputs[i] (counts[i] elements) <- op over every rank's part `rank` of inputs[i]
// (size() parts of counts[i] elements, end to end), for every i < n. Buffers whose parts
// are under 256 KiB are packed into one reduce-scatter; larger ones run one by one. Same
// op semantics as reduceScatter. outputs[i] may be this rank's part of inputs[i].
RINGTREE_API void reduceScatterCoalesced(Communicator& comm, const void* const* inputs, void* const* outputs,
                                         const size_t* counts, size_t n, DataType type,
                                         const ReduceScatterOptions& options = {});

}  // namespace ringtree
