#pragma once

#include <pybind11/pybind11.h>

#include <exception>

namespace ringtree::python {

// Translates ringtree's C++ exceptions into the Python classes of ringtree.errors
// (InvalidArgument -> ValueError, NetworkError -> DistNetworkError, StoreError ->
// DistStoreError, TimeoutError -> DistTimeoutError, CollectiveMismatchError ->
// CollectiveMismatchError, any other ringtree::Error -> DistBackendError).
void initErrors(pybind11::module_& m);

// The Python exception object (not raised) for a C++ exception, by the same mapping;
// std::bad_alloc becomes MemoryError, other std::exceptions RuntimeError. None for a null
// pointer. GIL held.
pybind11::object toPythonException(const std::exception_ptr& error);

// Inside a catch block: sets the Python error of the exception being handled (pybind11's
// own classes, ringtree's by the mapping above) and returns null, for raw CPython
// functions to return.
PyObject* raiseCurrentException();

}  // namespace ringtree::python
