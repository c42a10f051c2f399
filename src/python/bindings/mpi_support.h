#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Binds what ringtree.mpi (the MPI backend, written over mpi4py) needs of the core
// (private API): borrowing a buffer's memory by address, ringtree's AVG/PREMUL_SUM
// scaling, and MPI reduction operators whose function is ringtree's own reduction kernel.
void initMpiSupport(pybind11::module_& m);

}  // namespace ringtree::python
