#include "collectives.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/communicator.h>
#include <ringtree/error.h>
#include <ringtree/options.h>
#include <ringtree/process_group.h>
#include <ringtree/store/store.h>
#include <ringtree/types.h>
#include <ringtree/work.h>

#include "buffers.h"
#include "errors.h"

namespace py = pybind11;

namespace ringtree::python {

namespace {

using Microseconds = std::chrono::microseconds;
using Milliseconds = std::chrono::milliseconds;

// A timedelta as the milliseconds a deadline takes, rounded up so that a positive
// timeout never becomes "none"; negative ones are refused.
Milliseconds toMilliseconds(Microseconds timeout, const char* what) {
  if (timeout.count() < 0) {
    throw InvalidArgument(std::string(what) + ": timeout must not be negative, got " +
                          std::to_string(timeout.count()) + " us");
  }
  return std::chrono::ceil<Milliseconds>(timeout);
}

TransportKind parseTransport(const std::string& name) {
  if (name == "auto") {
    return TransportKind::kAuto;
  }
  if (name == "tcp") {
    return TransportKind::kTcp;
  }
  if (name == "shm") {
    return TransportKind::kShm;
  }
  throw InvalidArgument("unknown transport '" + name + "'; expected 'auto', 'tcp' or 'shm'");
}

// `op` is a ReduceOp.RedOpType (an int) or a ReduceOp instance (.op, and .factor for
// PREMUL_SUM), as torch.distributed accepts both.
void parseReduceOp(py::handle op, ReduceOp& out, double& factor) {
  py::handle code = op;
  py::object inner;
  if (!PyLong_Check(op.ptr())) {
    if (py::hasattr(op, "op")) {
      inner = op.attr("op");
    }
    if (!inner || !PyLong_Check(inner.ptr())) {
      throw py::type_error(std::string("op must be a ReduceOp or a ReduceOp.RedOpType, got ") +
                           Py_TYPE(op.ptr())->tp_name);
    }
    code = inner;
  }
  const long value = PyLong_AsLong(code.ptr());
  if (value == -1 && PyErr_Occurred()) {
    PyErr_Clear();
  }
  if (value < 0 || value >= kNumReduceOps) {
    throw InvalidArgument("unknown reduce op " + std::string(py::str(code)) + "; expected a ReduceOp");
  }
  out = static_cast<ReduceOp>(value);
  if (out != ReduceOp::kPremulSum) {
    return;
  }
  py::object factorObject = code.ptr() == op.ptr() ? py::none() : py::getattr(op, "factor", py::none());
  if (factorObject.is_none()) {
    throw InvalidArgument("ReduceOp.PREMUL_SUM needs a factor: pass ReduceOp(ReduceOp.PREMUL_SUM, factor)");
  }
  factor = PyFloat_AsDouble(factorObject.ptr());
  if (factor == -1.0 && PyErr_Occurred()) {
    throw py::error_already_set();
  }
}

void destroyProcessGroup(ProcessGroup* group) {
  if (pythonIsFinalizing()) {
    return;  // its worker may be blocked in Python, which no longer runs: leak it
  }
  if (PyGILState_Check()) {
    py::gil_scoped_release release;  // the worker may need the GIL to finish
    delete group;
  } else {
    delete group;
  }
}

// A Python object owned by C++ code that may drop it on a thread without the GIL: the
// destructor takes the GIL to release it (or leaks it while the interpreter shuts down).
struct ObjectHeldOffThread {
  explicit ObjectHeldOffThread(py::object held) : object(std::move(held)) {}
  ObjectHeldOffThread(const ObjectHeldOffThread&) = delete;
  ObjectHeldOffThread& operator=(const ObjectHeldOffThread&) = delete;
  ~ObjectHeldOffThread() {
    if (!object) return;
    if (pythonIsFinalizing()) {
      object.release();
      return;
    }
    py::gil_scoped_acquire gil;
    object = py::object();
  }
  py::object object;
};

// The `algorithm=` keyword of the Python collectives: None keeps the automatic choice.
Algorithm parseAlgorithmArgument(py::handle algorithm) {
  if (algorithm.is_none()) {
    return Algorithm::kAuto;
  }
  if (!py::isinstance<py::str>(algorithm)) {
    throw py::type_error(std::string("algorithm must be a str or None, got ") + Py_TYPE(algorithm.ptr())->tp_name);
  }
  return parseAlgorithm(algorithm.cast<std::string>().c_str());
}

// Runs a collective on `buffer`: if asyncOp, queued with the buffer as its keep-alive
// (returns the Work); else on this thread with the GIL released (returns None).
template <typename SyncCall, typename AsyncCall>
py::object run(Buffer& buffer, bool asyncOp, const SyncCall& syncCall, const AsyncCall& asyncCall) {
  void* data = buffer.data();
  const size_t count = buffer.count();
  const DataType type = buffer.type();
  if (asyncOp) {
    return py::cast(asyncCall(data, count, type, std::make_shared<Buffer>(std::move(buffer))));
  }
  {
    py::gil_scoped_release release;
    syncCall(data, count, type);
  }
  return py::none();
}

py::object allreduce(ProcessGroup& group, py::handle tensor, py::handle op, bool asyncOp, py::handle algorithm) {
  AllreduceOptions options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  parseReduceOp(op, options.op, options.premulFactor);
  Buffer buffer(tensor, Access::kReadWrite, "all_reduce");
  return run(
      buffer, asyncOp, [&](void* data, size_t count, DataType type) { group.allreduce(data, count, type, options); },
      [&](void* data, size_t count, DataType type, std::shared_ptr<void> keepAlive) {
        return group.allreduceAsync(data, count, type, options, std::move(keepAlive));
      });
}

py::object broadcast(ProcessGroup& group, py::handle tensor, int root, bool asyncOp, py::handle algorithm) {
  BroadcastOptions options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  options.root = root;
  // The root only reads its buffer.
  Buffer buffer(tensor, root == group.rank() ? Access::kRead : Access::kReadWrite, "broadcast");
  return run(
      buffer, asyncOp, [&](void* data, size_t count, DataType type) { group.broadcast(data, count, type, options); },
      [&](void* data, size_t count, DataType type, std::shared_ptr<void> keepAlive) {
        return group.broadcastAsync(data, count, type, options, std::move(keepAlive));
      });
}

py::object reduce(ProcessGroup& group, py::handle tensor, int root, py::handle op, bool asyncOp,
                  py::handle algorithm) {
  ReduceOptions options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  options.root = root;
  parseReduceOp(op, options.op, options.premulFactor);
  Buffer buffer(tensor, Access::kReadWrite, "reduce");
  return run(
      buffer, asyncOp, [&](void* data, size_t count, DataType type) { group.reduce(data, count, type, options); },
      [&](void* data, size_t count, DataType type, std::shared_ptr<void> keepAlive) {
        return group.reduceAsync(data, count, type, options, std::move(keepAlive));
      });
}

py::object barrier(ProcessGroup& group, std::optional<Microseconds> timeout, bool asyncOp) {
  BarrierOptions options;
  if (timeout.has_value()) {
    options.timeout = toMilliseconds(*timeout, "barrier");
    if (options.timeout.count() == 0) {
      throw InvalidArgument("barrier: timeout must be positive, got 0");
    }
  }
  if (asyncOp) {
    return py::cast(group.barrierAsync(options));
  }
  {
    py::gil_scoped_release release;
    group.barrier(options);
  }
  return py::none();
}

// --- The gather/scatter family and the coalesced collectives --------------------------------

// Raises ValueError unless `op` is defined on `type` (see types.h).
void checkReduceOp(const char* what, DataType type, ReduceOp op) {
  if (isSupported(type, op)) {
    return;
  }
  std::string message = std::string(what) + " does not support ReduceOp." + reduceOpName(op) + " on " +
                        dataTypeName(type) + " buffers";
  if (type == DataType::kComplex64 || type == DataType::kComplex128) {
    message += " (complex buffers support SUM, AVG and PREMUL_SUM)";
  }
  throw InvalidArgument(message);
}

void checkRoot(const ProcessGroup& group, const char* what, int root) {
  if (root < 0 || root >= group.size()) {
    throw InvalidArgument(std::string(what) + ": root " + std::to_string(root) + " is not a rank of this group of " +
                          std::to_string(group.size()) + " ranks");
  }
}

// Whether two byte ranges share a byte.
bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  const auto first = reinterpret_cast<uintptr_t>(a);
  const auto second = reinterpret_cast<uintptr_t>(b);
  return aBytes > 0 && bBytes > 0 && first < second + bBytes && second < first + aBytes;
}

// The memory of one borrowed buffer, in elements of the call's dtype.
struct Span {
  void* data;
  size_t count;
  size_t rows = 1;  // the size of dim 0 (1 for a 0-dim tensor)
};

// One collective call: the buffers it borrowed, which must all hold one dtype, and the
// per-rank pointer and count arrays handed to the core (see collectives.h). A synchronous
// call holds it for its duration; an asynchronous one hands it to its Work as the
// keep-alive, so the memory stays borrowed and the arrays stay in place until the
// operation finished. Built with the GIL held; read by the operation without it.
class Call {
 public:
  explicit Call(const char* what) : what_(what) {}

