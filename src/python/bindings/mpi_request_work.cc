#include "mpi_request_work.h"

#include <datetime.h>
#include <pythread.h>
#include <structmember.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <thread>

#include "fast_methods.h"

namespace py = pybind11;

// _MpiRequestWork: torch 2.13's Work API over one nonblocking MPI request (ringtree.mpi's
// isend and irecv; see ringtree/mpi/work.py for the whole design). The request completes
// in wait() (MPI_Wait, seen by the watchdog through Progress.waiting meanwhile),
// is_completed() (MPI_Test), or on the progress thread (_poll(), MPI_Test) for a work that
// has a done callback or Future, or was dropped unfinished (tp_finalize hands it over,
// which keeps it alive until MPI completed it).
//
// One thread at a time touches the request: `busy` is set, with the GIL held, around each
// mpi4py call on it (mpi4py releases the GIL inside MPI); a thread that finds it set
// polls `done` instead. Completion (with the GIL) records the source of an any-source
// receive, the error if any (an MPI error wrapped as DistBackendError naming the call),
// releases the request and runs the done callbacks.
namespace ringtree::python {

namespace {

struct RequestWork {
  PyObject_HEAD
  PyObject* owner;                     // holds *helpers
  const RequestWorkHelpers* helpers;
  PyObject* request;                   // the mpi4py Request, until completion
  PyObject* status;                    // MPI.Status of an any-source receive, until completion
  PyObject* tensor;                    // what result() returns, in a list
  PyObject* buffer;                    // the borrowed buffer (and what names the call)
  PyObject* error;                     // the operation's error, once done
  PyObject* callbacks;                 // list of done callbacks, or null
  PyObject* future;                    // the torch Future, once asked for
  const char* what;
  double deadline;                     // time.monotonic() seconds past which the watchdog ends the job
  long source;
  int done;
  int busy;
};

PyTypeObject* workType = nullptr;
PyObject* waitName = nullptr;
PyObject* testName = nullptr;
PyObject* getSourceName = nullptr;
PyObject* describeName = nullptr;

double monotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

RequestWork* asWork(PyObject* object) { return reinterpret_cast<RequestWork*>(object); }

// engine._describe(what, buffer): "rank R: what (dtype, N elements) on group 'G' (MPI)".
PyObject* describe(RequestWork* self) {
  PyObject* what = PyUnicode_FromString(self->what);
  if (what == nullptr) return nullptr;
  PyObject* args[3] = {self->helpers->engine, what, self->buffer};
  PyObject* text = PyObject_VectorcallMethod(describeName, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  Py_DECREF(what);
  return text;
}

// The Python exception being raised, taken (its traceback attached); a new reference.
PyObject* takeException() {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr) PyException_SetTraceback(value, traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  return value;
}

// The raised MPI error as ringtree's DistBackendError naming the call (the raw one if
// that fails); a new reference.
PyObject* takeWrappedError(RequestWork* self) {
  PyObject* raw = takeException();
  PyObject* text = describe(self);
  PyObject* wrapped = text == nullptr ? nullptr : PyObject_CallFunctionObjArgs(self->helpers->wrap, raw, text, nullptr);
  Py_XDECREF(text);
  if (wrapped == nullptr) {
    PyErr_Clear();
    return raw;
  }
  Py_DECREF(raw);
  return wrapped;
}

// request.Wait(status) or request.Test(status) (no argument without a status).
PyObject* callRequest(RequestWork* self, PyObject* name) {
  PyObject* args[2] = {self->request, self->status};
  self->busy = 1;
  PyObject* result =
      PyObject_VectorcallMethod(name, args, (self->status != nullptr ? 2 : 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  self->busy = 0;
  return result;
}

void runCallback(RequestWork* self, PyObject* callback) {
  PyObject* result = PyObject_CallFunctionObjArgs(self->helpers->runCallback, callback,
                                                  self->error != nullptr ? self->error : Py_None, nullptr);
  if (result == nullptr) PyErr_WriteUnraisable(callback);  // _run_callback reports a callback's own errors
  Py_XDECREF(result);
}

// Completes the work with `error` (stolen; null: success).
void complete(RequestWork* self, PyObject* error) {
  if (error == nullptr && self->status != nullptr) {
    PyObject* args[1] = {self->status};
    PyObject* source = PyObject_VectorcallMethod(getSourceName, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    if (source != nullptr) {
      self->source = PyLong_AsLong(source);
      Py_DECREF(source);
    }
    if (PyErr_Occurred()) error = takeException();
  }
  self->error = error;
  self->done = 1;
  Py_CLEAR(self->request);
  Py_CLEAR(self->status);
  PyObject* callbacks = self->callbacks;
  self->callbacks = nullptr;
  if (callbacks != nullptr) {
    for (Py_ssize_t index = 0; index < PyList_GET_SIZE(callbacks); ++index) {
      runCallback(self, PyList_GET_ITEM(callbacks, index));
    }
    Py_DECREF(callbacks);
  }
}

// One MPI_Test; completes the work when the operation finished. Caller checked !done
// and !busy. Returns done.
int test(RequestWork* self) {
  PyObject* finished = callRequest(self, testName);
  if (finished == nullptr) {
    complete(self, takeWrappedError(self));
    return 1;
  }
  const int yes = PyObject_IsTrue(finished);
  Py_DECREF(finished);
  if (yes != 0) complete(self, yes < 0 ? takeException() : nullptr);
  return self->done;
}

// Blocks in MPI_Wait, registered in Progress.waiting for the watchdog meanwhile, and
// completes the work. -1 with a Python error if the registration fails.
int blockingWait(RequestWork* self) {
  PyObject* thread = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
  if (thread == nullptr || PyDict_SetItem(self->helpers->waiting, thread, reinterpret_cast<PyObject*>(self)) < 0) {
    Py_XDECREF(thread);
    return -1;
  }
  PyObject* result = callRequest(self, waitName);
  PyObject* error = result == nullptr ? takeWrappedError(self) : nullptr;
  Py_XDECREF(result);
  // A callback run on this thread may have waited here too and removed the entry.
  if (PyDict_DelItem(self->helpers->waiting, thread) < 0) PyErr_Clear();
  Py_DECREF(thread);
  complete(self, error);
  return 0;
}

// Tests until done (another thread holds the request, or a timeout was given), sleeping
// without the GIL in between (20 us, doubling to 1 ms). Past `deadline` (monotonic
// seconds) raises DistTimeoutError naming `timeout` and returns -1.
int pollUntil(RequestWork* self, double deadline, PyObject* timeout) {
  double delay = 20e-6;
  while (true) {
    if (!self->done && !self->busy) test(self);
    if (self->done) return 0;
    if (monotonicSeconds() >= deadline) {
      PyObject* text = describe(self);
      if (text != nullptr) {
        PyErr_Format(self->helpers->timeoutError, "Work.wait timed out after %S in %U", timeout, text);
        Py_DECREF(text);
      }
      return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    Py_END_ALLOW_THREADS
    delay = std::min(delay * 2, 1e-3);
  }
}

// The seconds of a wait() timeout (0: no limit); -1 with TypeError/ValueError.
double timeoutSeconds(PyObject* timeout) {
  if (!PyDelta_Check(timeout)) {
    PyErr_Format(PyExc_TypeError, "Work.wait: timeout must be a datetime.timedelta, got %s", Py_TYPE(timeout)->tp_name);
    return -1;
  }
  const double seconds = PyDateTime_DELTA_GET_DAYS(timeout) * 86400.0 + PyDateTime_DELTA_GET_SECONDS(timeout) +
                         PyDateTime_DELTA_GET_MICROSECONDS(timeout) * 1e-6;
  if (seconds < 0) {
    PyErr_Format(PyExc_ValueError, "Work.wait: timeout must not be negative, got %S", timeout);
    return -1;
  }
  return seconds;
}

// wait(timeout=timedelta(0)): blocks until the operation finished (0: no limit); True on
// success, raises its error otherwise; past a positive timeout DistTimeoutError (the
// operation keeps going).
PyObject* wait(PyObject* object, PyObject* const* args, Py_ssize_t nargs, PyObject* names) {
  auto* self = asWork(object);
  PyObject* timeout = nullptr;
  const Py_ssize_t given = nargs + (names != nullptr ? PyTuple_GET_SIZE(names) : 0);
  if (given > 1 || (names != nullptr && PyTuple_GET_SIZE(names) == 1 &&
                    PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(names, 0), "timeout") != 0)) {
    PyErr_SetString(PyExc_TypeError, "Work.wait takes one argument, timeout (a datetime.timedelta)");
    return nullptr;
  }
  double seconds = 0;
  if (given == 1) {
    timeout = args[0];
    seconds = timeoutSeconds(timeout);
    if (seconds < 0) return nullptr;
  }
  if (!self->done) {
    if (seconds == 0 && !self->busy) {
      if (blockingWait(self) < 0) return nullptr;
    } else {
      const double deadline = seconds == 0 ? std::numeric_limits<double>::infinity() : monotonicSeconds() + seconds;
      if (pollUntil(self, deadline, timeout) < 0) return nullptr;
    }
  }
  if (self->error != nullptr) {
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(self->error)), self->error);
    return nullptr;
  }
  Py_RETURN_TRUE;
}

PyObject* isCompleted(PyObject* object, PyObject*) {
  auto* self = asWork(object);
  if (!self->done && !self->busy) test(self);
  return PyBool_FromLong(self->done);
}

PyObject* isSuccess(PyObject* object, PyObject*) {
  auto* self = asWork(object);
  if (!self->done && !self->busy) test(self);
  return PyBool_FromLong(self->done && self->error == nullptr);
}

// _poll(): the progress thread's test; returns whether the work is done.
PyObject* poll(PyObject* object, PyObject* none) { return isCompleted(object, none); }

PyObject* exception(PyObject* object, PyObject*) {
  auto* self = asWork(object);
  PyObject* error = self->done && self->error != nullptr ? self->error : Py_None;
  Py_INCREF(error);
  return error;
}

PyObject* sourceRank(PyObject* object, PyObject*) {
  auto* self = asWork(object);
  return PyLong_FromLong(self->done && self->error == nullptr ? self->source : -1);
}

PyObject* result(PyObject* object, PyObject*) {
  auto* self = asWork(object);
  if (!self->done) {
    PyErr_SetString(PyExc_RuntimeError,
                    "Work needs to be completed before calling result(). Should call wait() before result().");
    return nullptr;
  }
  PyObject* list = PyList_New(1);
  if (list == nullptr) return nullptr;
  Py_INCREF(self->tensor);
  PyList_SET_ITEM(list, 0, self->tensor);
  return list;
}

PyObject* synchronize(PyObject*, PyObject*) { Py_RETURN_NONE; }  // nothing to do for host memory

// _add_done_callback(callback): callback(error or None) once done (now, if it is); the
// first one hands the work to the progress thread, which completes it without a waiter.
PyObject* addDoneCallback(PyObject* object, PyObject* callback) {
  auto* self = asWork(object);
  if (self->done) {
    runCallback(self, callback);
    Py_RETURN_NONE;
  }
  const bool first = self->callbacks == nullptr;
  if (first && (self->callbacks = PyList_New(0)) == nullptr) return nullptr;
  if (PyList_Append(self->callbacks, callback) < 0) return nullptr;
  if (first) {
    PyObject* added = PyObject_CallOneArg(self->helpers->progressAdd, object);
    if (added == nullptr) return nullptr;
    Py_DECREF(added);
  }
  Py_RETURN_NONE;
}

// get_future(): a torch.futures.Future completed with result()'s list, or the error.
PyObject* getFuture(PyObject* object, PyObject*) {
  auto* self = asWork(object);
  if (self->future == nullptr && (self->future = PyObject_CallOneArg(self->helpers->futureOf, object)) == nullptr) {
    return nullptr;
  }
  Py_INCREF(self->future);
  return self->future;
}

PyObject* describeMethod(PyObject* object, PyObject*) { return describe(asWork(object)); }

PyObject* repr(PyObject* object) {
  auto* self = asWork(object);
  PyObject* text = describe(self);
  if (text == nullptr) return nullptr;
  const char* state = !self->done ? "pending" : self->error == nullptr ? "completed" : "failed";
  PyObject* shown = PyUnicode_FromFormat("<ringtree.mpi Work %U %s>", text, state);
  Py_DECREF(text);
  return shown;
}

// Dropped unfinished (an isend nobody waits for): the progress thread keeps the work, and
// so the request and its buffer, until MPI completed it.
void finalize(PyObject* object) {
  auto* self = asWork(object);
  if (self->done) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyObject* added = PyObject_CallOneArg(self->helpers->progressAdd, object);
  if (added == nullptr) PyErr_WriteUnraisable(object);
  Py_XDECREF(added);
  PyErr_Restore(type, value, traceback);
}

int traverse(PyObject* object, visitproc visit, void* arg) {
  auto* self = asWork(object);
  Py_VISIT(Py_TYPE(object));
  Py_VISIT(self->owner);
  Py_VISIT(self->request);
  Py_VISIT(self->status);
  Py_VISIT(self->tensor);
  Py_VISIT(self->buffer);
  Py_VISIT(self->error);
  Py_VISIT(self->callbacks);
  Py_VISIT(self->future);
  return 0;
}

int clear(PyObject* object) {
  auto* self = asWork(object);
  Py_CLEAR(self->request);
  Py_CLEAR(self->status);
  Py_CLEAR(self->tensor);
  Py_CLEAR(self->buffer);
  Py_CLEAR(self->error);
  Py_CLEAR(self->callbacks);
  Py_CLEAR(self->future);
  Py_CLEAR(self->owner);  // last: helpers live in it
  return 0;
}

void dealloc(PyObject* object) {
  if (PyObject_CallFinalizerFromDealloc(object) < 0) return;  // handed to the progress thread
  PyTypeObject* type = Py_TYPE(object);
  PyObject_GC_UnTrack(object);
  clear(object);
  type->tp_free(object);
  Py_DECREF(type);
}

PyMethodDef methods[] = {
    {"wait", fastcallKeywords<wait>(), METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=timedelta(0)): blocks until done (0: no limit); True, or raises the operation's error "
     "(DistTimeoutError past a positive timeout)."},
    {"is_completed", &isCompleted, METH_NOARGS, "Whether the operation finished (tests the request)."},
    {"is_success", &isSuccess, METH_NOARGS, "Whether the operation finished without an error."},
    {"exception", &exception, METH_NOARGS, "The operation's error once done, else None."},
    {"source_rank", &sourceRank, METH_NOARGS, "The group rank a completed receive came from (-1 otherwise)."},
    {"_source_rank", &sourceRank, METH_NOARGS, "As source_rank()."},
    {"result", &result, METH_NOARGS, "[tensor], once done."},
    {"synchronize", &synchronize, METH_NOARGS, "Nothing to do for host memory."},
    {"get_future", &getFuture, METH_NOARGS, "A torch.futures.Future completed with result()'s list, or the error."},
    {"_add_done_callback", &addDoneCallback, METH_O, "Runs callback(error or None) once done."},
    {"_poll", &poll, METH_NOARGS, "The progress thread's test: whether the work is done."},
    {"_describe", &describeMethod, METH_NOARGS, "Names the call (rank, call, dtype, count, group)."},
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef members[] = {
    {"deadline", T_DOUBLE, offsetof(RequestWork, deadline), READONLY,
     "time.monotonic() seconds past which the watchdog ends the job."},
    {nullptr, 0, 0, 0, nullptr},
};

// Made by the MPI backend's isend/irecv only.
PyObject* refuseNew(PyTypeObject*, PyObject*, PyObject*) {
  PyErr_SetString(PyExc_TypeError, "_MpiRequestWork objects are made by ringtree.mpi's isend and irecv");
  return nullptr;
}

PyType_Slot slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(&refuseNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(&dealloc)},
    {Py_tp_finalize, reinterpret_cast<void*>(&finalize)},
    {Py_tp_traverse, reinterpret_cast<void*>(&traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(&clear)},
    {Py_tp_repr, reinterpret_cast<void*>(&repr)},
    {Py_tp_methods, methods},
    {Py_tp_members, members},
    {Py_tp_doc, const_cast<char*>("The Work of a ringtree.mpi isend or irecv (private API).")},
    {0, nullptr},
};

PyType_Spec spec = {"ringtree._C._MpiRequestWork", sizeof(RequestWork), 0,
                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, slots};

}  // namespace

PyObject* newRequestWork(PyObject* owner, const RequestWorkHelpers* helpers, const char* what, PyObject* request,
                         PyObject* status, PyObject* tensor, PyObject* buffer, long source, double deadline) {
  PyObject* object = workType->tp_alloc(workType, 0);
  if (object == nullptr) {
    Py_DECREF(request);
    Py_XDECREF(status);
    return nullptr;
  }
  auto* self = asWork(object);
  Py_INCREF(owner);
  Py_INCREF(tensor);
  Py_INCREF(buffer);
  self->owner = owner;
  self->helpers = helpers;
  self->request = request;
  self->status = status;
  self->tensor = tensor;
  self->buffer = buffer;
  self->what = what;
  self->deadline = deadline;
  self->source = source;
  return object;
}

void initRequestWork(py::module_& m) {
  PyDateTime_IMPORT;
  if (PyDateTimeAPI == nullptr) throw py::error_already_set();
  waitName = PyUnicode_InternFromString("Wait");
  testName = PyUnicode_InternFromString("Test");
  getSourceName = PyUnicode_InternFromString("Get_source");
  describeName = PyUnicode_InternFromString("_describe");
  PyObject* type = PyType_FromSpec(&spec);
  if (type == nullptr || waitName == nullptr || testName == nullptr || getSourceName == nullptr ||
      describeName == nullptr) {
    throw py::error_already_set();
  }
  workType = reinterpret_cast<PyTypeObject*>(type);
  Py_INCREF(type);  // workType keeps one reference for the module's life
  m.add_object("_MpiRequestWork", py::reinterpret_steal<py::object>(type));
}

}  // namespace ringtree::python
