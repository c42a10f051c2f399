#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ringtree/buffer.h>
#include <ringtree/communicator.h>
#include <ringtree/device_backend.h>
#include <ringtree/export.h>
#include <ringtree/options.h>
#include <ringtree/store/store.h>
#include <ringtree/types.h>
#include <ringtree/work.h>

namespace ringtree {

namespace detail {
class CpuBackend;
}

// The backend of one group of ranks: the one door through which every collective,
// point-to-point operation and barrier enters ringtree, on buffers of any device
// (torch.distributed's ProcessGroup/Backend role; the Python API and the torch plug-in
// are thin fronts over it).
//
// Each operation takes BufferViews and validates everything before anything runs or
// moves: element counts and types, that every buffer of the call has one type and is
// on one device, that the op is defined on the type (see isSupported), roots and peers,
// per-rank lists holding one buffer per rank, overlaps. A bad argument throws
// InvalidArgument, whose message names the operation and the argument as
// torch.distributed does ("all_gather: tensor_list must hold one tensor per rank of the
// group (4), got 3"). The call then goes to the engine of the buffers' device type: host
// buffers to the CPU engine (built from the group's communicators), other devices to the
// backend registered for them (<ringtree/device_backend.h>), made for this group on the
// first buffer of that device (a collective: every rank must reach it with the same call).
// A device type nothing is registered for throws InvalidArgument naming it.
//
// Every collective comes in two forms:
//  - synchronous (`allreduce(...)`): returns when this rank's part is done. On the CPU
//    engine, when nothing is queued or running it runs directly on the calling thread (no
//    thread hand-off, no allocation besides the algorithm's); otherwise it is queued
//    behind the pending operations and the caller blocks until it ran.
//  - asynchronous (`allreduceAsync(...)`): queued (on the CPU engine: to the group's worker
//    thread, started on first use); returns at once with a Work. The buffers must stay
//    valid and untouched until the Work completes; `keepAlive` (any owner of them) is held
//    until then.
// On one engine, collectives run one at a time in submission order, whichever thread
// submits them, so every rank must submit the same collectives in the same order.
//
// Point-to-point operations (send, recv, isend, irecv) run on a channel of their own,
// never queued behind collectives; see <ringtree/p2p.h> for their matching (by peer and
// tag, kAnySource) and progress rules. They need the group to have been made with
// point-to-point connections (create() does that), else they throw Error.
//
// Errors of an operation itself (NetworkError, TimeoutError, CollectiveMismatchError,
// see collectives.h and p2p.h) are thrown by the synchronous form and stored in the
// Work of the asynchronous one; after one of them on a collective, the engine is
// unusable and every later collective fails at once.
//
// Threading: every member function may be called from any thread. Nothing else may use
// the communicators while the group exists. Work callbacks run on the thread that ran the
// operation; they may submit, wait, shut the group down or destroy it (the worker then
// ends when the callback returns).
//
// A Work::wait() without a timeout on a CPU collective runs the queued operations up to
// its own on the waiting thread when the worker has not taken them yet (in submission
// order, one at a time, as the worker would), which spares two thread wake-ups; otherwise
// it sleeps until the worker finished its operation.
class RINGTREE_API ProcessGroup {
 public:
  // The source of a receive that takes the first message from whichever rank
  // (PointToPoint::kAnySource).
  static constexpr int kAnySource = -1;

  // Connects the group: a collective over the `size` ranks sharing `store` (keys under
  // "comm/" for the connections of the CPU engine, whose collectives and point-to-point
  // messages travel on two channels of them, "device/<type>/" for device backends).
  // Blocks until connected; throws what Communicator::create throws.
  static std::shared_ptr<ProcessGroup> create(std::shared_ptr<Store> store, int rank, int size,
                                              const CommunicatorOptions& options = {});

