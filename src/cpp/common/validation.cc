#include "common/validation.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include <ringtree/error.h>

#include "common/inline_array.h"

namespace ringtree::validation {

namespace {

bool isComplex(DataType type) { return type == DataType::kComplex64 || type == DataType::kComplex128; }

bool isBitwise(ReduceOp op) { return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor; }

// "name" or "name[index]" (index >= 0).
std::string argumentName(const char* name, int index) {
  return index < 0 ? std::string(name) : std::string(name) + "[" + std::to_string(index) + "]";
}

// Whether two byte ranges share a byte.
bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  const auto first = reinterpret_cast<uintptr_t>(a);
  const auto second = reinterpret_cast<uintptr_t>(b);
  return aBytes > 0 && bBytes > 0 && first < second + bBytes && second < first + aBytes;
}

// The buffers of one ProcessGroup call, checked as they are added: that each one's bytes
// fit in size_t, that its data is not null while it holds elements, and that it has the
// type and device of the call's first buffer. Text is only built on failure.
class CallBuffers {
 public:
  CallBuffers(const char* op, const Group& group) : op_(op), group_(group) {}

  // Adds `buffer`, the argument `name` (its element `index` when index >= 0).
  void add(const BufferView& buffer, const char* name, int index = -1) {
    if (added_ == 0) {
      type_ = buffer.type;
      device_ = buffer.device;
      firstName_ = name;
      firstIndex_ = index;
    } else if (buffer.type != type_) {
      throw InvalidArgument(std::string(op_) + ": Invalid usage of tensors with different dtypes: " +
                            argumentName(firstName_, firstIndex_) + " is " + dataTypeName(type_) + " but " +
                            argumentName(name, index) + " is " + dataTypeName(buffer.type));
    } else if (buffer.device != device_) {
      throw InvalidArgument(std::string(op_) + ": tensors on different devices: " +
                            argumentName(firstName_, firstIndex_) + " is on " + deviceName(device_) + " but " +
                            argumentName(name, index) + " is on " + deviceName(buffer.device));
    }
    ++added_;
    if (buffer.data == nullptr && buffer.count > 0) {
      throw InvalidArgument(std::string(op_) + ": " + argumentName(name, index) + " is null but should hold " +
                            elementsText(buffer.count));
    }
    if (buffer.rows > 0 && buffer.count % buffer.rows != 0) {
      throw InvalidArgument(std::string(op_) + ": " + argumentName(name, index) + " has " + std::to_string(buffer.rows) +
                            " rows, which do not divide its " + elementsText(buffer.count));
    }
    checkedBytes(op_, buffer.count, buffer.type);
  }

  // Adds every element of `list`, the argument `name`.
  void addList(const std::vector<BufferView>& list, const char* name) {
    for (size_t i = 0; i < list.size(); ++i) add(list[i], name, static_cast<int>(i));
  }

  // Throws unless `list`, the argument `name`, holds one buffer per rank of the group.
  void requireOnePerRank(size_t listSize, const std::string& name) const {
    if (listSize != static_cast<size_t>(group_.size)) {
      throw InvalidArgument(std::string(op_) + ": " + name + " must hold one tensor per rank of the group (" +
                            std::to_string(group_.size) + "), got " + std::to_string(listSize));
    }
  }

  // torch's rule for a rooted call's list: given (non-empty) on the root, and only there.
  void requireListOnRootOnly(bool isRoot, const std::vector<BufferView>& list, const char* name,
                             const char* rootName) const {
    if (isRoot && list.empty()) {
      throw InvalidArgument(std::string("Argument ``") + name + "`` must be specified on " + rootName + " rank.");
    }
    if (!isRoot && !list.empty()) {
      throw InvalidArgument(std::string("Argument ``") + name + "`` must NOT be specified on non-" + rootName +
                            " ranks.");
    }
  }

