#include "work.h"

#include <datetime.h>
#include <structmember.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include <ringtree/error.h>

#include "buffers.h"
#include "errors.h"
#include "fast_methods.h"
#include "gil_until_wait.h"

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
    const PythonRunsHere python;  // letting go of the objects may run __del__
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

// ringtree.Work: a CPython type of the module's own rather than a pybind11 class, so that
// making and dropping the Work of an async call costs an allocation, without pybind11's
// instance registry (its insert and erase were ~70 ns of every async call). Each Python
// Work has its own state: operations that share one C++ Work (a CUDA batch_isend_irecv's)
// still give each op's own tensor from result() and get_future(). Not GC-tracked: it
// references no Python object itself (the state holds the Python objects, out of the
// collector's sight, as pybind11's holder did).
struct PyWork {
  PyObject_HEAD
  std::shared_ptr<Work> work;             // constructed in pythonWorkWithState, destroyed in dealloc
  std::shared_ptr<HeldOffThread> state;   // likewise; set there, or made on first need
  PyObject* weakrefs;                     // weak references to this object, for the interpreter
};

PyWork& asPyWork(PyObject* self) { return *reinterpret_cast<PyWork*>(self); }

// The Python Work's state, made on first need. GIL held.
HeldOffThread& stateOf(PyWork& self) {
  if (!self.state) {
    self.state = std::make_shared<HeldOffThread>();
    self.state->outputs = py::list();
  }
  return *self.state;
}

// Calls callback(error) on the thread that finishes the Work (or here, at once, if it
// already finished), with the GIL taken there; error is the exception, None on success.
void addDoneCallback(Work& work, py::function callback) {
  auto held = std::make_shared<HeldOffThread>();
  held->callback = std::move(callback);
  // Adding it may wait (a point-to-point Work hands its operation to the engine's thread,
  // taking the engine's lock): the GIL goes if it does.
  const GilUntilWait gilWhileAdding(true);
  work.addCallback([held](Work& finished) {
    if (pythonIsFinalizing()) return;
    py::gil_scoped_acquire gil;
    const PythonRunsHere python;
    py::object function = std::move(held->callback);
    try {
      function(toPythonException(finished.exception()));
    } catch (py::error_already_set& error) {
      error.discard_as_unraisable("ringtree.Work done callback");
    }
  });
}

py::list result(PyWork& self) {
  if (!self.work->isCompleted()) {
    throw std::runtime_error(
        "Work needs to be completed before calling result(). Should call wait() before result().");
  }
  return outputList(stateOf(self));
}

// torch's Work.get_future(): a torch.futures.Future that the thread finishing the
// operation completes, with result()'s list or with the operation's error. The same
// Future on every call.
py::object getFuture(PyWork& self) {
  HeldOffThread* state = &stateOf(self);
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
  addDoneCallback(*self.work, py::cpp_function([setResult, setException, outputs](py::object error) {
    if (error.is_none()) {
      setResult(outputs);
    } else {
      setException(error);
    }
  }));
  return future;
}

// ---------------------------------------------------------------------------------------
// The type's methods and slots.

PyTypeObject* workType = nullptr;  // the type, kept for the module's life

Work& workOf(PyObject* self) { return *asPyWork(self).work; }

// Calls body() and returns its result, or sets the Python error of what it threw.
template <typename Body>
PyObject* guarded(Body&& body) {
  try {
    return body();
  } catch (...) {
    return raiseCurrentException();
  }
}

// Whether a vectorcall's keyword names are none, or `name` alone.
bool onlyKeyword(PyObject* kwnames, const char* name) {
  return kwnames == nullptr || PyTuple_GET_SIZE(kwnames) == 0 ||
         (PyTuple_GET_SIZE(kwnames) == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), name) == 0);
}

