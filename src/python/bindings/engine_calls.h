#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>

namespace ringtree::python {

// The methods of the bound ProcessGroup class that small-message latency rides on, which
// installEngineCalls replaces by vectorcall methods (engine_calls.cc).
enum EngineMethod : size_t {
  kAllreduce, kBroadcast, kReduce, kAllgatherSingle, kReduceScatterSingle, kAlltoallSingle, kBarrier,
  kSend, kRecv, kIsend, kIrecv, kNumMethods
};

// Replaces those methods of the bound ProcessGroup class `type` by vectorcall methods over
// the same calls. Call once, after the pybind11 methods are defined.
void installEngineCalls(pybind11::handle type);

// The bound ProcessGroup class (nullptr before installEngineCalls).
PyTypeObject* engineType();

// The Python name of `method` ("allreduce", ...).
const char* engineMethodName(EngineMethod method);

// engine.<method>(*args) for `engine` an exact instance of engineType(), without the
// method lookup: the same vectorcall method runs, with the same conversions and checks.
PyObject* callEngineMethod(EngineMethod method, PyObject* engine, PyObject* const* args, Py_ssize_t nargs);

}  // namespace ringtree::python