  // Throws unless `whole` holds exactly size() times `part`'s elements, and unless `part`
  // is either outside `whole` or this rank's part of it (in place).
  void requireWholeOfParts(const BufferView& whole, const char* wholeName, const BufferView& part,
                           const char* partName) const {
    const auto size = static_cast<size_t>(group_.size);
    if (part.count > std::numeric_limits<size_t>::max() / size || whole.count != part.count * size) {
      throw InvalidArgument(std::string(op_) + ": " + wholeName + " must hold world_size (" + std::to_string(size) +
                            ") times " + partName + "'s " + elementsText(part.count) + ", got " +
                            elementsText(whole.count));
    }
    const size_t elementBytes = elementSize(part.type);
    const void* own = static_cast<const std::byte*>(whole.data) + static_cast<size_t>(group_.rank) * part.count * elementBytes;
    if (overlaps(part.data, part.count * elementBytes, whole.data, whole.count * elementBytes) && part.data != own) {
      throw InvalidArgument(std::string(op_) + ": " + partName + " overlaps " + wholeName +
                            " but is not this rank's part of it (in place, " + partName + " must be the part that "
                            "starts at element rank * " + partName + ".numel())");
    }
  }

  const char* op() const { return op_; }
  const Device& device() const { return device_; }
  DataType type() const { return type_; }
  bool empty() const { return added_ == 0; }

 private:
  const char* op_;
  const Group& group_;
  size_t added_ = 0;
  DataType type_ = DataType::kFloat32;
  Device device_{};
  const char* firstName_ = nullptr;
  int firstIndex_ = -1;
};

// "all_gather: tensor has 3 elements but tensor_list[1], this rank's output, has 4 elements".
[[noreturn]] void throwCountMismatch(const char* op, const std::string& name, size_t count,
                                     const std::string& otherName, const char* otherRole, size_t otherCount) {
  throw InvalidArgument(std::string(op) + ": " + name + " has " + elementsText(count) + " but " + otherName + ", " +
                        otherRole + ", has " + elementsText(otherCount));
}

}  // namespace

std::string elementsText(size_t count) { return std::to_string(count) + (count == 1 ? " element" : " elements"); }

size_t checkedBytes(const char* op, size_t count, DataType type) {
  const size_t es = elementSize(type);  // throws for a type outside the enum
  if (count > std::numeric_limits<size_t>::max() / es) {
    throw InvalidArgument(std::string(op) + ": " + std::to_string(count) + " elements of " + dataTypeName(type) +
                          " do not fit in the address space");
  }
  return count * es;
}

size_t checkedTotal(const char* op, const char* what, const size_t* counts, int size, DataType type) {
  if (counts == nullptr) {
    throw InvalidArgument(std::string(op) + ": " + what + " is null");
  }
  size_t total = 0;
  for (int r = 0; r < size; ++r) {
    if (counts[r] > std::numeric_limits<size_t>::max() - total) {
      throw InvalidArgument(std::string(op) + ": the sum of " + what + " does not fit in size_t");
    }
    total += counts[r];
  }
  checkedBytes(op, total, type);
  return total;
}

size_t checkedBlocksTotal(const char* op, size_t count, int size, DataType type) {
  const auto blocks = static_cast<size_t>(size);
  if (count > std::numeric_limits<size_t>::max() / blocks) {
    throw InvalidArgument(std::string(op) + ": " + std::to_string(size) + " blocks of " + std::to_string(count) +
                          " elements do not fit in size_t");
  }
  checkedBytes(op, count * blocks, type);
  return count * blocks;
}

void checkBuffer(const char* op, const char* what, const void* buffer, size_t count) {
  if (buffer == nullptr && count > 0) {
    throw InvalidArgument(std::string(op) + ": " + what + " is null but should hold " + elementsText(count));
  }
}

void checkBuffers(const char* op, const char* what, const void* const* buffers, int size, const size_t* counts,
                  size_t count) {
  if (buffers == nullptr) {
    throw InvalidArgument(std::string(op) + ": " + what + " is null (expected an array of " + std::to_string(size) +
                          " buffers, one per rank)");
  }
  for (int r = 0; r < size; ++r) {
    const size_t expected = counts != nullptr ? counts[r] : count;
    if (buffers[r] == nullptr && expected > 0) {
      throw InvalidArgument(std::string(op) + ": " + argumentName(what, r) + " is null but should hold " +
                            elementsText(expected));
    }
  }
}