  // The collective's torch name, a string literal ("all_gather").
  const char* what() const { return what_; }
  DataType type() const { return type_; }

  // Borrows `object`, the argument `name` (its element `index` when index >= 0). Raises
  // what Buffer's constructor raises, and ValueError for a dtype other than the one of the
  // call's first buffer.
  Span borrow(py::handle object, Access access, const std::string& name, int index = -1) {
    Buffer buffer(object, access, what_);
    const Span span{buffer.data(), buffer.count(), buffer.rows()};
    if (buffers_.empty()) {
      type_ = buffer.type();
      firstName_ = argumentName(name, index);
    } else if (buffer.type() != type_) {
      throw InvalidArgument(std::string(what_) + ": Invalid usage of tensors with different dtypes: " + firstName_ +
                            " is " + dataTypeName(type_) + " but " + argumentName(name, index) + " is " +
                            dataTypeName(buffer.type()));
    }
    buffers_.push_back(std::move(buffer));
    return span;
  }

  // Borrows every element of `list`, which must be a list or a tuple (TypeError otherwise).
  std::vector<Span> borrowList(py::handle list, Access access, const std::string& name) {
    if (!PyList_Check(list.ptr()) && !PyTuple_Check(list.ptr())) {
      throw py::type_error(std::string(what_) + ": " + name + " must be a list of tensors, got " +
                           Py_TYPE(list.ptr())->tp_name);
    }
    const auto elements = py::reinterpret_borrow<py::sequence>(list);
    const size_t length = elements.size();
    std::vector<Span> spans;
    spans.reserve(length);
    buffers_.reserve(buffers_.size() + length);
    for (size_t i = 0; i < length; ++i) {
      spans.push_back(borrow(elements[i], access, name, static_cast<int>(i)));
    }
    return spans;
  }

