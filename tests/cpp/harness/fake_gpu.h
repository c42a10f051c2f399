#pragma once

// An in-process stand-in for the CUDA runtime table (RingtreeGpuApi) and for NCCL
// (cuda::NcclApi), so that code driving them runs on a machine without a GPU, its ranks
// being threads of one process. One machine per process: every function here and every
// table entry works on it, from any thread.
//
// Devices. deviceCount() devices (setDeviceCount, default kDefaultDeviceCount); the current
// device is per thread (setDevice, 0 on a new thread). Device memory is host memory from
// deviceMalloc: aligned to 256 bytes, filled with 0xA5 bytes, known to pointerDevice (the
// owning device for any address inside an allocation, -1 elsewhere). deviceFree waits, as
// cudaFree does, until every stream of the allocation's device ran what it held at the call.
//
// Streams. Each stream is a FIFO run by a worker thread of its own, so enqueueing never
// waits for the work. The null stream is the current device's legacy stream: one FIFO per
// device, independent of the created streams (which are non-blocking ones). A stream belongs
// to the device current when it was created. Events: eventRecord marks the work enqueued on
// the stream so far; eventQuery gives 0 once that work ran (and for an event never recorded),
// RINGTREE_GPU_NOT_READY before; streamWaitEvent holds the stream's later work until the
// event's work ran (no wait for an event never recorded). An event records only streams of
// its own device (else kCudaErrorInvalidResourceHandle), as CUDA requires.
//
// Kernels. reduce, scale and divide run on the stream's worker with the CPU engine's kernels
// (algorithms/reduce_ops.h): reduce with reduceFunction(type, op) (AVG and PREMUL_SUM reduce
// as SUM), scale() and divide(). They are checked when enqueued and return
// kCudaErrorInvalidValue for a (type, op) outside isSupported, for scale on bool or a
// non-finite factor on an integer type, for divide on bool or by a divisor <= 0, and for an
// operand not inside one device allocation; kCudaErrorInvalidResourceHandle when the stream
// is not on the current device (a kernel launch). memcpyAsync copies between any memory
// (host or device), and rejects with kCudaErrorInvalidValue a range that starts inside a
// device allocation and runs past its end.
//
// NCCL. Version kNcclVersionCode (2.28.7) with every optional entry set (knobs below change
// both). Communicators meet in process:
//  - getUniqueId gives a fresh id (a counter in its bytes). commInitRank(comm, nranks, id,
//    rank) joins the communicator of that id (any 128 bytes name one) on the calling
//    thread's current device, and returns once all nranks ranks joined: kNcclSystemError
//    after the join timeout (setJoinTimeout), kNcclInvalidArgument for a rank out of range
//    or an nranks other than the first joiner's, kNcclInvalidUsage for a rank joined twice
//    and, on every rank, when two ranks share a device (as NCCL's duplicate-GPU check;
//    setAllowSharedDevice lifts it).
//  - commSplit follows MPI_Comm_split over the parent (blocking, collective, in the order of
//    the ranks' splits): ranks of one color >= 0 form a communicator, ordered by (key,
//    parent rank), each on its parent's device; color -1 (NCCL_SPLIT_NOCOLOR) gives a null
//    communicator. config is ignored. kNcclSystemError after the join timeout,
//    kNcclRemoteError when a parent rank aborted or destroyed its communicator.
//  - commDestroy waits until the communicator's enqueued operations completed (with the
//    peers), then frees it; commAbort frees it at once. Both accept null (success).
//  - Collectives and send/recv are checked when called and enqueued on the stream (null:
//    the communicator's device's null stream; a stream of another device is
//    kNcclUnhandledCudaError); they run on the stream's worker, where each rank's operation
//    meets its peers' matching ones: collectives by their order on the communicator, sends
//    and receives by their order between the two ranks. The last rank to arrive moves the
//    data for all, reading every input before writing any output, so in-place calls (send
//    == recv, and allGather's / reduceScatter's in-place offsets) work. Reductions combine
//    the ranks in rank order. Buffers must lie inside device allocations of the
//    communicator's device (kNcclInvalidArgument otherwise); a null buffer is accepted
//    where NCCL ignores it (broadcast's send off the root, reduce's recv off the root) and
//    for zero counts. A collective of count 0 completes at once without meeting its peers.
//  - Types: int8, uint8, int32, int64, float16, float32, float64, bfloat16 as ringtree's
//    DataTypes; uint32 and uint64 move data (broadcast, allGather, send/recv) but a
//    reduction of them is kNcclInvalidArgument (ringtree has no such type).
//  - Ops: sum, prod, max, min as the CPU kernels; avg as NCCL's: floating types multiply
//    every input by 1/nranks rounded to the element type, then sum; integer types sum, then
//    divide (truncating). redOpCreatePreMulSum's op (ids from 5, per communicator) multiplies
//    each rank's input by that rank's scalar (a value of the op's type, read when created for
//    kNcclScalarHostImmediate, when the collective runs for kNcclScalarDevice), then sums; it
//    is valid with its own type and communicator only.
//  - groupStart/groupEnd nest; the outermost groupEnd enqueues the operations called since,
//    as one unit per stream that posts all its sends and receives before waiting for any,
//    so a ring step of send + recv does not deadlock. Collectives in a group run in order.
//  - Ranks that disagree on a collective (kind, count, type, op, root), or a send and a
//    receive of different byte counts, move no data: every party's communicator then
//    reports kNcclInvalidUsage from commGetAsyncError. An operation whose peer aborted or
//    destroyed its communicator moves no data and reports kNcclRemoteError; one whose peers
//    do not arrive within the stall timeout (setStallTimeout) reports kNcclInternalError.
//  - After commAbort, every operation of that communicator still enqueued (a hung one
//    included) completes without moving data; the stream's other work runs as usual.
//  - getErrorString and getLastError give fixed descriptive strings (getLastError: the
//    latest failure of any call into this NCCL, "" before one).
//
// Ranks in the knobs below are the ranks given to commInitRank: a communicator made by
// commSplit carries the one its root ancestor was joined with. Knobs, counters and timeouts
// go back to their defaults at reset(); live objects (streams, events, allocations,
// communicators) stay valid across it. Call reset() when no call into the fake is under way.
//
// Nothing here throws; every function is thread-safe.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backends/cuda/gpu_api.h"
#include "backends/cuda/nccl_api.h"