void checkRoot(const char* op, int root, int size) {
  if (root < 0 || root >= size) {
    throw InvalidArgument(std::string(op) + ": root " + std::to_string(root) + " is not a rank of this group of " +
                          std::to_string(size) + (size == 1 ? " rank" : " ranks"));
  }
}

void checkReduceOp(const char* op, DataType type, ReduceOp reduceOp) {
  if (static_cast<int>(type) >= kNumDataTypes) {
    throw InvalidArgument(std::string(op) + ": unknown DataType " + std::to_string(static_cast<int>(type)));
  }
  if (static_cast<int>(reduceOp) >= kNumReduceOps) {
    throw InvalidArgument(std::string(op) + ": unknown ReduceOp " + std::to_string(static_cast<int>(reduceOp)));
  }
  if (isSupported(type, reduceOp)) return;
  std::string message = std::string(op) + " does not support ReduceOp." + reduceOpName(reduceOp) + " on " +
                        dataTypeName(type) + " buffers";
  if (isComplex(type)) {
    message += " (complex buffers support SUM, AVG and PREMUL_SUM)";
  } else if (isBitwise(reduceOp)) {
    message += " (bitwise ops need integer or bool buffers)";
  } else if (type == DataType::kBool) {
    message += " (bool buffers support SUM, PRODUCT, MIN, MAX, BAND, BOR and BXOR)";
  }
  throw InvalidArgument(message);
}

void checkTimeout(const char* op, std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) {
    throw InvalidArgument(std::string(op) + ": timeout must be >= 0 ms, got " + std::to_string(timeout.count()) +
                          " ms");
  }
}

void checkPeer(const char* op, int peer, int rank, int size, bool anySourceAllowed) {
  if (anySourceAllowed && peer == -1) return;
  if (peer < 0 || peer >= size) {
    throw InvalidArgument("rank " + std::to_string(rank) + ": " + op + ": peer " + std::to_string(peer) +
                          " is not a rank of this group [0, " + std::to_string(size) + ")" +
                          (anySourceAllowed ? " nor kAnySource (-1)" : ""));
  }
  if (peer == rank) {
    throw InvalidArgument("rank " + std::to_string(rank) + ": " + op + ": peer " + std::to_string(peer) +
                          " is this rank; point-to-point messages go to other ranks");
  }
}

void checkTag(const char* op, int peer, int tag, bool receive) {
  if (tag < 0) {
    const std::string peerText = peer < 0 ? "any source" : "rank " + std::to_string(peer);
    throw InvalidArgument(std::string(op) + (receive ? " from " : " to ") + peerText + ": tag " +
                          std::to_string(tag) + " is negative");
  }
}

// --- ProcessGroup's operations.

