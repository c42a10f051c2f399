#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Replaces the methods of the bound ProcessGroup class `type` that small-message latency
// rides on by vectorcall methods over the same calls (see engine_calls.cc). Call once,
// after the pybind11 methods are defined.
void installEngineCalls(pybind11::handle type);

}  // namespace ringtree::python
