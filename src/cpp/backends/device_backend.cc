#include <ringtree/device_backend.h>

#include <array>
#include <cstddef>
#include <mutex>
#include <string>

#include <ringtree/error.h>

#include "backends/cuda/backend_choice.h"
#include "backends/device_registry.h"
#include "common/validation.h"

namespace ringtree {

namespace {

// `parts` consecutive views of `partCount` elements each, from the start of `whole`.
std::vector<BufferView> partsOf(const BufferView& whole, size_t partCount, int parts) {
  std::vector<BufferView> views;
  views.reserve(static_cast<size_t>(parts));
  const size_t partBytes = partCount * elementSize(whole.type);
  for (int r = 0; r < parts; ++r) {
    views.emplace_back(static_cast<std::byte*>(whole.data) + static_cast<size_t>(r) * partBytes, partCount,
                       whole.type, whole.device);
  }
  return views;
}

// Views of counts[r] elements each, laid end to end from the start of `whole`.
std::vector<BufferView> partsOf(const BufferView& whole, const std::vector<size_t>& counts) {
  std::vector<BufferView> views;
  views.reserve(counts.size());
  const size_t elementBytes = elementSize(whole.type);
  auto* cursor = static_cast<std::byte*>(whole.data);
  for (size_t count : counts) {
    views.emplace_back(cursor, count, whole.type, whole.device);
    cursor += count * elementBytes;
  }
  return views;
}

std::mutex registryMutex;
static_assert(static_cast<int>(DeviceType::kCuda) == 1, "the registry below lists device types in order");
// CUDA buffers go to NCCL with ringtree's CUDA library until someone registers otherwise;
// the factory loads both on first use.
std::array<detail::DeviceBackendRegistration, kNumDeviceTypes> registry{
    detail::DeviceBackendRegistration{},
    detail::DeviceBackendRegistration{"cuda", &cuda::makeDefaultCudaBackend}};

// The calling thread's current stream of each device index (null: the default stream).
thread_local std::vector<void*> currentStreams;

}  // namespace

DeviceBackend::~DeviceBackend() = default;

std::shared_ptr<Work> DeviceBackend::allgatherSingle(const BufferView& outputTensor, const BufferView& inputTensor,
                                                     const AllgatherOptions& options, const Submission& submission) {
  return allgather(partsOf(outputTensor, inputTensor.count, size()), inputTensor, options, submission);
}

std::shared_ptr<Work> DeviceBackend::allgatherSingleCoalesced(const std::vector<BufferView>& outputTensors,
                                                              const std::vector<BufferView>& inputTensors,
                                                              const AllgatherOptions& options,
                                                              const Submission& submission) {
  // outputLists[r][i] <- rank r's inputTensors[i]: part r of outputTensors[i].
  std::vector<std::vector<BufferView>> outputLists(static_cast<size_t>(size()));
  for (size_t i = 0; i < inputTensors.size(); ++i) {
    const std::vector<BufferView> parts = partsOf(outputTensors[i], inputTensors[i].count, size());
    for (size_t r = 0; r < parts.size(); ++r) outputLists[r].push_back(parts[r]);
  }
  return allgatherCoalesced(outputLists, inputTensors, options, submission);
}

std::shared_ptr<Work> DeviceBackend::reduceScatterSingle(const BufferView& output, const BufferView& input,
                                                         const ReduceScatterOptions& options,
                                                         const Submission& submission) {
  return reduceScatter(output, partsOf(input, output.count, size()), options, submission);
}

std::shared_ptr<Work> DeviceBackend::alltoallSingle(const BufferView& output, const BufferView& input,
                                                    const std::vector<int64_t>& outputSplitSizes,
                                                    const std::vector<int64_t>& inputSplitSizes,
                                                    const AlltoallOptions& options, const Submission& submission) {
  const char* op = "all_to_all_single";
  return alltoall(partsOf(output, validation::splitCounts(op, output, outputSplitSizes, size(), "output")),
                  partsOf(input, validation::splitCounts(op, input, inputSplitSizes, size(), "input")), options,
                  submission);
}

std::vector<std::shared_ptr<Work>> DeviceBackend::batchIsendIrecv(const std::vector<PointToPointOp>& ops,
                                                                   std::shared_ptr<void> keepAlive) {
  std::vector<std::shared_ptr<Work>> works;
  works.reserve(ops.size());
  for (const PointToPointOp& op : ops) {
    works.push_back(op.send ? isend(op.tensor, op.peer, op.tag, keepAlive) : irecv(op.tensor, op.peer, op.tag, keepAlive));
  }
  return works;
}

void registerDeviceBackend(DeviceType type, const char* name, DeviceBackendFactory factory) {
  if (type == DeviceType::kCpu || static_cast<int>(type) >= kNumDeviceTypes) {
    throw InvalidArgument(std::string("registerDeviceBackend: cannot register a backend for device type ") +
                          (type == DeviceType::kCpu ? "cpu, whose engine is built in"
                                                    : std::to_string(static_cast<int>(type))));
  }
  std::lock_guard<std::mutex> lock(registryMutex);
  registry[static_cast<size_t>(type)] = factory != nullptr ? detail::DeviceBackendRegistration{name, factory}
                                                           : detail::DeviceBackendRegistration{};
}

bool hasDeviceBackend(DeviceType type) {
  return type == DeviceType::kCpu || detail::registeredDeviceBackend(type).factory != nullptr;
}

void setCurrentStream(const Device& device, void* stream) {
  if (device.type == DeviceType::kCpu || device.index < 0) return;
  const auto index = static_cast<size_t>(device.index);
  if (index >= currentStreams.size()) {
    if (stream == nullptr) return;
    currentStreams.resize(index + 1, nullptr);
  }
  currentStreams[index] = stream;
}

void* currentStream(const Device& device) {
  if (device.type == DeviceType::kCpu || device.index < 0) return nullptr;
  const auto index = static_cast<size_t>(device.index);
  return index < currentStreams.size() ? currentStreams[index] : nullptr;
}

namespace detail {

DeviceBackendRegistration registeredDeviceBackend(DeviceType type) {
  if (static_cast<int>(type) >= kNumDeviceTypes) return {};
  std::lock_guard<std::mutex> lock(registryMutex);
  return registry[static_cast<size_t>(type)];
}

}  // namespace detail

}  // namespace ringtree