Device checkAllreduce(const Group& group, const BufferView& tensor, const AllreduceOptions& options) {
  CallBuffers call("all_reduce", group);
  call.add(tensor, "tensor");
  checkReduceOp(call.op(), tensor.type, options.op);
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkAllreduceCoalesced(const Group& group, const std::vector<BufferView>& tensors,
                               const AllreduceOptions& options) {
  CallBuffers call("all_reduce_coalesced", group);
  call.addList(tensors, "tensors");
  if (!call.empty()) checkReduceOp(call.op(), call.type(), options.op);
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkBroadcast(const Group& group, const BufferView& tensor, const BroadcastOptions& options) {
  CallBuffers call("broadcast", group);
  call.add(tensor, "tensor");
  checkRoot(call.op(), options.root, group.size);
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkReduce(const Group& group, const BufferView& tensor, const ReduceOptions& options) {
  CallBuffers call("reduce", group);
  call.add(tensor, "tensor");
  checkRoot(call.op(), options.root, group.size);
  checkReduceOp(call.op(), tensor.type, options.op);
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkAllgather(const Group& group, const std::vector<BufferView>& tensorList, const BufferView& tensor,
                      const AllgatherOptions& options) {
  CallBuffers call("all_gather", group);
  call.add(tensor, "tensor");
  call.addList(tensorList, "tensor_list");
  call.requireOnePerRank(tensorList.size(), "tensor_list");
  const BufferView& own = tensorList[static_cast<size_t>(group.rank)];
  if (own.count != tensor.count) {
    throwCountMismatch(call.op(), "tensor", tensor.count, argumentName("tensor_list", group.rank),
                       "this rank's output", own.count);
  }
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkAllgatherSingle(const Group& group, const BufferView& outputTensor, const BufferView& inputTensor,
                            const AllgatherOptions& options) {
  CallBuffers call("all_gather_single", group);
  call.add(outputTensor, "output_tensor");
  call.add(inputTensor, "input_tensor");
  call.requireWholeOfParts(outputTensor, "output_tensor", inputTensor, "input_tensor");
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkAllgatherCoalesced(const Group& group, const std::vector<std::vector<BufferView>>& outputTensorLists,
                               const std::vector<BufferView>& inputTensorList, const AllgatherOptions& options) {
  CallBuffers call("all_gather_coalesced", group);
  call.addList(inputTensorList, "input_tensor_list");
  if (outputTensorLists.size() != static_cast<size_t>(group.size)) {
    throw InvalidArgument(std::string(call.op()) + ": output_tensor_lists must hold one list per rank of the group (" +
                          std::to_string(group.size) + "), got " + std::to_string(outputTensorLists.size()));
  }
  for (size_t r = 0; r < outputTensorLists.size(); ++r) {
    const std::string name = argumentName("output_tensor_lists", static_cast<int>(r));
    const std::vector<BufferView>& outputs = outputTensorLists[r];
    for (size_t i = 0; i < outputs.size(); ++i) call.add(outputs[i], name.c_str(), static_cast<int>(i));
    if (outputs.size() != inputTensorList.size()) {
      throw InvalidArgument(std::string(call.op()) + ": " + name +
                            " must hold one tensor per tensor of input_tensor_list (" +
                            std::to_string(inputTensorList.size()) + "), got " + std::to_string(outputs.size()));
    }
    if (r != static_cast<size_t>(group.rank)) continue;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].count != inputTensorList[i].count) {
        throwCountMismatch(call.op(), argumentName(name.c_str(), static_cast<int>(i)), outputs[i].count,
                           argumentName("input_tensor_list", static_cast<int>(i)), "this rank's input",
                           inputTensorList[i].count);
      }
    }
  }
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkAllgatherSingleCoalesced(const Group& group, const std::vector<BufferView>& outputTensors,
                                     const std::vector<BufferView>& inputTensors, const AllgatherOptions& options) {
  CallBuffers call("all_gather_single_coalesced", group);
  call.addList(inputTensors, "input_tensors");
  call.addList(outputTensors, "output_tensors");
  if (outputTensors.size() != inputTensors.size()) {
    throw InvalidArgument(std::string(call.op()) + ": output_tensors must hold one tensor per tensor of "
                          "input_tensors (" + std::to_string(inputTensors.size()) + "), got " +
                          std::to_string(outputTensors.size()));
  }
  for (size_t i = 0; i < inputTensors.size(); ++i) {
    const std::string output = argumentName("output_tensors", static_cast<int>(i));
    const std::string input = argumentName("input_tensors", static_cast<int>(i));
    call.requireWholeOfParts(outputTensors[i], output.c_str(), inputTensors[i], input.c_str());
  }
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkGather(const Group& group, const BufferView& tensor, const std::vector<BufferView>& gatherList,
                   const GatherOptions& options) {
  CallBuffers call("gather", group);
  checkRoot(call.op(), options.root, group.size);
  call.add(tensor, "tensor");
  call.requireListOnRootOnly(group.rank == options.root, gatherList, "gather_list", "destination");
  call.addList(gatherList, "gather_list");
  if (!gatherList.empty()) call.requireOnePerRank(gatherList.size(), "gather_list");
  for (size_t r = 0; r < gatherList.size(); ++r) {
    if (gatherList[r].count != tensor.count) {
      throw InvalidArgument(std::string(call.op()) + ": every tensor of gather_list must have tensor's size (" +
                            elementsText(tensor.count) + "), gather_list[" + std::to_string(r) + "] has " +
                            elementsText(gatherList[r].count));
    }
  }
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkScatter(const Group& group, const BufferView& tensor, const std::vector<BufferView>& scatterList,
                    const ScatterOptions& options) {
  CallBuffers call("scatter", group);
  checkRoot(call.op(), options.root, group.size);
  call.add(tensor, "tensor");
  call.requireListOnRootOnly(group.rank == options.root, scatterList, "scatter_list", "source");
  call.addList(scatterList, "scatter_list");
  if (!scatterList.empty()) call.requireOnePerRank(scatterList.size(), "scatter_list");
  for (size_t r = 0; r < scatterList.size(); ++r) {
    if (scatterList[r].count != tensor.count) {
      throw InvalidArgument(std::string(call.op()) + ": every tensor of scatter_list must have tensor's size (" +
                            elementsText(tensor.count) + "), scatter_list[" + std::to_string(r) + "] has " +
                            elementsText(scatterList[r].count));
    }
  }
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkReduceScatter(const Group& group, const BufferView& output, const std::vector<BufferView>& inputList,
                          const ReduceScatterOptions& options) {
  CallBuffers call("reduce_scatter", group);
  call.add(output, "output");
  call.addList(inputList, "input_list");
  call.requireOnePerRank(inputList.size(), "input_list");
  checkReduceOp(call.op(), output.type, options.op);
  const BufferView& own = inputList[static_cast<size_t>(group.rank)];
  if (own.count != output.count) {
    throwCountMismatch(call.op(), "output", output.count, argumentName("input_list", group.rank), "this rank's part",
                       own.count);
  }
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkReduceScatterSingle(const Group& group, const BufferView& output, const BufferView& input,
                                const ReduceScatterOptions& options) {
  CallBuffers call("reduce_scatter_single", group);
  call.add(output, "output");
  call.add(input, "input");
  checkReduceOp(call.op(), output.type, options.op);
  call.requireWholeOfParts(input, "input", output, "output");
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkReduceScatterSingleCoalesced(const Group& group, const std::vector<BufferView>& outputs,
                                         const std::vector<BufferView>& inputs, const ReduceScatterOptions& options) {
  CallBuffers call("reduce_scatter_single_coalesced", group);
  call.addList(outputs, "outputs");
  call.addList(inputs, "inputs");
  if (inputs.size() != outputs.size()) {
    throw InvalidArgument(std::string(call.op()) + ": inputs must hold one tensor per tensor of outputs (" +
                          std::to_string(outputs.size()) + "), got " + std::to_string(inputs.size()));
  }
  if (!call.empty()) checkReduceOp(call.op(), call.type(), options.op);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string input = argumentName("inputs", static_cast<int>(i));
    const std::string output = argumentName("outputs", static_cast<int>(i));
    call.requireWholeOfParts(inputs[i], input.c_str(), outputs[i], output.c_str());
  }
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkAlltoall(const Group& group, const std::vector<BufferView>& outputTensorList,
                     const std::vector<BufferView>& inputTensorList, const AlltoallOptions& options) {
  CallBuffers call("all_to_all", group);
  call.addList(outputTensorList, "output_tensor_list");
  call.addList(inputTensorList, "input_tensor_list");
  call.requireOnePerRank(outputTensorList.size(), "output_tensor_list");
  call.requireOnePerRank(inputTensorList.size(), "input_tensor_list");
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

Device checkAlltoallSingle(const Group& group, const BufferView& output, const BufferView& input,
                           const std::vector<int64_t>& outputSplitSizes, const std::vector<int64_t>& inputSplitSizes,
                           const AlltoallOptions& options) {
  CallBuffers call("all_to_all_single", group);
  call.add(output, "output");
  call.add(input, "input");
  const size_t elementBytes = elementSize(input.type);
  if (overlaps(input.data, input.count * elementBytes, output.data, output.count * elementBytes)) {
    throw InvalidArgument(std::string(call.op()) + ": input and output must not overlap");
  }
  InlineArray<size_t> counts(static_cast<size_t>(group.size));  // checked only
  splitCountsInto(call.op(), output, outputSplitSizes, group.size, "output", counts.data());
  splitCountsInto(call.op(), input, inputSplitSizes, group.size, "input", counts.data());
  checkTimeout(call.op(), options.timeout);
  return call.device();
}

void checkBarrier(const BarrierOptions& options) { checkTimeout("barrier", options.timeout); }

Device checkSend(const Group& group, const char* op, const BufferView& tensor, int dst, int tag) {
  CallBuffers call(op, group);
  call.add(tensor, "tensor");
  checkPeer(op, dst, group.rank, group.size, /*anySourceAllowed=*/false);
  checkTag(op, dst, tag, /*receive=*/false);
  return call.device();
}

Device checkRecv(const Group& group, const char* op, const BufferView& tensor, int src, int tag) {
  CallBuffers call(op, group);
  call.add(tensor, "tensor");
  checkPeer(op, src, group.rank, group.size, /*anySourceAllowed=*/true);
  checkTag(op, src, tag, /*receive=*/true);
  return call.device();
}

void splitCountsInto(const char* op, const BufferView& buffer, const std::vector<int64_t>& splitSizes, int size,
                     const char* name, size_t* counts) {
  const auto prefix = [op] { return std::string(op) + ": "; };  // made only for an error
  const size_t rows = buffer.leadingRows();
  const size_t rowElements = rows > 0 ? buffer.count / rows : 0;
  if (splitSizes.empty()) {
    if (rows % static_cast<size_t>(size) != 0) {
      throw InvalidArgument(prefix() + name + "'s dim 0 (" + std::to_string(rows) +
                            ") does not divide equally across the group's " + std::to_string(size) + " ranks; pass " +
                            name + "_split_sizes");
    }
    std::fill(counts, counts + size, rows / static_cast<size_t>(size) * rowElements);
    return;
  }
  if (splitSizes.size() != static_cast<size_t>(size)) {
    throw InvalidArgument(prefix() + name + "_split_sizes must hold one size per rank of the group (" +
                          std::to_string(size) + "), got " + std::to_string(splitSizes.size()));
  }
  uint64_t total = 0;
  bool wraps = false;
  for (size_t r = 0; r < splitSizes.size(); ++r) {
    if (splitSizes[r] < 0) {
      throw InvalidArgument(prefix() + name + "_split_sizes must be non-negative, got " +
                            std::to_string(splitSizes[r]) + " at index " + std::to_string(r));
    }
    const auto splitRows = static_cast<uint64_t>(splitSizes[r]);
    wraps = wraps || splitRows > std::numeric_limits<uint64_t>::max() - total;
    total += splitRows;
  }
  if (wraps || total != rows) {
    throw InvalidArgument(prefix() + name + "_split_sizes add up to " +
                          (wraps ? "more than 2^64" : std::to_string(total)) + " but " + name + "'s dim 0 is " +
                          std::to_string(rows) + " (split sizes don't match the total dim 0 size)");
  }
  for (size_t r = 0; r < splitSizes.size(); ++r) counts[r] = static_cast<size_t>(splitSizes[r]) * rowElements;
}

std::vector<size_t> splitCounts(const char* op, const BufferView& buffer, const std::vector<int64_t>& splitSizes,
                                int size, const char* name) {
  std::vector<size_t> counts(static_cast<size_t>(size));
  splitCountsInto(op, buffer, splitSizes, size, name, counts.data());
  return counts;
}

}  // namespace ringtree::validation
