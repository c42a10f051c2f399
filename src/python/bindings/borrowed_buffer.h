#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include <ringtree/error.h>
#include <ringtree/types.h>

#include "buffers.h"
#include "errors.h"

// _BorrowedBuffer: a host buffer borrowed for one call of ringtree.mpi (the MPI backend),
// as a plain CPython object whose buffer protocol mpi4py reads, and the mpi4py messages
// built on it. Private API; GIL held everywhere.
namespace ringtree::python {

// A buffer borrowed for one MPI call: its memory stays valid while this object lives
// (the MPI backend holds it until the operation completed).
class BorrowedBuffer {
 public:
  BorrowedBuffer(pybind11::handle object, bool writable, const char* what)
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
  size_t nbytes() const { return view_.bytes(); }
  size_t rows() const { return view_.leadingRows(); }
  const char* dtype() const { return dataTypeName(view_.type); }

 private:
  Buffer buffer_;
  BufferView view_;
  bool writable_;
};

// The BorrowedBuffer inside a _BorrowedBuffer object.
BorrowedBuffer& borrowedOf(PyObject* object);

// torch's name of `type` as an interned Python string (a borrowed reference, never freed).
pybind11::handle dataTypeNameObject(DataType type);

// The mpi4py message [borrowed, count, datatypes[type]] of `object`, borrowed for `what`
// (datatypes: a tuple of kNumDataTypes MPI datatypes); *type receives its element type.
// Throws as Buffer does, and InvalidArgument past MPI's int counts.
pybind11::object mpiMessage(PyObject* object, bool writable, const char* what, PyObject* datatypes, DataType* type);

// Whether `datatypes` is a tuple of kNumDataTypes entries; else sets TypeError naming `name`.
bool checkDatatypes(PyObject* datatypes, const char* name);

// Adds _BorrowedBuffer, _borrow(buffer, writable, what) and
// _mpi_borrow(buffer, writable, what, datatypes) to the module.
void initBorrowedBuffer(pybind11::module_& m);

}  // namespace ringtree::python
