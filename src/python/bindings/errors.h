#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Translates ringtree's C++ exceptions into the Python classes of ringtree.errors
// (InvalidArgument -> ValueError, NetworkError -> DistNetworkError, StoreError ->
// DistStoreError, TimeoutError -> DistTimeoutError, any other ringtree::Error ->
// DistBackendError).
void initErrors(pybind11::module_& m);

}  // namespace ringtree::python
