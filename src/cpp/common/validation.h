#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <ringtree/buffer.h>
#include <ringtree/options.h>
#include <ringtree/types.h>

// Argument checks, one module for every layer: ProcessGroup's operations (over
// BufferViews, naming operations and arguments as torch.distributed does), the
// collectives over a Communicator (over pointer and count arrays), point-to-point and the
// reduction table. Each check throws InvalidArgument, before any data moves, with the one
// text of its error; `op` names the operation the caller runs ("all_gather", "allgather",
// "isend").
namespace ringtree::validation {

// --- Sizes and raw buffers.

// count * elementSize(type); throws when that does not fit in size_t, or for a type
// outside the enum.
size_t checkedBytes(const char* op, size_t count, DataType type);

// The sum of counts[0 .. size); throws when `counts` (named `what`) is null or when the
// sum, or the sum in bytes, does not fit in size_t.
size_t checkedTotal(const char* op, const char* what, const size_t* counts, int size, DataType type);

// count * size, the elements of `size` blocks of count; throws when that, or the same in
// bytes, does not fit in size_t.
size_t checkedBlocksTotal(const char* op, size_t count, int size, DataType type);

// Throws when `buffer` (named `what`) is null while it should hold count > 0 elements.
void checkBuffer(const char* op, const char* what, const void* buffer, size_t count);

// Throws when the array `buffers` (named `what`, one pointer per rank) is null, or when
// buffers[r] is null while it should hold counts[r] > 0 elements (counts == nullptr:
// every buffer holds `count` elements).
void checkBuffers(const char* op, const char* what, const void* const* buffers, int size, const size_t* counts,
                  size_t count = 0);

// --- Operation arguments.

// Throws unless 0 <= root < size.
void checkRoot(const char* op, int root, int size);

// Throws unless `reduceOp` is defined on `type` (see isSupported in <ringtree/types.h>),
// or when either is outside its enum.
void checkReduceOp(const char* op, DataType type, ReduceOp reduceOp);

// Throws for a negative timeout (zero means "the default").
void checkTimeout(const char* op, std::chrono::milliseconds timeout);

// Point-to-point: throws unless `peer` is a rank of the group other than `rank` (or
// kAnySource, -1, when anySourceAllowed); checkTag throws for a negative tag (`receive`:
// of a receive from `peer`, else of a send to it).
void checkPeer(const char* op, int peer, int rank, int size, bool anySourceAllowed);
void checkTag(const char* op, int peer, int tag, bool receive);

// --- ProcessGroup's operations (<ringtree/process_group.h>).
//
// Each checks every argument of the operation of that name, as the header states its
// rules: buffer sizes and null data, one type and one device for every buffer of the
// call, per-rank lists, counts that must agree, overlaps, the op, the root, the timeout.
// Each returns the device the call runs on (the first buffer's; the CPU when the call has
// no buffer). Messages name the operation by its torch name ("all_gather") and the
// buffers by torch's argument names ("tensor_list[2]").

struct Group {
  int rank;
  int size;
};

Device checkAllreduce(const Group& group, const BufferView& tensor, const AllreduceOptions& options);
Device checkAllreduceCoalesced(const Group& group, const std::vector<BufferView>& tensors,
                               const AllreduceOptions& options);
Device checkBroadcast(const Group& group, const BufferView& tensor, const BroadcastOptions& options);
Device checkReduce(const Group& group, const BufferView& tensor, const ReduceOptions& options);
Device checkAllgather(const Group& group, const std::vector<BufferView>& tensorList, const BufferView& tensor,
                      const AllgatherOptions& options);
Device checkAllgatherSingle(const Group& group, const BufferView& outputTensor, const BufferView& inputTensor,
                            const AllgatherOptions& options);
Device checkAllgatherCoalesced(const Group& group, const std::vector<std::vector<BufferView>>& outputTensorLists,
                               const std::vector<BufferView>& inputTensorList, const AllgatherOptions& options);
Device checkAllgatherSingleCoalesced(const Group& group, const std::vector<BufferView>& outputTensors,
                                     const std::vector<BufferView>& inputTensors, const AllgatherOptions& options);
Device checkGather(const Group& group, const BufferView& tensor, const std::vector<BufferView>& gatherList,
                   const GatherOptions& options);
Device checkScatter(const Group& group, const BufferView& tensor, const std::vector<BufferView>& scatterList,
                    const ScatterOptions& options);
Device checkReduceScatter(const Group& group, const BufferView& output, const std::vector<BufferView>& inputList,
                          const ReduceScatterOptions& options);
Device checkReduceScatterSingle(const Group& group, const BufferView& output, const BufferView& input,
                                const ReduceScatterOptions& options);
Device checkReduceScatterSingleCoalesced(const Group& group, const std::vector<BufferView>& outputs,
                                         const std::vector<BufferView>& inputs, const ReduceScatterOptions& options);
Device checkAlltoall(const Group& group, const std::vector<BufferView>& outputTensorList,
                     const std::vector<BufferView>& inputTensorList, const AlltoallOptions& options);
Device checkAlltoallSingle(const Group& group, const BufferView& output, const BufferView& input,
                           const std::vector<int64_t>& outputSplitSizes, const std::vector<int64_t>& inputSplitSizes,
                           const AlltoallOptions& options);
void checkBarrier(const BarrierOptions& options);
// op: "send", "isend", "recv", "irecv".
Device checkSend(const Group& group, const char* op, const BufferView& tensor, int dst, int tag);
Device checkRecv(const Group& group, const char* op, const BufferView& tensor, int src, int tag);

// --- Helpers of the checks, shared with the code that cuts buffers into parts.

// The element counts of all_to_all_single's parts of `buffer` (argument `name`): one per
// rank from `splitSizes` (rows each, BufferView::rows), or `size` equal parts when
// splitSizes is empty. Throws for split sizes that are not one per rank, negative, or do
// not add up to the buffer's rows, and for rows that do not divide equally.
std::vector<size_t> splitCounts(const char* op, const BufferView& buffer, const std::vector<int64_t>& splitSizes,
                                int size, const char* name);
// The same into counts[0 .. size), for a caller that keeps them on its stack.
void splitCountsInto(const char* op, const BufferView& buffer, const std::vector<int64_t>& splitSizes, int size,
                     const char* name, size_t* counts);

// "3 elements", "1 element".
std::string elementsText(size_t count);

}  // namespace ringtree::validation
