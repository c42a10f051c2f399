#include "mpi_fast_calls.h"

#include <structmember.h>

#include <array>
#include <chrono>
#include <cstddef>

#include <ringtree/types.h>

#include "borrowed_buffer.h"
#include "mpi_request_work.h"

namespace py = pybind11;

// _MpiFastCalls: the one-buffer calls of one MpiEngine, in C -- the calls small-message
// latency rides on: the synchronous all_reduce, broadcast, reduce, all_gather_into_tensor,
// reduce_scatter_tensor, all_to_all_single in equal parts, send and recv from a given
// rank, and isend/irecv (any source too), which return an _MpiRequestWork. Each takes the
// engine method's arguments. A call it does not serve as is goes to the engine's Python
// method of the same name, which does everything: async_op, algorithm=, split sizes, a
// closed group (closed true: every call), a group that has a worker for async collectives
// (enabled false: the collectives), a reduction not yet cached or needing AVG/PREMUL_SUM
// scaling, a root, peer or tag out of range or not a plain int, buffers that do not match
// (the Python method says how). Served: the borrow and message (as _mpi_borrow), the
// cached (dtype, op) -> (MPI op, kind, factor) look-up, the watchdog record (overdue();
// a request work carries its own deadline), one vectorcall of the bound mpi4py method. An
// MPI error goes through raise_error(what, borrowed, exception), which raises ringtree's.
namespace ringtree::python {

namespace {

enum Call : size_t {
  kAllreduce, kBroadcast, kReduce, kAllgather, kReduceScatter, kAlltoall, kSend, kRecv, kIsend, kIrecv, kNumCalls
};

// The mpi4py method each call makes, and the engine method it hands other calls to.
constexpr std::array<const char*, kNumCalls> kMpiMethods = {
    "Allreduce", "Bcast", "Reduce", "Allgather", "Reduce_scatter_block", "Alltoall", "Send", "Recv", "Isend", "Irecv"};
constexpr std::array<const char*, kNumCalls> kEngineMethods = {
    "allreduce", "broadcast", "reduce", "allgather_single", "reduce_scatter_single", "alltoall_single", "send", "recv",
    "isend", "irecv"};

struct FastCalls {
  PyObject_HEAD
  PyObject* mpi[kNumCalls];   // bound comm methods
  PyObject* slow[kNumCalls];  // the engine's Python methods
  PyObject* inPlace;          // MPI.IN_PLACE
  PyObject* datatypes;        // MPI datatype per DataType
  PyObject* opCache;          // dict (dtype name, op) -> (MPI op, kind, factor)
  PyObject* raiseError;
  PyObject* mpiError;         // MPI.Exception
  PyObject* statusType;       // MPI.Status
  PyObject* anySource;        // MPI.ANY_SOURCE
  RequestWorkHelpers helpers;  // what isend/irecv's works need
  int rank;
  int size;
  long tagBound;              // MPI_TAG_UB
  double timeout;
  int enabled;
  int closed;
  // The call running now, for the watchdog (written and read with the GIL held).
  const char* runningWhat;
  double runningDeadline;
  DataType runningType;
  size_t runningCount;
};

constexpr long kAvgCode = static_cast<long>(ReduceOp::kAvg);
constexpr long kPremulSumCode = static_cast<long>(ReduceOp::kPremulSum);

double monotonicSeconds() {
  // steady_clock is CLOCK_MONOTONIC on Linux, the clock of Python's time.monotonic().
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

PyObject* slowly(FastCalls* self, Call call, PyObject* const* args, Py_ssize_t nargs) {
  return PyObject_Vectorcall(self->slow[call], args, static_cast<size_t>(nargs), nullptr);
}

// 1 when a collective must go the Python way: disabled, async_op true, or algorithm given
// (args[asyncIndex] is async_op, the optional next one algorithm); -1 on error.
int declines(FastCalls* self, PyObject* const* args, Py_ssize_t nargs, Py_ssize_t asyncIndex) {
  if (!self->enabled || nargs < asyncIndex + 1 || nargs > asyncIndex + 2) return 1;
  if (nargs == asyncIndex + 2 && args[asyncIndex + 1] != Py_None) return 1;
  const int async = PyObject_IsTrue(args[asyncIndex]);
  return async < 0 ? -1 : async;
}

// An int argument in [low, high), else false (the Python way then says what is wrong).
bool smallInt(PyObject* object, long low, long high, long* value) {
  if (!PyLong_CheckExact(object)) return false;
  *value = PyLong_AsLong(object);
  if (*value == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return *value >= low && *value < high;
}

// The cached (MPI op, kind, factor) of `op` on `type`, if it needs no scaling; null
// otherwise (the Python way computes and caches it, or scales).
PyObject* cachedPlainOp(FastCalls* self, DataType type, PyObject* op) {
  PyObject* key = PyTuple_Pack(2, dataTypeNameObject(type).ptr(), op);
  if (key == nullptr) throw py::error_already_set();
  PyObject* entry = PyDict_GetItemWithError(self->opCache, key);  // borrowed
  Py_DECREF(key);
  if (entry == nullptr) {
    PyErr_Clear();  // an unhashable op: the Python way says what is wrong
    return nullptr;
  }
  const long kind = PyLong_AsLong(PyTuple_GET_ITEM(entry, 1));
  return kind == kAvgCode || kind == kPremulSumCode ? nullptr : PyTuple_GET_ITEM(entry, 0);
}

size_t countOf(PyObject* message) { return PyLong_AsSize_t(PyList_GET_ITEM(message, 1)); }

// Sets message[1] = count (an MPI call's count per rank).
void setCount(PyObject* message, size_t count) {
  PyObject* value = PyLong_FromSize_t(count);
  if (value == nullptr) throw py::error_already_set();
  PyList_SetItem(message, 1, value);  // steals value, drops the old count
}

// With the mpi4py call of `what` on `message` failed: raises its MPI error as ringtree's
// (other errors as they are); returns null.
PyObject* raiseMpiError(FastCalls* self, const char* what, PyObject* message) {
  if (!PyErr_ExceptionMatches(self->mpiError)) return nullptr;
  PyObject *errorType, *error, *traceback;
  PyErr_Fetch(&errorType, &error, &traceback);
  PyErr_NormalizeException(&errorType, &error, &traceback);
  if (traceback != nullptr) PyException_SetTraceback(error, traceback);
  PyObject* whatObject = PyUnicode_FromString(what);
  PyObject* raised = whatObject == nullptr ? nullptr
                                           : PyObject_CallFunctionObjArgs(self->raiseError, whatObject,
                                                                          PyList_GET_ITEM(message, 0), error, nullptr);
  Py_XDECREF(whatObject);
  Py_XDECREF(errorType);
  Py_XDECREF(error);
  Py_XDECREF(traceback);
  Py_XDECREF(raised);  // raise_error raises; a value it returned is dropped
  return nullptr;
}

// Runs the mpi4py call `call` with args as the running call `what` on `message`; an MPI
// error raised as ringtree's. Returns Py_None (new reference), or null.
PyObject* run(FastCalls* self, Call call, const char* what, PyObject* const* args, size_t nargs, PyObject* message,
              DataType type) {
  self->runningWhat = what;
  self->runningDeadline = monotonicSeconds() + self->timeout;
  self->runningType = type;
  self->runningCount = countOf(message);
  PyObject* result = PyObject_Vectorcall(self->mpi[call], args, nargs, nullptr);
  self->runningWhat = nullptr;
  if (result != nullptr) {
    Py_DECREF(result);
    Py_RETURN_NONE;
  }
  return raiseMpiError(self, what, message);
}

// Starts the nonblocking mpi4py call `call` (Isend, Irecv) with args as `what` on
// `message` of `tensor`; its work, or null with ringtree's error. `status` (stolen, may be
// null) and `source`: as newRequestWork's.
PyObject* start(FastCalls* self, Call call, const char* what, PyObject* const* args, PyObject* message,
                PyObject* status, PyObject* tensor, long source) {
  PyObject* request = PyObject_Vectorcall(self->mpi[call], args, 3, nullptr);
  if (request == nullptr) {
    Py_XDECREF(status);
    return raiseMpiError(self, what, message);
  }
  return newRequestWork(reinterpret_cast<PyObject*>(self), &self->helpers, what, request, status, tensor,
                        PyList_GET_ITEM(message, 0), source, monotonicSeconds() + self->timeout);
}

// allreduce(tensor, op, async_op, algorithm=None)
PyObject* allreduce(PyObject* object, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  const int no = declines(self, args, nargs, 2);
  if (no != 0) return no < 0 ? nullptr : slowly(self, kAllreduce, args, nargs);
  try {
    DataType type{};
    py::object message = mpiMessage(args[0], true, "all_reduce", self->datatypes, &type);
    PyObject* op = cachedPlainOp(self, type, args[1]);
    if (op == nullptr) return slowly(self, kAllreduce, args, nargs);
    PyObject* call[3] = {self->inPlace, message.ptr(), op};
    return run(self, kAllreduce, "all_reduce", call, 3, message.ptr(), type);
  } catch (...) {
    return raiseCurrentException();
  }
}

// broadcast(tensor, root, async_op, algorithm=None)
PyObject* broadcast(PyObject* object, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  const int no = declines(self, args, nargs, 2);
  long root = 0;
  if (no != 0 || !smallInt(args[1], 0, self->size, &root)) return no < 0 ? nullptr : slowly(self, kBroadcast, args, nargs);
  try {
    DataType type{};
    py::object message = mpiMessage(args[0], root != self->rank, "broadcast", self->datatypes, &type);
    PyObject* call[2] = {message.ptr(), args[1]};
    return run(self, kBroadcast, "broadcast", call, 2, message.ptr(), type);
  } catch (...) {
    return raiseCurrentException();
  }
}

// reduce(tensor, root, op, async_op, algorithm=None)
PyObject* reduce(PyObject* object, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  const int no = declines(self, args, nargs, 3);
  long root = 0;
  if (no != 0 || !smallInt(args[1], 0, self->size, &root)) return no < 0 ? nullptr : slowly(self, kReduce, args, nargs);
  try {
    const bool isRoot = root == self->rank;
    DataType type{};
    py::object message = mpiMessage(args[0], isRoot, "reduce", self->datatypes, &type);
    PyObject* op = cachedPlainOp(self, type, args[2]);
    if (op == nullptr) return slowly(self, kReduce, args, nargs);
    PyObject* call[4] = {isRoot ? self->inPlace : message.ptr(), isRoot ? message.ptr() : Py_None, op, args[1]};
    return run(self, kReduce, "reduce", call, 4, message.ptr(), type);
  } catch (...) {
    return raiseCurrentException();
  }
}

// allgather_single(output_tensor, input_tensor, async_op, algorithm=None)
PyObject* allgather(PyObject* object, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  const int no = declines(self, args, nargs, 2);
  if (no != 0) return no < 0 ? nullptr : slowly(self, kAllgather, args, nargs);
  try {
    DataType inputType{}, outputType{};
    const char* what = "all_gather_into_tensor";
    py::object send = mpiMessage(args[1], false, what, self->datatypes, &inputType);
    py::object receive = mpiMessage(args[0], true, what, self->datatypes, &outputType);
    const size_t count = countOf(send.ptr());
    if (inputType != outputType || countOf(receive.ptr()) != count * static_cast<size_t>(self->size)) {
      return slowly(self, kAllgather, args, nargs);
    }
    setCount(receive.ptr(), count);
    PyObject* call[2] = {send.ptr(), receive.ptr()};
    return run(self, kAllgather, what, call, 2, send.ptr(), inputType);
  } catch (...) {
    return raiseCurrentException();
  }
}

// reduce_scatter_single(output, input, op, async_op, algorithm=None)
PyObject* reduceScatter(PyObject* object, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  const int no = declines(self, args, nargs, 3);
  if (no != 0) return no < 0 ? nullptr : slowly(self, kReduceScatter, args, nargs);
  try {
    DataType outputType{}, inputType{};
    const char* what = "reduce_scatter_tensor";
    py::object receive = mpiMessage(args[0], true, what, self->datatypes, &outputType);
    py::object send = mpiMessage(args[1], false, what, self->datatypes, &inputType);
    const size_t count = countOf(receive.ptr());
    PyObject* op = inputType == outputType ? cachedPlainOp(self, outputType, args[2]) : nullptr;
    if (op == nullptr || countOf(send.ptr()) != count * static_cast<size_t>(self->size)) {
      return slowly(self, kReduceScatter, args, nargs);
    }
    setCount(send.ptr(), count);
    PyObject* call[3] = {send.ptr(), receive.ptr(), op};
    return run(self, kReduceScatter, what, call, 3, receive.ptr(), outputType);
  } catch (...) {
    return raiseCurrentException();
  }
}

bool noSplits(PyObject* sizes) {
  return sizes == Py_None || ((PyList_CheckExact(sizes) || PyTuple_CheckExact(sizes)) && PySequence_Size(sizes) == 0);
}

// alltoall_single(output, input, output_split_sizes, input_split_sizes, async_op, algorithm=None)
PyObject* alltoall(PyObject* object, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  const int no = declines(self, args, nargs, 4);
  if (no != 0 || !noSplits(args[2]) || !noSplits(args[3])) return no < 0 ? nullptr : slowly(self, kAlltoall, args, nargs);
  try {
    DataType inputType{}, outputType{};
    const char* what = "all_to_all_single";
    py::object send = mpiMessage(args[1], false, what, self->datatypes, &inputType);
    py::object receive = mpiMessage(args[0], true, what, self->datatypes, &outputType);
    const auto size = static_cast<size_t>(self->size);
    const size_t count = countOf(send.ptr());
    if (inputType != outputType || countOf(receive.ptr()) != count ||
        borrowedOf(PyList_GET_ITEM(send.ptr(), 0)).rows() % size != 0 ||
        borrowedOf(PyList_GET_ITEM(receive.ptr(), 0)).rows() % size != 0) {
      return slowly(self, kAlltoall, args, nargs);
    }
    setCount(send.ptr(), count / size);
    setCount(receive.ptr(), count / size);
    PyObject* call[2] = {send.ptr(), receive.ptr()};
    return run(self, kAlltoall, what, call, 2, send.ptr(), inputType);
  } catch (...) {
    return raiseCurrentException();
  }
}

// Point to point: send(tensor, dst, tag), recv(tensor, src, tag) from a given rank (the
// Python way takes any-source receives, which must report the sender), isend(tensor, dst,
// tag), irecv(tensor, src, tag) with src -1 for any rank. They do not depend on the
// group's collective order: served until the group is closed. Whether the call's peer
// (-1 too where `anySource`) and tag are plain ints the call takes.
bool peerAndTag(FastCalls* self, PyObject* const* args, Py_ssize_t nargs, bool anySource, long* peer) {
  long tag = 0;
  return !self->closed && nargs == 3 && smallInt(args[1], anySource ? -1 : 0, self->size, peer) &&
         *peer != self->rank && smallInt(args[2], 0, self->tagBound + 1, &tag);
}

PyObject* send(PyObject* object, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  long peer = 0;
  if (!peerAndTag(self, args, nargs, false, &peer)) return slowly(self, kSend, args, nargs);
  try {
    DataType type{};
    py::object message = mpiMessage(args[0], false, "send", self->datatypes, &type);
    PyObject* call[3] = {message.ptr(), args[1], args[2]};
    return run(self, kSend, "send", call, 3, message.ptr(), type);
  } catch (...) {
    return raiseCurrentException();
  }
}

PyObject* recv(PyObject* object, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  long peer = 0;
  if (!peerAndTag(self, args, nargs, false, &peer)) return slowly(self, kRecv, args, nargs);
  try {
    DataType type{};
    py::object message = mpiMessage(args[0], true, "recv", self->datatypes, &type);
    PyObject* call[3] = {message.ptr(), args[1], args[2]};
    PyObject* done = run(self, kRecv, "recv", call, 3, message.ptr(), type);
    if (done == nullptr) return nullptr;
    Py_DECREF(done);
    Py_INCREF(args[1]);
    return args[1];  // the sender's group rank
  } catch (...) {
    return raiseCurrentException();
  }
}

PyObject* isend(PyObject* object, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  long peer = 0;
  if (!peerAndTag(self, args, nargs, false, &peer)) return slowly(self, kIsend, args, nargs);
  try {
    DataType type{};
    py::object message = mpiMessage(args[0], false, "isend", self->datatypes, &type);
    PyObject* call[3] = {message.ptr(), args[1], args[2]};
    return start(self, kIsend, "isend", call, message.ptr(), nullptr, args[0], -1);
  } catch (...) {
    return raiseCurrentException();
  }
}

PyObject* irecv(PyObject* object, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  long peer = 0;
  if (!peerAndTag(self, args, nargs, true, &peer)) return slowly(self, kIrecv, args, nargs);
  try {
    DataType type{};
    py::object message = mpiMessage(args[0], true, "irecv", self->datatypes, &type);
    PyObject* status = nullptr;  // an any-source receive's, which names the sender
    if (peer == -1 && (status = PyObject_CallNoArgs(self->statusType)) == nullptr) return nullptr;
    PyObject* call[3] = {message.ptr(), peer == -1 ? self->anySource : args[1], args[2]};
    return start(self, kIrecv, "irecv", call, message.ptr(), status, args[0], peer);
  } catch (...) {
    return raiseCurrentException();
  }
}

// overdue(now) -> (what, dtype, count) of the call running past its deadline, else None.
PyObject* overdue(PyObject* object, PyObject* now) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  const double seconds = PyFloat_AsDouble(now);
  if (seconds == -1.0 && PyErr_Occurred()) return nullptr;
  if (self->runningWhat == nullptr || seconds <= self->runningDeadline) Py_RETURN_NONE;
  return Py_BuildValue("(sOn)", self->runningWhat, dataTypeNameObject(self->runningType).ptr(),
                       static_cast<Py_ssize_t>(self->runningCount));
}

// _MpiFastCalls(comm, engine, datatypes, op_cache, in_place, raise_error, mpi_error, rank,
// size, tag_ub, timeout, status_type, any_source, progress, wrap, future_of, run_callback,
// timeout_error): `engine`'s class methods named in kEngineMethods, bound to it, take what
// the C calls do not serve; the last seven are what the request works need (see
// RequestWorkHelpers; progress gives its waiting dict and add method).
PyObject* create(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *comm, *engine, *datatypes, *opCache, *inPlace, *raiseError, *mpiError, *statusType, *anySource, *progress,
      *wrap, *futureOf, *runCallback, *timeoutError;
  int rank = 0, size = 0;
  long tagBound = 0;
  double timeout = 0;
  static const char* names[] = {"comm", "engine", "datatypes", "op_cache", "in_place", "raise_error", "mpi_error",
                                "rank", "size", "tag_ub", "timeout", "status_type", "any_source", "progress", "wrap",
                                "future_of", "run_callback", "timeout_error", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!O!OOOiildOOOOOOO:_MpiFastCalls", const_cast<char**>(names),
                                   &comm, &engine, &PyTuple_Type, &datatypes, &PyDict_Type, &opCache, &inPlace,
                                   &raiseError, &mpiError, &rank, &size, &tagBound, &timeout, &statusType, &anySource,
                                   &progress, &wrap, &futureOf, &runCallback, &timeoutError)) {
    return nullptr;
  }
  if (!checkDatatypes(datatypes, "_MpiFastCalls")) return nullptr;
  py::object owner = py::reinterpret_steal<py::object>(type->tp_alloc(type, 0));
  if (!owner) return nullptr;
  auto* self = reinterpret_cast<FastCalls*>(owner.ptr());
  PyObject* engineType = reinterpret_cast<PyObject*>(Py_TYPE(engine));
  for (size_t call = 0; call < kNumCalls; ++call) {
    self->mpi[call] = PyObject_GetAttrString(comm, kMpiMethods[call]);
    py::object function = py::reinterpret_steal<py::object>(PyObject_GetAttrString(engineType, kEngineMethods[call]));
    self->slow[call] = function ? PyMethod_New(function.ptr(), engine) : nullptr;
    if (self->mpi[call] == nullptr || self->slow[call] == nullptr) return nullptr;
  }
  RequestWorkHelpers& helpers = self->helpers;
  helpers.waiting = PyObject_GetAttrString(progress, "waiting");
  helpers.progressAdd = PyObject_GetAttrString(progress, "add");
  if (helpers.waiting == nullptr || helpers.progressAdd == nullptr) return nullptr;
  if (!PyDict_Check(helpers.waiting)) {
    PyErr_SetString(PyExc_TypeError, "_MpiFastCalls: progress.waiting must be a dict");
    return nullptr;
  }
  PyObject** slots[] = {&self->inPlace,    &self->datatypes,  &self->opCache,   &self->raiseError,
                        &self->mpiError,   &self->statusType, &self->anySource, &helpers.engine,
                        &helpers.wrap,     &helpers.futureOf, &helpers.runCallback, &helpers.timeoutError};
  PyObject* values[] = {inPlace, datatypes, opCache, raiseError, mpiError, statusType, anySource, engine,
                        wrap,    futureOf,  runCallback, timeoutError};
  for (size_t index = 0; index < std::size(slots); ++index) {
    Py_INCREF(values[index]);
    *slots[index] = values[index];
  }
  self->rank = rank;
  self->size = size;
  self->tagBound = tagBound;
  self->timeout = timeout;
  self->enabled = 1;
  self->closed = 0;
  self->runningWhat = nullptr;
  return owner.release().ptr();
}

int traverse(PyObject* object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  Py_VISIT(Py_TYPE(object));
  for (size_t call = 0; call < kNumCalls; ++call) {
    Py_VISIT(self->mpi[call]);
    Py_VISIT(self->slow[call]);
  }
  Py_VISIT(self->inPlace);
  Py_VISIT(self->datatypes);
  Py_VISIT(self->opCache);
  Py_VISIT(self->raiseError);
  Py_VISIT(self->mpiError);
  Py_VISIT(self->statusType);
  Py_VISIT(self->anySource);
  const RequestWorkHelpers& helpers = self->helpers;
  Py_VISIT(helpers.engine);
  Py_VISIT(helpers.waiting);
  Py_VISIT(helpers.progressAdd);
  Py_VISIT(helpers.wrap);
  Py_VISIT(helpers.futureOf);
  Py_VISIT(helpers.runCallback);
  Py_VISIT(helpers.timeoutError);
  return 0;
}

int clear(PyObject* object) {
  auto* self = reinterpret_cast<FastCalls*>(object);
  for (size_t call = 0; call < kNumCalls; ++call) {
    Py_CLEAR(self->mpi[call]);
    Py_CLEAR(self->slow[call]);
  }
  Py_CLEAR(self->inPlace);
  Py_CLEAR(self->datatypes);
  Py_CLEAR(self->opCache);
  Py_CLEAR(self->raiseError);
  Py_CLEAR(self->mpiError);
  Py_CLEAR(self->statusType);
  Py_CLEAR(self->anySource);
  RequestWorkHelpers& helpers = self->helpers;
  Py_CLEAR(helpers.engine);
  Py_CLEAR(helpers.waiting);
  Py_CLEAR(helpers.progressAdd);
  Py_CLEAR(helpers.wrap);
  Py_CLEAR(helpers.futureOf);
  Py_CLEAR(helpers.runCallback);
  Py_CLEAR(helpers.timeoutError);
  return 0;
}

void dealloc(PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  PyObject_GC_UnTrack(object);
  clear(object);
  type->tp_free(object);
  Py_DECREF(type);
}

template <PyObject* (*Function)(PyObject*, PyObject* const*, Py_ssize_t)>
constexpr PyCFunction fastcall() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Function));
}

