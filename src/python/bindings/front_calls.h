#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Adds ringtree._C.FrontCall, the C entry of the Python front's hot module-level calls
// (front_calls.cc).
void initFrontCalls(pybind11::module_& m);

}  // namespace ringtree::python
