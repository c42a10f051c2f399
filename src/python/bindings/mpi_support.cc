#include "mpi_support.h"

#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include <ringtree/error.h>
#include <ringtree/reductions.h>
#include <ringtree/types.h>

#include "buffers.h"
#include "errors.h"

namespace py = pybind11;

namespace ringtree::python {

namespace {

// A buffer borrowed for one MPI call: its memory stays valid while this object lives
// (the MPI backend holds it until the operation completed).
class BorrowedBuffer {
 public:
  BorrowedBuffer(py::handle object, bool writable, const char* what)
      : buffer_(object, writable ? Access::kReadWrite : Access::kRead, what), view_(buffer_.view()), writable_(writable) {
    if (view_.device.type != DeviceType::kCpu) {
      throw InvalidArgument(std::string(what) + ": the mpi backend takes host (CPU) buffers, got one on " +
                            deviceName(view_.device));
    }
  }

  uintptr_t address() const { return reinterpret_cast<uintptr_t>(view_.data); }
  void* data() const { return view_.data; }
  bool writable() const { return writable_; }
  DataType type() const { return view_.type; }
  size_t count() const { return view_.count; }
  size_t nbytes() const { return view_.count * elementSize(view_.type); }
  size_t rows() const { return view_.leadingRows(); }
  const char* dtype() const { return dataTypeName(view_.type); }