PyMethodDef methods[] = {
    {"allreduce", fastcall<allreduce>(), METH_FASTCALL, "As MpiEngine.allreduce."},
    {"broadcast", fastcall<broadcast>(), METH_FASTCALL, "As MpiEngine.broadcast."},
    {"reduce", fastcall<reduce>(), METH_FASTCALL, "As MpiEngine.reduce."},
    {"allgather_single", fastcall<allgather>(), METH_FASTCALL, "As MpiEngine.allgather_single."},
    {"reduce_scatter_single", fastcall<reduceScatter>(), METH_FASTCALL, "As MpiEngine.reduce_scatter_single."},
    {"alltoall_single", fastcall<alltoall>(), METH_FASTCALL, "As MpiEngine.alltoall_single."},
    {"send", fastcall<send>(), METH_FASTCALL, "As MpiEngine.send."},
    {"recv", fastcall<recv>(), METH_FASTCALL, "As MpiEngine.recv."},
    {"isend", fastcall<isend>(), METH_FASTCALL, "As MpiEngine.isend."},
    {"irecv", fastcall<irecv>(), METH_FASTCALL, "As MpiEngine.irecv."},
    {"overdue", &overdue, METH_O,
     "overdue(now): (what, dtype, count) of the call running past its deadline (time.monotonic() seconds), else "
     "None."},
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef members[] = {
    {"enabled", T_INT, offsetof(FastCalls, enabled), 0,
     "False sends every collective the Python way (set once the group has a worker, or is closed)."},
    {"closed", T_INT, offsetof(FastCalls, closed), 0, "True sends every call the Python way (the group is closed)."},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(&create)},
    {Py_tp_dealloc, reinterpret_cast<void*>(&dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(&traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(&clear)},
    {Py_tp_methods, methods},
    {Py_tp_members, members},
    {Py_tp_doc, const_cast<char*>("The synchronous one-buffer calls of one MpiEngine, in C (private API).")},
    {0, nullptr},
};

PyType_Spec spec = {"ringtree._C._MpiFastCalls", sizeof(FastCalls), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
                    slots};

}  // namespace

void initMpiFastCalls(py::module_& m) {
  PyObject* type = PyType_FromSpec(&spec);
  if (type == nullptr) throw py::error_already_set();
  m.add_object("_MpiFastCalls", py::reinterpret_steal<py::object>(type));
}

}  // namespace ringtree::python