// A wait() timeout, a datetime.timedelta or seconds as a float, in whole milliseconds,
// rounded up (any positive timeout is at least 1 ms); 0, no limit, for 0 and for anything
// from kNoLimitDays on (infinity included). TypeError for another type, ValueError for a
// negative value or NaN. Every range is checked before any arithmetic that could overflow.
constexpr int64_t kNoLimitDays = 100000;  // ~274 years: no deadline, and no overflow computing one
std::chrono::milliseconds waitTimeout(PyObject* timeout) {
  const auto refuseNegative = [timeout] {
    throw InvalidArgument("Work.wait: timeout must not be negative, got " +
                          py::repr(py::handle(timeout)).cast<std::string>());
  };
  int64_t micros = 0;
  if (PyDelta_Check(timeout)) {
    const int64_t days = PyDateTime_DELTA_GET_DAYS(timeout);  // the sign; seconds and microseconds are >= 0
    if (days < 0) refuseNegative();
    if (days >= kNoLimitDays) return std::chrono::milliseconds(0);
    micros = (days * 86400 + PyDateTime_DELTA_GET_SECONDS(timeout)) * 1000000 +
             PyDateTime_DELTA_GET_MICROSECONDS(timeout);
  } else if (PyFloat_Check(timeout)) {
    const double seconds = PyFloat_AS_DOUBLE(timeout);
    if (std::isnan(seconds)) throw InvalidArgument("Work.wait: timeout must be a number of seconds, got nan");
    if (seconds < 0) refuseNegative();
    if (seconds >= static_cast<double>(kNoLimitDays) * 86400) return std::chrono::milliseconds(0);
    // To the nearest microsecond, halves to even, as timedelta(seconds=...) rounds; a
    // positive timeout stays one.
    micros = std::max<int64_t>(static_cast<int64_t>(std::nearbyint(seconds * 1e6)), seconds > 0 ? 1 : 0);
  } else {
    throw py::type_error(std::string("Work.wait: timeout must be a datetime.timedelta (or seconds as a float), got ") +
                         Py_TYPE(timeout)->tp_name);
  }
  return std::chrono::ceil<std::chrono::milliseconds>(Microseconds(micros));
}

// wait(timeout=timedelta(0)): a timedelta, or seconds as a float (0: no limit).
PyObject* wait(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return guarded([&]() -> PyObject* {
    Work& work = workOf(self);
    const Py_ssize_t given = nargs + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
    if (given == 0) {  // the caller that waits at once: a Work that finished keeps the GIL
      if (work.isCompleted()) return PyBool_FromLong(work.wait() ? 1 : 0);  // returns or raises at once
      bool success = false;
      {
        py::gil_scoped_release release;
        success = work.wait(std::chrono::milliseconds(0));
      }
      return PyBool_FromLong(success ? 1 : 0);
    }
    if (given > 1 || !onlyKeyword(kwnames, "timeout")) {
      throw py::type_error("Work.wait() takes one argument, timeout (a datetime.timedelta)");
    }
    const std::chrono::milliseconds timeout = waitTimeout(args[0]);
    bool success = false;
    {
      py::gil_scoped_release release;
      success = work.wait(timeout);
    }
    return PyBool_FromLong(success ? 1 : 0);
  });
}

PyObject* isCompleted(PyObject* self, PyObject*) { return PyBool_FromLong(workOf(self).isCompleted() ? 1 : 0); }

PyObject* isSuccess(PyObject* self, PyObject*) { return PyBool_FromLong(workOf(self).isSuccess() ? 1 : 0); }

PyObject* sourceRank(PyObject* self, PyObject*) { return PyLong_FromLong(workOf(self).sourceRank()); }

PyObject* exception(PyObject* self, PyObject*) {
  return guarded([&] { return toPythonException(workOf(self).exception()).release().ptr(); });
}

PyObject* resultMethod(PyObject* self, PyObject*) {
  return guarded([&] { return result(asPyWork(self)).release().ptr(); });
}

PyObject* getFutureMethod(PyObject* self, PyObject*) {
  return guarded([&] { return getFuture(asPyWork(self)).release().ptr(); });
}

PyObject* synchronize(PyObject*, PyObject*) { Py_RETURN_NONE; }

// _add_done_callback(callback)
PyObject* addDoneCallbackMethod(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return guarded([&]() -> PyObject* {
    const Py_ssize_t given = nargs + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
    if (given != 1 || !onlyKeyword(kwnames, "callback")) {
      throw py::type_error("Work._add_done_callback() takes one argument, callback");
    }
    if (PyCallable_Check(args[0]) == 0) {
      throw py::type_error(std::string("Work._add_done_callback: callback must be callable, got ") +
                           Py_TYPE(args[0])->tp_name);
    }
    addDoneCallback(workOf(self), py::reinterpret_borrow<py::function>(args[0]));
    Py_RETURN_NONE;
  });
}

PyObject* repr(PyObject* self) {
  const Work& work = workOf(self);
  const char* state = !work.isCompleted() ? "pending" : (work.isSuccess() ? "completed" : "failed");
  return PyUnicode_FromFormat("<ringtree.Work %s %s>", work.opName(), state);
}

void dealloc(PyObject* self) {
  PyWork& object = asPyWork(self);
  PyTypeObject* type = Py_TYPE(self);
  if (object.weakrefs != nullptr) PyObject_ClearWeakRefs(self);
  object.state.~shared_ptr();  // with the GIL held, unless an operation still holds it (HeldOffThread)
  object.work.~shared_ptr();
  type->tp_free(self);
  Py_DECREF(type);
}

PyObject* refuseNew(PyTypeObject*, PyObject*, PyObject*) {
  PyErr_SetString(PyExc_TypeError,
                  "ringtree.Work objects are made by the asynchronous calls (async_op=True, isend, irecv, ...)");
  return nullptr;
}