  // A group of the ranks `ranks` of `parent` (parent ranks; ranks[i] becomes group rank
  // i) over parent's connections (Communicator::createOver): it opens no connection; its
  // collectives and point-to-point messages travel on channels of their own, so it may be
  // used at the same time as parent and every other group, from any thread. Members on
  // one host over shared memory set up a node arena of their own (a collective over them:
  // it returns once every member called it); otherwise it returns at once. Every member calls it with the same ranks and `name`, which must differ
  // from that of every other live group over those connections with the same members
  // (torch's group names do). `store` is the group's own (keys under "comm/" for status
  // publishing, "device/<type>/" for device backends); options.timeout is the group's.
  // Throws what Communicator::createOver throws, InvalidArgument for a null store.
  static std::shared_ptr<ProcessGroup> createOver(const ProcessGroup& parent, const std::vector<int>& ranks,
                                                  const std::string& name, std::shared_ptr<Store> store,
                                                  const CommunicatorOptions& options = {});

  // A group over existing communicators: `collectives` for the collectives,
  // `pointToPoint` (optional; one made for it alone) for send/recv, `store` (optional)
  // for setting up device backends. Throws InvalidArgument when `collectives` is null or
  // the communicators disagree on rank or size.
  explicit ProcessGroup(std::shared_ptr<Communicator> collectives, std::shared_ptr<Communicator> pointToPoint = nullptr,
                        std::shared_ptr<Store> store = nullptr);
  // shutdown().
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The CPU engine's collective communicator (diagnostics: flight recorder, identity).
  Communicator& communicator();

  // --- Collectives. Names of arguments and of operations in messages are torch's.

  // In place: tensor <- op over every rank's tensor; every rank ends with the same bits.
  void allreduce(const BufferView& tensor, const AllreduceOptions& options = {});
  std::shared_ptr<Work> allreduceAsync(const BufferView& tensor, const AllreduceOptions& options = {},
                                       std::shared_ptr<void> keepAlive = nullptr);

  // In place: every tensors[i] <- op over every rank's tensors[i], as one operation (small
  // tensors are packed into one allreduce). All of one type and device.
  void allreduceCoalesced(const std::vector<BufferView>& tensors, const AllreduceOptions& options = {});
  std::shared_ptr<Work> allreduceCoalescedAsync(const std::vector<BufferView>& tensors,
                                                const AllreduceOptions& options = {},
                                                std::shared_ptr<void> keepAlive = nullptr);

  // In place: tensor <- root's tensor (options.root, a group rank). The root's tensor is
  // only read.
  void broadcast(const BufferView& tensor, const BroadcastOptions& options = {});
  std::shared_ptr<Work> broadcastAsync(const BufferView& tensor, const BroadcastOptions& options = {},
                                       std::shared_ptr<void> keepAlive = nullptr);

  // In place on the root: tensor <- op over every rank's tensor; the others' are unchanged.
  void reduce(const BufferView& tensor, const ReduceOptions& options = {});
  std::shared_ptr<Work> reduceAsync(const BufferView& tensor, const ReduceOptions& options = {},
                                    std::shared_ptr<void> keepAlive = nullptr);

  // tensorList[r] <- rank r's tensor: one buffer per rank; sizes may differ by rank (the
  // same on every rank), tensorList[rank] has tensor's and may be tensor itself.
  void allgather(const std::vector<BufferView>& tensorList, const BufferView& tensor,
                 const AllgatherOptions& options = {});
  std::shared_ptr<Work> allgatherAsync(const std::vector<BufferView>& tensorList, const BufferView& tensor,
                                       const AllgatherOptions& options = {},
                                       std::shared_ptr<void> keepAlive = nullptr);

  // outputTensor (size() times inputTensor's count) <- every rank's inputTensor, end to
  // end in rank order (torch's all_gather_into_tensor). In place: inputTensor is this
  // rank's part of outputTensor; any other overlap is refused.
  void allgatherSingle(const BufferView& outputTensor, const BufferView& inputTensor,
                       const AllgatherOptions& options = {});
  std::shared_ptr<Work> allgatherSingleAsync(const BufferView& outputTensor, const BufferView& inputTensor,
                                             const AllgatherOptions& options = {},
                                             std::shared_ptr<void> keepAlive = nullptr);

  // outputTensorLists[r][i] <- rank r's inputTensorList[i], as one operation: one list per
  // rank, each with one buffer per input.
  void allgatherCoalesced(const std::vector<std::vector<BufferView>>& outputTensorLists,
                          const std::vector<BufferView>& inputTensorList, const AllgatherOptions& options = {});
  std::shared_ptr<Work> allgatherCoalescedAsync(const std::vector<std::vector<BufferView>>& outputTensorLists,
                                                const std::vector<BufferView>& inputTensorList,
                                                const AllgatherOptions& options = {},
                                                std::shared_ptr<void> keepAlive = nullptr);