 private:
  Buffer buffer_;
  BufferView view_;
  bool writable_;
};

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

BorrowedBuffer& borrowedOf(PyObject* object) { return reinterpret_cast<BorrowedObject*>(object)->buffer(); }

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

// Raises the Python error of the exception being handled (pybind11's own classes,
// ringtree's through the same mapping as everywhere); returns null for the caller to
// return.
PyObject* raiseCurrentException() {
  try {
    throw;
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (py::builtin_exception& error) {
    error.set_error();
  } catch (...) {
    py::object exception = toPythonException(std::current_exception());
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
  }
  return nullptr;
}

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

PyObject* borrowedDtype(PyObject* self, void*) {
  return dataTypeNameObject(borrowedOf(self).type()).inc_ref().ptr();
}

// _mpi_borrow(buffer, writable, what, datatypes) -> ([borrowed, count, datatypes[type]], dtype name)
PyObject* mpiBorrowFunction(PyObject*, PyObject* const* args, Py_ssize_t count) {
  bool writable = false;
  const char* what = nullptr;
  if (!parseBorrowArguments(args, count, 4, "_mpi_borrow", writable, what)) return nullptr;
  if (!PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[3]) != kNumDataTypes) {
    PyErr_SetString(PyExc_TypeError, "_mpi_borrow: datatypes must be a tuple with one entry per DataType");
    return nullptr;
  }
  try {
    py::object borrowed = makeBorrowed(args[0], writable, what);
    const BorrowedBuffer& buffer = borrowedOf(borrowed.ptr());
    if (buffer.count() > static_cast<size_t>(INT32_MAX)) {
      throw InvalidArgument(std::string(what) + ": the mpi backend moves at most 2**31 - 1 elements in one call, got " +
                            std::to_string(buffer.count()));
    }
    PyObject* elements = PyLong_FromSize_t(buffer.count());
    if (elements == nullptr) throw py::error_already_set();
    PyObject* datatype = PyTuple_GET_ITEM(args[3], static_cast<Py_ssize_t>(buffer.type()));
    Py_INCREF(datatype);
    PyObject* message = PyList_New(3);
    if (message == nullptr) {
      Py_DECREF(elements);
      Py_DECREF(datatype);
      throw py::error_already_set();
    }
    PyList_SET_ITEM(message, 0, borrowed.release().ptr());
    PyList_SET_ITEM(message, 1, elements);
    PyList_SET_ITEM(message, 2, datatype);
    PyObject* result = PyTuple_Pack(2, message, dataTypeNameObject(buffer.type()).ptr());
    Py_DECREF(message);
    return result;
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

DataType parseDataType(const std::string& name) {
  for (int index = 0; index < kNumDataTypes; ++index) {
    const auto type = static_cast<DataType>(index);
    if (name == dataTypeName(type)) return type;
  }
  throw InvalidArgument("unknown data type '" + name + "'");
}

// MPI_User_function, with the datatype handle passed by pointer as the standard has it;
// every MPI ABI passes these four arguments the same way.
using MpiUserFunction = void (*)(void* in, void* inout, int* len, void* datatype);
using MpiOpCreate = int (*)(MpiUserFunction function, int commute, void* op);

// One user function per (type, op): MPI gives a function no state but the datatype, and
// the datatype the backend passes only tells the element's size (a 2-byte integer type
// for float16 and bfloat16, say).
template <size_t Index>
void reduceWithRingtree(void* in, void* inout, int* len, void* /*datatype*/) {
  constexpr auto type = static_cast<DataType>(Index / kNumReduceOps);
  constexpr auto op = static_cast<ReduceOp>(Index % kNumReduceOps);
  // Only combinations isSupported() accepts are ever created, so this cannot throw.
  reduceInto(inout, in, static_cast<size_t>(*len), type, op);
}

template <size_t... Index>
constexpr std::array<MpiUserFunction, sizeof...(Index)> userFunctions(std::index_sequence<Index...>) {
  return {&reduceWithRingtree<Index>...};
}

constexpr auto kUserFunctions = userFunctions(std::make_index_sequence<size_t{kNumDataTypes} * kNumReduceOps>());

// Creates an MPI_Op (commutative) that reduces elements of `type` by ringtree's kernel for
// `op`, with the MPI_Op_create of the MPI library that `library` (a loaded shared object:
// mpi4py's extension) links. Returns the new handle, read as a little-endian integer of
// `handleSize` bytes. Throws for a combination the engine does not define and when the
// library or the symbol cannot be found.
uint64_t createReduceOp(const std::string& library, const std::string& typeName, int opCode, size_t handleSize) {
  const DataType type = parseDataType(typeName);
  if (opCode < 0 || opCode >= kNumReduceOps) {
    throw InvalidArgument("unknown reduce op " + std::to_string(opCode));
  }
  const auto op = static_cast<ReduceOp>(opCode);
  if (!isSupported(type, op)) {
    throw InvalidArgument(std::string("ReduceOp.") + reduceOpName(op) + " is not supported for " + typeName);
  }
  if (handleSize == 0 || handleSize > sizeof(uint64_t)) {
    throw InvalidArgument("MPI_Op handles of " + std::to_string(handleSize) + " bytes are not supported");
  }
  void* handle = dlopen(library.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) {
    throw std::runtime_error("cannot find the loaded MPI library through " + library + ": " + dlerror());
  }
  auto create = reinterpret_cast<MpiOpCreate>(dlsym(handle, "MPI_Op_create"));
  dlclose(handle);  // only drops the reference RTLD_NOLOAD took; the library stays loaded
  if (create == nullptr) {
    throw std::runtime_error("the MPI library linked by " + library + " has no MPI_Op_create");
  }
  std::array<unsigned char, sizeof(uint64_t)> raw{};
  const int status = create(kUserFunctions[static_cast<size_t>(type) * kNumReduceOps + opCode], 1, raw.data());
  if (status != 0) {
    throw std::runtime_error("MPI_Op_create failed with error code " + std::to_string(status));
  }
  uint64_t value = 0;
  for (size_t byte = 0; byte < handleSize; ++byte) value |= uint64_t{raw[byte]} << (8 * byte);
  return value;
}

}  // namespace

void initMpiSupport(py::module_& m) {
  borrowedType = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&borrowedSpec));
  if (borrowedType == nullptr) throw py::error_already_set();
  m.add_object("_BorrowedBuffer", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(borrowedType)));
  for (PyMethodDef* method = borrowMethods; method->ml_name != nullptr; ++method) {
    py::object function = py::reinterpret_steal<py::object>(PyCFunction_NewEx(method, nullptr, m.ptr()));
    if (!function) throw py::error_already_set();
    m.add_object(method->ml_name, function);
  }
  m.def(
      "_check_reduction",
      [](const std::string& what, const std::string& type, int op) {
        if (op < 0 || op >= kNumReduceOps) {
          throw InvalidArgument(what + ": unknown ReduceOp " + std::to_string(op));
        }
        checkReduction(what.c_str(), parseDataType(type), static_cast<ReduceOp>(op));
      },
      py::arg("what"), py::arg("dtype"), py::arg("op"),
      "Raises ValueError, with the message of every collective, when op is not defined on dtype.");
  m.def(
      "_premultiply",
      [](uintptr_t address, size_t count, const std::string& type, double factor) {
        const DataType parsed = parseDataType(type);
        py::gil_scoped_release release;
        premultiply(reinterpret_cast<void*>(address), count, parsed, factor);
      },
      py::arg("address"), py::arg("count"), py::arg("dtype"), py::arg("factor"),
      "In place on count elements of dtype at address (memory the caller owns): every element *= factor, as "
      "PREMUL_SUM scales each input.");
  m.def(
      "_divide_by_ranks",
      [](uintptr_t address, size_t count, const std::string& type, int64_t ranks) {
        const DataType parsed = parseDataType(type);
        py::gil_scoped_release release;
        divideByRanks(reinterpret_cast<void*>(address), count, parsed, ranks);
      },
      py::arg("address"), py::arg("count"), py::arg("dtype"), py::arg("ranks"),
      "In place on count elements of dtype at address: every element /= ranks, as AVG finishes a sum "
      "(integers truncate toward zero).");
  m.def("_mpi_reduce_op", &createReduceOp, py::arg("library"), py::arg("dtype"), py::arg("op"),
        py::arg("handle_size"),
        "Creates an MPI_Op reducing `dtype` with ringtree's kernel for `op` through the MPI library that the "
        "shared object `library` links; returns its handle as an int.");
}

}  // namespace ringtree::python
