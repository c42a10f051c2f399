#include "engine_calls.h"

#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <optional>

#include <ringtree/process_group.h>

#include "errors.h"
#include "fast_methods.h"
#include "process_group_calls.h"

namespace py = pybind11;

// The hot methods of ringtree._C.ProcessGroup as CPython vectorcall methods: allreduce,
// broadcast, reduce, allgather_single, reduce_scatter_single, alltoall_single, barrier,
// send, recv, isend and irecv. pybind11's dispatch (its argument loaders, overload loop
// and keyword matching) cost about 0.13 us of a 0.57 us one-rank all_reduce; these take
// the positional call the fronts make (async_op an exact bool, ranks and tags exact ints,
// no timeout: barrier's None, the collectives' left out) straight to the same conversions (process_group_calls.h), and
// hand every other call (keywords, other argument types, a timeout) to the pybind11 method
// they replaced, which converts or refuses it as before (fast_methods.h). Behaviour is the
// same either way.
namespace ringtree::python {

namespace {

constexpr std::array<const char*, kNumMethods> kNames = {
    "allreduce", "broadcast", "reduce", "allgather_single", "reduce_scatter_single", "alltoall_single", "barrier",
    "send", "recv", "isend", "irecv"};

// The bound ProcessGroup class whose methods these replaced.
PyTypeObject* boundType = nullptr;

// The pybind11 methods replaced, one reference each for the module's life.
std::array<PyObject*, kNumMethods> pybindMethods{};

// The pybind11 method of `method` called as self.method(*args, **kwargs).
PyObject* slowly(EngineMethod method, PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return callReplaced(pybindMethods[method], self, args, nargs, kwnames);
}

// Whether the call is positional with `low` to `high` arguments.
bool positional(Py_ssize_t nargs, PyObject* kwnames, Py_ssize_t low, Py_ssize_t high) {
  return kwnames == nullptr && nargs >= low && nargs <= high;
}

// An exact bool argument (pybind11 converts or refuses anything else).
bool exactBool(PyObject* object, bool* value) {
  *value = object == Py_True;
  return object == Py_True || object == Py_False;
}

// An exact int argument within C int range.
bool exactInt(PyObject* object, int* value) {
  if (!PyLong_CheckExact(object)) return false;
  int overflow = 0;
  const long parsed = PyLong_AsLongAndOverflow(object, &overflow);
  if (overflow != 0 || parsed < INT_MIN || parsed > INT_MAX) return false;
  *value = static_cast<int>(parsed);
  return true;
}

ProcessGroup& groupOf(PyObject* self) { return boundValue<ProcessGroup>(self); }

// The optional trailing algorithm argument at `index`.
PyObject* algorithmAt(PyObject* const* args, Py_ssize_t nargs, Py_ssize_t index) {
  return nargs > index ? args[index] : Py_None;
}

// allreduce(tensor, op, async_op, algorithm=None)
PyObject* allreduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  bool async = false;
  if (!positional(nargs, kwnames, 3, 4) || !exactBool(args[2], &async)) {
    return slowly(kAllreduce, self, args, nargs, kwnames);
  }
  try {
    return calls::allreduce(groupOf(self), args[0], args[1], async, algorithmAt(args, nargs, 3), std::nullopt).release().ptr();
  } catch (...) {
    return raiseCurrentException();
  }
}

// broadcast(tensor, root, async_op, algorithm=None)
PyObject* broadcast(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  bool async = false;
  int root = 0;
  if (!positional(nargs, kwnames, 3, 4) || !exactInt(args[1], &root) || !exactBool(args[2], &async)) {
    return slowly(kBroadcast, self, args, nargs, kwnames);
  }
  try {
    return calls::broadcast(groupOf(self), args[0], root, async, algorithmAt(args, nargs, 3), std::nullopt).release().ptr();
  } catch (...) {
    return raiseCurrentException();
  }
}

// reduce(tensor, root, op, async_op, algorithm=None)
PyObject* reduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  bool async = false;
  int root = 0;
  if (!positional(nargs, kwnames, 4, 5) || !exactInt(args[1], &root) || !exactBool(args[3], &async)) {
    return slowly(kReduce, self, args, nargs, kwnames);
  }
  try {
    return calls::reduce(groupOf(self), args[0], root, args[2], async, algorithmAt(args, nargs, 4), std::nullopt).release().ptr();
  } catch (...) {
    return raiseCurrentException();
  }
}

