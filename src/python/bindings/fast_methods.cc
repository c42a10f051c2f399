#include "fast_methods.h"

#include <array>
#include <deque>
#include <string>
#include <vector>

namespace py = pybind11;

namespace ringtree::python {

PyObject* replaceWithFastMethod(py::handle type, const char* name, FastMethod function) {
  // The definitions and docstrings stay alive (and in place) for the module's life, as the
  // descriptors require.
  static std::deque<PyMethodDef> definitions;
  static std::deque<std::string> docstrings;
  py::object replaced = type.attr("__dict__")[name];
  docstrings.push_back(py::str(replaced.attr("__doc__")));
  definitions.push_back({name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(function)),
                         METH_FASTCALL | METH_KEYWORDS, docstrings.back().c_str()});
  auto* typeObject = reinterpret_cast<PyTypeObject*>(type.ptr());
  py::object descriptor = py::reinterpret_steal<py::object>(PyDescr_NewMethod(typeObject, &definitions.back()));
  if (!descriptor) throw py::error_already_set();
  type.attr(name) = descriptor;
  return replaced.release().ptr();
}

PyObject* callReplaced(PyObject* replaced, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames) {
  const Py_ssize_t total = nargs + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
  std::array<PyObject*, 12> small{};
  std::vector<PyObject*> large;
  PyObject** call = small.data();
  if (static_cast<size_t>(total) + 1 > small.size()) {
    large.resize(static_cast<size_t>(total) + 1);
    call = large.data();
  }
  call[0] = self;
  for (Py_ssize_t index = 0; index < total; ++index) call[index + 1] = args[index];
  return PyObject_Vectorcall(replaced, call, static_cast<size_t>(nargs) + 1, kwnames);
}

}  // namespace ringtree::python
