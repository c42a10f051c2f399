#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <ringtree/buffer.h>
#include <ringtree/export.h>
#include <ringtree/options.h>
#include <ringtree/store/store.h>
#include <ringtree/work.h>

// The seam between ProcessGroup and the engines that move buffers of one device type:
// the CPU engine (ringtree's own; always there) and the engines other libraries register
// for other devices (ringtree's CUDA library registers the "cuda" one when it is loaded).
namespace ringtree {

// How ProcessGroup hands an operation to a backend.
struct Submission {
  // false: the call returns once the operation is complete as far as the caller can tell
  // (host memory: the results are in place; device memory: the operation is ordered
  // before whatever the caller enqueues next on its current stream), and returns null.
  // true: the call returns a Work at once; the operation completes it.
  bool async = false;
  // async only: held until the operation finished, then released (before the Work is
  // marked completed): the owner of the buffers, typically.
  std::shared_ptr<void> keepAlive;
};

// One send or receive of ProcessGroup::batchIsendIrecv.
struct PointToPointOp {
  bool send = true;  // false: a receive
  BufferView tensor;
  int peer = 0;      // the destination, or the source (never kAnySource in a batch)
  int tag = 0;
};

// One engine of one ProcessGroup, for the buffers on devices of deviceType().
//
// ProcessGroup validates every argument before it calls a backend (counts, types, ops,
// roots, peers, that every buffer of the call is on this backend's device type), so a
// backend only runs operations. Each operation method runs or queues one operation under
// `submission` (see Submission), with the semantics of the ProcessGroup method of the same
// name (see <ringtree/process_group.h>; argument names and order are torch.distributed's).
// Errors of the operation itself are thrown by a synchronous submission and stored in the
// Work of an asynchronous one.
//
// The "single" and coalesced-single forms have default implementations that cut the
// buffers into per-rank views and call the list forms; a backend with native forms of its
// own (NCCL's allgather into one buffer, say) overrides them.
//
// Threading: ProcessGroup calls a backend from any thread, concurrently; a backend
// serialises what it must. shutdown() and abort() are called once each at most, from the
// ProcessGroup's shutdown()/abort()/destructor; the backend is destroyed right after the
// last of them.
class RINGTREE_API DeviceBackend {
 public:
  virtual ~DeviceBackend();

  // This rank in the group, and the group's size.
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual DeviceType deviceType() const = 0;
  // The backend's name for messages and diagnostics ("cpu", "nccl", ...). A string literal.
  virtual const char* name() const = 0;

  virtual std::shared_ptr<Work> allreduce(const BufferView& tensor, const AllreduceOptions& options,
                                          const Submission& submission) = 0;
  virtual std::shared_ptr<Work> allreduceCoalesced(const std::vector<BufferView>& tensors,
                                                   const AllreduceOptions& options,
                                                   const Submission& submission) = 0;
  virtual std::shared_ptr<Work> broadcast(const BufferView& tensor, const BroadcastOptions& options,
                                          const Submission& submission) = 0;
  virtual std::shared_ptr<Work> reduce(const BufferView& tensor, const ReduceOptions& options,
                                       const Submission& submission) = 0;
  virtual std::shared_ptr<Work> allgather(const std::vector<BufferView>& tensorList, const BufferView& tensor,
                                          const AllgatherOptions& options, const Submission& submission) = 0;
  virtual std::shared_ptr<Work> allgatherSingle(const BufferView& outputTensor, const BufferView& inputTensor,
                                                const AllgatherOptions& options, const Submission& submission);
  // outputTensorLists[r][i] <- rank r's inputTensorList[i].
  virtual std::shared_ptr<Work> allgatherCoalesced(const std::vector<std::vector<BufferView>>& outputTensorLists,
                                                   const std::vector<BufferView>& inputTensorList,
                                                   const AllgatherOptions& options,
                                                   const Submission& submission) = 0;
  virtual std::shared_ptr<Work> allgatherSingleCoalesced(const std::vector<BufferView>& outputTensors,
                                                         const std::vector<BufferView>& inputTensors,
                                                         const AllgatherOptions& options,
                                                         const Submission& submission);
  // gatherList is empty on every rank but the root.
  virtual std::shared_ptr<Work> gather(const BufferView& tensor, const std::vector<BufferView>& gatherList,
                                       const GatherOptions& options, const Submission& submission) = 0;
  // scatterList is empty on every rank but the root.
  virtual std::shared_ptr<Work> scatter(const BufferView& tensor, const std::vector<BufferView>& scatterList,
                                        const ScatterOptions& options, const Submission& submission) = 0;
  virtual std::shared_ptr<Work> reduceScatter(const BufferView& output, const std::vector<BufferView>& inputList,
                                              const ReduceScatterOptions& options,
                                              const Submission& submission) = 0;
  virtual std::shared_ptr<Work> reduceScatterSingle(const BufferView& output, const BufferView& input,
                                                    const ReduceScatterOptions& options,
                                                    const Submission& submission);
  virtual std::shared_ptr<Work> reduceScatterSingleCoalesced(const std::vector<BufferView>& outputs,
                                                             const std::vector<BufferView>& inputs,
                                                             const ReduceScatterOptions& options,
                                                             const Submission& submission) = 0;
  virtual std::shared_ptr<Work> alltoall(const std::vector<BufferView>& outputTensorList,
                                         const std::vector<BufferView>& inputTensorList,
                                         const AlltoallOptions& options, const Submission& submission) = 0;
  // The split sizes count rows (BufferView::rows) and have been checked against the
  // buffers: one per rank, non-negative, adding up to the leading dimension; empty means
  // equal parts.
  virtual std::shared_ptr<Work> alltoallSingle(const BufferView& output, const BufferView& input,
                                               const std::vector<int64_t>& outputSplitSizes,
                                               const std::vector<int64_t>& inputSplitSizes,
                                               const AlltoallOptions& options, const Submission& submission);
  virtual std::shared_ptr<Work> barrier(const BarrierOptions& options, const Submission& submission) = 0;

