#include "backends/cuda/staged_backend.h"

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ringtree/error.h>

#include "backends/cuda/device_guard.h"

namespace ringtree::cuda {

namespace {

// One device buffer's host copy.
struct HostCopy {
  std::vector<std::byte> bytes;
  BufferView view;    // over `bytes`, the device buffer's count, type and rows
  BufferView device;  // the device buffer
};

class StagedBackend final : public DeviceBackend {
 public:
  StagedBackend(const DeviceBackendContext& context, const RingtreeGpuApi& gpu)
      : DeviceBackend(context.rank, context.size), gpu_(gpu), device_(context.device), host_(*context.host) {}

  DeviceType deviceType() const override { return DeviceType::kCuda; }
  const char* name() const override { return "staged"; }

  std::shared_ptr<Work> allreduce(const BufferView& tensor, const AllreduceOptions& options,
                                  const Submission& submission) override {
    return run("all_reduce", submission, [&] {
      Call call(*this, "all_reduce");
      HostCopy copy = call.in(tensor);
      host_.allreduce(copy.view, options, {});
      call.out(copy);
    });
  }

  std::shared_ptr<Work> allreduceCoalesced(const std::vector<BufferView>& tensors, const AllreduceOptions& options,
                                           const Submission& submission) override {
    return run("all_reduce_coalesced", submission, [&] {
      Call call(*this, "all_reduce_coalesced");
      std::vector<HostCopy> copies = call.in(tensors);
      host_.allreduceCoalesced(views(copies), options, {});
      call.out(copies);
    });
  }

  std::shared_ptr<Work> broadcast(const BufferView& tensor, const BroadcastOptions& options,
                                  const Submission& submission) override {
    return run("broadcast", submission, [&] {
      Call call(*this, "broadcast");
      const bool root = rank() == options.root;
      HostCopy copy = root ? call.in(tensor) : call.space(tensor);
      host_.broadcast(copy.view, options, {});
      if (!root) call.out(copy);
    });
  }

  std::shared_ptr<Work> reduce(const BufferView& tensor, const ReduceOptions& options,
                               const Submission& submission) override {
    return run("reduce", submission, [&] {
      Call call(*this, "reduce");
      HostCopy copy = call.in(tensor);
      host_.reduce(copy.view, options, {});
      if (rank() == options.root) call.out(copy);
    });
  }

  std::shared_ptr<Work> allgather(const std::vector<BufferView>& tensorList, const BufferView& tensor,
                                  const AllgatherOptions& options, const Submission& submission) override {
    return run("all_gather", submission, [&] {
      Call call(*this, "all_gather");
      HostCopy input = call.in(tensor);
      std::vector<HostCopy> outputs = call.space(tensorList);
      host_.allgather(views(outputs), input.view, options, {});
      call.out(outputs);
    });
  }

  std::shared_ptr<Work> allgatherSingle(const BufferView& outputTensor, const BufferView& inputTensor,
                                        const AllgatherOptions& options, const Submission& submission) override {
    return run("all_gather_single", submission, [&] {
      Call call(*this, "all_gather_single");
      HostCopy input = call.in(inputTensor);
      HostCopy output = call.space(outputTensor);
      host_.allgatherSingle(output.view, input.view, options, {});
      call.out(output);
    });
  }

  std::shared_ptr<Work> allgatherCoalesced(const std::vector<std::vector<BufferView>>& outputTensorLists,
                                           const std::vector<BufferView>& inputTensorList,
                                           const AllgatherOptions& options, const Submission& submission) override {
    return run("all_gather_coalesced", submission, [&] {
      Call call(*this, "all_gather_coalesced");
      std::vector<HostCopy> inputs = call.in(inputTensorList);
      std::vector<std::vector<HostCopy>> outputs;
      std::vector<std::vector<BufferView>> outputViews;
      for (const std::vector<BufferView>& list : outputTensorLists) {
        outputs.push_back(call.space(list));
        outputViews.push_back(views(outputs.back()));
      }
      host_.allgatherCoalesced(outputViews, views(inputs), options, {});
      for (std::vector<HostCopy>& list : outputs) call.out(list);
    });
  }

  std::shared_ptr<Work> gather(const BufferView& tensor, const std::vector<BufferView>& gatherList,
                               const GatherOptions& options, const Submission& submission) override {
    return run("gather", submission, [&] {
      Call call(*this, "gather");
      HostCopy input = call.in(tensor);
      std::vector<HostCopy> outputs = call.space(gatherList);  // empty but on the root
      host_.gather(input.view, views(outputs), options, {});
      call.out(outputs);
    });
  }

  std::shared_ptr<Work> scatter(const BufferView& tensor, const std::vector<BufferView>& scatterList,
                                const ScatterOptions& options, const Submission& submission) override {
    return run("scatter", submission, [&] {
      Call call(*this, "scatter");
      std::vector<HostCopy> inputs = call.in(scatterList);  // empty but on the root
      HostCopy output = call.space(tensor);
      host_.scatter(output.view, views(inputs), options, {});
      call.out(output);
    });
  }