// allgather_single(output_tensor, input_tensor, async_op, algorithm=None)
PyObject* allgatherSingle(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  bool async = false;
  if (!positional(nargs, kwnames, 3, 4) || !exactBool(args[2], &async)) {
    return slowly(kAllgatherSingle, self, args, nargs, kwnames);
  }
  try {
    return calls::allgatherSingle(groupOf(self), args[0], args[1], async, algorithmAt(args, nargs, 3), std::nullopt)
        .release()
        .ptr();
  } catch (...) {
    return raiseCurrentException();
  }
}

// reduce_scatter_single(output, input, op, async_op, algorithm=None)
PyObject* reduceScatterSingle(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  bool async = false;
  if (!positional(nargs, kwnames, 4, 5) || !exactBool(args[3], &async)) {
    return slowly(kReduceScatterSingle, self, args, nargs, kwnames);
  }
  try {
    return calls::reduceScatterSingle(groupOf(self), args[0], args[1], args[2], async, algorithmAt(args, nargs, 4), std::nullopt)
        .release()
        .ptr();
  } catch (...) {
    return raiseCurrentException();
  }
}

// alltoall_single(output, input, output_split_sizes, input_split_sizes, async_op, algorithm=None)
PyObject* alltoallSingle(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  bool async = false;
  if (!positional(nargs, kwnames, 5, 6) || !exactBool(args[4], &async)) {
    return slowly(kAlltoallSingle, self, args, nargs, kwnames);
  }
  try {
    return calls::alltoallSingle(groupOf(self), args[0], args[1], args[2], args[3], async,
                                 algorithmAt(args, nargs, 5), std::nullopt)
        .release()
        .ptr();
  } catch (...) {
    return raiseCurrentException();
  }
}

// barrier(timeout, async_op), timeout None (a timedelta goes the pybind11 way).
PyObject* barrier(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  bool async = false;
  if (!positional(nargs, kwnames, 2, 2) || args[0] != Py_None || !exactBool(args[1], &async)) {
    return slowly(kBarrier, self, args, nargs, kwnames);
  }
  try {
    return calls::barrier(groupOf(self), std::nullopt, async).release().ptr();
  } catch (...) {
    return raiseCurrentException();
  }
}

// The point-to-point calls' (tensor, peer, tag); false sends the call the pybind11 way.
bool peerAndTag(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, int* peer, int* tag) {
  return positional(nargs, kwnames, 3, 3) && exactInt(args[1], peer) && exactInt(args[2], tag);
}

PyObject* send(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  int peer = 0, tag = 0;
  if (!peerAndTag(args, nargs, kwnames, &peer, &tag)) return slowly(kSend, self, args, nargs, kwnames);
  try {
    calls::send(groupOf(self), args[0], peer, tag);
    Py_RETURN_NONE;
  } catch (...) {
    return raiseCurrentException();
  }
}

PyObject* recv(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  int peer = 0, tag = 0;
  if (!peerAndTag(args, nargs, kwnames, &peer, &tag)) return slowly(kRecv, self, args, nargs, kwnames);
  try {
    return PyLong_FromLong(calls::recv(groupOf(self), args[0], peer, tag));
  } catch (...) {
    return raiseCurrentException();
  }
}

PyObject* isend(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  int peer = 0, tag = 0;
  if (!peerAndTag(args, nargs, kwnames, &peer, &tag)) return slowly(kIsend, self, args, nargs, kwnames);
  try {
    return calls::isend(groupOf(self), args[0], peer, tag).release().ptr();
  } catch (...) {
    return raiseCurrentException();
  }
}

PyObject* irecv(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  int peer = 0, tag = 0;
  if (!peerAndTag(args, nargs, kwnames, &peer, &tag)) return slowly(kIrecv, self, args, nargs, kwnames);
  try {
    return calls::irecv(groupOf(self), args[0], peer, tag).release().ptr();
  } catch (...) {
    return raiseCurrentException();
  }
}

constexpr std::array<FastMethod, kNumMethods> kFunctions = {
    &allreduce, &broadcast, &reduce, &allgatherSingle, &reduceScatterSingle, &alltoallSingle, &barrier,
    &send, &recv, &isend, &irecv};

}  // namespace

void installEngineCalls(py::handle type) {
  for (size_t method = 0; method < kNumMethods; ++method) {
    pybindMethods[method] = replaceWithFastMethod(type, kNames[method], kFunctions[method]);
  }
  boundType = reinterpret_cast<PyTypeObject*>(type.ptr());
}

PyTypeObject* engineType() { return boundType; }

const char* engineMethodName(EngineMethod method) { return kNames[method]; }

PyObject* callEngineMethod(EngineMethod method, PyObject* engine, PyObject* const* args, Py_ssize_t nargs) {
  return kFunctions[method](engine, args, nargs, nullptr);
}

}  // namespace ringtree::python
