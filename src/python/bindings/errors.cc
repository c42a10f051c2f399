#include "errors.h"

#include <ringtree/error.h>

namespace py = pybind11;

namespace ringtree::python {

namespace {
// The classes live in Python (ringtree/errors.py) so that they can subclass both
// DistError and the matching built-in; they are looked up when first needed.
void raise(const char* className, const char* message) {
  py::object cls = py::module_::import("ringtree.errors").attr(className);
  PyErr_SetString(cls.ptr(), message);
}
}  // namespace

void initErrors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) {
        std::rethrow_exception(p);
      }
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const NetworkError& e) {
      raise("DistNetworkError", e.what());
    } catch (const StoreError& e) {
      raise("DistStoreError", e.what());
    } catch (const TimeoutError& e) {
      raise("DistTimeoutError", e.what());
    } catch (const Error& e) {
      raise("DistBackendError", e.what());
    }
  });
}

}  // namespace ringtree::python
