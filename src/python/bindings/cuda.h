#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Binds what the process has for CUDA buffers (private API, used by ringtree.cuda):
// _cuda_status() and _nccl_status(), as dicts of <ringtree/cuda.h>'s structs.
void initCuda(pybind11::module_& m);

}  // namespace ringtree::python
