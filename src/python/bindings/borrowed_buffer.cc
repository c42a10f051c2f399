#include "borrowed_buffer.h"

#include <new>
#include <string>
#include <utility>

#include "errors.h"

namespace py = pybind11;

namespace ringtree::python {

namespace {



// _BorrowedBuffer: a plain CPython object holding a BorrowedBuffer in place, so that
// making one costs an allocation and the borrow, without pybind11's instance registry and
// argument dispatch (it is made on every call of the MPI backend). Its buffer protocol
// gives the bytes, unformatted, writable when borrowed writable: what an mpi4py message
// [buffer, count, datatype] needs.
struct BorrowedObject {
  PyObject_HEAD
  alignas(BorrowedBuffer) unsigned char storage[sizeof(BorrowedBuffer)];
  bool constructed;

  BorrowedBuffer& buffer() { return *std::launder(reinterpret_cast<BorrowedBuffer*>(storage)); }
};

PyTypeObject* borrowedType = nullptr;


void deallocBorrowed(PyObject* object) {
  auto* self = reinterpret_cast<BorrowedObject*>(object);
  if (self->constructed) self->buffer().~BorrowedBuffer();
  PyTypeObject* type = Py_TYPE(object);
  type->tp_free(object);
  Py_DECREF(type);
}

int getBorrowedBuffer(PyObject* object, Py_buffer* view, int flags) {
  const BorrowedBuffer& borrowed = borrowedOf(object);
  return PyBuffer_FillInfo(view, object, borrowed.data(), static_cast<Py_ssize_t>(borrowed.nbytes()),
                           borrowed.writable() ? 0 : 1, flags);
}

PyObject* borrowedAddress(PyObject* self, void*) { return PyLong_FromSize_t(borrowedOf(self).address()); }
PyObject* borrowedCount(PyObject* self, void*) { return PyLong_FromSize_t(borrowedOf(self).count()); }
PyObject* borrowedNbytes(PyObject* self, void*) { return PyLong_FromSize_t(borrowedOf(self).nbytes()); }
PyObject* borrowedRows(PyObject* self, void*) { return PyLong_FromSize_t(borrowedOf(self).rows()); }
PyObject* borrowedDtype(PyObject* self, void*);

PyGetSetDef borrowedGetSet[] = {
    {"address", borrowedAddress, nullptr, "The first element's address.", nullptr},
    {"count", borrowedCount, nullptr, "The number of elements.", nullptr},
    {"nbytes", borrowedNbytes, nullptr, "The size in bytes.", nullptr},
    {"rows", borrowedRows, nullptr, "The size of the leading dimension (1 for a 0-dim buffer).", nullptr},
    {"dtype", borrowedDtype, nullptr, "torch's name of the element type ('float32', ...).", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot borrowedSlots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(&deallocBorrowed)},
    {Py_tp_getset, borrowedGetSet},
    {Py_bf_getbuffer, reinterpret_cast<void*>(&getBorrowedBuffer)},
    {Py_tp_doc, const_cast<char*>("A host buffer's memory, borrowed zero-copy while this object lives; its buffer "
                                  "protocol gives the bytes (private API).")},
    {0, nullptr},
};

PyType_Spec borrowedSpec = {"ringtree._C._BorrowedBuffer", sizeof(BorrowedObject), 0, Py_TPFLAGS_DEFAULT,
                            borrowedSlots};


// A new _BorrowedBuffer of `object`; throws as Buffer does.
py::object makeBorrowed(PyObject* object, bool writable, const char* what) {
  auto* self = PyObject_New(BorrowedObject, borrowedType);
  if (self == nullptr) throw py::error_already_set();
  self->constructed = false;
  py::object owner = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(self));
  new (self->storage) BorrowedBuffer(object, writable, what);
  self->constructed = true;
  return owner;
}

// The arguments (buffer, writable, what): `what` as UTF-8, `writable` as a truth value.
bool parseBorrowArguments(PyObject* const* args, Py_ssize_t count, Py_ssize_t expected, const char* name,
                          bool& writable, const char*& what) {
  if (count != expected) {
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments, got %zd", name, expected, count);
    return false;
  }
  const int truth = PyObject_IsTrue(args[1]);
  if (truth < 0) return false;
  writable = truth == 1;
  what = PyUnicode_AsUTF8(args[2]);
  return what != nullptr;
}

// _borrow(buffer, writable, what) -> _BorrowedBuffer
PyObject* borrowFunction(PyObject*, PyObject* const* args, Py_ssize_t count) {
  bool writable = false;
  const char* what = nullptr;
  if (!parseBorrowArguments(args, count, 3, "_borrow", writable, what)) return nullptr;
  try {
    return makeBorrowed(args[0], writable, what).release().ptr();
  } catch (...) {
    return raiseCurrentException();
  }
}


PyObject* borrowedDtype(PyObject* self, void*) {
  return dataTypeNameObject(borrowedOf(self).type()).inc_ref().ptr();
}



// _mpi_borrow(buffer, writable, what, datatypes) -> ([borrowed, count, datatypes[type]], dtype name)
PyObject* mpiBorrowFunction(PyObject*, PyObject* const* args, Py_ssize_t count) {
  bool writable = false;
  const char* what = nullptr;
  if (!parseBorrowArguments(args, count, 4, "_mpi_borrow", writable, what)) return nullptr;
  if (!checkDatatypes(args[3], "_mpi_borrow")) return nullptr;
  try {
    DataType type{};
    py::object message = mpiMessage(args[0], writable, what, args[3], &type);
    return PyTuple_Pack(2, message.ptr(), dataTypeNameObject(type).ptr());
  } catch (...) {
    return raiseCurrentException();
  }
}

PyMethodDef borrowMethods[] = {
    {"_borrow", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&borrowFunction)), METH_FASTCALL,
     "_borrow(buffer, writable, what): borrows a host buffer with the checks every collective makes (TypeError for "
     "an unsupported type, ValueError for a non-contiguous, read-only when writable, device or grad-requiring one)."},
    {"_mpi_borrow", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&mpiBorrowFunction)), METH_FASTCALL,
     "_mpi_borrow(buffer, writable, what, datatypes): _borrow, as the mpi4py message of the buffer and its dtype "
     "name: ([borrowed, count, datatypes[type]], name); datatypes holds the MPI datatype of each DataType, in the "
     "enum's order."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