  // Point-to-point (peer: a rank of the group; recv's may be kAnySource = -1). send and
  // recv block; recv returns the rank the message came from.
  virtual void send(const BufferView& tensor, int dst, int tag) = 0;
  virtual int recv(const BufferView& tensor, int src, int tag) = 0;
  virtual std::shared_ptr<Work> isend(const BufferView& tensor, int dst, int tag, std::shared_ptr<void> keepAlive) = 0;
  virtual std::shared_ptr<Work> irecv(const BufferView& tensor, int src, int tag, std::shared_ptr<void> keepAlive) = 0;
  // Posts every op before any is waited for, and returns one Work per op (ops may share
  // one). The default posts isend/irecv in list order, which suits engines whose posting
  // never blocks; a backend whose peers must see the ops together (NCCL) overrides it.
  virtual std::vector<std::shared_ptr<Work>> batchIsendIrecv(const std::vector<PointToPointOp>& ops,
                                                             std::shared_ptr<void> keepAlive);

  // See ProcessGroup::shutdown() and ProcessGroup::abort().
  virtual void shutdown() = 0;
  virtual void abort() = 0;

 protected:
  DeviceBackend(int rank, int size) : rank_(rank), size_(size) {}

 private:
  int rank_;
  int size_;
};

// What a factory gets to make the backend of one group for one device: the group's
// rank, size and timeout, its store (the backend's keys go under a prefix of its own:
// give it a PrefixStore), and the device of the first buffer that asked for it.
struct DeviceBackendContext {
  std::shared_ptr<Store> store;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  Device device{};
  // The group's CPU engine, for a backend that stages device buffers through host memory
  // (the CUDA backend where NCCL cannot serve the group). It outlives the device backends
  // and is shut down before them: use it only from operations.
  DeviceBackend* host = nullptr;
};

// Makes a group's backend for one device type (a collective over the group's ranks:
// every rank's factory is called by the same operation). Throws what setting up fails with
// (NetworkError, TimeoutError, Error).
using DeviceBackendFactory = std::unique_ptr<DeviceBackend> (*)(const DeviceBackendContext& context);

// Registers the factory of backends for `type` (not kCpu, whose engine is built in), used
// by the groups that meet a buffer of that type from then on; `name` (a string literal,
// "nccl") names it in messages. A later registration for the same type replaces it; a
// null factory removes it (groups keep the backends they made). Thread-safe. Throws
// InvalidArgument for kCpu.
RINGTREE_API void registerDeviceBackend(DeviceType type, const char* name, DeviceBackendFactory factory);

// Whether a backend factory is registered for `type` (always true for kCpu). The CUDA
// backend (NCCL with ringtree's CUDA library) counts as registered from the start: its
// factory loads the libraries when a group first meets a CUDA buffer, and throws what is
// missing.
RINGTREE_API bool hasDeviceBackend(DeviceType type);

// The calling thread's current stream on `device` (a cudaStream_t for kCuda; null: the
// legacy default stream), as torch and CuPy keep one per thread and device. A device
// operation waits for the work enqueued on it before the call, and a synchronous one is
// ordered before whatever is enqueued on it after the call returns; an asynchronous
// one's Work::wait() returns once the operation finished. The Python layer sets it from
// torch.cuda.current_stream() / CuPy's current stream for each call; C++ callers set it
// themselves. Ignored for kCpu.
RINGTREE_API void setCurrentStream(const Device& device, void* stream);
RINGTREE_API void* currentStream(const Device& device);

}  // namespace ringtree
