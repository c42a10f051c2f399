#pragma once

#include <pybind11/pybind11.h>

// CPython vectorcall methods installed over methods of a pybind11-bound class, for the calls
// small-message latency rides on (engine_calls.cc: the ProcessGroup's collectives and
// point-to-point calls; Work is a CPython type of its own, work.cc, whose methods are
// FastMethods too). A fast method takes the call in the form the Python fronts make it and
// hands any other to the pybind11 method it replaced, which converts or refuses it as
// before: behaviour is the same either way.
namespace ringtree::python {

using FastMethod = PyObject* (*)(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);

// `Function` as a PyMethodDef's ml_meth, for METH_FASTCALL | METH_KEYWORDS.
template <FastMethod Function>
constexpr PyCFunction fastcallKeywords() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Function));
}

// Replaces `name` of the bound class `type` by a method descriptor of `function` with the
// replaced method's docstring; returns the replaced method (a reference kept for the
// module's life). Call once per method, after the pybind11 methods are defined.
PyObject* replaceWithFastMethod(pybind11::handle type, const char* name, FastMethod function);

// replaced(self, *args, **kwargs): a call the fast method leaves to the pybind11 method.
PyObject* callReplaced(PyObject* replaced, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames);

// The C++ object of `self`, an instance of a pybind11 class of T with one holder (the
// method descriptor checked its type), read without pybind11's type-registry search.
// Throws TypeError for an instance whose constructor did not run.
template <typename T>
T& boundValue(PyObject* self) {
  auto* instance = reinterpret_cast<pybind11::detail::instance*>(self);
  void* value = instance->get_value_and_holder().value_ptr();
  if (value == nullptr) throw pybind11::type_error("the object was not initialized");
  return *static_cast<T*>(value);
}

}  // namespace ringtree::python