BorrowedBuffer& borrowedOf(PyObject* object) { return reinterpret_cast<BorrowedObject*>(object)->buffer(); }

// Raises the Python error of the exception being handled (pybind11's own classes,
// ringtree's through the same mapping as everywhere); returns null for the caller to
// return.
// torch's dtype names as interned Python strings, made once.
py::handle dataTypeNameObject(DataType type) {
  static const auto names = [] {
    std::array<PyObject*, kNumDataTypes> made{};
    for (int index = 0; index < kNumDataTypes; ++index) {
      made[index] = PyUnicode_InternFromString(dataTypeName(static_cast<DataType>(index)));
    }
    return made;
  }();
  return names[static_cast<size_t>(type)];
}

// The mpi4py message [borrowed, count, datatypes[type]] of `object`, borrowed for `what`
// (datatypes: a tuple of kNumDataTypes MPI datatypes); *type receives its element type.
// Throws as Buffer does, and InvalidArgument past MPI's int counts.
py::object mpiMessage(PyObject* object, bool writable, const char* what, PyObject* datatypes, DataType* type) {
  py::object borrowed = makeBorrowed(object, writable, what);
  const BorrowedBuffer& buffer = borrowedOf(borrowed.ptr());
  if (buffer.count() > static_cast<size_t>(INT32_MAX)) {
    throw InvalidArgument(std::string(what) + ": the mpi backend moves at most 2**31 - 1 elements in one call, got " +
                          std::to_string(buffer.count()));
  }
  *type = buffer.type();
  py::object elements = py::reinterpret_steal<py::object>(PyLong_FromSize_t(buffer.count()));
  py::object message = py::reinterpret_steal<py::object>(PyList_New(3));
  if (!elements || !message) throw py::error_already_set();
  PyObject* datatype = PyTuple_GET_ITEM(datatypes, static_cast<Py_ssize_t>(buffer.type()));
  Py_INCREF(datatype);
  PyList_SET_ITEM(message.ptr(), 0, borrowed.release().ptr());
  PyList_SET_ITEM(message.ptr(), 1, elements.release().ptr());
  PyList_SET_ITEM(message.ptr(), 2, datatype);
  return message;
}

bool checkDatatypes(PyObject* datatypes, const char* name) {
  if (PyTuple_Check(datatypes) && PyTuple_GET_SIZE(datatypes) == kNumDataTypes) return true;
  PyErr_Format(PyExc_TypeError, "%s: datatypes must be a tuple with one entry per DataType", name);
  return false;
}

void initBorrowedBuffer(py::module_& m) {
  borrowedType = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&borrowedSpec));
  if (borrowedType == nullptr) throw py::error_already_set();
  m.add_object("_BorrowedBuffer", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(borrowedType)));
  for (PyMethodDef* method = borrowMethods; method->ml_name != nullptr; ++method) {
    py::object function = py::reinterpret_steal<py::object>(PyCFunction_NewEx(method, nullptr, m.ptr()));
    if (!function) throw py::error_already_set();
    m.add_object(method->ml_name, function);
  }
}

}  // namespace ringtree::python