  // allgatherSingle(outputTensors[i], inputTensors[i]) for every i, as one operation
  // (torch's all_gather_into_tensor_coalesced).
  void allgatherSingleCoalesced(const std::vector<BufferView>& outputTensors,
                                const std::vector<BufferView>& inputTensors, const AllgatherOptions& options = {});
  std::shared_ptr<Work> allgatherSingleCoalescedAsync(const std::vector<BufferView>& outputTensors,
                                                      const std::vector<BufferView>& inputTensors,
                                                      const AllgatherOptions& options = {},
                                                      std::shared_ptr<void> keepAlive = nullptr);

  // On the root (options.root): gatherList[r] <- rank r's tensor, every one of tensor's
  // size. gatherList is given on the root only (empty elsewhere).
  void gather(const BufferView& tensor, const std::vector<BufferView>& gatherList, const GatherOptions& options = {});
  std::shared_ptr<Work> gatherAsync(const BufferView& tensor, const std::vector<BufferView>& gatherList,
                                    const GatherOptions& options = {}, std::shared_ptr<void> keepAlive = nullptr);

  // tensor <- the root's scatterList[rank], every one of tensor's size. scatterList is
  // given on the root only (empty elsewhere).
  void scatter(const BufferView& tensor, const std::vector<BufferView>& scatterList,
               const ScatterOptions& options = {});
  std::shared_ptr<Work> scatterAsync(const BufferView& tensor, const std::vector<BufferView>& scatterList,
                                     const ScatterOptions& options = {}, std::shared_ptr<void> keepAlive = nullptr);

  // output <- op over every rank's inputList[rank]: one buffer per rank (sizes may differ
  // by rank, the same on every rank); output has inputList[rank]'s size and may be it.
  void reduceScatter(const BufferView& output, const std::vector<BufferView>& inputList,
                     const ReduceScatterOptions& options = {});
  std::shared_ptr<Work> reduceScatterAsync(const BufferView& output, const std::vector<BufferView>& inputList,
                                           const ReduceScatterOptions& options = {},
                                           std::shared_ptr<void> keepAlive = nullptr);

  // output <- op over every rank's part `rank` of input (size() equal parts end to end;
  // torch's reduce_scatter_tensor). In place: output is this rank's part of input.
  void reduceScatterSingle(const BufferView& output, const BufferView& input,
                           const ReduceScatterOptions& options = {});
  std::shared_ptr<Work> reduceScatterSingleAsync(const BufferView& output, const BufferView& input,
                                                 const ReduceScatterOptions& options = {},
                                                 std::shared_ptr<void> keepAlive = nullptr);

  // reduceScatterSingle(outputs[i], inputs[i]) for every i, as one operation (small ones
  // packed into one reduce-scatter; torch's reduce_scatter_tensor_coalesced).
  void reduceScatterSingleCoalesced(const std::vector<BufferView>& outputs, const std::vector<BufferView>& inputs,
                                    const ReduceScatterOptions& options = {});
  std::shared_ptr<Work> reduceScatterSingleCoalescedAsync(const std::vector<BufferView>& outputs,
                                                          const std::vector<BufferView>& inputs,
                                                          const ReduceScatterOptions& options = {},
                                                          std::shared_ptr<void> keepAlive = nullptr);

  // outputTensorList[r] <- rank r's inputTensorList[rank]: one buffer per rank in each;
  // inputTensorList[p] here must have the size of outputTensorList[rank] on rank p. Inputs
  // and outputs must not overlap, except inputTensorList[rank] == outputTensorList[rank].
  void alltoall(const std::vector<BufferView>& outputTensorList, const std::vector<BufferView>& inputTensorList,
                const AlltoallOptions& options = {});
  std::shared_ptr<Work> alltoallAsync(const std::vector<BufferView>& outputTensorList,
                                      const std::vector<BufferView>& inputTensorList,
                                      const AlltoallOptions& options = {},
                                      std::shared_ptr<void> keepAlive = nullptr);

