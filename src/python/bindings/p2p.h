#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Binds PointToPoint (the engine of send, recv, isend, irecv and batch_isend_irecv) over
// a Communicator of its own, on Python buffers (see buffers.h). Calls take the GIL only
// to borrow the buffers; the returned Work is the collectives' Work class.
void initPointToPoint(pybind11::module_& m);

}  // namespace ringtree::python