PyMethodDef methods[] = {
    {"wait", fastcallKeywords<wait>(), METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=timedelta(0)): blocks until the operation finished (0: no limit; seconds as a float are "
     "accepted too); True on success, raises its error otherwise. Past a positive timeout raises DistTimeoutError "
     "and the operation keeps running."},
    {"is_completed", &isCompleted, METH_NOARGS, "Whether the operation finished (successfully or not)."},
    {"is_success", &isSuccess, METH_NOARGS, "Whether the operation finished without an error."},
    {"source_rank", &sourceRank, METH_NOARGS,
     "For a point-to-point receive: the group rank the message came from, once it completed successfully; -1 for "
     "other operations."},
    {"_source_rank", &sourceRank, METH_NOARGS, "Alias of source_rank() (torch's older name)."},
    {"exception", &exception, METH_NOARGS,
     "The operation's error as an exception object; None while it runs or if it succeeded."},
    {"result", &resultMethod, METH_NOARGS,
     "The tensors the operation wrote, as torch 2.13's gloo backend gives them: [tensor] for all_reduce, broadcast, "
     "reduce, scatter, reduce_scatter*, all_to_all_single, isend and irecv; the output list for all_gather and "
     "all_to_all; gather_list on the destination ([] elsewhere); the flattened output lists for "
     "all_gather_coalesced; [] for barrier; [output] for all_gather_single. Raises RuntimeError while the operation "
     "runs."},
    {"get_future", &getFutureMethod, METH_NOARGS,
     "A torch.futures.Future that the thread finishing the operation completes, with result()'s list on success, "
     "with the operation's error otherwise; the same Future on every call. fut.then(...) callbacks run on that "
     "thread. Needs torch."},
    {"synchronize", &synchronize, METH_NOARGS,
     "Nothing to do for host memory, written before the Work completes (torch's synchronize() orders device "
     "streams)."},
    {"_add_done_callback", fastcallKeywords<addDoneCallbackMethod>(), METH_FASTCALL | METH_KEYWORDS,
     "_add_done_callback(callback): calls callback(error) once the operation finished (error: its exception, None "
     "on success), on the thread that finishes it, or at once if it already finished (private API)."},
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(PyWork, weakrefs), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

const char* const kWorkDoc =
    "Handle of an asynchronous collective (async_op=True) or point-to-point operation (isend, irecv, "
    "batch_isend_irecv), with torch 2.13's Work API.\n\n"
    "wait(timeout) blocks until it finished (timeout: timedelta, 0 = no limit), returns True, and raises the "
    "operation's error if it failed; when the timeout passes first it raises DistTimeoutError and the operation "
    "keeps running. The buffers must not be used until the work completed.";

PyType_Slot slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(&refuseNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(&dealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(&repr)},
    {Py_tp_methods, methods},
    {Py_tp_members, members},
    {Py_tp_doc, const_cast<char*>(kWorkDoc)},
    {0, nullptr},
};

PyType_Spec spec = {"ringtree._C.Work", sizeof(PyWork), 0, Py_TPFLAGS_DEFAULT, slots};

}  // namespace

py::object pythonWork(std::shared_ptr<Work> work, py::list outputs) {
  auto state = std::make_shared<HeldOffThread>();
  state->outputs = std::move(outputs);
  return pythonWorkWithState(std::move(work), std::move(state));
}

std::shared_ptr<void> oneTensorState(py::handle tensor) {
  auto state = std::make_shared<HeldOffThread>();
  state->outputs = py::reinterpret_borrow<py::object>(tensor);
  state->oneTensor = true;
  return state;
}

py::object pythonWorkWithState(std::shared_ptr<Work> work, std::shared_ptr<void> state) {
  PyObject* object = workType->tp_alloc(workType, 0);
  if (object == nullptr) throw py::error_already_set();
  PyWork& self = asPyWork(object);
  new (&self.work) std::shared_ptr<Work>(std::move(work));
  new (&self.state) std::shared_ptr<HeldOffThread>(std::static_pointer_cast<HeldOffThread>(std::move(state)));
  return py::reinterpret_steal<py::object>(object);
}

py::object pythonWorkOn(std::shared_ptr<Work> work, py::handle tensor) {
  return pythonWorkWithState(std::move(work), oneTensorState(tensor));
}

void initWork(py::module_& m) {
  PyDateTime_IMPORT;
  if (PyDateTimeAPI == nullptr) throw py::error_already_set();
  PyObject* type = PyType_FromSpec(&spec);
  if (type == nullptr) throw py::error_already_set();
  workType = reinterpret_cast<PyTypeObject*>(type);
  Py_INCREF(type);  // workType keeps one reference for the module's life
  m.add_object("Work", py::reinterpret_steal<py::object>(type));
}

}  // namespace ringtree::python
