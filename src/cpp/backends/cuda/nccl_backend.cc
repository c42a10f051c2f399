#include "backends/cuda/nccl_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ringtree/error.h>

#include "backends/cuda/device_guard.h"
#include "backends/cuda/nccl_loader.h"

namespace ringtree::cuda {

namespace {

using Clock = std::chrono::steady_clock;

// The store key under which rank 0 publishes the communicator's unique id (the store
// handed to the backend is already the group's, under a prefix of the device type).
constexpr const char* kUniqueIdKey = "nccl_unique_id";

// How a reduction of one (type, op) runs.
struct ReducePlan {
  bool own = false;          // ringtree's ring over send/recv and its CUDA kernel
  int ncclType = -1;         // NCCL's element type (a complex number is two of them)
  size_t countFactor = 1;    // NCCL elements per ringtree element
  int ncclOp = kNcclSum;     // a built-in op; PREMUL_SUM makes its own when premul is set
  bool premul = false;       // ncclRedOpCreatePreMulSum with the factor
};

bool isFloating(DataType type) {
  switch (type) {
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kComplex64:
    case DataType::kComplex128: return true;
    default: return false;
  }
}

// NCCL's element type for reductions over `type` and how many of them make one element;
// -1 where NCCL has none (int16, bool).
std::pair<int, size_t> ncclReduceType(DataType type) {
  switch (type) {
    case DataType::kFloat16: return {kNcclFloat16, 1};
    case DataType::kBFloat16: return {kNcclBfloat16, 1};
    case DataType::kFloat32: return {kNcclFloat32, 1};
    case DataType::kFloat64: return {kNcclFloat64, 1};
    case DataType::kInt8: return {kNcclInt8, 1};
    case DataType::kUInt8: return {kNcclUint8, 1};
    case DataType::kInt32: return {kNcclInt32, 1};
    case DataType::kInt64: return {kNcclInt64, 1};
    case DataType::kComplex64: return {kNcclFloat32, 2};
    case DataType::kComplex128: return {kNcclFloat64, 2};
    default: return {-1, 1};
  }
}

// NCCL for what it computes as the CPU engine does; ringtree's kernels for the rest:
// bitwise ops, int16 and bool, integer AVG and PREMUL_SUM (NCCL's round differently), and
// PREMUL_SUM where NCCL's op is not usable (ncclPremulUsable: none in the loaded NCCL, or
// a one-rank communicator).
ReducePlan planReduction(DataType type, ReduceOp op, bool ncclHasPremul) {
  ReducePlan plan;
  const auto [ncclType, factor] = ncclReduceType(type);
  plan.ncclType = ncclType;
  plan.countFactor = factor;
  if (ncclType < 0) {
    plan.own = true;
    return plan;
  }
  switch (op) {
    case ReduceOp::kSum: plan.ncclOp = kNcclSum; break;
    case ReduceOp::kProduct: plan.ncclOp = kNcclProd; break;
    case ReduceOp::kMin: plan.ncclOp = kNcclMin; break;
    case ReduceOp::kMax: plan.ncclOp = kNcclMax; break;
    case ReduceOp::kAvg:
      plan.own = !isFloating(type);
      plan.ncclOp = kNcclAvg;
      break;
    case ReduceOp::kPremulSum:
      plan.own = !isFloating(type) || !ncclHasPremul;
      plan.premul = true;
      break;
    default: plan.own = true; break;  // BAND, BOR, BXOR
  }
  return plan;
}

// An operation enqueued on the backend's stream and not yet seen finished.
struct Pending {
  void* event = nullptr;          // recorded on the backend's stream after the operation
  Clock::time_point deadline;
  std::chrono::milliseconds timeout{0};  // what the deadline came from
  const char* opName = nullptr;
  std::shared_ptr<Work> work;     // null for a synchronous call
  // Non-null when `event` is the Work's own (its stream wait needs it for as long as the
  // Work lives): then it is never recycled nor destroyed here, only let go.
  std::shared_ptr<void> ownedEvent;
};

class NcclBackend final : public DeviceBackend {
 public:
  NcclBackend(const DeviceBackendContext& context, const RingtreeGpuApi& gpu, std::shared_ptr<const NcclApi> nccl)
      : DeviceBackend(context.rank, context.size),
        gpu_(gpu),
        nccl_(std::move(nccl)),
        device_(context.device),
        timeout_(context.timeout.count() > 0 ? context.timeout : std::chrono::milliseconds(std::chrono::minutes(30))) {
    DeviceGuard guard(gpu_, device_.index);
    NcclUniqueId id{};
    if (rank() == 0) {
      checkNccl("ncclGetUniqueId", "setting up", nccl_->getUniqueId(&id));
      context.store->set(kUniqueIdKey, Bytes(id.internal, id.internal + sizeof(id.internal)));
    } else {
      context.store->wait({kUniqueIdKey}, timeout_);
      const Bytes bytes = context.store->get(kUniqueIdKey);
      if (bytes.size() != sizeof(id.internal)) {
        throw Error(where("setting up") + ": the NCCL unique id in the store has " + std::to_string(bytes.size()) +
                    " bytes, not " + std::to_string(sizeof(id.internal)));
      }
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    try {
      checkCuda("creating its stream", gpu_.streamCreate(&stream_));
      checkCuda("creating an event", gpu_.eventCreate(&readyEvent_));
      checkCuda("creating an event", gpu_.eventCreate(&barrierEvent_));
      checkNccl("ncclCommInitRank", "setting up", nccl_->commInitRank(&comm_, size(), id, rank()));
    } catch (...) {
      comm_ = nullptr;
      release();
      throw;
    }
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclBackend() override {
    shutdown();
  }

  DeviceType deviceType() const override { return DeviceType::kCuda; }
  const char* name() const override { return "nccl"; }

  std::shared_ptr<Work> allreduce(const BufferView& tensor, const AllreduceOptions& options,
                                  const Submission& submission) override {
    Enqueue call(*this, "all_reduce", tensor.device, options.timeout);
    reduceInPlace(call, tensor.data, tensor.data, tensor.count, tensor.type, options.op, options.premulFactor);
    return call.finish(submission);
  }

  std::shared_ptr<Work> allreduceCoalesced(const std::vector<BufferView>& tensors, const AllreduceOptions& options,
                                           const Submission& submission) override {
    Enqueue call(*this, "all_reduce_coalesced", tensors.empty() ? device_ : tensors[0].device, options.timeout);
    for (const BufferView& tensor : tensors) {
      reduceInPlace(call, tensor.data, tensor.data, tensor.count, tensor.type, options.op, options.premulFactor);
    }
    return call.finish(submission);
  }

  std::shared_ptr<Work> broadcast(const BufferView& tensor, const BroadcastOptions& options,
                                  const Submission& submission) override {
    Enqueue call(*this, "broadcast", tensor.device, options.timeout);
    call.nccl("ncclBroadcast", nccl_->broadcast(tensor.data, tensor.data, tensor.bytes(), kNcclInt8, options.root,
                                                 comm_, stream_));
    return call.finish(submission);
  }

  std::shared_ptr<Work> reduce(const BufferView& tensor, const ReduceOptions& options,
                               const Submission& submission) override {
    Enqueue call(*this, "reduce", tensor.device, options.timeout);
    const ReducePlan plan = planReduction(tensor.type, options.op, ncclPremulUsable());
    if (plan.own) {
      // The ring reduces every rank's copy; only the root's buffer may change.
      void* work = tensor.data;
      if (rank() != options.root) {
        work = scratch(call, kStaging, tensor.bytes());
        call.cuda("copying to a staging buffer", gpu_.memcpyAsync(work, tensor.data, tensor.bytes(), stream_));
      }
      ownAllreduce(call, work, tensor.count, tensor.type, options.op, options.premulFactor);
    } else {
      const int op = ncclOp(call, plan, options.premulFactor);
      call.nccl("ncclReduce", nccl_->reduce(tensor.data, tensor.data, tensor.count * plan.countFactor, plan.ncclType,
                                             op, options.root, comm_, stream_));
      destroyOp(plan, op);
    }
    return call.finish(submission);
  }

  std::shared_ptr<Work> allgather(const std::vector<BufferView>& tensorList, const BufferView& tensor,
                                  const AllgatherOptions& options, const Submission& submission) override {
    Enqueue call(*this, "all_gather", tensor.device, options.timeout);
    gatherAllInto(call, tensorList, tensor);
    return call.finish(submission);
  }

  std::shared_ptr<Work> allgatherSingle(const BufferView& outputTensor, const BufferView& inputTensor,
                                        const AllgatherOptions& options, const Submission& submission) override {
    Enqueue call(*this, "all_gather_single", inputTensor.device, options.timeout);
    call.nccl("ncclAllGather", nccl_->allGather(inputTensor.data, outputTensor.data, inputTensor.bytes(), kNcclInt8,
                                                 comm_, stream_));
    return call.finish(submission);
  }

  std::shared_ptr<Work> allgatherCoalesced(const std::vector<std::vector<BufferView>>& outputTensorLists,
                                           const std::vector<BufferView>& inputTensorList,
                                           const AllgatherOptions& options, const Submission& submission) override {
    Enqueue call(*this, "all_gather_coalesced", inputTensorList.empty() ? device_ : inputTensorList[0].device, options.timeout);
    for (size_t i = 0; i < inputTensorList.size(); ++i) {
      std::vector<BufferView> outputs;
      outputs.reserve(outputTensorLists.size());
      for (const std::vector<BufferView>& list : outputTensorLists) outputs.push_back(list[i]);
      gatherAllInto(call, outputs, inputTensorList[i]);
    }
    return call.finish(submission);
  }

  std::shared_ptr<Work> allgatherSingleCoalesced(const std::vector<BufferView>& outputTensors,
                                                 const std::vector<BufferView>& inputTensors,
                                                 const AllgatherOptions& options,
                                                 const Submission& submission) override {
    Enqueue call(*this, "all_gather_single_coalesced", inputTensors.empty() ? device_ : inputTensors[0].device, options.timeout);
    Group group(call);
    for (size_t i = 0; i < inputTensors.size(); ++i) {
      call.nccl("ncclAllGather", nccl_->allGather(inputTensors[i].data, outputTensors[i].data,
                                                   inputTensors[i].bytes(), kNcclInt8, comm_, stream_));
    }
    group.end();
    return call.finish(submission);
  }

  std::shared_ptr<Work> gather(const BufferView& tensor, const std::vector<BufferView>& gatherList,
                               const GatherOptions& options, const Submission& submission) override {
    Enqueue call(*this, "gather", tensor.device, options.timeout);
    Group group(call);
    if (rank() == options.root) {
      for (int r = 0; r < size(); ++r) {
        const BufferView& part = gatherList[static_cast<size_t>(r)];
        if (r == rank()) {
          if (part.data != tensor.data) {
            call.cuda("copying its own part", gpu_.memcpyAsync(part.data, tensor.data, tensor.bytes(), stream_));
          }
        } else {
          call.nccl("ncclRecv", nccl_->recv(part.data, part.bytes(), kNcclInt8, r, comm_, stream_));
        }
      }
    } else {
      call.nccl("ncclSend", nccl_->send(tensor.data, tensor.bytes(), kNcclInt8, options.root, comm_, stream_));
    }
    group.end();
    return call.finish(submission);
  }

  std::shared_ptr<Work> scatter(const BufferView& tensor, const std::vector<BufferView>& scatterList,
                                const ScatterOptions& options, const Submission& submission) override {
    Enqueue call(*this, "scatter", tensor.device, options.timeout);
    Group group(call);
    if (rank() == options.root) {
      for (int r = 0; r < size(); ++r) {
        const BufferView& part = scatterList[static_cast<size_t>(r)];
        if (r == rank()) {
          if (part.data != tensor.data) {
            call.cuda("copying its own part", gpu_.memcpyAsync(tensor.data, part.data, tensor.bytes(), stream_));
          }
        } else {
          call.nccl("ncclSend", nccl_->send(part.data, part.bytes(), kNcclInt8, r, comm_, stream_));
        }
      }
    } else {
      call.nccl("ncclRecv", nccl_->recv(tensor.data, tensor.bytes(), kNcclInt8, options.root, comm_, stream_));
    }
    group.end();
    return call.finish(submission);
  }

  std::shared_ptr<Work> reduceScatter(const BufferView& output, const std::vector<BufferView>& inputList,
                                      const ReduceScatterOptions& options, const Submission& submission) override {
    Enqueue call(*this, "reduce_scatter", output.device, options.timeout);
    // NCCL reduces one buffer of size() parts: lay the inputs end to end first.
    size_t totalBytes = 0;
    bool even = true;
    for (const BufferView& input : inputList) {
      totalBytes += input.bytes();
      even = even && input.count == output.count;
    }
    auto* staging = static_cast<std::byte*>(scratch(call, kStaging, totalBytes));
    size_t offset = 0;
    size_t mine = 0;
    for (size_t r = 0; r < inputList.size(); ++r) {
      if (static_cast<int>(r) == rank()) mine = offset;
      call.cuda("copying to a staging buffer",
                gpu_.memcpyAsync(staging + offset, inputList[r].data, inputList[r].bytes(), stream_));
      offset += inputList[r].bytes();
    }
    if (even) {
      reduceScatterFrom(call, output, staging, options);
    } else {
      // Parts of different sizes: reduce them all, keep this rank's.
      reduceInPlace(call, staging, staging, totalBytes / elementSize(output.type), output.type, options.op,
                    options.premulFactor);
      call.cuda("copying the result", gpu_.memcpyAsync(output.data, staging + mine, output.bytes(), stream_));
    }
    return call.finish(submission);
  }

  std::shared_ptr<Work> reduceScatterSingle(const BufferView& output, const BufferView& input,
                                            const ReduceScatterOptions& options,
                                            const Submission& submission) override {
    Enqueue call(*this, "reduce_scatter_single", output.device, options.timeout);
    reduceScatterFrom(call, output, input.data, options);
    return call.finish(submission);
  }

  std::shared_ptr<Work> reduceScatterSingleCoalesced(const std::vector<BufferView>& outputs,
                                                     const std::vector<BufferView>& inputs,
                                                     const ReduceScatterOptions& options,
                                                     const Submission& submission) override {
    Enqueue call(*this, "reduce_scatter_single_coalesced", outputs.empty() ? device_ : outputs[0].device, options.timeout);
    for (size_t i = 0; i < outputs.size(); ++i) reduceScatterFrom(call, outputs[i], inputs[i].data, options);
    return call.finish(submission);
  }

  std::shared_ptr<Work> alltoall(const std::vector<BufferView>& outputTensorList,
                                 const std::vector<BufferView>& inputTensorList, const AlltoallOptions& options,
                                 const Submission& submission) override {
    Enqueue call(*this, "all_to_all", inputTensorList.empty() ? device_ : inputTensorList[0].device, options.timeout);
    Group group(call);
    for (int r = 0; r < size(); ++r) {
      const BufferView& out = outputTensorList[static_cast<size_t>(r)];
      const BufferView& in = inputTensorList[static_cast<size_t>(r)];
      if (r == rank()) {
        if (out.data != in.data) {
          call.cuda("copying its own part", gpu_.memcpyAsync(out.data, in.data, in.bytes(), stream_));
        }
        continue;
      }
      call.nccl("ncclSend", nccl_->send(in.data, in.bytes(), kNcclInt8, r, comm_, stream_));
      call.nccl("ncclRecv", nccl_->recv(out.data, out.bytes(), kNcclInt8, r, comm_, stream_));
    }
    group.end();
    return call.finish(submission);
  }

  // An allreduce of one int32 on the device; a synchronous barrier then waits on the host
  // for it (every rank reached the barrier once it finished).
  std::shared_ptr<Work> barrier(const BarrierOptions& options, const Submission& submission) override {
    Enqueue call(*this, "barrier", device_, options.timeout);
    void* flag = scratch(call, kBarrierFlag, sizeof(int32_t));
    call.nccl("ncclAllReduce", nccl_->allReduce(flag, flag, 1, kNcclInt32, kNcclSum, comm_, stream_));
    if (submission.async) return call.finish(submission);
    // The host waits on an event of its own (pool events are recycled by the watchdog).
    call.cuda("recording its end", gpu_.eventRecord(barrierEvent_, stream_));
    call.finish({});
    const Clock::time_point deadline = Clock::now() + call.timeout();
    call.unlock();
    waitOnHost("barrier", barrierEvent_, deadline);
    return nullptr;
  }

  void send(const BufferView& tensor, int dst, int tag) override {
    Enqueue call(*this, "send", tensor.device);
    call.nccl("ncclSend", nccl_->send(tensor.data, tensor.bytes(), kNcclInt8, dst, comm_, stream_));
    call.finish({});
  }

  int recv(const BufferView& tensor, int src, int tag) override {
    checkSource("recv", src);
    Enqueue call(*this, "recv", tensor.device);
    call.nccl("ncclRecv", nccl_->recv(tensor.data, tensor.bytes(), kNcclInt8, src, comm_, stream_));
    call.finish({});
    return src;
  }

  std::shared_ptr<Work> isend(const BufferView& tensor, int dst, int tag, std::shared_ptr<void> keepAlive) override {
    Enqueue call(*this, "send", tensor.device);
    call.nccl("ncclSend", nccl_->send(tensor.data, tensor.bytes(), kNcclInt8, dst, comm_, stream_));
    return call.finish({true, std::move(keepAlive)});
  }

  std::shared_ptr<Work> irecv(const BufferView& tensor, int src, int tag, std::shared_ptr<void> keepAlive) override {
    checkSource("irecv", src);
    Enqueue call(*this, "recv", tensor.device);
    call.nccl("ncclRecv", nccl_->recv(tensor.data, tensor.bytes(), kNcclInt8, src, comm_, stream_));
    std::shared_ptr<Work> work = call.finish({true, std::move(keepAlive)});
    work->setSourceRank(src);
    return work;
  }

  // Every op in one NCCL group: peers sending to each other first cannot deadlock. The ops
  // share one Work.
  std::vector<std::shared_ptr<Work>> batchIsendIrecv(const std::vector<PointToPointOp>& ops,
                                                     std::shared_ptr<void> keepAlive) override {
    Enqueue call(*this, "batch_isend_irecv", ops.front().tensor.device);
    Group group(call);
    for (const PointToPointOp& op : ops) {
      if (op.send) {
        call.nccl("ncclSend", nccl_->send(op.tensor.data, op.tensor.bytes(), kNcclInt8, op.peer, comm_, stream_));
      } else {
        call.nccl("ncclRecv", nccl_->recv(op.tensor.data, op.tensor.bytes(), kNcclInt8, op.peer, comm_, stream_));
      }
    }
    group.end();
    return std::vector<std::shared_ptr<Work>>(ops.size(), call.finish({true, std::move(keepAlive)}));
  }

  // Waits (within the timeout) for what was enqueued, then destroys the communicator.
  void shutdown() override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed_) return;
    const Clock::time_point deadline = Clock::now() + timeout_;
    drained_.wait_until(lock, deadline, [&] { return pending_.empty() || failure_ || closed_; });
    const bool drained = pending_.empty();
    lock.unlock();
    close(/*abort=*/!drained, "shut down");
  }

