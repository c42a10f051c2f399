#include "work.h"

#include <pybind11/chrono.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

#include <ringtree/error.h>

#include "buffers.h"
#include "errors.h"
#include "fast_methods.h"

namespace py = pybind11;

namespace ringtree::python {

namespace {

using Microseconds = std::chrono::microseconds;

// Python objects owned by C++ code that may drop them on a thread without the GIL (the
// worker that finishes a Work, say): the destructor takes the GIL to release them, or
// leaks them while the interpreter shuts down.
struct HeldOffThread {
  HeldOffThread() = default;
  HeldOffThread(const HeldOffThread&) = delete;
  HeldOffThread& operator=(const HeldOffThread&) = delete;
  ~HeldOffThread() {
    if (pythonIsFinalizing()) {
      outputs.release();
      future.release();
      callback.release();
      return;
    }
    if (PyGILState_Check() != 0) {  // the usual case: the last reference was a Python object's
      clear();
      return;
    }
    py::gil_scoped_acquire gil;
    clear();
  }

  void clear() {
    outputs = py::object();
    future = py::object();
    callback = py::object();
  }

  py::object outputs;      // a list of the tensors the operation writes, or the one tensor
  bool oneTensor = false;  // outputs is the one tensor
  py::object future;       // the torch.futures.Future of get_future(), once made
  py::object callback;     // a done callback waiting to run
};

// The tensors the operation writes as a list: the Work's own list, or a new [tensor] for
// a one-tensor Work. GIL held.
py::list outputList(const HeldOffThread& state) {
  if (!state.oneTensor) return py::list(state.outputs);
  py::list list;
  list.append(state.outputs);
  return list;
}

// The Work's Python state (Work::attachment), made on first need. GIL held.
std::shared_ptr<HeldOffThread> stateOf(Work& work) {
  auto state = std::static_pointer_cast<HeldOffThread>(work.attachment());
  if (!state) {
    state = std::make_shared<HeldOffThread>();
    state->outputs = py::list();
    work.setAttachment(state);
  }
  return state;
}

// Calls callback(error) on the thread that finishes the Work (or here, at once, if it
// already finished), with the GIL taken there; error is the exception, None on success.
void addDoneCallback(Work& work, py::function callback) {
  auto held = std::make_shared<HeldOffThread>();
  held->callback = std::move(callback);
  work.addCallback([held](Work& finished) {
    if (pythonIsFinalizing()) return;
    py::gil_scoped_acquire gil;
    py::object function = std::move(held->callback);
    try {
      function(toPythonException(finished.exception()));
    } catch (py::error_already_set& error) {
      error.discard_as_unraisable("ringtree.Work done callback");
    }
  });
}

py::list result(Work& work) {
  if (!work.isCompleted()) {
    throw std::runtime_error(
        "Work needs to be completed before calling result(). Should call wait() before result().");
  }
  return outputList(*stateOf(work));
}

// torch's Work.get_future(): a torch.futures.Future that the thread finishing the
// operation completes, with result()'s list or with the operation's error. The same
// Future on every call.
py::object getFuture(Work& work) {
  const auto state = stateOf(work);
  if (state->future) return state->future;
  py::object futureType;
  try {
    futureType = py::module_::import("torch.futures").attr("Future");
  } catch (py::error_already_set& error) {
    if (!error.matches(PyExc_ImportError)) throw;
    throw std::runtime_error("Work.get_future() returns a torch.futures.Future: it needs torch installed");
  }
  py::object future = futureType();
  state->future = future;
  py::list outputs = outputList(*state);
  py::object setResult = future.attr("set_result");
  py::object setException = future.attr("set_exception");
  addDoneCallback(work, py::cpp_function([setResult, setException, outputs](py::object error) {
    if (error.is_none()) {
      setResult(outputs);
    } else {
      setException(error);
    }
  }));
  return future;
}

// The pybind11 wait method that fastWait replaced.
PyObject* pybindWait = nullptr;

// Work.wait() without arguments, the caller that waits at once, as a vectorcall method:
// pybind11's dispatch (the timeout's loader and default, the call guard) is left out of
// every isend/irecv/async call + wait, and a Work that completed already keeps the GIL. A
// call with a timeout goes to the pybind11 method.
PyObject* fastWait(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (nargs != 0 || kwnames != nullptr) return callReplaced(pybindWait, self, args, nargs, kwnames);
  try {
    Work& work = boundValue<Work>(self);
    if (work.isCompleted()) return PyBool_FromLong(work.wait() ? 1 : 0);  // returns or raises at once
    bool success = false;
    {
      py::gil_scoped_release release;
      success = work.wait(std::chrono::milliseconds(0));
    }
    return PyBool_FromLong(success ? 1 : 0);
  } catch (...) {
    return raiseCurrentException();
  }
}

}  // namespace

py::object pythonWork(std::shared_ptr<Work> work, py::list outputs) {
  auto state = std::make_shared<HeldOffThread>();
  state->outputs = std::move(outputs);
  work->setAttachment(std::move(state));
  return py::cast(std::move(work));
}

std::shared_ptr<void> oneTensorState(py::handle tensor) {
  auto state = std::make_shared<HeldOffThread>();
  state->outputs = py::reinterpret_borrow<py::object>(tensor);
  state->oneTensor = true;
  return state;
}

py::object pythonWorkWithState(std::shared_ptr<Work> work, std::shared_ptr<void> state) {
  work->setAttachment(std::move(state));
  return py::cast(std::move(work));
}

py::object pythonWorkOn(std::shared_ptr<Work> work, py::handle tensor) {
  return pythonWorkWithState(std::move(work), oneTensorState(tensor));
}

void initWork(py::module_& m) {
  py::class_<Work, std::shared_ptr<Work>>(m, "Work", R"(Handle of an asynchronous collective (async_op=True) or
point-to-point operation (isend, irecv, batch_isend_irecv), with torch 2.13's Work API.

wait(timeout) blocks until it finished (timeout: timedelta, 0 = no limit), returns True,
and raises the operation's error if it failed; when the timeout passes first it raises
DistTimeoutError and the operation keeps running. The buffers must not be used until
the work completed.)")
      .def(
          "wait",
          [](Work& work, Microseconds timeout) {
            if (timeout.count() < 0) {
              throw InvalidArgument("Work.wait: timeout must not be negative, got " + std::to_string(timeout.count()) +
                                    " us");
            }
            return work.wait(std::chrono::ceil<std::chrono::milliseconds>(timeout));
          },
          py::arg("timeout") = Microseconds(0), py::call_guard<py::gil_scoped_release>(),
          "Blocks until the operation finished; True on success, raises its error otherwise.")
      .def("is_completed", &Work::isCompleted, "Whether the operation finished (successfully or not).")
      .def("is_success", &Work::isSuccess, "Whether the operation finished without an error.")
      .def("source_rank", &Work::sourceRank,
           "For a point-to-point receive: the group rank the message came from, once it completed "
           "successfully; -1 for other operations.")
      .def("_source_rank", &Work::sourceRank, "Alias of source_rank() (torch's older name).")
      .def(
          "exception", [](const Work& work) { return toPythonException(work.exception()); },
          "The operation's error as an exception object; None while it runs or if it succeeded.")
      .def("result", &result,
           "The tensors the operation wrote, as torch 2.13's gloo backend gives them: [tensor] for all_reduce, "
           "broadcast, reduce, scatter, reduce_scatter*, all_to_all_single, isend and irecv; the output list for "
           "all_gather and all_to_all; gather_list on the destination ([] elsewhere); the flattened output lists for "
           "all_gather_coalesced; [] for barrier; [output] for all_gather_single. Raises RuntimeError while the "
           "operation runs.")
      .def("get_future", &getFuture,
           "A torch.futures.Future that the thread finishing the operation completes, with result()'s list on "
           "success, with the operation's error otherwise; the same Future on every call. fut.then(...) callbacks "
           "run on that thread. Needs torch.")
      .def(
          "synchronize", [](const Work&) {},
          "Nothing to do for host memory, written before the Work completes (torch's synchronize() orders device "
          "streams).")
      .def("_add_done_callback", &addDoneCallback, py::arg("callback"),
           "Calls callback(error) once the operation finished (error: its exception, None on success), on the "
           "thread that finishes it, or at once if it already finished (private API).")
      .def("__repr__", [](const Work& work) {
        const char* state = !work.isCompleted() ? "pending" : (work.isSuccess() ? "completed" : "failed");
        return std::string("<ringtree.Work ") + work.opName() + " " + state + ">";
      });
  pybindWait = replaceWithFastMethod(m.attr("Work"), "wait", &fastWait);
}

}  // namespace ringtree::python
