#include "backends/cpu_backend.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "common/inline_array.h"
#include "common/validation.h"
#include "communicator_impl.h"

namespace ringtree::detail {

namespace {

// The data pointers and element counts of `buffers`, as the collectives of
// <ringtree/collectives.h> take per-rank buffers (on the stack up to InlineArray's size).
struct Arrays {
  explicit Arrays(const std::vector<BufferView>& buffers) : data(buffers.size()), counts(buffers.size()) {
    for (size_t i = 0; i < buffers.size(); ++i) {
      data[i] = buffers[i].data;
      counts[i] = buffers[i].count;
    }
  }
  // Row-major concatenation of lists[0], lists[1], ... (allgatherCoalesced's outputs).
  explicit Arrays(const std::vector<std::vector<BufferView>>& lists) : data(total(lists)), counts(data.size()) {
    size_t i = 0;
    for (const std::vector<BufferView>& list : lists) {
      for (const BufferView& buffer : list) {
        data[i] = buffer.data;
        counts[i++] = buffer.count;
      }
    }
  }
  // `parts` consecutive parts of `whole` with counts[0 .. parts) elements: the ranks' parts
  // of a single-tensor call, set by the caller.
  explicit Arrays(size_t parts) : data(parts), counts(parts) {}
  void cut(const BufferView& whole) {
    auto* cursor = static_cast<std::byte*>(whole.data);
    for (size_t i = 0; i < data.size(); ++i) {
      data[i] = cursor;
      cursor += counts[i] * elementSize(whole.type);
    }
  }

  const void* const* inputs() const { return data.data(); }
  void* const* outputs() const { return data.data(); }

  InlineArray<void*> data;
  InlineArray<size_t> counts;

 private:
  static size_t total(const std::vector<std::vector<BufferView>>& lists) {
    size_t count = 0;
    for (const auto& list : lists) count += list.size();
    return count;
  }
};

// The bytes of the buffers among a call's arguments (options count nothing).
size_t bufferBytes(const BufferView& buffer) { return buffer.bytes(); }
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

// The synchronous single-tensor calls cut their tensors into the ranks' parts on the
// stack; DeviceBackend's general form (vectors of views, then arrays) stays for the
// asynchronous ones, whose operation outlives the call.
std::shared_ptr<Work> CpuBackend::allgatherSingle(const BufferView& outputTensor, const BufferView& inputTensor,
                                                  const AllgatherOptions& options, const Submission& submission) {
  if (submission.async) return DeviceBackend::allgatherSingle(outputTensor, inputTensor, options, submission);
  Arrays outputs(static_cast<size_t>(size()));
  std::fill(outputs.counts.data(), outputs.counts.data() + size(), inputTensor.count);
  outputs.cut(outputTensor);
  auto operation = [&] {
    ringtree::allgather(*collectives_, inputTensor.data, outputs.outputs(), outputs.counts.data(), inputTensor.type,
                        options);
  };
  queue_->runSync("all_gather", operation);
  return nullptr;
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

std::shared_ptr<Work> CpuBackend::reduceScatterSingle(const BufferView& output, const BufferView& input,
                                                      const ReduceScatterOptions& options,
                                                      const Submission& submission) {
  if (submission.async) return DeviceBackend::reduceScatterSingle(output, input, options, submission);
  Arrays inputs(static_cast<size_t>(size()));
  std::fill(inputs.counts.data(), inputs.counts.data() + size(), output.count);
  inputs.cut(input);
  auto operation = [&] {
    ringtree::reduceScatter(*collectives_, inputs.inputs(), output.data, inputs.counts.data(), output.type, options);
  };
  queue_->runSync("reduce_scatter", operation);
  return nullptr;
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

std::shared_ptr<Work> CpuBackend::alltoallSingle(const BufferView& output, const BufferView& input,
                                                 const std::vector<int64_t>& outputSplitSizes,
                                                 const std::vector<int64_t>& inputSplitSizes,
                                                 const AlltoallOptions& options, const Submission& submission) {
  if (submission.async) {
    return DeviceBackend::alltoallSingle(output, input, outputSplitSizes, inputSplitSizes, options, submission);
  }
  const char* op = "all_to_all_single";
  Arrays outputs(static_cast<size_t>(size()));
  Arrays inputs(static_cast<size_t>(size()));
  validation::splitCountsInto(op, output, outputSplitSizes, size(), "output", outputs.counts.data());
  validation::splitCountsInto(op, input, inputSplitSizes, size(), "input", inputs.counts.data());
  outputs.cut(output);
  inputs.cut(input);
  auto operation = [&] {
    ringtree::alltoall(*collectives_, inputs.inputs(), inputs.counts.data(), outputs.outputs(), outputs.counts.data(),
                       output.type, options);
  };
  queue_->runSync("all_to_all", operation);
  return nullptr;
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