  void abort() override { close(/*abort=*/true, "aborted"); }

 private:
  // Scratch buffers on the device, one per use, grown on demand (all uses are ordered on
  // the backend's stream, so one of each is enough).
  enum ScratchSlot { kStaging = 0, kRing = 1, kBarrierFlag = 2, kNumScratchSlots = 3 };

  // One call's enqueueing: holds the enqueueing lock (NCCL calls on one communicator must
  // not overlap), sets the device, orders the backend's stream after the caller's, and
  // checks every CUDA and NCCL result on the way. A failure once part of the operation is
  // enqueued leaves this rank out of step with its peers: it fails the backend (aborting
  // the communicator) before it is thrown. `timeout` is the call's own (zero: the group's).
  class Enqueue {
   public:
    Enqueue(NcclBackend& backend, const char* opName, const Device& device,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0))
        : backend_(backend),
          opName_(opName),
          timeout_(timeout.count() > 0 ? timeout : backend.timeout_),
          lock_(backend.enqueueMutex_),
          guard_(backend.gpu_, backend.device_.index) {
      backend_.throwIfUnusable(opName_, device);
      callerStream_ = currentStream(backend_.device_);
      cuda("ordering after the caller's stream", backend_.gpu_.eventRecord(backend_.readyEvent_, callerStream_));
      cuda("ordering after the caller's stream", backend_.gpu_.streamWaitEvent(backend_.stream_, backend_.readyEvent_));
      enqueued_ = false;  // the ordering alone leaves the peers in step
    }