namespace ringtree::test::fake_gpu {

// CUDA runtime codes the fake returns.
constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorInvalidValue = 1;
constexpr int kCudaErrorMemoryAllocation = 2;
constexpr int kCudaErrorNoDevice = 100;
constexpr int kCudaErrorInvalidDevice = 101;
constexpr int kCudaErrorInvalidResourceHandle = 400;
constexpr int kCudaErrorNotReady = RINGTREE_GPU_NOT_READY;

constexpr int kDefaultDeviceCount = 8;
// What both driverVersion and the table's runtimeVersion report (13.0).
constexpr int kCudaVersion = 13000;
// NCCL 2.28.7.
constexpr int kNcclVersionCode = 22807;
// What NcclApi::path says.
constexpr const char* kNcclPath = "in-process fake NCCL";
// The first id redOpCreatePreMulSum gives on a communicator (NCCL's ncclNumOps).
constexpr int kFirstCreatedRedOp = 5;

// The CUDA table backed by the fake (the same object every call).
const RingtreeGpuApi& gpuApi();
// An NCCL table backed by the fake, as the knobs set it at the call.
std::shared_ptr<const cuda::NcclApi> ncclApi();

// Knobs, counters, timeouts and the calling thread's current device back to their defaults.
void reset();

// --- The machine ---------------------------------------------------------------------

// How many devices deviceCount reports (default kDefaultDeviceCount). 0: no device
// (deviceCount returns kCudaErrorNoDevice, and what needs a device fails).
void setDeviceCount(int count);

// Enqueues fn on stream (null: the current device's null stream) like any other work, as
// cudaLaunchHostFunc does: tests use it to hold a stream (fn blocks) or to observe order. fn
// runs on the stream's worker and may call the fake. kCudaErrorInvalidResourceHandle for an
// unknown stream.
int enqueueHostFunction(void* stream, std::function<void()> fn);

// --- NCCL knobs ----------------------------------------------------------------------

// What getVersion and NcclApi::version report (default kNcclVersionCode).
void setNcclVersion(int code);
// false: the next ncclApi() tables have the optional entries null (getLastError, commSplit,
// redOpCreatePreMulSum, redOpDestroy), as an NCCL before 2.11 has. Default true.
void setOptionalNcclSymbols(bool present);
// How long commInitRank and commSplit wait for the other ranks (default 30 s).
void setJoinTimeout(std::chrono::milliseconds timeout);
// How long an enqueued operation waits for its peers before it gives up with
// kNcclInternalError (default 30 s). Applies to operations enqueued after the call.
void setStallTimeout(std::chrono::milliseconds timeout);
// true: ranks of one communicator may share a device (default false, as NCCL).
void setAllowSharedDevice(bool allow);

// getUniqueId returns result (a non-zero NcclResult) until called again with 0.
void failGetUniqueId(int result);
// commInitRank by rank (-1: by any rank) returns result at once, without joining, until
// called again with 0 for that rank (-1 first: a rank's own setting wins).
void failCommInitRank(int result, int rank = -1);
// The next send on a communicator of rank returns result (a non-zero NcclResult) at the
// call, enqueueing nothing.
void failNextSend(int rank, int result);
// The next operation (collective, send or recv) enqueued on a communicator of rank hangs:
// its stream runs nothing after it until that communicator is aborted. Calls add up.
void hangNextCollective(int rank);
// The same for one communicator.
void hangNextCollectiveOn(cuda::NcclComm comm);
// commGetAsyncError reports result for every communicator of rank, present and future,
// until called again with 0 (a communicator's own setting, below, wins).
void setAsyncError(int rank, int result);
// The same for one communicator (0: back to what it reports by itself).
void setAsyncErrorOn(cuda::NcclComm comm, int result);

// --- Observing -----------------------------------------------------------------------

// Calls into the fake since the last reset(). NCCL calls count when they returned
// kNcclSuccess; objects count when made or freed.
struct Counters {
  int commsInitialized = 0;  // by commInitRank (one per rank)
  int commsSplit = 0;        // non-null communicators commSplit returned
  int commsDestroyed = 0;
  int commsAborted = 0;
  int allReduce = 0;
  int broadcast = 0;
  int reduce = 0;
  int allGather = 0;
  int reduceScatter = 0;
  int send = 0;
  int recv = 0;
  int groupStart = 0;
  int groupEnd = 0;
  // Outermost groupEnd calls whose group held an operation of an aborted communicator
  // (real NCCL has freed it by then).
  int groupEndsOnAbortedComms = 0;
  int redOpsCreated = 0;
  int redOpsDestroyed = 0;
  int streamsCreated = 0;
  int streamsDestroyed = 0;
  int eventsCreated = 0;
  int eventsDestroyed = 0;
  int allocations = 0;
  int frees = 0;
  // The stream argument (as passed: null stays null) of the latest accepted collective,
  // send or recv; null before any.
  void* lastCollectiveStream = nullptr;
};
Counters counters();

// Whether a runtime call made `device`'s primary context since the last reset(): setDevice
// to it, or a call needing a context on a thread whose current device it was.
bool contextActive(int device);

// Objects alive now, whenever made (reset() leaves them): a test compares these before and
// after to find leaks. Null streams are not counted.
struct Live {
  int streams = 0;
  int events = 0;
  int allocations = 0;
  size_t allocatedBytes = 0;
  int communicators = 0;
};
Live live();

// A live communicator.
struct CommInfo {
  cuda::NcclComm handle = nullptr;
  int rank = 0;
  int nranks = 0;
  int initRank = 0;  // the commInitRank rank of its root ancestor
  int device = 0;
};
// Every live communicator, in the order they were made.
std::vector<CommInfo> communicators();

}  // namespace ringtree::test::fake_gpu
