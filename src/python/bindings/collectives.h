#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Binds Communicator (creation through a Store), Work and the CPU ProcessGroup with its
// collectives on Python buffers (see buffers.h). Every blocking call releases the GIL;
// buffers are read with it held.
void initCollectives(pybind11::module_& m);

}  // namespace ringtree::python