    void cuda(const char* what, int result) {
      if (result == 0) {
        enqueued_ = true;
        return;
      }
      raise(std::make_exception_ptr(
          Error(backend_.where(opName_) + ": CUDA failed " + what + ": " + backend_.gpu_.errorString(result))));
    }
    void nccl(const char* function, int result) {
      if (result == kNcclSuccess) {
        enqueued_ = true;
        return;
      }
      // The watchdog may have aborted the communicator since throwIfUnusable (an
      // asynchronous error, a timeout): the call then fails with that failure, not with
      // what NCCL says of an aborted communicator.
      const std::exception_ptr recorded = backend_.recordedFailure();
      raise(recorded ? recorded : backend_.ncclError(function, opName_, result));
    }

    // Records the end of the operation and hands it to the watchdog; see the class comment
    // of the header for what synchronous and asynchronous calls return.
    std::shared_ptr<Work> finish(const Submission& submission) {
      enqueued_ = true;  // from here every failure leaves an untracked operation behind
      if (submission.async) return finishAsync(submission);
      void* done = backend_.takeEvent();
      const int recorded = backend_.gpu_.eventRecord(done, backend_.stream_);
      if (recorded != 0) backend_.recycle(done);
      cuda("recording its end", recorded);
      // Before the event goes to the watchdog, which may destroy it at once (when the
      // backend failed meanwhile).
      const int ordered = backend_.gpu_.streamWaitEvent(callerStream_, done);
      backend_.track(done, opName_, nullptr, timeout_);
      cuda("ordering the caller's stream after it", ordered);
      return nullptr;
    }

