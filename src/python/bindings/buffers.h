#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include <ringtree/buffer.h>
#include <ringtree/types.h>

namespace ringtree::python {

// Whether a collective writes the buffer (all of them do, except broadcast on its root).
enum class Access { kRead, kReadWrite };

// How long the borrow must last. kCall: a synchronous call, during which the caller holds
// the object (its frame does), so nothing needs keeping: torch tensors are then read
// without an export to free afterwards (DLPack's dltensor_from_py_object_no_sync, no
// allocation). kExport: an asynchronous call, whose Work outlives the caller's frame: an
// owning DLPack export (or buffer view) keeps the memory.
enum class Hold { kCall, kExport };

// The memory of a Python tensor or array, borrowed zero-copy for one operation: its
// first element, element count, type and device, and whatever keeps it valid.
//
// Accepted: any object with __dlpack__ (torch, NumPy, CuPy, JAX, ...), read through
// DLPack's C exchange table (`type.__dlpack_c_exchange_api__`) when the type offers one,
// else through a `__dlpack__(max_version=(1, 0))` capsule (legacy `__dlpack__()` for
// producers without versioned capsules); objects without __dlpack__ through the buffer
// protocol (bytearray, memoryview, array.array, ...). The memory must be host memory
// (DLPack device CPU or CUDA host) or CUDA memory (the view names the device; the process
// group refuses a device it has no backend for), C-contiguous (sizes of 1 may have any
// stride), of a
// supported element type, writable for Access::kReadWrite, and — for torch — must not
// require grad nor carry a conjugate or negative bit.
//
// Threading: created with the GIL held. The destructor may run on any thread, with or
// without the GIL: it calls the DLPack deleter (which the protocol makes callable from
// any thread) exactly once, or releases a buffer-protocol view taking the GIL itself. At
// interpreter shutdown it leaks instead (Python can no longer release anything).
class Buffer {
 public:
  // Raises TypeError for an object that is not a buffer or has an unsupported element
  // type (the message names it), ValueError for everything else that makes the buffer
  // unusable (device, layout, read-only, requires grad, ...). `what` names the call in
  // messages ("all_reduce").
  Buffer(pybind11::handle object, Access access, const char* what, Hold hold = Hold::kExport);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer& operator=(Buffer&&) = delete;

  // The borrowed memory, for ProcessGroup: its rows are the size of dim 0 (1 for a 0-dim
  // tensor), which all_to_all_single splits by.
  BufferView view() const { return BufferView(data_, count_, type_, device_, rows_); }
  // Whether it holds an export or view of its own (released by its destructor); false for
  // a Hold::kCall borrow, whose memory only a reference to the object keeps.
  bool ownsExport() const { return owner_ != Owner::kNone; }

 private:
  enum class Owner { kNone, kVersioned, kLegacy, kView };

  void acquire(pybind11::handle object, Access access, const char* what, Hold hold);
  // borrow: read the tensor without an owning export (Hold::kCall, and a producer whose
  // tensors are never read-only, which the unowned form cannot say).
  void fromExchangeApi(pybind11::handle object, const void* api, Access access, const char* what, bool borrow);
  void fromCapsule(pybind11::handle object, Access access, const char* what);
  void fromBufferProtocol(pybind11::handle object, Access access, const char* what);
  // Reads the DLTensor at `tensor` (a DLPack DLTensor) into data_, count_ and type_.
  void readTensor(const void* tensor, const char* what);
  void release() noexcept;

  void* data_ = nullptr;
  size_t count_ = 0;
  size_t rows_ = 1;
  DataType type_ = DataType::kUInt8;
  Device device_{};
  Owner owner_ = Owner::kNone;
  void* managed_ = nullptr;  // the DLManagedTensor(Versioned) whose deleter we call
  // A buffer-protocol view, on the heap: it must be released at the address it was filled
  // in (PyBuffer_FillInfo points its shape into it).
  std::unique_ptr<Py_buffer> view_;
};

// Whether the interpreter is shutting down (then nothing may call into Python any more).
// Callable without the GIL.
bool pythonIsFinalizing();

}  // namespace ringtree::python