  std::shared_ptr<Work> reduceScatter(const BufferView& output, const std::vector<BufferView>& inputList,
                                      const ReduceScatterOptions& options, const Submission& submission) override {
    return run("reduce_scatter", submission, [&] {
      Call call(*this, "reduce_scatter");
      std::vector<HostCopy> inputs = call.in(inputList);
      HostCopy result = call.space(output);
      host_.reduceScatter(result.view, views(inputs), options, {});
      call.out(result);
    });
  }

  std::shared_ptr<Work> reduceScatterSingle(const BufferView& output, const BufferView& input,
                                            const ReduceScatterOptions& options,
                                            const Submission& submission) override {
    return run("reduce_scatter_single", submission, [&] {
      Call call(*this, "reduce_scatter_single");
      HostCopy whole = call.in(input);
      HostCopy result = call.space(output);
      host_.reduceScatterSingle(result.view, whole.view, options, {});
      call.out(result);
    });
  }

  std::shared_ptr<Work> reduceScatterSingleCoalesced(const std::vector<BufferView>& outputs,
                                                     const std::vector<BufferView>& inputs,
                                                     const ReduceScatterOptions& options,
                                                     const Submission& submission) override {
    return run("reduce_scatter_single_coalesced", submission, [&] {
      Call call(*this, "reduce_scatter_single_coalesced");
      std::vector<HostCopy> wholes = call.in(inputs);
      std::vector<HostCopy> results = call.space(outputs);
      host_.reduceScatterSingleCoalesced(views(results), views(wholes), options, {});
      call.out(results);
    });
  }

  std::shared_ptr<Work> alltoall(const std::vector<BufferView>& outputTensorList,
                                 const std::vector<BufferView>& inputTensorList, const AlltoallOptions& options,
                                 const Submission& submission) override {
    return run("all_to_all", submission, [&] {
      Call call(*this, "all_to_all");
      std::vector<HostCopy> inputs = call.in(inputTensorList);
      std::vector<HostCopy> outputs = call.space(outputTensorList);
      host_.alltoall(views(outputs), views(inputs), options, {});
      call.out(outputs);
    });
  }

  std::shared_ptr<Work> barrier(const BarrierOptions& options, const Submission& submission) override {
    return run("barrier", submission, [&] {
      Call call(*this, "barrier");
      host_.barrier(options, {});
    });
  }

  void send(const BufferView& tensor, int dst, int tag) override {
    Call call(*this, "send");
    HostCopy copy = call.in(tensor);
    host_.send(copy.view, dst, tag);
  }

  int recv(const BufferView& tensor, int src, int tag) override {
    Call call(*this, "recv");
    HostCopy copy = call.space(tensor);
    const int source = host_.recv(copy.view, src, tag);
    call.out(copy);
    return source;
  }

  // Posted on the CPU engine and returned at once (a receive posted after a send to the
  // same peer cannot wait for it): the host copy is the engine's keep-alive.
  std::shared_ptr<Work> isend(const BufferView& tensor, int dst, int tag, std::shared_ptr<void> keepAlive) override {
    Call call(*this, "send");
    auto copy = std::make_shared<HostCopy>(call.in(tensor));
    const BufferView view = copy->view;
    return host_.isend(view, dst, tag, std::make_shared<KeptAlive>(KeptAlive{copy, std::move(keepAlive)}));
  }

  // The Work completes once the message is back in device memory: the CPU engine's
  // receive, then a copy on the legacy default stream, waited for, on the thread that
  // completed the receive.
  std::shared_ptr<Work> irecv(const BufferView& tensor, int src, int tag, std::shared_ptr<void> keepAlive) override {
    Call call(*this, "recv");
    auto copy = std::make_shared<HostCopy>(call.space(tensor));
    auto work = std::make_shared<Work>("recv", std::move(keepAlive));
    const BufferView view = copy->view;
    const std::shared_ptr<Work> posted = host_.irecv(view, src, tag, copy);
    const RingtreeGpuApi* gpu = &gpu_;
    const int device = device_.index;
    const std::string where = "rank " + std::to_string(rank()) + " of " + std::to_string(size()) + ", recv on " +
                              deviceName(device_) + " (staged through host memory)";
    posted->addCallback([work, copy, gpu, device, where](Work& received) {
      if (!received.isSuccess()) {
        work->finish(received.exception());
        return;
      }
      int result = 0;
      {
        DeviceGuard guard(*gpu, device);
        if (!copy->bytes.empty()) {
          result = gpu->memcpyAsync(copy->device.data, copy->bytes.data(), copy->bytes.size(), nullptr);
        }
        if (result == 0) result = gpu->streamSynchronize(nullptr);
      }
      if (result != 0) {
        work->finish(std::make_exception_ptr(
            Error(where + ": CUDA failed copying back to device memory: " + gpu->errorString(result))));
        return;
      }
      work->setSourceRank(received.sourceRank());
      work->finish();
    });
    return work;
  }