    // The asynchronous end: the Work's own event, which its stream wait (Work::wait())
    // makes the waiting thread's current stream wait for.
    std::shared_ptr<Work> finishAsync(const Submission& submission) {
      const RingtreeGpuApi* gpu = &backend_.gpu_;
      void* raw = nullptr;
      cuda("creating an event", gpu->eventCreate(&raw));
      const Device device = backend_.device_;
      // Whichever thread lets go of the Work last destroys it: on the group's device.
      std::shared_ptr<void> event(raw, [gpu, device](void* created) {
        DeviceGuard guard(*gpu, device.index);
        gpu->eventDestroy(created);
      });
      cuda("recording its end", gpu->eventRecord(raw, backend_.stream_));
      auto work = std::make_shared<Work>(opName_, submission.keepAlive);
      work->setStreamWait([gpu, event, device] {
        DeviceGuard guard(*gpu, device.index);
        return gpu->streamWaitEvent(currentStream(device), event.get()) == 0;
      });
      backend_.track(raw, opName_, work, timeout_, std::move(event));
      return work;
    }

    NcclBackend& backend() { return backend_; }
    std::chrono::milliseconds timeout() const { return timeout_; }
    // Lets other calls in before this object ends (a host-side wait).
    void unlock() { lock_.unlock(); }

    // Group's bookkeeping of the ncclGroupStart calls not yet ended.
    void groupStarted() { ++openGroups_; }
    bool groupEnding() {
      if (openGroups_ == 0) return false;
      --openGroups_;
      return true;
    }

   private:
    [[noreturn]] void raise(const std::exception_ptr& error) {
      // The groups still open end first: failing the backend aborts the communicator,
      // which NCCL frees, and they hold it.
      for (; openGroups_ > 0; --openGroups_) backend_.nccl_->groupEnd();
      if (enqueued_) backend_.fail(error);
      std::rethrow_exception(error);
    }

