#include <ringtree/process_group.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <ringtree/error.h>
#include <ringtree/store/prefix_store.h>

#include "backends/cpu_backend.h"
#include "backends/device_registry.h"
#include "common/validation.h"

namespace ringtree {

namespace {

std::vector<int> allRanks(int size) {
  std::vector<int> ranks(static_cast<size_t>(std::max(size, 0)));
  for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
  return ranks;
}

// The point-to-point communicator of a group: a channel of its own over base's connections.
std::shared_ptr<Communicator> pointToPointOver(const Communicator& base, const std::vector<int>& ranks,
                                               const std::string& name, CommunicatorOptions options) {
  options.pointToPointOnly = true;
  return Communicator::createOver(base, ranks, name, options);
}

}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::create(std::shared_ptr<Store> store, int rank, int size,
                                                   const CommunicatorOptions& options) {
  if (!store) {
    throw InvalidArgument("ProcessGroup::create needs a store, got null");
  }
  auto collectives = Communicator::create(std::make_shared<PrefixStore>("comm", store), rank, size, options);
  return std::make_shared<ProcessGroup>(collectives, pointToPointOver(*collectives, allRanks(size), "p2p", options),
                                        std::move(store));
}

std::shared_ptr<ProcessGroup> ProcessGroup::createOver(const ProcessGroup& parent, const std::vector<int>& ranks,
                                                       const std::string& name, std::shared_ptr<Store> store,
                                                       const CommunicatorOptions& options) {
  if (!store) {
    throw InvalidArgument("ProcessGroup::createOver needs a store, got null");
  }
  Communicator& base = parent.cpu_->communicator();
  auto collectives = Communicator::createOver(base, ranks, "group " + name,
                                              options, std::make_shared<PrefixStore>("comm", store));
  return std::make_shared<ProcessGroup>(collectives, pointToPointOver(base, ranks, "group " + name + " p2p", options),
                                        std::move(store));
}

namespace {

std::shared_ptr<Communicator> nonNull(std::shared_ptr<Communicator> communicator) {
  if (!communicator) {
    throw InvalidArgument("ProcessGroup needs a communicator, got null");
  }
  return communicator;
}

}  // namespace

ProcessGroup::ProcessGroup(std::shared_ptr<Communicator> collectives, std::shared_ptr<Communicator> pointToPoint,
                           std::shared_ptr<Store> store)
    : store_(std::move(store)) {
  collectives = nonNull(std::move(collectives));
  rank_ = collectives->rank();
  size_ = collectives->size();
  if (pointToPoint && (pointToPoint->rank() != rank_ || pointToPoint->size() != size_)) {
    throw InvalidArgument("ProcessGroup: the point-to-point communicator is rank " +
                          std::to_string(pointToPoint->rank()) + " of " + std::to_string(pointToPoint->size()) +
                          " but the collective one is rank " + std::to_string(rank_) + " of " + std::to_string(size_));
  }
  cpu_ = std::make_unique<detail::CpuBackend>(std::move(collectives), std::move(pointToPoint));
}

ProcessGroup::~ProcessGroup() { shutdown(); }

Communicator& ProcessGroup::communicator() { return cpu_->communicator(); }

uint64_t ProcessGroup::inlineCallCount() const { return cpu_->inlineCallCount(); }

DeviceBackend& ProcessGroup::backendFor(const char* what, const Device& device) {
  if (device.type == DeviceType::kCpu) return *cpu_;
  return makeDeviceBackend(what, device);
}

DeviceBackend& ProcessGroup::makeDeviceBackend(const char* what, const Device& device) {
  const auto index = static_cast<size_t>(device.type);
  std::lock_guard<std::mutex> lock(mutex_);
  if (index < devices_.size() && devices_[index]) return *devices_[index];
  if (shutdown_) {
    throw Error(std::string(what) + " on a ProcessGroup that has been shut down");
  }
  const detail::DeviceBackendRegistration registration = detail::registeredDeviceBackend(device.type);
  if (registration.factory == nullptr) {
    throw InvalidArgument(std::string(what) + ": the buffers are on " + deviceName(device) + ", and no backend for " +
                          deviceTypeName(device.type) + " buffers is available in this process (ringtree's " +
                          deviceTypeName(device.type) + " library is not loaded)");
  }
  if (!store_) {
    throw InvalidArgument(std::string(what) + ": the buffers are on " + deviceName(device) + ", but this ProcessGroup "
                          "was made without a store, which its " + registration.name + " backend needs to set up");
  }
  DeviceBackendContext context;
  context.store = std::make_shared<PrefixStore>(std::string("device/") + deviceTypeName(device.type), store_);
  context.rank = rank_;
  context.size = size_;
  context.timeout = cpu_->communicator().timeout();
  context.device = device;
  context.host = cpu_.get();
  std::unique_ptr<DeviceBackend> backend = registration.factory(context);
  if (!backend || backend->deviceType() != device.type || backend->rank() != rank_ || backend->size() != size_) {
    throw Error(std::string(what) + ": the " + registration.name + " backend factory made no backend for " +
                deviceTypeName(device.type) + " buffers of rank " + std::to_string(rank_) + " of " +
                std::to_string(size_));
  }
  devices_[index] = std::move(backend);
  return *devices_[index];
}

void ProcessGroup::allreduce(const BufferView& tensor, const AllreduceOptions& options) {
  const Device device = validation::checkAllreduce({rank_, size_}, tensor, options);
  backendFor("all_reduce", device).allreduce(tensor, options, {});
}

std::shared_ptr<Work> ProcessGroup::allreduceAsync(const BufferView& tensor, const AllreduceOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkAllreduce({rank_, size_}, tensor, options);
  return backendFor("all_reduce", device).allreduce(tensor, options, {true, std::move(keepAlive)});
}

void ProcessGroup::allreduceCoalesced(const std::vector<BufferView>& tensors, const AllreduceOptions& options) {
  const Device device = validation::checkAllreduceCoalesced({rank_, size_}, tensors, options);
  backendFor("all_reduce_coalesced", device).allreduceCoalesced(tensors, options, {});
}

std::shared_ptr<Work> ProcessGroup::allreduceCoalescedAsync(const std::vector<BufferView>& tensors, const AllreduceOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkAllreduceCoalesced({rank_, size_}, tensors, options);
  return backendFor("all_reduce_coalesced", device).allreduceCoalesced(tensors, options, {true, std::move(keepAlive)});
}

void ProcessGroup::broadcast(const BufferView& tensor, const BroadcastOptions& options) {
  const Device device = validation::checkBroadcast({rank_, size_}, tensor, options);
  backendFor("broadcast", device).broadcast(tensor, options, {});
}

std::shared_ptr<Work> ProcessGroup::broadcastAsync(const BufferView& tensor, const BroadcastOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkBroadcast({rank_, size_}, tensor, options);
  return backendFor("broadcast", device).broadcast(tensor, options, {true, std::move(keepAlive)});
}

void ProcessGroup::reduce(const BufferView& tensor, const ReduceOptions& options) {
  const Device device = validation::checkReduce({rank_, size_}, tensor, options);
  backendFor("reduce", device).reduce(tensor, options, {});
}

std::shared_ptr<Work> ProcessGroup::reduceAsync(const BufferView& tensor, const ReduceOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkReduce({rank_, size_}, tensor, options);
  return backendFor("reduce", device).reduce(tensor, options, {true, std::move(keepAlive)});
}

void ProcessGroup::allgather(const std::vector<BufferView>& tensorList, const BufferView& tensor, const AllgatherOptions& options) {
  const Device device = validation::checkAllgather({rank_, size_}, tensorList, tensor, options);
  backendFor("all_gather", device).allgather(tensorList, tensor, options, {});
}

std::shared_ptr<Work> ProcessGroup::allgatherAsync(const std::vector<BufferView>& tensorList, const BufferView& tensor, const AllgatherOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkAllgather({rank_, size_}, tensorList, tensor, options);
  return backendFor("all_gather", device).allgather(tensorList, tensor, options, {true, std::move(keepAlive)});
}

void ProcessGroup::allgatherSingle(const BufferView& outputTensor, const BufferView& inputTensor, const AllgatherOptions& options) {
  const Device device = validation::checkAllgatherSingle({rank_, size_}, outputTensor, inputTensor, options);
  backendFor("all_gather_single", device).allgatherSingle(outputTensor, inputTensor, options, {});
}

std::shared_ptr<Work> ProcessGroup::allgatherSingleAsync(const BufferView& outputTensor, const BufferView& inputTensor, const AllgatherOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkAllgatherSingle({rank_, size_}, outputTensor, inputTensor, options);
  return backendFor("all_gather_single", device).allgatherSingle(outputTensor, inputTensor, options, {true, std::move(keepAlive)});
}

void ProcessGroup::allgatherCoalesced(const std::vector<std::vector<BufferView>>& outputTensorLists, const std::vector<BufferView>& inputTensorList, const AllgatherOptions& options) {
  const Device device = validation::checkAllgatherCoalesced({rank_, size_}, outputTensorLists, inputTensorList, options);
  backendFor("all_gather_coalesced", device).allgatherCoalesced(outputTensorLists, inputTensorList, options, {});
}

std::shared_ptr<Work> ProcessGroup::allgatherCoalescedAsync(const std::vector<std::vector<BufferView>>& outputTensorLists, const std::vector<BufferView>& inputTensorList, const AllgatherOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkAllgatherCoalesced({rank_, size_}, outputTensorLists, inputTensorList, options);
  return backendFor("all_gather_coalesced", device).allgatherCoalesced(outputTensorLists, inputTensorList, options, {true, std::move(keepAlive)});
}

void ProcessGroup::allgatherSingleCoalesced(const std::vector<BufferView>& outputTensors, const std::vector<BufferView>& inputTensors, const AllgatherOptions& options) {
  const Device device = validation::checkAllgatherSingleCoalesced({rank_, size_}, outputTensors, inputTensors, options);
  backendFor("all_gather_single_coalesced", device).allgatherSingleCoalesced(outputTensors, inputTensors, options, {});
}

std::shared_ptr<Work> ProcessGroup::allgatherSingleCoalescedAsync(const std::vector<BufferView>& outputTensors, const std::vector<BufferView>& inputTensors, const AllgatherOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkAllgatherSingleCoalesced({rank_, size_}, outputTensors, inputTensors, options);
  return backendFor("all_gather_single_coalesced", device).allgatherSingleCoalesced(outputTensors, inputTensors, options, {true, std::move(keepAlive)});
}

void ProcessGroup::gather(const BufferView& tensor, const std::vector<BufferView>& gatherList, const GatherOptions& options) {
  const Device device = validation::checkGather({rank_, size_}, tensor, gatherList, options);
  backendFor("gather", device).gather(tensor, gatherList, options, {});
}

std::shared_ptr<Work> ProcessGroup::gatherAsync(const BufferView& tensor, const std::vector<BufferView>& gatherList, const GatherOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkGather({rank_, size_}, tensor, gatherList, options);
  return backendFor("gather", device).gather(tensor, gatherList, options, {true, std::move(keepAlive)});
}

void ProcessGroup::scatter(const BufferView& tensor, const std::vector<BufferView>& scatterList, const ScatterOptions& options) {
  const Device device = validation::checkScatter({rank_, size_}, tensor, scatterList, options);
  backendFor("scatter", device).scatter(tensor, scatterList, options, {});
}

std::shared_ptr<Work> ProcessGroup::scatterAsync(const BufferView& tensor, const std::vector<BufferView>& scatterList, const ScatterOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkScatter({rank_, size_}, tensor, scatterList, options);
  return backendFor("scatter", device).scatter(tensor, scatterList, options, {true, std::move(keepAlive)});
}

void ProcessGroup::reduceScatter(const BufferView& output, const std::vector<BufferView>& inputList, const ReduceScatterOptions& options) {
  const Device device = validation::checkReduceScatter({rank_, size_}, output, inputList, options);
  backendFor("reduce_scatter", device).reduceScatter(output, inputList, options, {});
}

std::shared_ptr<Work> ProcessGroup::reduceScatterAsync(const BufferView& output, const std::vector<BufferView>& inputList, const ReduceScatterOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkReduceScatter({rank_, size_}, output, inputList, options);
  return backendFor("reduce_scatter", device).reduceScatter(output, inputList, options, {true, std::move(keepAlive)});
}

void ProcessGroup::reduceScatterSingle(const BufferView& output, const BufferView& input, const ReduceScatterOptions& options) {
  const Device device = validation::checkReduceScatterSingle({rank_, size_}, output, input, options);
  backendFor("reduce_scatter_single", device).reduceScatterSingle(output, input, options, {});
}

std::shared_ptr<Work> ProcessGroup::reduceScatterSingleAsync(const BufferView& output, const BufferView& input, const ReduceScatterOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkReduceScatterSingle({rank_, size_}, output, input, options);
  return backendFor("reduce_scatter_single", device).reduceScatterSingle(output, input, options, {true, std::move(keepAlive)});
}

void ProcessGroup::reduceScatterSingleCoalesced(const std::vector<BufferView>& outputs, const std::vector<BufferView>& inputs, const ReduceScatterOptions& options) {
  const Device device = validation::checkReduceScatterSingleCoalesced({rank_, size_}, outputs, inputs, options);
  backendFor("reduce_scatter_single_coalesced", device).reduceScatterSingleCoalesced(outputs, inputs, options, {});
}

std::shared_ptr<Work> ProcessGroup::reduceScatterSingleCoalescedAsync(const std::vector<BufferView>& outputs, const std::vector<BufferView>& inputs, const ReduceScatterOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkReduceScatterSingleCoalesced({rank_, size_}, outputs, inputs, options);
  return backendFor("reduce_scatter_single_coalesced", device).reduceScatterSingleCoalesced(outputs, inputs, options, {true, std::move(keepAlive)});
}

void ProcessGroup::alltoall(const std::vector<BufferView>& outputTensorList, const std::vector<BufferView>& inputTensorList, const AlltoallOptions& options) {
  const Device device = validation::checkAlltoall({rank_, size_}, outputTensorList, inputTensorList, options);
  backendFor("all_to_all", device).alltoall(outputTensorList, inputTensorList, options, {});
}

std::shared_ptr<Work> ProcessGroup::alltoallAsync(const std::vector<BufferView>& outputTensorList, const std::vector<BufferView>& inputTensorList, const AlltoallOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkAlltoall({rank_, size_}, outputTensorList, inputTensorList, options);
  return backendFor("all_to_all", device).alltoall(outputTensorList, inputTensorList, options, {true, std::move(keepAlive)});
}

void ProcessGroup::alltoallSingle(const BufferView& output, const BufferView& input, const std::vector<int64_t>& outputSplitSizes, const std::vector<int64_t>& inputSplitSizes, const AlltoallOptions& options) {
  const Device device = validation::checkAlltoallSingle({rank_, size_}, output, input, outputSplitSizes, inputSplitSizes, options);
  backendFor("all_to_all_single", device).alltoallSingle(output, input, outputSplitSizes, inputSplitSizes, options, {});
}

std::shared_ptr<Work> ProcessGroup::alltoallSingleAsync(const BufferView& output, const BufferView& input, const std::vector<int64_t>& outputSplitSizes, const std::vector<int64_t>& inputSplitSizes, const AlltoallOptions& options, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkAlltoallSingle({rank_, size_}, output, input, outputSplitSizes, inputSplitSizes, options);
  return backendFor("all_to_all_single", device).alltoallSingle(output, input, outputSplitSizes, inputSplitSizes, options, {true, std::move(keepAlive)});
}

void ProcessGroup::barrier(const BarrierOptions& options) {
  validation::checkBarrier(options);
  cpu_->barrier(options, {});
}

std::shared_ptr<Work> ProcessGroup::barrierAsync(const BarrierOptions& options) {
  validation::checkBarrier(options);
  return cpu_->barrier(options, {true, nullptr});
}

void ProcessGroup::send(const BufferView& tensor, int dst, int tag) {
  const Device device = validation::checkSend({rank_, size_}, "send", tensor, dst, tag);
  backendFor("send", device).send(tensor, dst, tag);
}

int ProcessGroup::recv(const BufferView& tensor, int src, int tag) {
  const Device device = validation::checkRecv({rank_, size_}, "recv", tensor, src, tag);
  return backendFor("recv", device).recv(tensor, src, tag);
}

std::shared_ptr<Work> ProcessGroup::isend(const BufferView& tensor, int dst, int tag, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkSend({rank_, size_}, "isend", tensor, dst, tag);
  return backendFor("isend", device).isend(tensor, dst, tag, std::move(keepAlive));
}

std::shared_ptr<Work> ProcessGroup::irecv(const BufferView& tensor, int src, int tag, std::shared_ptr<void> keepAlive) {
  const Device device = validation::checkRecv({rank_, size_}, "irecv", tensor, src, tag);
  return backendFor("irecv", device).irecv(tensor, src, tag, std::move(keepAlive));
}

std::vector<std::shared_ptr<Work>> ProcessGroup::batchIsendIrecv(const std::vector<PointToPointOp>& ops,
                                                                  std::shared_ptr<void> keepAlive) {
  const char* what = "batch_isend_irecv";
  if (ops.empty()) throw InvalidArgument("batch_isend_irecv needs at least one operation, got none");
  Device device{};
  for (size_t i = 0; i < ops.size(); ++i) {
    const PointToPointOp& op = ops[i];
    if (!op.send && op.peer == kAnySource) {
      throw InvalidArgument("batch_isend_irecv: op " + std::to_string(i) + " receives from any source, which a "
                            "batch cannot (name the source rank)");
    }
    const Device opDevice = op.send ? validation::checkSend({rank_, size_}, what, op.tensor, op.peer, op.tag)
                                    : validation::checkRecv({rank_, size_}, what, op.tensor, op.peer, op.tag);
    if (i == 0) {
      device = opDevice;
    } else if (opDevice != device) {
      throw InvalidArgument("batch_isend_irecv: operations on different devices: op 0 is on " + deviceName(device) +
                            " but op " + std::to_string(i) + " is on " + deviceName(opDevice));
    }
  }
  return backendFor(what, device).batchIsendIrecv(ops, std::move(keepAlive));
}

void ProcessGroup::shutdown() {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    first = !shutdown_;
    shutdown_ = true;
  }
  cpu_->shutdown();  // idempotent, and it must run here from a Work callback on the worker
  if (!first) return;
  for (auto& backend : devices_) {
    if (backend) backend->shutdown();
  }
}

bool ProcessGroup::isShutdown() const { return cpu_->isShutdown(); }

void ProcessGroup::abort() {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    first = !aborted_;
    shutdown_ = true;
    aborted_ = true;
  }
  cpu_->abort();
  if (!first) return;
  for (auto& backend : devices_) {
    if (backend) backend->abort();
  }
}

}  // namespace ringtree
