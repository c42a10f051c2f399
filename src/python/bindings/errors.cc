#include "errors.h"

#include <new>

#include <ringtree/error.h>

namespace py = pybind11;

namespace ringtree::python {

namespace {
// The classes live in Python (ringtree/errors.py) so that they can subclass both
// DistError and the matching built-in; they are looked up when first needed.
py::object errorClass(const Error& e) {
  if (dynamic_cast<const InvalidArgument*>(&e) != nullptr) {
    return py::reinterpret_borrow<py::object>(PyExc_ValueError);
  }
  const char* name = "DistBackendError";
  if (dynamic_cast<const NetworkError*>(&e) != nullptr) {
    name = "DistNetworkError";
  } else if (dynamic_cast<const StoreError*>(&e) != nullptr) {
    name = "DistStoreError";
  } else if (dynamic_cast<const TimeoutError*>(&e) != nullptr) {
    name = "DistTimeoutError";
  } else if (dynamic_cast<const CollectiveMismatchError*>(&e) != nullptr) {
    name = "CollectiveMismatchError";
  }
  return py::module_::import("ringtree.errors").attr(name);
}
}  // namespace

void initErrors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) {
        std::rethrow_exception(p);
      }
    } catch (const Error& e) {
      PyErr_SetString(errorClass(e).ptr(), e.what());
    }
  });
}

py::object toPythonException(const std::exception_ptr& error) {
  if (!error) {
    return py::none();
  }
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return errorClass(e)(e.what());
  } catch (const std::bad_alloc& e) {
    return py::reinterpret_borrow<py::object>(PyExc_MemoryError)(e.what());
  } catch (const std::exception& e) {
    return py::reinterpret_borrow<py::object>(PyExc_RuntimeError)(e.what());
  } catch (...) {
    return py::reinterpret_borrow<py::object>(PyExc_RuntimeError)("unknown C++ exception");
  }
}

PyObject* raiseCurrentException() {
  try {
    throw;
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (py::builtin_exception& error) {
    error.set_error();
  } catch (...) {
    try {
      py::object exception = toPythonException(std::current_exception());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
    } catch (py::error_already_set& error) {  // the class could not be made (at shutdown, say): its error
      error.restore();
    } catch (...) {
      PyErr_SetString(PyExc_RuntimeError, "ringtree: an error that could not be converted to a Python exception");
    }
  }
  return nullptr;
}

}  // namespace ringtree::python