    NcclBackend& backend_;
    const char* opName_;
    const std::chrono::milliseconds timeout_;
    std::unique_lock<std::mutex> lock_;
    DeviceGuard guard_;
    void* callerStream_ = nullptr;
    bool enqueued_ = false;
    int openGroups_ = 0;
  };

  // ncclGroupStart ... ncclGroupEnd around the point-to-point calls of one operation.
  class Group {
   public:
    explicit Group(Enqueue& call) : call_(call), nccl_(*call.backend().nccl_) {
      call_.nccl("ncclGroupStart", nccl_.groupStart());
      call_.groupStarted();
    }
    void end() {
      open_ = false;
      if (call_.groupEnding()) call_.nccl("ncclGroupEnd", nccl_.groupEnd());
    }
    ~Group() {
      // Unwinding from an exception that did not end it (a failure's raise ends it first).
      if (open_ && call_.groupEnding()) nccl_.groupEnd();
    }
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;

   private:
    Enqueue& call_;
    const NcclApi& nccl_;
    bool open_ = true;
  };
  friend class Group;

  std::string where(const char* opName) const {
    return std::string("rank ") + std::to_string(rank()) + " of " + std::to_string(size()) + ", " + opName + " on " +
           deviceName(device_) + " (NCCL " + ncclVersionString(nccl_->version) + ")";
  }

  void checkCuda(const char* what, int result) const {
    if (result != 0) throw Error(where("setting up") + ": CUDA failed " + what + ": " + gpu_.errorString(result));
  }

  void checkNccl(const char* function, const char* opName, int result) const {
    if (result != kNcclSuccess) std::rethrow_exception(ncclError(function, opName, result));
  }

  // The error of an NCCL call that returned `result`: InvalidArgument for NCCL's invalid
  // argument and usage results, else Error; with NCCL's last error text where it has one.
  std::exception_ptr ncclError(const char* function, const char* opName, int result) const {
    std::string message = where(opName) + ": " + function + " failed: " + nccl_->getErrorString(result);
    if (nccl_->getLastError != nullptr && comm_ != nullptr) {
      const char* last = nccl_->getLastError(comm_);
      if (last != nullptr && *last != '\0') message += std::string(" (") + last + ")";
    }
    if (result == kNcclInvalidArgument || result == kNcclInvalidUsage) {
      return std::make_exception_ptr(InvalidArgument(message));
    }
    return std::make_exception_ptr(Error(message));
  }

  // The failure the backend recorded (null while none).
  std::exception_ptr recordedFailure() {
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
  }

  // Refuses calls once the backend failed or closed, and buffers on another device than the
  // communicator's; notes the call for errors found after it.
  void throwIfUnusable(const char* opName, const Device& device) {
    std::lock_guard<std::mutex> lock(mutex_);
    lastOpName_ = opName;
    if (failure_) std::rethrow_exception(failure_);
    if (closed_) throw Error(where(opName) + ": the group's NCCL communicator has been " + closedHow_);
    if (device.index != device_.index) {
      throw InvalidArgument(where(opName) + ": the buffers are on " + deviceName(device) + ", but this group's CUDA "
                            "buffers are on " + deviceName(device_) + " (one device per group and rank, as NCCL has)");
    }
  }

  void checkSource(const char* opName, int src) const {
    if (src < 0) {
      throw InvalidArgument(where(opName) + ": receiving from any source is not supported for CUDA buffers "
                            "(NCCL has no wildcard receive); name the source rank");
    }
  }

  // Under the enqueueing lock: a device buffer of at least `bytes` for `slot`. A grown
  // slot's old buffer is kept until release(), since operations still queued may use it
  // (freeing it now would wait for the device, with the lock held); slots at least double,
  // so what is kept is less than what is in use.
  void* scratch(Enqueue& call, ScratchSlot slot, size_t bytes) {
    Scratch& s = scratch_[slot];
    if (bytes <= s.bytes && s.data != nullptr) return s.data;
    const size_t rounded = std::max<size_t>({bytes, 256, 2 * s.bytes});
    void* data = nullptr;
    call.cuda(("allocating " + std::to_string(rounded) + " bytes of scratch memory").c_str(),
              gpu_.deviceMalloc(&data, rounded));
    if (s.data != nullptr) retiredScratch_.push_back(s.data);
    s.data = data;
    s.bytes = rounded;
    return s.data;
  }

  // Whether PREMUL_SUM may be NCCL's op. Not on a one-rank communicator: NCCL's one-rank
  // path (a copy kernel that applies the factor) copies the tail of some sizes unscaled
  // (seen with NCCL 2.28.9 on an H200, torch's own NCCL backend alike: float64 x 65539
  // and complex64 x 65539, the elements past 65536 and past 131072 floats), so ringtree's
  // scale kernel does that call.
  bool ncclPremulUsable() const { return nccl_->redOpCreatePreMulSum != nullptr && size() > 1; }

  // NCCL's op for a plan: the built-in one, or a PREMUL_SUM op made for `factor` (destroyed
  // by destroyOp once the call that uses it is enqueued, as NCCL allows).
  int ncclOp(Enqueue& call, const ReducePlan& plan, double factor) {
    if (!plan.premul) return plan.ncclOp;
    int op = 0;
    // A host-immediate scalar of the element type (complex: its real part type).
    double asDouble = factor;
    float asFloat = static_cast<float>(factor);
    void* scalar = plan.ncclType == kNcclFloat64 ? static_cast<void*>(&asDouble) : static_cast<void*>(&asFloat);
    int scalarType = plan.ncclType == kNcclFloat64 ? kNcclFloat64 : kNcclFloat32;
    if (plan.ncclType == kNcclFloat16 || plan.ncclType == kNcclBfloat16) {
      // NCCL takes the scalar in the element type; half types convert through ringtree's
      // kernel table rules: round float32 to nearest even.
      halfScalar_ = toHalfBits(asFloat, plan.ncclType == kNcclBfloat16);
      scalar = &halfScalar_;
      scalarType = plan.ncclType;
    }
    call.nccl("ncclRedOpCreatePreMulSum",
              nccl_->redOpCreatePreMulSum(&op, scalar, scalarType, kNcclScalarHostImmediate, comm_));
    return op;
  }