  // Part r of output <- part `rank` of rank r's input, parts cut by rows
  // (BufferView::rows): the split sizes give each part's rows (one per rank,
  // non-negative, adding up to the buffer's rows), or, empty, cut the buffer into size()
  // equal parts. input and output must not overlap (torch's all_to_all_single).
  void alltoallSingle(const BufferView& output, const BufferView& input, const std::vector<int64_t>& outputSplitSizes,
                      const std::vector<int64_t>& inputSplitSizes, const AlltoallOptions& options = {});
  std::shared_ptr<Work> alltoallSingleAsync(const BufferView& output, const BufferView& input,
                                            const std::vector<int64_t>& outputSplitSizes,
                                            const std::vector<int64_t>& inputSplitSizes,
                                            const AlltoallOptions& options = {},
                                            std::shared_ptr<void> keepAlive = nullptr);

  // Returns once every rank entered the barrier (on the CPU engine).
  void barrier(const BarrierOptions& options = {});
  std::shared_ptr<Work> barrierAsync(const BarrierOptions& options = {});

  // --- Point-to-point, on the group's own channel (see above and <ringtree/p2p.h>).
  // dst/src are group ranks other than this one; src may be kAnySource; tag >= 0.

  // Returns once tensor may be reused.
  void send(const BufferView& tensor, int dst, int tag = 0);
  // Returns once the message is in tensor, with the rank it came from.
  int recv(const BufferView& tensor, int src, int tag = 0);
  // The Work completes when tensor may be reused (isend) or holds the message (irecv;
  // Work::sourceRank() names the sender).
  std::shared_ptr<Work> isend(const BufferView& tensor, int dst, int tag = 0, std::shared_ptr<void> keepAlive = nullptr);
  std::shared_ptr<Work> irecv(const BufferView& tensor, int src, int tag = 0, std::shared_ptr<void> keepAlive = nullptr);
  // Sends and receives posted together, as torch's batch_isend_irecv: their order in the
  // list cannot deadlock (two ranks may each send to the other first). Every buffer on one
  // device; sources are group ranks (no kAnySource). One Work per op, in order (on a CUDA
  // group the ops run as one NCCL group and share one Work); `keepAlive` is held until
  // every op finished. Throws InvalidArgument for an empty list or a bad op, before any
  // is posted.
  std::vector<std::shared_ptr<Work>> batchIsendIrecv(const std::vector<PointToPointOp>& ops,
                                                     std::shared_ptr<void> keepAlive = nullptr);

  // --- Life cycle.

  // Stops the group: later submissions throw Error. Operations already queued still run,
  // in order (each bounded by its deadline), then the worker thread is joined; pending
  // point-to-point operations fail. Returns once nothing runs any more (an inline call on
  // another thread included). Idempotent. From a Work callback on the worker it runs what
  // is still queued itself.
  void shutdown();
  bool isShutdown() const;

  // Aborts the group: refuses later submissions (as shutdown() does), fails the queued
  // operations with Error without running them, makes the running one fail within about
  // 100 ms with Error wherever it waits (Communicator::abort), waits for it, stops the
  // worker thread, and then closes the connections and the node arena (its peers see this
  // rank leave). Returns once all that is done. Idempotent. Must not be called from a Work
  // callback.
  void abort();

  // How many synchronous CPU collectives ran on the calling thread (the fast path). A
  // debug counter for tests.
  uint64_t inlineCallCount() const;

 private:
  // The engine for buffers of `device`'s type: the CPU engine, or this group's backend
  // for that device type, made on first use. Throws InvalidArgument (`what` names the
  // operation) when none is registered, Error after shutdown().
  DeviceBackend& backendFor(const char* what, const Device& device);
  DeviceBackend& makeDeviceBackend(const char* what, const Device& device);

  int rank_;
  int size_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<detail::CpuBackend> cpu_;
  // Backends of the other device types, by DeviceType; made under mutex_, never removed
  // until destruction (so references handed out stay valid).
  mutable std::mutex mutex_;
  std::array<std::unique_ptr<DeviceBackend>, kNumDeviceTypes> devices_;
  bool shutdown_ = false;  // device backends are told once each (DeviceBackend's contract)
  bool aborted_ = false;
};

}  // namespace ringtree