  // Raises ValueError unless `spans`, the argument `name`, holds one buffer per rank.
  void requireOnePerRank(const std::vector<Span>& spans, int size, const std::string& name) const {
    if (spans.size() != static_cast<size_t>(size)) {
      throw InvalidArgument(std::string(what_) + ": " + name + " must hold one tensor per rank of the group (" +
                            std::to_string(size) + "), got " + std::to_string(spans.size()));
    }
  }

  void addInput(const Span& span) {
    inputs.push_back(span.data);
    inputCounts.push_back(span.count);
  }
  void addOutput(const Span& span) {
    outputs.push_back(span.data);
    outputCounts.push_back(span.count);
  }

  // The arrays handed to the core, in rank order where the core takes one per rank.
  std::vector<const void*> inputs;
  std::vector<size_t> inputCounts;
  std::vector<void*> outputs;
  std::vector<size_t> outputCounts;

 private:
  static std::string argumentName(const std::string& name, int index) {
    return index < 0 ? name : name + "[" + std::to_string(index) + "]";
  }

  const char* what_;
  std::vector<Buffer> buffers_;
  DataType type_ = DataType::kUInt8;
  std::string firstName_;  // the argument whose dtype is the call's
};

// Runs `operation(communicator, call)` on the group: with asyncOp queued, `call` kept alive
// by the Work until it finished (returns the Work); else at once with the GIL released
// (returns None).
template <typename Operation>
py::object submit(ProcessGroup& group, bool asyncOp, std::shared_ptr<Call> call, Operation operation) {
  Communicator* communicator = &group.communicator();
  if (asyncOp) {
    const Call* borrowed = call.get();
    const char* what = borrowed->what();
    return py::cast(group.runAsync(
        what, [communicator, borrowed, operation] { operation(*communicator, *borrowed); }, std::move(call)));
  }
  {
    py::gil_scoped_release release;
    group.run(call->what(), [&] { operation(*communicator, *call); });
  }
  return py::none();
}

// Spans of `count` elements each, one per rank, laid end to end from `data`.
std::vector<Span> slices(void* data, size_t count, DataType type, int size) {
  std::vector<Span> spans;
  spans.reserve(size);
  for (int r = 0; r < size; ++r) {
    spans.push_back({static_cast<std::byte*>(data) + static_cast<size_t>(r) * count * elementSize(type), count});
  }
  return spans;
}

// memcpy that accepts the null pointers of empty buffers.
void copyBytes(void* destination, const void* source, size_t bytes) {
  if (bytes > 0) {
    std::memcpy(destination, source, bytes);
  }
}

std::string elementsText(size_t count) { return std::to_string(count) + (count == 1 ? " element" : " elements"); }

py::object allgather(ProcessGroup& group, py::handle outputList, py::handle input, bool asyncOp,
                     py::handle algorithm) {
  AllgatherOptions options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  auto call = std::make_shared<Call>("all_gather");
  const Span in = call->borrow(input, Access::kRead, "tensor");
  const std::vector<Span> outs = call->borrowList(outputList, Access::kReadWrite, "tensor_list");
  call->requireOnePerRank(outs, group.size(), "tensor_list");
  const Span& own = outs[group.rank()];
  if (own.count != in.count) {
    throw InvalidArgument("all_gather: tensor has " + elementsText(in.count) + " but tensor_list[" +
                          std::to_string(group.rank()) + "], this rank's output, has " + elementsText(own.count));
  }
  call->addInput(in);
  for (const Span& out : outs) {
    call->addOutput(out);
  }
  return submit(group, asyncOp, std::move(call), [options](Communicator& comm, const Call& c) {
    ringtree::allgather(comm, c.inputs[0], c.outputs.data(), c.outputCounts.data(), c.type(), options);
  });
}

py::object allgatherSingle(ProcessGroup& group, py::handle output, py::handle input, bool asyncOp,
                           py::handle algorithm) {
  AllgatherOptions options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  auto call = std::make_shared<Call>("all_gather_single");
  const Span out = call->borrow(output, Access::kReadWrite, "output_tensor");
  const Span in = call->borrow(input, Access::kRead, "input_tensor");
  const size_t size = group.size();
  if (out.count != in.count * size) {
    throw InvalidArgument("all_gather_single: output_tensor must hold world_size (" + std::to_string(size) +
                          ") times input_tensor's " + elementsText(in.count) + ", got " + elementsText(out.count));
  }
  const std::vector<Span> parts = slices(out.data, in.count, call->type(), group.size());
  const size_t elementBytes = elementSize(call->type());
  if (overlaps(in.data, in.count * elementBytes, out.data, out.count * elementBytes) &&
      in.data != parts[group.rank()].data) {
    throw InvalidArgument(
        "all_gather_single: input_tensor overlaps output_tensor but is not this rank's part of it (in place, "
        "input_tensor must be the part that starts at element rank * input_tensor.numel())");
  }
  call->addInput(in);
  for (const Span& part : parts) {
    call->addOutput(part);
  }
  return submit(group, asyncOp, std::move(call), [options](Communicator& comm, const Call& c) {
    ringtree::allgather(comm, c.inputs[0], c.outputs.data(), c.outputCounts.data(), c.type(), options);
  });
}

py::object gather(ProcessGroup& group, py::handle input, py::handle outputList, int root, bool asyncOp,
                  py::handle algorithm) {
  GatherOptions options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  options.root = root;
  checkRoot(group, "gather", root);
  auto call = std::make_shared<Call>("gather");
  const Span in = call->borrow(input, Access::kRead, "tensor");
  call->addInput(in);
  if (group.rank() == root) {  // the other ranks receive nothing: their list is not used
    const std::vector<Span> outs = call->borrowList(outputList, Access::kReadWrite, "gather_list");
    call->requireOnePerRank(outs, group.size(), "gather_list");
    for (size_t r = 0; r < outs.size(); ++r) {
      if (outs[r].count != in.count) {
        throw InvalidArgument("gather: every tensor of gather_list must have tensor's size (" +
                              elementsText(in.count) + "), gather_list[" + std::to_string(r) + "] has " +
                              elementsText(outs[r].count));
      }
      call->addOutput(outs[r]);
    }
  }
  return submit(group, asyncOp, std::move(call), [options](Communicator& comm, const Call& c) {
    ringtree::gather(comm, c.inputs[0], c.outputs.empty() ? nullptr : c.outputs.data(), c.inputCounts[0], c.type(),
                     options);
  });
}

py::object scatter(ProcessGroup& group, py::handle output, py::handle inputList, int root, bool asyncOp,
                   py::handle algorithm) {
  ScatterOptions options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  options.root = root;
  checkRoot(group, "scatter", root);
  auto call = std::make_shared<Call>("scatter");
  const Span out = call->borrow(output, Access::kReadWrite, "tensor");
  call->addOutput(out);
  if (group.rank() == root) {  // the other ranks send nothing: their list is not used
    const std::vector<Span> ins = call->borrowList(inputList, Access::kRead, "scatter_list");
    call->requireOnePerRank(ins, group.size(), "scatter_list");
    for (size_t r = 0; r < ins.size(); ++r) {
      if (ins[r].count != out.count) {
        throw InvalidArgument("scatter: every tensor of scatter_list must have tensor's size (" +
                              elementsText(out.count) + "), scatter_list[" + std::to_string(r) + "] has " +
                              elementsText(ins[r].count));
      }
      call->addInput(ins[r]);
    }
  }
  return submit(group, asyncOp, std::move(call), [options](Communicator& comm, const Call& c) {
    ringtree::scatter(comm, c.inputs.empty() ? nullptr : c.inputs.data(), c.outputs[0], c.outputCounts[0], c.type(),
                      options);
  });
}

py::object reduceScatter(ProcessGroup& group, py::handle output, py::handle inputList, py::handle op,
                         bool asyncOp, py::handle algorithm) {
  ReduceScatterOptions options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  parseReduceOp(op, options.op, options.premulFactor);
  auto call = std::make_shared<Call>("reduce_scatter");
  const Span out = call->borrow(output, Access::kReadWrite, "output");
  const std::vector<Span> ins = call->borrowList(inputList, Access::kRead, "input_list");
  call->requireOnePerRank(ins, group.size(), "input_list");
  checkReduceOp("reduce_scatter", call->type(), options.op);
  const Span& own = ins[group.rank()];
  if (own.count != out.count) {
    throw InvalidArgument("reduce_scatter: output has " + elementsText(out.count) + " but input_list[" +
                          std::to_string(group.rank()) + "], this rank's part, has " + elementsText(own.count));
  }
  for (const Span& in : ins) {
    call->addInput(in);
  }
  call->addOutput(out);
  return submit(group, asyncOp, std::move(call), [options](Communicator& comm, const Call& c) {
    ringtree::reduceScatter(comm, c.inputs.data(), c.outputs[0], c.inputCounts.data(), c.type(), options);
  });
}

py::object reduceScatterSingle(ProcessGroup& group, py::handle output, py::handle input, py::handle op,
                               bool asyncOp, py::handle algorithm) {
  ReduceScatterOptions options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  parseReduceOp(op, options.op, options.premulFactor);
  auto call = std::make_shared<Call>("reduce_scatter_single");
  const Span out = call->borrow(output, Access::kReadWrite, "output");
  const Span in = call->borrow(input, Access::kRead, "input");
  checkReduceOp("reduce_scatter_single", call->type(), options.op);
  const size_t size = group.size();
  if (in.count != out.count * size) {
    throw InvalidArgument("reduce_scatter_single: input must hold world_size (" + std::to_string(size) +
                          ") times output's " + elementsText(out.count) + ", got " + elementsText(in.count));
  }
  const std::vector<Span> parts = slices(in.data, out.count, call->type(), group.size());
  const size_t elementBytes = elementSize(call->type());
  if (overlaps(in.data, in.count * elementBytes, out.data, out.count * elementBytes) &&
      out.data != parts[group.rank()].data) {
    throw InvalidArgument(
        "reduce_scatter_single: output overlaps input but is not this rank's part of it (in place, output must be "
        "the part that starts at element rank * output.numel())");
  }
  for (const Span& part : parts) {
    call->addInput(part);
  }
  call->addOutput(out);
  return submit(group, asyncOp, std::move(call), [options](Communicator& comm, const Call& c) {
    ringtree::reduceScatter(comm, c.inputs.data(), c.outputs[0], c.inputCounts.data(), c.type(), options);
  });
}

py::object alltoall(ProcessGroup& group, py::handle outputList, py::handle inputList, bool asyncOp,
                    py::handle algorithm) {
  AlltoallOptions options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  auto call = std::make_shared<Call>("all_to_all");
  const std::vector<Span> outs = call->borrowList(outputList, Access::kReadWrite, "output_tensor_list");
  const std::vector<Span> ins = call->borrowList(inputList, Access::kRead, "input_tensor_list");
  call->requireOnePerRank(outs, group.size(), "output_tensor_list");
  call->requireOnePerRank(ins, group.size(), "input_tensor_list");
  for (int r = 0; r < group.size(); ++r) {
    call->addInput(ins[r]);
    call->addOutput(outs[r]);
  }
  return submit(group, asyncOp, std::move(call), [options](Communicator& comm, const Call& c) {
    ringtree::alltoall(comm, c.inputs.data(), c.inputCounts.data(), c.outputs.data(), c.outputCounts.data(), c.type(),
                       options);
  });
}

// The parts of `span` (the argument `name`) sent to or received from each rank, cut along
// dim 0: `splitSizes` rows each, end to end, or equal parts when there are none (None or
// empty, as in torch). Raises ValueError naming the argument for sizes that do not fit.
std::vector<Span> splitSpan(const Call& call, const Span& span, const std::optional<std::vector<int64_t>>& splitSizes,
                            int size, const char* name) {
  const std::string prefix = std::string(call.what()) + ": ";
  const size_t rowElements = span.rows > 0 ? span.count / span.rows : 0;
  if (!splitSizes.has_value() || splitSizes->empty()) {
    if (span.rows % size != 0) {
      throw InvalidArgument(prefix + name + "'s dim 0 (" + std::to_string(span.rows) +
                            ") does not divide equally across the group's " + std::to_string(size) + " ranks; pass " +
                            name + "_split_sizes");
    }
    return slices(span.data, span.rows / size * rowElements, call.type(), size);
  }
  if (splitSizes->size() != static_cast<size_t>(size)) {
    throw InvalidArgument(prefix + name + "_split_sizes must hold one size per rank of the group (" +
                          std::to_string(size) + "), got " + std::to_string(splitSizes->size()));
  }
  std::vector<Span> spans;
  spans.reserve(size);
  size_t rows = 0;
  for (int64_t splitRows : *splitSizes) {
    if (splitRows < 0) {
      throw InvalidArgument(prefix + name + "_split_sizes must be non-negative, got " + std::to_string(splitRows));
    }
    if (static_cast<size_t>(splitRows) > std::numeric_limits<size_t>::max() - rows) {  // the sum would wrap
      throw InvalidArgument(prefix + name + "_split_sizes add up to more than " + name + "'s dim 0 (" +
                            std::to_string(span.rows) + ")");
    }
    std::byte* start = static_cast<std::byte*>(span.data) + rows * rowElements * elementSize(call.type());
    spans.push_back({start, static_cast<size_t>(splitRows) * rowElements, static_cast<size_t>(splitRows)});
    rows += static_cast<size_t>(splitRows);
  }
  if (rows != span.rows) {
    throw InvalidArgument(prefix + name + "_split_sizes add up to " + std::to_string(rows) + " but " + name +
                          "'s dim 0 is " + std::to_string(span.rows) + " (split sizes don't match the total dim 0 size)");
  }
  return spans;
}

py::object alltoallSingle(ProcessGroup& group, py::handle output, py::handle input,
                          const std::optional<std::vector<int64_t>>& outputSplitSizes,
                          const std::optional<std::vector<int64_t>>& inputSplitSizes, bool asyncOp,
                          py::handle algorithm) {
  AlltoallOptions options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  auto call = std::make_shared<Call>("all_to_all_single");
  const Span out = call->borrow(output, Access::kReadWrite, "output");
  const Span in = call->borrow(input, Access::kRead, "input");
  const size_t elementBytes = elementSize(call->type());
  if (overlaps(in.data, in.count * elementBytes, out.data, out.count * elementBytes)) {
    throw InvalidArgument("all_to_all_single: input and output must not overlap");
  }
  const std::vector<Span> outs = splitSpan(*call, out, outputSplitSizes, group.size(), "output");
  const std::vector<Span> ins = splitSpan(*call, in, inputSplitSizes, group.size(), "input");
  for (int r = 0; r < group.size(); ++r) {
    call->addInput(ins[r]);
    call->addOutput(outs[r]);
  }
  return submit(group, asyncOp, std::move(call), [options](Communicator& comm, const Call& c) {
    ringtree::alltoall(comm, c.inputs.data(), c.inputCounts.data(), c.outputs.data(), c.outputCounts.data(), c.type(),
                       options);
  });
}

// all_reduce_coalesced packs the buffers smaller than this into one scratch buffer that a
// single allreduce reduces (one round of latency for all of them instead of one each);
// larger ones are reduced in place one by one, where packing would only add two copies.
constexpr size_t kPackBelowBytes = 256 * 1024;

py::object allreduceCoalesced(ProcessGroup& group, py::handle tensors, py::handle op, bool asyncOp) {
  AllreduceOptions options;
  parseReduceOp(op, options.op, options.premulFactor);
  auto call = std::make_shared<Call>("all_reduce_coalesced");
  for (const Span& span : call->borrowList(tensors, Access::kReadWrite, "tensors")) {
    call->addOutput(span);
  }
  if (!call->outputs.empty()) {
    checkReduceOp("all_reduce_coalesced", call->type(), options.op);
  }
  return submit(group, asyncOp, std::move(call), [options](Communicator& comm, const Call& c) {
    const size_t elementBytes = elementSize(c.type());
    // Every rank decides from the element counts, which agree across ranks.
    auto packed = [&](size_t i) { return c.outputCounts[i] > 0 && c.outputCounts[i] * elementBytes < kPackBelowBytes; };
    size_t packedCount = 0;
    for (size_t i = 0; i < c.outputs.size(); ++i) {
      packedCount += packed(i) ? c.outputCounts[i] : 0;
    }
    if (packedCount > 0) {
      std::unique_ptr<std::byte[]> scratch(new std::byte[packedCount * elementBytes]);
      std::byte* cursor = scratch.get();
      for (size_t i = 0; i < c.outputs.size(); ++i) {
        if (packed(i)) {
          std::memcpy(cursor, c.outputs[i], c.outputCounts[i] * elementBytes);
          cursor += c.outputCounts[i] * elementBytes;
        }
      }
      ringtree::allreduce(comm, scratch.get(), packedCount, c.type(), options);
      cursor = scratch.get();
      for (size_t i = 0; i < c.outputs.size(); ++i) {
        if (packed(i)) {
          std::memcpy(c.outputs[i], cursor, c.outputCounts[i] * elementBytes);
          cursor += c.outputCounts[i] * elementBytes;
        }
      }
    }
    for (size_t i = 0; i < c.outputs.size(); ++i) {
      if (!packed(i) && c.outputCounts[i] > 0) {
        ringtree::allreduce(comm, c.outputs[i], c.outputCounts[i], c.type(), options);
      }
    }
  });
}

// outputLists[r][i] <- rank r's inputs[i]: one allgather of every rank's inputs packed end
// to end into a scratch buffer, then unpacked.
py::object allgatherCoalesced(ProcessGroup& group, py::handle outputLists, py::handle inputList, bool asyncOp) {
  auto call = std::make_shared<Call>("all_gather_coalesced");
  for (const Span& span : call->borrowList(inputList, Access::kRead, "input_tensor_list")) {
    call->addInput(span);
  }
  const size_t perRank = call->inputs.size();
  if (!PyList_Check(outputLists.ptr()) && !PyTuple_Check(outputLists.ptr())) {
    throw py::type_error(
        std::string("all_gather_coalesced: output_tensor_lists must be a list of lists of tensors, got ") +
        Py_TYPE(outputLists.ptr())->tp_name);
  }
  const auto lists = py::reinterpret_borrow<py::sequence>(outputLists);
  if (lists.size() != static_cast<size_t>(group.size())) {
    throw InvalidArgument("all_gather_coalesced: output_tensor_lists must hold one list per rank of the group (" +
                          std::to_string(group.size()) + "), got " + std::to_string(lists.size()));
  }
  for (size_t r = 0; r < lists.size(); ++r) {
    const std::string name = "output_tensor_lists[" + std::to_string(r) + "]";
    const std::vector<Span> outs = call->borrowList(lists[r], Access::kReadWrite, name);
    if (outs.size() != perRank) {
      throw InvalidArgument("all_gather_coalesced: " + name +
                            " must hold one tensor per tensor of input_tensor_list (" + std::to_string(perRank) +
                            "), got " + std::to_string(outs.size()));
    }
    for (size_t i = 0; i < perRank; ++i) {
      if (r == static_cast<size_t>(group.rank()) && outs[i].count != call->inputCounts[i]) {
        throw InvalidArgument("all_gather_coalesced: " + name + "[" + std::to_string(i) +
                              "], this rank's output, has " + elementsText(outs[i].count) + " but input_tensor_list[" +
                              std::to_string(i) + "] has " + elementsText(call->inputCounts[i]));
      }
      call->addOutput(outs[i]);
    }
  }
  return submit(group, asyncOp, std::move(call), [perRank](Communicator& comm, const Call& c) {
    const size_t elementBytes = elementSize(c.type());
    const size_t size = comm.size();
    std::vector<size_t> counts(size, 0);
    for (size_t r = 0; r < size; ++r) {
      for (size_t i = 0; i < perRank; ++i) {
        counts[r] += c.outputCounts[r * perRank + i];
      }
    }
    size_t total = 0;
    for (size_t count : counts) {
      total += count;
    }
    std::unique_ptr<std::byte[]> scratch(new std::byte[total * elementBytes]);
    std::vector<void*> slots(size);
    std::byte* cursor = scratch.get();
    for (size_t r = 0; r < size; ++r) {
      slots[r] = cursor;
      cursor += counts[r] * elementBytes;
    }
    cursor = static_cast<std::byte*>(slots[comm.rank()]);
    for (size_t i = 0; i < perRank; ++i) {
      copyBytes(cursor, c.inputs[i], c.inputCounts[i] * elementBytes);
      cursor += c.inputCounts[i] * elementBytes;
    }
    ringtree::allgather(comm, slots[comm.rank()], slots.data(), counts.data(), c.type());
    for (size_t r = 0; r < size; ++r) {
      cursor = static_cast<std::byte*>(slots[r]);
      for (size_t i = 0; i < perRank; ++i) {
        const size_t bytes = c.outputCounts[r * perRank + i] * elementBytes;
        copyBytes(c.outputs[r * perRank + i], cursor, bytes);
        cursor += bytes;
      }
    }
  });
}

}  // namespace

