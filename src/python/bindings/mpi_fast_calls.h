#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Adds _MpiFastCalls, the C side of ringtree.mpi's one-buffer calls (see
// mpi_fast_calls.cc), to the module. Needs initBorrowedBuffer's and initRequestWork's
// types registered first.
void initMpiFastCalls(pybind11::module_& m);

}  // namespace ringtree::python
