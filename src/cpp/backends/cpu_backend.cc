#include "backends/cpu_backend.h"

#include <string>
#include <utility>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "communicator_impl.h"

namespace ringtree::detail {

namespace {

// The data pointers and element counts of `buffers`, as the collectives of
// <ringtree/collectives.h> take per-rank buffers.
struct Arrays {
  explicit Arrays(const std::vector<BufferView>& buffers) {
    data.reserve(buffers.size());
    counts.reserve(buffers.size());
    for (const BufferView& buffer : buffers) {
      data.push_back(buffer.data);
      counts.push_back(buffer.count);
    }
  }
  // Row-major concatenation of lists[0], lists[1], ... (allgatherCoalesced's outputs).
  explicit Arrays(const std::vector<std::vector<BufferView>>& lists) {
    for (const std::vector<BufferView>& list : lists) {
      for (const BufferView& buffer : list) {
        data.push_back(buffer.data);
        counts.push_back(buffer.count);
      }
    }
  }
  const void* const* inputs() const { return data.data(); }
  void* const* outputs() const { return data.data(); }

  std::vector<void*> data;
  std::vector<size_t> counts;
};

// The bytes of the buffers among a call's arguments (options count nothing).
size_t bufferBytes(const BufferView& buffer) { return buffer.count * elementSize(buffer.type); }
size_t bufferBytes(const std::vector<BufferView>& buffers) {
  size_t total = 0;
  for (const BufferView& buffer : buffers) total += bufferBytes(buffer);
  return total;
}
size_t bufferBytes(const std::vector<std::vector<BufferView>>& lists) {
  size_t total = 0;
  for (const auto& list : lists) total += bufferBytes(list);
  return total;
}
template <typename Other>
size_t bufferBytes(const Other&) {
  return 0;
}

// Asynchronous calls on at most this many bytes start deferred (OperationQueue::Start):
// their latency is the wake-up a waiter spares; a larger one starts at once, since a
// wake-up is nothing to its transfer time and a delayed start would be.
constexpr size_t kDeferredStartBytes = size_t{64} << 10;

}  // namespace

CpuBackend::CpuBackend(std::shared_ptr<Communicator> collectives, std::shared_ptr<Communicator> pointToPoint)
    : DeviceBackend(collectives->rank(), collectives->size()),
      collectives_(std::move(collectives)),
      queue_(OperationQueue::create()) {
  if (pointToPoint) {
    p2p_ = std::make_unique<PointToPoint>(std::move(pointToPoint));
  }
}

CpuBackend::~CpuBackend() { shutdown(); }

template <typename Body, typename... Args>
std::shared_ptr<Work> CpuBackend::run(const char* opName, const Submission& submission, Body body,
                                      const Args&... args) {
  Communicator* communicator = collectives_.get();
  if (!submission.async) {
    auto operation = [&] { body(*communicator, args...); };
    queue_->runSync(opName, operation);
    return nullptr;
  }
  const size_t bytes = (size_t{0} + ... + bufferBytes(args));
  const auto start = bytes <= kDeferredStartBytes ? OperationQueue::Start::kDeferred : OperationQueue::Start::kAtOnce;
  return queue_->submit(opName, [communicator, body, args...] { body(*communicator, args...); },
                        submission.keepAlive, start);
}

std::shared_ptr<Work> CpuBackend::allreduce(const BufferView& tensor, const AllreduceOptions& options,
                                            const Submission& submission) {
  return run(
      "all_reduce", submission,
      [](Communicator& comm, const BufferView& t, const AllreduceOptions& o) {
        ringtree::allreduce(comm, t.data, t.count, t.type, o);
      },
      tensor, options);
}

std::shared_ptr<Work> CpuBackend::allreduceCoalesced(const std::vector<BufferView>& tensors,
                                                     const AllreduceOptions& options, const Submission& submission) {
  return run(
      "all_reduce_coalesced", submission,
      [](Communicator& comm, const std::vector<BufferView>& ts, const AllreduceOptions& o) {
        if (ts.empty()) return;
        const Arrays buffers(ts);
        ringtree::allreduceCoalesced(comm, buffers.outputs(), buffers.counts.data(), ts.size(), ts[0].type, o);
      },
      tensors, options);
}

std::shared_ptr<Work> CpuBackend::broadcast(const BufferView& tensor, const BroadcastOptions& options,
                                            const Submission& submission) {
  return run(
      "broadcast", submission,
      [](Communicator& comm, const BufferView& t, const BroadcastOptions& o) {
        ringtree::broadcast(comm, t.data, t.count, t.type, o);
      },
      tensor, options);
}

std::shared_ptr<Work> CpuBackend::reduce(const BufferView& tensor, const ReduceOptions& options,
                                         const Submission& submission) {
  return run(
      "reduce", submission,
      [](Communicator& comm, const BufferView& t, const ReduceOptions& o) {
        ringtree::reduce(comm, t.data, t.count, t.type, o);
      },
      tensor, options);
}

std::shared_ptr<Work> CpuBackend::allgather(const std::vector<BufferView>& tensorList, const BufferView& tensor,
                                            const AllgatherOptions& options, const Submission& submission) {
  return run(
      "all_gather", submission,
      [](Communicator& comm, const std::vector<BufferView>& outs, const BufferView& in, const AllgatherOptions& o) {
        const Arrays outputs(outs);
        ringtree::allgather(comm, in.data, outputs.outputs(), outputs.counts.data(), in.type, o);
      },
      tensorList, tensor, options);
}

std::shared_ptr<Work> CpuBackend::allgatherCoalesced(const std::vector<std::vector<BufferView>>& outputTensorLists,
                                                     const std::vector<BufferView>& inputTensorList,
                                                     const AllgatherOptions& options, const Submission& submission) {
  return run(
      "all_gather_coalesced", submission,
      [](Communicator& comm, const std::vector<std::vector<BufferView>>& outs, const std::vector<BufferView>& ins,
         const AllgatherOptions& o) {
        if (ins.empty()) return;
        const Arrays inputs(ins);
        const Arrays outputs(outs);
        ringtree::allgatherCoalesced(comm, inputs.inputs(), ins.size(), outputs.outputs(), outputs.counts.data(),
                                     ins[0].type, o);
      },
      outputTensorLists, inputTensorList, options);
}

std::shared_ptr<Work> CpuBackend::gather(const BufferView& tensor, const std::vector<BufferView>& gatherList,
                                         const GatherOptions& options, const Submission& submission) {
  return run(
      "gather", submission,
      [](Communicator& comm, const BufferView& in, const std::vector<BufferView>& outs, const GatherOptions& o) {
        const Arrays outputs(outs);
        ringtree::gather(comm, in.data, outs.empty() ? nullptr : outputs.outputs(), in.count, in.type, o);
      },
      tensor, gatherList, options);
}

std::shared_ptr<Work> CpuBackend::scatter(const BufferView& tensor, const std::vector<BufferView>& scatterList,
                                          const ScatterOptions& options, const Submission& submission) {
  return run(
      "scatter", submission,
      [](Communicator& comm, const BufferView& out, const std::vector<BufferView>& ins, const ScatterOptions& o) {
        const Arrays inputs(ins);
        ringtree::scatter(comm, ins.empty() ? nullptr : inputs.inputs(), out.data, out.count, out.type, o);
      },
      tensor, scatterList, options);
}

std::shared_ptr<Work> CpuBackend::reduceScatter(const BufferView& output, const std::vector<BufferView>& inputList,
                                                const ReduceScatterOptions& options, const Submission& submission) {
  return run(
      "reduce_scatter", submission,
      [](Communicator& comm, const BufferView& out, const std::vector<BufferView>& ins,
         const ReduceScatterOptions& o) {
        const Arrays inputs(ins);
        ringtree::reduceScatter(comm, inputs.inputs(), out.data, inputs.counts.data(), out.type, o);
      },
      output, inputList, options);
}

std::shared_ptr<Work> CpuBackend::reduceScatterSingleCoalesced(const std::vector<BufferView>& outputs,
                                                               const std::vector<BufferView>& inputs,
                                                               const ReduceScatterOptions& options,
                                                               const Submission& submission) {
  return run(
      "reduce_scatter_single_coalesced", submission,
      [](Communicator& comm, const std::vector<BufferView>& outs, const std::vector<BufferView>& ins,
         const ReduceScatterOptions& o) {
        if (outs.empty()) return;
        const Arrays outputArrays(outs);
        const Arrays inputArrays(ins);
        ringtree::reduceScatterCoalesced(comm, inputArrays.inputs(), outputArrays.outputs(),
                                         outputArrays.counts.data(), outs.size(), outs[0].type, o);
      },
      outputs, inputs, options);
}

std::shared_ptr<Work> CpuBackend::alltoall(const std::vector<BufferView>& outputTensorList,
                                           const std::vector<BufferView>& inputTensorList,
                                           const AlltoallOptions& options, const Submission& submission) {
  return run(
      "all_to_all", submission,
      [](Communicator& comm, const std::vector<BufferView>& outs, const std::vector<BufferView>& ins,
         const AlltoallOptions& o) {
        const Arrays outputs(outs);
        const Arrays inputs(ins);
        const DataType type = outs.empty() ? DataType::kFloat32 : outs[0].type;
        ringtree::alltoall(comm, inputs.inputs(), inputs.counts.data(), outputs.outputs(), outputs.counts.data(),
                           type, o);
      },
      outputTensorList, inputTensorList, options);
}

std::shared_ptr<Work> CpuBackend::barrier(const BarrierOptions& options, const Submission& submission) {
  return run(
      "barrier", submission, [](Communicator& comm, const BarrierOptions& o) { ringtree::barrier(comm, o); },
      options);
}

PointToPoint& CpuBackend::pointToPoint(const char* op) {
  if (!p2p_) {
    throw Error(std::string(op) + ": this ProcessGroup was made without point-to-point connections");
  }
  return *p2p_;
}

void CpuBackend::send(const BufferView& tensor, int dst, int tag) {
  pointToPoint("send").send(tensor.data, tensor.count, tensor.type, dst, tag);
}

int CpuBackend::recv(const BufferView& tensor, int src, int tag) {
  return pointToPoint("recv").recv(tensor.data, tensor.count, tensor.type, src, tag);
}

std::shared_ptr<Work> CpuBackend::isend(const BufferView& tensor, int dst, int tag, std::shared_ptr<void> keepAlive) {
  return pointToPoint("isend").isend(tensor.data, tensor.count, tensor.type, dst, tag, std::move(keepAlive));
}

std::shared_ptr<Work> CpuBackend::irecv(const BufferView& tensor, int src, int tag, std::shared_ptr<void> keepAlive) {
  return pointToPoint("irecv").irecv(tensor.data, tensor.count, tensor.type, src, tag, std::move(keepAlive));
}

void CpuBackend::shutdown() {
  queue_->shutdown();
  if (p2p_) p2p_->shutdown();
}

void CpuBackend::abort() {
  if (p2p_) p2p_->shutdown();
  queue_->abort(collectives_->rank(), [this] { collectives_->abort(); });
  collectives_->impl().releaseConnections();
}

}  // namespace ringtree::detail