void initCollectives(py::module_& m) {
  py::class_<Work, std::shared_ptr<Work>>(m, "Work", py::dynamic_attr(), R"(Handle of an asynchronous collective (async_op=True) or
point-to-point operation (isend, irecv, batch_isend_irecv).

wait(timeout) blocks until it finished (timeout: timedelta, 0 = no limit), returns True,
and raises the operation's error if it failed; when the timeout passes first it raises
DistTimeoutError and the operation keeps running. The buffers must not be used until
the work completed.)")
      .def(
          "wait",
          [](Work& work, Microseconds timeout) { return work.wait(toMilliseconds(timeout, "Work.wait")); },
          py::arg("timeout") = Microseconds(0), py::call_guard<py::gil_scoped_release>(),
          "Blocks until the collective finished; True on success, raises its error otherwise.")
      .def("is_completed", &Work::isCompleted, "Whether the collective finished (successfully or not).")
      .def("is_success", &Work::isSuccess, "Whether the collective finished without an error.")
      .def("source_rank", &Work::sourceRank,
           "For a point-to-point receive: the group rank the message came from, once it completed "
           "successfully; -1 for other operations.")
      .def("_source_rank", &Work::sourceRank, "Alias of source_rank() (torch's older name).")
      .def(
          "exception", [](const Work& work) { return toPythonException(work.exception()); },
          "The collective's error as an exception object; None while it runs or if it succeeded.")
      .def(
          "_add_done_callback",
          [](Work& work, py::function callback) {
            // The callback runs on the thread that finishes the Work (or here, at once, if it
            // already finished), with the GIL taken there, and is dropped under the GIL.
            auto held = std::make_shared<ObjectHeldOffThread>(std::move(callback));
            work.addCallback([held](Work& finished) {
              if (pythonIsFinalizing()) return;
              py::gil_scoped_acquire gil;
              py::object function = std::move(held->object);
              try {
                function(toPythonException(finished.exception()));
              } catch (py::error_already_set& error) {
                error.discard_as_unraisable("ringtree.Work done callback");
              }
            });
          },
          py::arg("callback"),
          "Calls callback(error) once the operation finished (error: its exception, None on success), on the "
          "thread that finishes it, or at once if it already finished (private API).")
      .def("__repr__", [](const Work& work) {
        const char* state = !work.isCompleted() ? "pending" : (work.isSuccess() ? "completed" : "failed");
        return std::string("<ringtree.Work ") + work.opName() + " " + state + ">";
      });

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator",
                                                          "rank + size + one connection per peer (private API).")
      .def_static(
          "create",
          [](std::shared_ptr<Store> store, int rank, int size, Microseconds timeout, const std::string& transport,
             const std::string& interface) {
            if (!store) {
              throw InvalidArgument("Communicator.create needs a store, got None");
            }
            CommunicatorOptions options;
            options.transport = parseTransport(transport);
            options.interface = interface;
            options.timeout = toMilliseconds(timeout, "Communicator.create");
            py::gil_scoped_release release;
            return Communicator::create(std::move(store), rank, size, options);
          },
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("transport") = "auto",
          py::arg("interface") = "",
          "Connects to the other ranks through store (a collective over the size ranks); blocks until done.")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("timeout", &Communicator::timeout)
      .def("transport_to", &Communicator::transportTo, py::arg("peer"),
           "'self', 'tcp' or 'shm': how this rank reaches peer.");

  py::class_<ProcessGroup, std::shared_ptr<ProcessGroup>>(m, "ProcessGroup", R"(The CPU engine of a group (private API).

Collectives run in submission order; a synchronous one runs on the calling thread when
nothing is pending. Buffers are torch tensors, NumPy arrays or any object with __dlpack__
or the buffer protocol, used in place.)")
      .def(py::init([](std::shared_ptr<Communicator> communicator) {
             return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(communicator)), destroyProcessGroup);
           }),
           py::arg("communicator"))
      .def("allreduce", &allreduce, py::arg("tensor"), py::arg("op"), py::arg("async_op"),
           py::arg("algorithm") = py::none(),
           "In place: tensor <- op over every rank's tensor. Returns a Work if async_op, else None.")
      .def("broadcast", &broadcast, py::arg("tensor"), py::arg("root"), py::arg("async_op"),
           py::arg("algorithm") = py::none(),
           "In place: tensor <- root's tensor (root is a group rank).")
      .def("reduce", &reduce, py::arg("tensor"), py::arg("root"), py::arg("op"), py::arg("async_op"),
           py::arg("algorithm") = py::none(),
           "In place on root: tensor <- op over every rank's tensor; the others' are left unchanged.")
      .def("allgather", &allgather, py::arg("output_list"), py::arg("input"), py::arg("async_op"),
           py::arg("algorithm") = py::none(),
           "output_list[r] <- rank r's input (one buffer per rank; sizes may differ by rank).")
      .def("allgather_single", &allgatherSingle, py::arg("output"), py::arg("input"), py::arg("async_op"),
           py::arg("algorithm") = py::none(),
           "output (world_size times input's size) <- every rank's input, end to end in rank order.")
      .def("gather", &gather, py::arg("input"), py::arg("output_list"), py::arg("root"), py::arg("async_op"),
           py::arg("algorithm") = py::none(),
           "On root: output_list[r] <- rank r's input; output_list is not used on the other ranks.")
      .def("scatter", &scatter, py::arg("output"), py::arg("input_list"), py::arg("root"), py::arg("async_op"),
           py::arg("algorithm") = py::none(),
           "output <- root's input_list[rank]; input_list is not used on the other ranks.")
      .def("reduce_scatter", &reduceScatter, py::arg("output"), py::arg("input_list"), py::arg("op"),
           py::arg("async_op"), py::arg("algorithm") = py::none(),
           "output <- op over every rank's input_list[rank].")
      .def("reduce_scatter_single", &reduceScatterSingle, py::arg("output"), py::arg("input"), py::arg("op"),
           py::arg("async_op"), py::arg("algorithm") = py::none(),
           "output <- op over every rank's part `rank` of input (world_size equal parts, end to end).")
      .def("alltoall", &alltoall, py::arg("output_list"), py::arg("input_list"), py::arg("async_op"),
           py::arg("algorithm") = py::none(), "output_list[r] <- rank r's input_list[rank].")
      .def("alltoall_single", &alltoallSingle, py::arg("output"), py::arg("input"),
           py::arg("output_split_sizes"), py::arg("input_split_sizes"), py::arg("async_op"),
           py::arg("algorithm") = py::none(),
           "Part r of output <- part `rank` of rank r's input; parts are cut along dim 0, the split "
           "sizes' rows each (None: world_size equal parts), end to end in rank order. input and "
           "output must not overlap.")
      .def("allreduce_coalesced", &allreduceCoalesced, py::arg("tensors"), py::arg("op"), py::arg("async_op"),
           "In place: every buffer of tensors <- op over every rank's buffer at the same index, as one operation.")
      .def("allgather_coalesced", &allgatherCoalesced, py::arg("output_lists"), py::arg("input_list"),
           py::arg("async_op"), "output_lists[r][i] <- rank r's input_list[i], as one allgather.")
      .def("barrier", &barrier, py::arg("timeout"), py::arg("async_op"),
           "Returns once every rank entered the barrier (timeout: timedelta or None for the group's).")
      .def("shutdown", &ProcessGroup::shutdown, py::call_guard<py::gil_scoped_release>(),
           "Refuses new collectives, runs the queued ones and stops the worker thread.")
      .def_property_readonly("rank", &ProcessGroup::rank)
      .def_property_readonly("size", &ProcessGroup::size)
      .def_property_readonly("communicator", &ProcessGroup::communicator, py::return_value_policy::reference_internal)
      .def_property_readonly("is_shutdown", &ProcessGroup::isShutdown)
      .def_property_readonly("_inline_call_count", &ProcessGroup::inlineCallCount,
                             "How many synchronous collectives ran on the calling thread (a debug counter).");
}

}  // namespace ringtree::python