  void destroyOp(const ReducePlan& plan, int op) {
    if (plan.premul && !plan.own && nccl_->redOpDestroy != nullptr) nccl_->redOpDestroy(op, comm_);
  }

  // float32 -> float16 / bfloat16 bits, rounding to nearest even.
  static uint16_t toHalfBits(float value, bool bfloat) {
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    if (bfloat) {
      if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
      return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
    if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
    if (magnitude < 0x38800000u) {                                              // subnormal or zero
      float absolute = 0;
      std::memcpy(&absolute, &magnitude, sizeof(absolute));
      // Scaled by 2^24 the subnormal's mantissa is an integer; nearbyint rounds to even.
      const float scaled = absolute * 16777216.0f;
      return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
    }
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }

  // recv = reduce(send) over the group, of `count` elements (send == recv in place).
  void reduceInPlace(Enqueue& call, const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                     double factor) {
    const ReducePlan plan = planReduction(type, op, ncclPremulUsable());
    if (plan.own) {
      if (send != recv) call.cuda("copying the input", gpu_.memcpyAsync(recv, send, count * elementSize(type), stream_));
      ownAllreduce(call, recv, count, type, op, factor);
      return;
    }
    const int ncclOpValue = ncclOp(call, plan, factor);
    call.nccl("ncclAllReduce",
              nccl_->allReduce(send, recv, count * plan.countFactor, plan.ncclType, ncclOpValue, comm_, stream_));
    destroyOp(plan, ncclOpValue);
  }

  // output = part rank() of reduce(input's size() parts); input is on the device.
  void reduceScatterFrom(Enqueue& call, const BufferView& output, void* input, const ReduceScatterOptions& options) {
    const ReducePlan plan = planReduction(output.type, options.op, ncclPremulUsable());
    const size_t partBytes = output.bytes();
    if (plan.own) {
      // Reduce all parts in a copy, then keep this rank's part.
      auto* whole = static_cast<std::byte*>(scratch(call, kStaging, partBytes * static_cast<size_t>(size())));
      if (whole != input) {
        call.cuda("copying to a staging buffer",
                  gpu_.memcpyAsync(whole, input, partBytes * static_cast<size_t>(size()), stream_));
      }
      ownAllreduce(call, whole, output.count * static_cast<size_t>(size()), output.type, options.op,
                   options.premulFactor);
      call.cuda("copying the result",
                gpu_.memcpyAsync(output.data, whole + static_cast<size_t>(rank()) * partBytes, partBytes, stream_));
      return;
    }
    const int op = ncclOp(call, plan, options.premulFactor);
    call.nccl("ncclReduceScatter", nccl_->reduceScatter(input, output.data, output.count * plan.countFactor,
                                                         plan.ncclType, op, comm_, stream_));
    destroyOp(plan, op);
  }

  // outputs[r] <- rank r's input: NCCL's allgather into one buffer, then copied out (in
  // place where the outputs already are that buffer's parts); parts of different sizes as
  // one broadcast from each rank, in one NCCL group.
  void gatherAllInto(Enqueue& call, const std::vector<BufferView>& outputs, const BufferView& input) {
    const size_t partBytes = input.bytes();
    bool even = true;
    for (const BufferView& output : outputs) even = even && output.count == input.count;
    if (!even) {
      Group group(call);
      for (size_t r = 0; r < outputs.size(); ++r) {
        const void* send = static_cast<int>(r) == rank() ? input.data : outputs[r].data;
        call.nccl("ncclBroadcast", nccl_->broadcast(send, outputs[r].data, outputs[r].bytes(), kNcclInt8,
                                                     static_cast<int>(r), comm_, stream_));
      }
      group.end();
      return;
    }
    bool contiguous = true;
    for (size_t r = 0; r < outputs.size(); ++r) {
      contiguous = contiguous && static_cast<std::byte*>(outputs[r].data) ==
                                     static_cast<std::byte*>(outputs[0].data) + r * partBytes;
    }
    auto* whole = contiguous ? static_cast<std::byte*>(outputs[0].data)
                             : static_cast<std::byte*>(scratch(call, kStaging, partBytes * outputs.size()));
    call.nccl("ncclAllGather", nccl_->allGather(input.data, whole, partBytes, kNcclInt8, comm_, stream_));
    if (contiguous) return;
    for (size_t r = 0; r < outputs.size(); ++r) {
      call.cuda("copying the gathered parts", gpu_.memcpyAsync(outputs[r].data, whole + r * partBytes, partBytes, stream_));
    }
  }

  // The reduction NCCL does not have, in place over `data`: PREMUL_SUM scales first, then a
  // ring reduce-scatter and a ring allgather over ncclSend/ncclRecv, reducing each received
  // chunk with ringtree's kernel; AVG divides last. Every step is enqueued on the stream.
  void ownAllreduce(Enqueue& call, void* data, size_t count, DataType type, ReduceOp op, double factor) {
    if (op == ReduceOp::kPremulSum) {
      call.cuda("scaling by the PREMUL_SUM factor",
                gpu_.scale(data, count, static_cast<int>(type), factor, stream_));
    }
    const int n = size();
    const size_t element = elementSize(type);
    auto* bytes = static_cast<std::byte*>(data);
    auto start = [&](int chunk) { return count * static_cast<size_t>(chunk) / static_cast<size_t>(n); };
    auto length = [&](int chunk) { return start(chunk + 1) - start(chunk); };
    const int next = (rank() + 1) % n;
    const int previous = (rank() + n - 1) % n;
    if (n > 1) {
      auto* incoming = static_cast<std::byte*>(scratch(call, kRing, length(n - 1) * element + element));
      for (int step = 0; step < n - 1; ++step) {
        const int sendChunk = (rank() - step + n) % n;
        const int recvChunk = (rank() - step - 1 + 2 * n) % n;
        {
          Group group(call);
          call.nccl("ncclSend", nccl_->send(bytes + start(sendChunk) * element, length(sendChunk) * element,
                                             kNcclInt8, next, comm_, stream_));
          call.nccl("ncclRecv", nccl_->recv(incoming, length(recvChunk) * element, kNcclInt8, previous, comm_,
                                             stream_));
          group.end();
        }
        call.cuda("reducing a received chunk", gpu_.reduce(bytes + start(recvChunk) * element, incoming,
                                                           length(recvChunk), static_cast<int>(type),
                                                           static_cast<int>(op), stream_));
      }
      for (int step = 0; step < n - 1; ++step) {
        const int sendChunk = (rank() + 1 - step + n) % n;
        const int recvChunk = (rank() - step + n) % n;
        Group group(call);
        call.nccl("ncclSend", nccl_->send(bytes + start(sendChunk) * element, length(sendChunk) * element, kNcclInt8,
                                           next, comm_, stream_));
        call.nccl("ncclRecv", nccl_->recv(bytes + start(recvChunk) * element, length(recvChunk) * element, kNcclInt8,
                                           previous, comm_, stream_));
        group.end();
      }
    }
    if (op == ReduceOp::kAvg) {
      call.cuda("dividing by the number of ranks", gpu_.divide(data, count, static_cast<int>(type), n, stream_));
    }
  }

  // An event from the pool.
  void* takeEvent() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!freeEvents_.empty()) {
      void* event = freeEvents_.back();
      freeEvents_.pop_back();
      return event;
    }
    void* event = nullptr;
    const int result = gpu_.eventCreate(&event);
    if (result != 0) throw Error(where("recording an event") + ": CUDA failed: " + gpu_.errorString(result));
    return event;
  }

