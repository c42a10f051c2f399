#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Binds Communicator (diagnostics only) and ProcessGroup, the native backend of a group:
// every collective and point-to-point call on Python buffers (see buffers.h), with the
// Works of work.h. Every blocking call releases the GIL; buffers are read with it held.
void initProcessGroup(pybind11::module_& m);

}  // namespace ringtree::python