  // Nothing of its own to end: the CPU engine belongs to the group.
  void shutdown() override {}
  void abort() override {}

 private:
  // One operation: the device set for its duration, the caller's stream waited for first,
  // and the copies in and out on that stream.
  class Call {
   public:
    Call(StagedBackend& backend, const char* opName)
        : backend_(backend),
          opName_(opName),
          stream_(currentStream(backend.device_)),
          guard_(backend.gpu_, backend.device_.index) {
      check("setting the device", guard_.result());
      check("waiting for the caller's stream", backend_.gpu_.streamSynchronize(stream_));
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

    // Host memory for `device`, uninitialised. Refuses a buffer on another GPU than the
    // group's (its producer's stream would not be the one waited for).
    HostCopy space(const BufferView& device) {
      if (device.device.index != backend_.device_.index) {
        throw InvalidArgument("rank " + std::to_string(backend_.rank()) + " of " + std::to_string(backend_.size()) +
                              ", " + opName_ + ": the buffers are on " + deviceName(device.device) +
                              ", but this group's CUDA buffers are on " + deviceName(backend_.device_) +
                              " (one device per group and rank)");
      }
      HostCopy copy;
      copy.bytes.resize(device.bytes());
      copy.view = BufferView(copy.bytes.data(), device.count, device.type, Device{}, device.rows);
      copy.device = device;
      return copy;
    }
    std::vector<HostCopy> space(const std::vector<BufferView>& devices) {
      std::vector<HostCopy> copies;
      copies.reserve(devices.size());
      for (const BufferView& device : devices) copies.push_back(space(device));
      return copies;
    }
    // Host copies of `device`'s contents.
    HostCopy in(const BufferView& device) {
      HostCopy copy = space(device);
      copyAndWait("copying to host memory", copy.bytes.data(), device.data, copy.bytes.size());
      return copy;
    }
    std::vector<HostCopy> in(const std::vector<BufferView>& devices) {
      std::vector<HostCopy> copies;
      copies.reserve(devices.size());
      for (const BufferView& device : devices) copies.push_back(in(device));
      return copies;
    }
    // The host copy's contents back into its device buffer.
    void out(const HostCopy& copy) {
      copyAndWait("copying back to device memory", copy.device.data, copy.bytes.data(), copy.bytes.size());
    }
    void out(const std::vector<HostCopy>& copies) {
      for (const HostCopy& copy : copies) out(copy);
    }

   private:
    void copyAndWait(const char* what, void* destination, const void* source, size_t bytes) {
      if (bytes == 0) return;
      check(what, backend_.gpu_.memcpyAsync(destination, source, bytes, stream_));
      check(what, backend_.gpu_.streamSynchronize(stream_));
    }
    void check(const char* what, int result) {
      if (result != 0) {
        throw Error("rank " + std::to_string(backend_.rank()) + " of " + std::to_string(backend_.size()) + ", " +
                    opName_ + " on " + deviceName(backend_.device_) + " (staged through host memory): CUDA failed " +
                    what + ": " + backend_.gpu_.errorString(result));
      }
    }

    StagedBackend& backend_;
    const char* opName_;
    void* stream_;
    DeviceGuard guard_;
  };

  static std::vector<BufferView> views(const std::vector<HostCopy>& copies) {
    std::vector<BufferView> result;
    result.reserve(copies.size());
    for (const HostCopy& copy : copies) result.push_back(copy.view);
    return result;
  }

  // What an isend keeps alive: its host copy and the caller's keep-alive.
  struct KeptAlive {
    std::shared_ptr<HostCopy> copy;
    std::shared_ptr<void> caller;
  };

  // Runs `operation` now. Synchronous: its errors are thrown. Asynchronous: a completed
  // Work, holding its error if it failed (DeviceBackend's contract).
  template <typename Operation>
  static std::shared_ptr<Work> run(const char* opName, const Submission& submission, Operation&& operation) {
    if (!submission.async) {
      operation();
      return nullptr;
    }
    auto work = std::make_shared<Work>(opName, submission.keepAlive);
    std::exception_ptr error;
    try {
      operation();
    } catch (...) {
      error = std::current_exception();
    }
    work->finish(error);
    return work;
  }

  const RingtreeGpuApi& gpu_;
  const Device device_;
  DeviceBackend& host_;
};

}  // namespace

std::unique_ptr<DeviceBackend> makeStagedBackend(const DeviceBackendContext& context, const RingtreeGpuApi& gpu) {
  if (context.host == nullptr) {
    throw InvalidArgument("the staged CUDA backend needs the group's CPU engine (DeviceBackendContext::host)");
  }
  return std::make_unique<StagedBackend>(context, gpu);
}

}  // namespace ringtree::cuda