  // An event takeEvent() gave that was not recorded.
  void recycle(void* event) {
    std::lock_guard<std::mutex> lock(mutex_);
    freeEvents_.push_back(event);
  }

  // Hands an enqueued operation to the watchdog, with its deadline. After a failure the
  // operation fails at once (the communicator is aborted).
  void track(void* event, const char* opName, std::shared_ptr<Work> work, std::chrono::milliseconds timeout,
             std::shared_ptr<void> ownedEvent = nullptr) {
    std::exception_ptr failed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_ && !closed_) {
        pending_.push_back(
            Pending{event, Clock::now() + timeout, timeout, opName, std::move(work), std::move(ownedEvent)});
        if (pending_.size() == 1) wake_.notify_one();
        return;
      }
      failed = failure_ ? failure_
                        : std::make_exception_ptr(Error(where(opName) + ": the group's NCCL communicator has been " +
                                                        closedHow_));
    }
    if (!ownedEvent) gpu_.eventDestroy(event);
    if (work) work->finish(failed);
  }

  // Blocks the calling thread until `event` (the backend's barrier event) completed, the
  // backend failed or closed, or `deadline`. The event is queried under mutex_ while
  // nothing failed and the backend is open: until then release() has not destroyed it (a
  // later record of it, by another barrier, completes after this one).
  void waitOnHost(const char* opName, void* event, Clock::time_point deadline) {
    auto pause = std::chrono::microseconds(1);
    for (;;) {
      int state = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (failure_) std::rethrow_exception(failure_);
        if (closed_) throw Error(where(opName) + ": the group's NCCL communicator has been " + closedHow_);
        state = gpu_.eventQuery(event);
      }
      if (state == 0) return;
      if (state != RINGTREE_GPU_NOT_READY) {
        throw Error(where(opName) + ": CUDA failed waiting for it: " + gpu_.errorString(state));
      }
      if (Clock::now() >= deadline) {
        const std::string message = where(opName) + " did not finish within its timeout; the communicator was aborted";
        fail(std::make_exception_ptr(TimeoutError(message)));
        throw TimeoutError(message);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  // The watchdog: completes what finished, fails everything on an asynchronous NCCL error
  // or on an operation past its deadline. Polls every 50 us to 1 ms while operations are
  // pending (backing off while nothing finishes), sleeps while none is.
  void watch() {
    // Its CUDA calls (event queries, destroys) work in the group's device's context; on a
    // thread with no device chosen they would make one on device 0.
    gpu_.setDevice(device_.index);
    auto pause = std::chrono::microseconds(50);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopWatching_) {
      if (pending_.empty() || failure_) {
        wake_.wait(lock, [&] { return stopWatching_ || (!pending_.empty() && !failure_); });
        pause = std::chrono::microseconds(50);
        continue;
      }
      std::vector<Pending> finished;
      std::string expired;
      Clock::time_point expiredDeadline;
      std::chrono::milliseconds expiredTimeout{0};
      // An asynchronous NCCL error first: operations whose events completed meanwhile may
      // have run on a failing communicator, and fail with it (as torch's watchdog does).
      int asyncError = kNcclSuccess;
      if (!aborted_ && comm_ != nullptr && nccl_->commGetAsyncError(comm_, &asyncError) == kNcclSuccess &&
          asyncError != kNcclSuccess && asyncError != kNcclInProgress) {
        std::string message = where(pending_.empty() ? lastOpName_ : pending_.front().opName) +
                              ": NCCL reported an asynchronous error: " + nccl_->getErrorString(asyncError);
        if (nccl_->getLastError != nullptr) {
          const char* last = nccl_->getLastError(comm_);
          if (last != nullptr && *last != '\0') message += std::string(" (") + last + ")";
        }
        failure_ = std::make_exception_ptr(Error(message + "; the communicator was aborted"));
      }
      if (!failure_) {
        while (!pending_.empty()) {
          const int state = gpu_.eventQuery(pending_.front().event);
          if (state == RINGTREE_GPU_NOT_READY) {
            if (Clock::now() >= pending_.front().deadline) {
              expired = pending_.front().opName;
              expiredDeadline = pending_.front().deadline;
              expiredTimeout = pending_.front().timeout;
            }
            break;
          }
          if (state != 0) {  // stays pending: fail() below fails it with the rest
            expired.clear();
            failure_ = std::make_exception_ptr(Error(where(pending_.front().opName) + ": CUDA reported an error: " +
                                                     gpu_.errorString(state)));
            break;
          }
          finished.push_back(std::move(pending_.front()));
          pending_.pop_front();
        }
      }
      if (!failure_ && !expired.empty()) {
        const auto late = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - expiredDeadline);
        failure_ = std::make_exception_ptr(TimeoutError(
            where(expired.c_str()) + " did not finish within its timeout of " + std::to_string(expiredTimeout.count()) +
            " ms (" + std::to_string(late.count()) + " ms ago); the communicator was aborted"));
      }
      for (Pending& entry : finished) {
        if (!entry.ownedEvent) freeEvents_.push_back(entry.event);
      }
      if (failure_) {
        lock.unlock();
        completeAll(finished, nullptr);
        fail(failure_);
        lock.lock();
        continue;
      }
      if (pending_.empty()) drained_.notify_all();
      lock.unlock();
      completeAll(finished, nullptr);
      pause = finished.empty() ? std::min(pause * 2, std::chrono::microseconds(1000)) : std::chrono::microseconds(50);
      std::this_thread::sleep_for(pause);
      lock.lock();
    }
  }

  static void completeAll(std::vector<Pending>& entries, const std::exception_ptr& error) {
    for (Pending& entry : entries) {
      if (entry.work) entry.work->finish(error);
    }
    entries.clear();
  }

  // Records `error` (the first one wins), aborts the communicator and fails every pending
  // operation with it. Their events are destroyed, not reused: they may never complete.
  void fail(const std::exception_ptr& error) {
    std::vector<Pending> failed;
    std::exception_ptr recorded;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) failure_ = error;
      recorded = failure_;
      failed.assign(std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.end()));
      pending_.clear();
      if (comm_ != nullptr && !aborted_) {
        aborted_ = true;
        nccl_->commAbort(comm_);
      }
      drained_.notify_all();
    }
    for (Pending& entry : failed) {
      if (!entry.ownedEvent) gpu_.eventDestroy(entry.event);
    }
    completeAll(failed, recorded);
  }

  // Ends the communicator (destroys it, or aborts it when `abort` or when operations are
  // still pending) and releases everything else. Idempotent.
  // Aborting never waits for the enqueueing lock (a call may be blocked inside NCCL, which
  // the abort releases); destroying takes it, so that no call is inside NCCL meanwhile.
  void close(bool abort, const char* how) {
    // Any thread may close: the events' destroys, NCCL's own device switching in abort and
    // destroy, and the owned events' deleters (when `left` ends, after the guard's
    // declaration, so before it) run on the group's device.
    DeviceGuard guard(gpu_, device_.index);
    std::vector<Pending> left;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return;
      closed_ = true;
      closedHow_ = how;
      stopWatching_ = true;
      wake_.notify_all();
      drained_.notify_all();
    }
    // Work callbacks run on the watchdog and must not close the group (Work's contract).
    if (watchdog_.joinable()) watchdog_.join();
    bool destroy = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      left.assign(std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.end()));
      pending_.clear();
      if (comm_ != nullptr && !aborted_) {
        aborted_ = true;
        if (abort || !left.empty()) {
          nccl_->commAbort(comm_);
        } else {
          destroy = true;
        }
      }
    }
    std::unique_lock<std::mutex> enqueueing(enqueueMutex_);
    if (destroy) nccl_->commDestroy(comm_);
    const std::exception_ptr error =
        left.empty() ? nullptr
                     : std::make_exception_ptr(Error(where(left.front().opName) + ": the group was " + how +
                                                     " before the operation finished"));
    for (Pending& entry : left) {
      if (!entry.ownedEvent) gpu_.eventDestroy(entry.event);
    }
    completeAll(left, error);
    release();
  }

  // Frees the stream, events and scratch buffers (after the communicator is gone; with the
  // enqueueing lock held, or before the backend is shared). deviceFree waits for the
  // device, as cudaFree does.
  void release() {
    DeviceGuard guard(gpu_, device_.index);
    for (Scratch& s : scratch_) {
      if (s.data != nullptr) gpu_.deviceFree(s.data);
      s = {};
    }
    for (void* data : retiredScratch_) gpu_.deviceFree(data);
    retiredScratch_.clear();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (void* event : freeEvents_) gpu_.eventDestroy(event);
      freeEvents_.clear();
    }
    for (void** event : {&readyEvent_, &barrierEvent_}) {
      if (*event != nullptr) gpu_.eventDestroy(*event);
      *event = nullptr;
    }
    if (stream_ != nullptr) gpu_.streamDestroy(stream_);
    stream_ = nullptr;
  }

  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
  };

  const RingtreeGpuApi& gpu_;
  const std::shared_ptr<const NcclApi> nccl_;
  const Device device_;
  const std::chrono::milliseconds timeout_;

  // Serialises enqueueing (NCCL calls on one communicator must not overlap) and guards
  // what only calls use. Taken before mutex_ when both are held.
  std::mutex enqueueMutex_;
  NcclComm comm_ = nullptr;  // set before the backend is shared, then constant
  void* stream_ = nullptr;
  void* readyEvent_ = nullptr;    // re-recorded by every call: a stream wait takes its latest record
  void* barrierEvent_ = nullptr;  // what a synchronous barrier waits for on the host
  Scratch scratch_[kNumScratchSlots];
  std::vector<void*> retiredScratch_;  // grown slots' old buffers, freed by release()
  uint16_t halfScalar_ = 0;

  // Guards the operations' state, for calls and the watchdog; never held across a wait.
  std::mutex mutex_;
  std::vector<void*> freeEvents_;
  std::deque<Pending> pending_;
  std::condition_variable wake_;     // the watchdog: work arrived, or stop
  std::condition_variable drained_;  // shutdown: nothing pending
  std::exception_ptr failure_;
  bool aborted_ = false;  // commAbort or commDestroy was called
  bool closed_ = false;
  const char* closedHow_ = "";
  const char* lastOpName_ = "setting up";  // the latest call enqueued, for errors found after it
  bool stopWatching_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<DeviceBackend> makeNcclBackend(const DeviceBackendContext& context, const RingtreeGpuApi& gpu,
                                               std::shared_ptr<const NcclApi> nccl) {
  return std::make_unique<NcclBackend>(context, gpu, std::move(nccl));
}

}  // namespace ringtree::cuda
