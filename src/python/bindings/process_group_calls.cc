#include "process_group_calls.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ringtree/error.h>
#include <ringtree/options.h>
#include <ringtree/process_group.h>

#include "buffers.h"
#include "gil_until_wait.h"
#include "work.h"

namespace py = pybind11;

// Conversion only: Python objects become BufferViews and options, and every check of
// the arguments themselves is ProcessGroup's (its messages name torch's arguments).
namespace ringtree::python {

namespace {

using Microseconds = std::chrono::microseconds;

// `op` is a ReduceOp.RedOpType (an int, or any integer-like object such as torch's
// RedOpType) or a ReduceOp instance (.op, and .factor for PREMUL_SUM), ringtree's or
// torch's, as torch.distributed accepts both.
void parseReduceOp(py::handle op, ReduceOp& out, double& factor) {
  py::handle code = op;
  py::object inner;
  if (!PyLong_Check(op.ptr()) && py::hasattr(op, "op")) {
    inner = op.attr("op");
    code = inner;
  }
  if (!PyIndex_Check(code.ptr())) {
    throw py::type_error(std::string("op must be a ReduceOp or a ReduceOp.RedOpType, got ") +
                         Py_TYPE(op.ptr())->tp_name);
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

// A call's `timeout=`: none keeps the group's (0 ms); a timedelta must be positive (the
// core refuses negative ones).
std::chrono::milliseconds callTimeout(const std::optional<Microseconds>& timeout, const char* what) {
  if (!timeout.has_value()) return std::chrono::milliseconds(0);
  const auto milliseconds = calls::toMilliseconds(*timeout);
  if (milliseconds.count() == 0) {  // 0 would mean "the group's timeout"
    throw InvalidArgument(std::string(what) + ": timeout must be positive, got 0");
  }
  return milliseconds;
}

template <typename Options>
Options optionsWith(py::handle algorithm, const std::optional<Microseconds>& timeout, const char* what) {
  Options options;
  options.algorithm = parseAlgorithmArgument(algorithm);
  options.timeout = callTimeout(timeout, what);
  return options;
}

// all_to_all_single's split sizes: None or a sequence of ints (empty: equal parts).
std::vector<int64_t> parseSplitSizes(py::handle sizes, const char* name) {
  std::vector<int64_t> parsed;
  if (sizes.is_none()) return parsed;
  if (!PySequence_Check(sizes.ptr())) {
    throw py::type_error(std::string("all_to_all_single: ") + name + " must be a list of ints, got " +
                         Py_TYPE(sizes.ptr())->tp_name);
  }
  for (py::handle size : py::reinterpret_borrow<py::sequence>(sizes)) {
    if (!PyLong_Check(size.ptr())) {
      throw py::type_error(std::string("all_to_all_single: ") + name + " must be a list of ints, got an element of type " +
                           Py_TYPE(size.ptr())->tp_name);
    }
    parsed.push_back(size.cast<int64_t>());
  }
  return parsed;
}

bool onHost(const BufferView& view) { return view.device.type == DeviceType::kCpu; }

// Whether a call on `view` alone may keep the GIL until it waits (GilUntilWait).
bool holdsGil(const BufferView& view) { return onHost(view) && view.bytes() <= kHoldGilBytes; }

// The buffers one call borrows: on the stack for a synchronous call, owned by the Work of
// an asynchronous one (its keep-alive), so that they stay borrowed until it completes.
// Borrowed with the GIL held; released on any thread (see Buffer).
class Borrowed {
 public:
  // hold: how one() borrows (Hold::kCall for a synchronous call's own arguments).
  Borrowed(const char* what, Hold hold) : what_(what), hold_(hold) {}

  BufferView one(py::handle object, Access access) { return borrow(object, access, hold_); }

  // Whether the call may keep the GIL until it waits (GilUntilWait): every buffer
  // borrowed so far is in host memory, and they hold at most kHoldGilBytes in all.
  bool holdsGil() const { return onHost_ && bytes_ <= kHoldGilBytes; }

  // Every element of `list` (the argument `name`), which must be a list or a tuple
  // (TypeError otherwise); None is an empty list when `noneIsEmpty`.
  std::vector<BufferView> list(py::handle list, Access access, const char* name, bool noneIsEmpty = false) {
    std::vector<BufferView> views;
    if (noneIsEmpty && list.is_none()) return views;
    if (!PyList_Check(list.ptr()) && !PyTuple_Check(list.ptr())) {
      throw py::type_error(std::string(what_) + ": " + name + " must be a list of tensors, got " +
                           Py_TYPE(list.ptr())->tp_name);
    }
    const auto elements = py::reinterpret_borrow<py::sequence>(list);
    views.reserve(elements.size());
    buffers_.reserve(buffers_.size() + elements.size());
    // Owned exports: another thread may take an element out of the list (its last
    // reference) while the call runs without the GIL.
    for (py::handle element : elements) views.push_back(borrow(element, access, Hold::kExport));
    return views;
  }

 private:
  // The first kInline buffers live in the object: a call on one or two tensors allocates
  // nothing for them.
  static constexpr size_t kInline = 2;

  BufferView borrow(py::handle object, Access access, Hold hold) {
    Buffer* buffer = nullptr;
    if (inlineCount_ < kInline) {
      std::optional<Buffer>& slot = inline_[inlineCount_++];
      slot.emplace(object, access, what_, hold);
      buffer = &*slot;
    } else {
      buffer = &buffers_.emplace_back(object, access, what_, hold);
    }
    const BufferView view = buffer->view();
    onHost_ = onHost_ && ringtree::python::onHost(view);
    bytes_ += view.bytes();
    return view;
  }

  const char* what_;
  Hold hold_;
  bool onHost_ = true;
  size_t bytes_ = 0;
  std::array<std::optional<Buffer>, kInline> inline_;
  size_t inlineCount_ = 0;
  std::vector<Buffer> buffers_;
};

// How a call's own tensor arguments are borrowed: the caller's frame holds them while a
// synchronous call runs.
Hold holdFor(bool asyncOp) { return asyncOp ? Hold::kExport : Hold::kCall; }

// A call over the buffers `borrowed` holds: with asyncOp, submitted by async(keepAlive)
// with them as the Work's keep-alive and outputs() kept by the Python Work for
// Work.result() (returns the Work); else sync() at once, with the GIL until it waits
// (returns None).
template <typename Sync, typename Async, typename Outputs>
py::object run(bool asyncOp, Borrowed& borrowed, const Sync& sync, const Async& async, const Outputs& outputs) {
  if (asyncOp) {
    return pythonWork(async(std::make_shared<Borrowed>(std::move(borrowed))), outputs());
  }
  {
    const GilUntilWait gil(borrowed.holdsGil());
    sync();
  }
  return py::none();
}

using KeepAlive = std::shared_ptr<void>;

// What keeps the memory of an asynchronous call on one tensor (a collective's, isend's,
// irecv's) while the operation runs: the Work's state, whose reference to the tensor is
// enough for a borrowed torch tensor (what an owning export would hold), or else the
// buffer's own export. An operation that completes while it is posted drops it at once,
// with no export made and freed for it. Needs no GIL (~Buffer takes it where it must).
KeepAlive keepAliveFor(Buffer&& buffer, const KeepAlive& state) {
  if (!buffer.ownsExport()) return state;
  return std::make_shared<Buffer>(std::move(buffer));
}

// The same for the calls on one buffer (borrowed with Hold::kCall either way), which need
// no Borrowed on the synchronous path.
template <typename Sync, typename Async>
py::object runOne(bool asyncOp, Buffer& buffer, py::handle tensor, const Sync& sync, const Async& async) {
  const BufferView view = buffer.view();
  if (asyncOp) {
    KeepAlive state = oneTensorState(tensor);
    std::shared_ptr<Work> work = async(view, keepAliveFor(std::move(buffer), state));  // before state moves on
    return pythonWorkWithState(std::move(work), std::move(state));
  }
  {
    const GilUntilWait gil(holdsGil(view));
    sync(view);
  }
  return py::none();
}

py::list listOf(py::handle tensor) {
  py::list list;
  list.append(tensor);
  return list;
}

// A new list of the elements of `sequence` (a list or a tuple the call already read).
py::list copyOf(py::handle sequence) {
  PyObject* list = PySequence_List(sequence.ptr());
  if (list == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::list>(list);
}

// Whether isend/irecv may post `buffer` with the GIL until the post waits (GilUntilWait):
// a small host buffer (holdsGil) that owns no export (a borrowed torch tensor, which the
// Python Work keeps: the engine's thread never takes the GIL to let go of it). A post
// waits only for the engine's lock while another thread holds it, or does work of other
// operations' that counts as a wait (a direct pull): the hook releases the GIL then. A
// buffer with an export of its own is posted with the GIL released, as before: its
// release on the engine's thread would wait for the GIL.
bool postWithGil(const Buffer& buffer) { return holdsGil(buffer.view()) && !buffer.ownsExport(); }

}  // namespace

namespace calls {

py::object allreduce(ProcessGroup& group, py::handle tensor, py::handle op, bool asyncOp, py::handle algorithm, const Timeout& timeout) {
  auto options = optionsWith<AllreduceOptions>(algorithm, timeout, "all_reduce");
  parseReduceOp(op, options.op, options.premulFactor);
  Buffer buffer(tensor, Access::kReadWrite, "all_reduce", Hold::kCall);
  return runOne(
      asyncOp, buffer, tensor, [&](const BufferView& view) { group.allreduce(view, options); },
      [&](const BufferView& view, KeepAlive keepAlive) { return group.allreduceAsync(view, options, keepAlive); });
}

py::object broadcast(ProcessGroup& group, py::handle tensor, int root, bool asyncOp, py::handle algorithm, const Timeout& timeout) {
  auto options = optionsWith<BroadcastOptions>(algorithm, timeout, "broadcast");
  options.root = root;
  Buffer buffer(tensor, root == group.rank() ? Access::kRead : Access::kReadWrite, "broadcast", Hold::kCall);
  return runOne(
      asyncOp, buffer, tensor, [&](const BufferView& view) { group.broadcast(view, options); },
      [&](const BufferView& view, KeepAlive keepAlive) { return group.broadcastAsync(view, options, keepAlive); });
}

py::object reduce(ProcessGroup& group, py::handle tensor, int root, py::handle op, bool asyncOp,
                  py::handle algorithm, const Timeout& timeout) {
  auto options = optionsWith<ReduceOptions>(algorithm, timeout, "reduce");
  options.root = root;
  parseReduceOp(op, options.op, options.premulFactor);
  Buffer buffer(tensor, Access::kReadWrite, "reduce", Hold::kCall);
  return runOne(
      asyncOp, buffer, tensor, [&](const BufferView& view) { group.reduce(view, options); },
      [&](const BufferView& view, KeepAlive keepAlive) { return group.reduceAsync(view, options, keepAlive); });
}

py::object allreduceCoalesced(ProcessGroup& group, py::handle tensors, py::handle op, bool asyncOp, const Timeout& timeout) {
  AllreduceOptions options;
  options.timeout = callTimeout(timeout, "all_reduce_coalesced");
  parseReduceOp(op, options.op, options.premulFactor);
  Borrowed borrowed("all_reduce_coalesced", holdFor(asyncOp));
  const auto views = borrowed.list(tensors, Access::kReadWrite, "tensors");
  return run(
      asyncOp, borrowed, [&] { group.allreduceCoalesced(views, options); },
      [&](KeepAlive keepAlive) { return group.allreduceCoalescedAsync(views, options, keepAlive); },
      [&] { return copyOf(tensors); });
}

py::object allgather(ProcessGroup& group, py::handle tensorList, py::handle tensor, bool asyncOp,
                     py::handle algorithm, const Timeout& timeout) {
  const auto options = optionsWith<AllgatherOptions>(algorithm, timeout, "all_gather");
  Borrowed borrowed("all_gather", holdFor(asyncOp));
  const BufferView input = borrowed.one(tensor, Access::kRead);
  const auto outputs = borrowed.list(tensorList, Access::kReadWrite, "tensor_list");
  return run(
      asyncOp, borrowed, [&] { group.allgather(outputs, input, options); },
      [&](KeepAlive keepAlive) { return group.allgatherAsync(outputs, input, options, keepAlive); },
      [&] { return copyOf(tensorList); });
}

py::object allgatherSingle(ProcessGroup& group, py::handle outputTensor, py::handle inputTensor, bool asyncOp,
                           py::handle algorithm, const Timeout& timeout) {
  const auto options = optionsWith<AllgatherOptions>(algorithm, timeout, "all_gather_single");
  Borrowed borrowed("all_gather_single", holdFor(asyncOp));
  const BufferView output = borrowed.one(outputTensor, Access::kReadWrite);
  const BufferView input = borrowed.one(inputTensor, Access::kRead);
  return run(
      asyncOp, borrowed, [&] { group.allgatherSingle(output, input, options); },
      [&](KeepAlive keepAlive) { return group.allgatherSingleAsync(output, input, options, keepAlive); },
      [&] { return listOf(outputTensor); });
}

py::object allgatherCoalesced(ProcessGroup& group, py::handle outputTensorLists, py::handle inputTensorList,
                              bool asyncOp, const Timeout& timeout) {
  AllgatherOptions options;
  options.timeout = callTimeout(timeout, "all_gather_coalesced");
  Borrowed borrowed("all_gather_coalesced", holdFor(asyncOp));
  const auto inputs = borrowed.list(inputTensorList, Access::kRead, "input_tensor_list");
  if (!PyList_Check(outputTensorLists.ptr()) && !PyTuple_Check(outputTensorLists.ptr())) {
    throw py::type_error(std::string("all_gather_coalesced: output_tensor_lists must be a list of lists of tensors, "
                                     "got ") + Py_TYPE(outputTensorLists.ptr())->tp_name);
  }
  std::vector<std::vector<BufferView>> outputs;
  py::list flattened;
  size_t r = 0;
  for (py::handle list : py::reinterpret_borrow<py::sequence>(outputTensorLists)) {
    const std::string name = "output_tensor_lists[" + std::to_string(r++) + "]";
    outputs.push_back(borrowed.list(list, Access::kReadWrite, name.c_str()));
    for (py::handle tensor : py::reinterpret_borrow<py::sequence>(list)) flattened.append(tensor);
  }
  return run(
      asyncOp, borrowed, [&] { group.allgatherCoalesced(outputs, inputs, options); },
      [&](KeepAlive keepAlive) { return group.allgatherCoalescedAsync(outputs, inputs, options, keepAlive); },
      [&] { return flattened; });
}

py::object allgatherSingleCoalesced(ProcessGroup& group, py::handle outputTensors, py::handle inputTensors,
                                    bool asyncOp, const Timeout& timeout) {
  AllgatherOptions options;
  options.timeout = callTimeout(timeout, "all_gather_single_coalesced");
  Borrowed borrowed("all_gather_single_coalesced", holdFor(asyncOp));
  const auto outputs = borrowed.list(outputTensors, Access::kReadWrite, "output_tensors");
  const auto inputs = borrowed.list(inputTensors, Access::kRead, "input_tensors");
  return run(
      asyncOp, borrowed, [&] { group.allgatherSingleCoalesced(outputs, inputs, options); },
      [&](KeepAlive keepAlive) { return group.allgatherSingleCoalescedAsync(outputs, inputs, options, keepAlive); },
      [&] { return copyOf(outputTensors); });
}

py::object gather(ProcessGroup& group, py::handle tensor, py::handle gatherList, int root, bool asyncOp,
                  py::handle algorithm, const Timeout& timeout) {
  auto options = optionsWith<GatherOptions>(algorithm, timeout, "gather");
  options.root = root;
  Borrowed borrowed("gather", holdFor(asyncOp));
  const BufferView input = borrowed.one(tensor, Access::kRead);
  const auto outputs = borrowed.list(gatherList, Access::kReadWrite, "gather_list", /*noneIsEmpty=*/true);
  return run(
      asyncOp, borrowed, [&] { group.gather(input, outputs, options); },
      [&](KeepAlive keepAlive) { return group.gatherAsync(input, outputs, options, keepAlive); },
      [&] { return root == group.rank() ? copyOf(gatherList) : py::list(); });
}

py::object scatter(ProcessGroup& group, py::handle tensor, py::handle scatterList, int root, bool asyncOp,
                   py::handle algorithm, const Timeout& timeout) {
  auto options = optionsWith<ScatterOptions>(algorithm, timeout, "scatter");
  options.root = root;
  Borrowed borrowed("scatter", holdFor(asyncOp));
  const BufferView output = borrowed.one(tensor, Access::kReadWrite);
  const auto inputs = borrowed.list(scatterList, Access::kRead, "scatter_list", /*noneIsEmpty=*/true);
  return run(
      asyncOp, borrowed, [&] { group.scatter(output, inputs, options); },
      [&](KeepAlive keepAlive) { return group.scatterAsync(output, inputs, options, keepAlive); },
      [&] { return listOf(tensor); });
}

py::object reduceScatter(ProcessGroup& group, py::handle output, py::handle inputList, py::handle op, bool asyncOp,
                         py::handle algorithm, const Timeout& timeout) {
  auto options = optionsWith<ReduceScatterOptions>(algorithm, timeout, "reduce_scatter");
  parseReduceOp(op, options.op, options.premulFactor);
  Borrowed borrowed("reduce_scatter", holdFor(asyncOp));
  const BufferView out = borrowed.one(output, Access::kReadWrite);
  const auto inputs = borrowed.list(inputList, Access::kRead, "input_list");
  return run(
      asyncOp, borrowed, [&] { group.reduceScatter(out, inputs, options); },
      [&](KeepAlive keepAlive) { return group.reduceScatterAsync(out, inputs, options, keepAlive); },
      [&] { return listOf(output); });
}

py::object reduceScatterSingle(ProcessGroup& group, py::handle output, py::handle input, py::handle op, bool asyncOp,
                               py::handle algorithm, const Timeout& timeout) {
  auto options = optionsWith<ReduceScatterOptions>(algorithm, timeout, "reduce_scatter_single");
  parseReduceOp(op, options.op, options.premulFactor);
  Borrowed borrowed("reduce_scatter_single", holdFor(asyncOp));
  const BufferView out = borrowed.one(output, Access::kReadWrite);
  const BufferView in = borrowed.one(input, Access::kRead);
  return run(
      asyncOp, borrowed, [&] { group.reduceScatterSingle(out, in, options); },
      [&](KeepAlive keepAlive) { return group.reduceScatterSingleAsync(out, in, options, keepAlive); },
      [&] { return listOf(output); });
}

py::object reduceScatterSingleCoalesced(ProcessGroup& group, py::handle outputs, py::handle inputs, py::handle op,
                                        bool asyncOp, const Timeout& timeout) {
  ReduceScatterOptions options;
  options.timeout = callTimeout(timeout, "reduce_scatter_single_coalesced");
  parseReduceOp(op, options.op, options.premulFactor);
  Borrowed borrowed("reduce_scatter_single_coalesced", holdFor(asyncOp));
  const auto outs = borrowed.list(outputs, Access::kReadWrite, "outputs");
  const auto ins = borrowed.list(inputs, Access::kRead, "inputs");
  return run(
      asyncOp, borrowed, [&] { group.reduceScatterSingleCoalesced(outs, ins, options); },
      [&](KeepAlive keepAlive) { return group.reduceScatterSingleCoalescedAsync(outs, ins, options, keepAlive); },
      [&] { return copyOf(outputs); });
}

py::object alltoall(ProcessGroup& group, py::handle outputTensorList, py::handle inputTensorList, bool asyncOp,
                    py::handle algorithm, const Timeout& timeout) {
  const auto options = optionsWith<AlltoallOptions>(algorithm, timeout, "all_to_all");
  Borrowed borrowed("all_to_all", holdFor(asyncOp));
  const auto outputs = borrowed.list(outputTensorList, Access::kReadWrite, "output_tensor_list");
  const auto inputs = borrowed.list(inputTensorList, Access::kRead, "input_tensor_list");
  return run(
      asyncOp, borrowed, [&] { group.alltoall(outputs, inputs, options); },
      [&](KeepAlive keepAlive) { return group.alltoallAsync(outputs, inputs, options, keepAlive); },
      [&] { return copyOf(outputTensorList); });
}

py::object alltoallSingle(ProcessGroup& group, py::handle output, py::handle input, py::handle outputSplitSizes,
                          py::handle inputSplitSizes, bool asyncOp, py::handle algorithm, const Timeout& timeout) {
  const auto options = optionsWith<AlltoallOptions>(algorithm, timeout, "all_to_all_single");
  const std::vector<int64_t> outputSplits = parseSplitSizes(outputSplitSizes, "output_split_sizes");
  const std::vector<int64_t> inputSplits = parseSplitSizes(inputSplitSizes, "input_split_sizes");
  Borrowed borrowed("all_to_all_single", holdFor(asyncOp));
  const BufferView out = borrowed.one(output, Access::kReadWrite);
  const BufferView in = borrowed.one(input, Access::kRead);
  return run(
      asyncOp, borrowed, [&] { group.alltoallSingle(out, in, outputSplits, inputSplits, options); },
      [&](KeepAlive keepAlive) {
        return group.alltoallSingleAsync(out, in, outputSplits, inputSplits, options, keepAlive);
      },
      [&] { return listOf(output); });
}

py::object barrier(ProcessGroup& group, const Timeout& timeout, bool asyncOp) {
  BarrierOptions options;
  options.timeout = callTimeout(timeout, "barrier");
  if (asyncOp) {
    return pythonWork(group.barrierAsync(options), py::list());
  }
  py::gil_scoped_release release;
  group.barrier(options);
  return py::none();
}

// Point-to-point. Calls on small host buffers keep the GIL until they wait (GilUntilWait,
// postWithGil): then the engine's progress thread may need it to release a finished
// operation's buffer. A blocking call's buffer is released with the GIL held.
void send(ProcessGroup& group, py::handle tensor, int dst, int tag) {
  const Buffer buffer(tensor, Access::kRead, "send", Hold::kCall);
  const GilUntilWait gil(holdsGil(buffer.view()));
  group.send(buffer.view(), dst, tag);
}

int recv(ProcessGroup& group, py::handle tensor, int src, int tag) {
  const Buffer buffer(tensor, Access::kReadWrite, "recv", Hold::kCall);
  const GilUntilWait gil(holdsGil(buffer.view()));
  return group.recv(buffer.view(), src, tag);
}

py::object isend(ProcessGroup& group, py::handle tensor, int dst, int tag) {
  Buffer buffer(tensor, Access::kRead, "isend", Hold::kCall);
  const BufferView view = buffer.view();
  std::shared_ptr<void> state = oneTensorState(tensor);
  std::shared_ptr<Work> work;
  {
    const GilUntilWait gil(postWithGil(buffer));
    work = group.isend(view, dst, tag, keepAliveFor(std::move(buffer), state));
  }
  return pythonWorkWithState(std::move(work), std::move(state));
}

py::object irecv(ProcessGroup& group, py::handle tensor, int src, int tag) {
  Buffer buffer(tensor, Access::kReadWrite, "irecv", Hold::kCall);
  const BufferView view = buffer.view();
  std::shared_ptr<void> state = oneTensorState(tensor);
  std::shared_ptr<Work> work;
  {
    const GilUntilWait gil(postWithGil(buffer));
    work = group.irecv(view, src, tag, keepAliveFor(std::move(buffer), state));
  }
  return pythonWorkWithState(std::move(work), std::move(state));
}

// ops: (is_send, tensor, peer, tag) tuples, posted together.
py::list batchIsendIrecv(ProcessGroup& group, const std::vector<py::tuple>& ops) {
  auto buffers = std::make_shared<std::vector<Buffer>>();
  buffers->reserve(ops.size());
  std::vector<PointToPointOp> native;
  native.reserve(ops.size());
  for (const py::tuple& op : ops) {
    if (op.size() != 4) throw py::value_error("batch_isend_irecv: each op is (is_send, tensor, peer, tag)");
    const bool send = op[0].cast<bool>();
    buffers->emplace_back(op[1], send ? Access::kRead : Access::kReadWrite, send ? "isend" : "irecv");
    native.push_back(PointToPointOp{send, buffers->back().view(), op[2].cast<int>(), op[3].cast<int>()});
  }
  std::vector<std::shared_ptr<Work>> works;
  {
    py::gil_scoped_release release;
    works = group.batchIsendIrecv(native, buffers);
  }
  py::list result;
  for (size_t i = 0; i < works.size(); ++i) result.append(pythonWorkOn(works[i], ops[i][1]));
  return result;
}

}  // namespace calls

}  // namespace ringtree::python
