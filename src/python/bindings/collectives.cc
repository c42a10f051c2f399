#include "collectives.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

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

}  // namespace

void initCollectives(py::module_& m) {
  py::class_<Work, std::shared_ptr<Work>>(m, "Work", R"(Handle of an asynchronous collective (async_op=True).

wait(timeout) blocks until it finished (timeout: timedelta, 0 = no limit), returns True,
and raises the collective's error if it failed; when the timeout passes first it raises
DistTimeoutError and the collective keeps running. The buffer must not be used until
the work completed.)")
      .def(
          "wait",
          [](Work& work, Microseconds timeout) { return work.wait(toMilliseconds(timeout, "Work.wait")); },
          py::arg("timeout") = Microseconds(0), py::call_guard<py::gil_scoped_release>(),
          "Blocks until the collective finished; True on success, raises its error otherwise.")
      .def("is_completed", &Work::isCompleted, "Whether the collective finished (successfully or not).")
      .def("is_success", &Work::isSuccess, "Whether the collective finished without an error.")
      .def(
          "exception", [](const Work& work) { return toPythonException(work.exception()); },
          "The collective's error as an exception object; None while it runs or if it succeeded.")
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
