#include "buffers.h"

#include <ringtree/device_backend.h>

#include <array>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>

#include "gil_until_wait.h"

namespace py = pybind11;

namespace ringtree::python {

namespace {

// The DLPack structs ringtree reads: the layouts of dlpack.h 1.x, stable within a major
// version (so we declare them instead of vendoring the header).
namespace dl {

constexpr int32_t kCpu = 1;
constexpr int32_t kCuda = 2;
constexpr int32_t kCudaHost = 3;
constexpr uint64_t kFlagReadOnly = 1;

struct Device {
  int32_t deviceType;
  int32_t deviceId;
};
struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means compact row-major
  uint64_t byteOffset;
};
struct ManagedTensor {  // capsule "dltensor"
  Tensor tensor;
  void* managerContext;
  void (*deleter)(ManagedTensor* self);
};
struct Version {
  uint32_t major;
  uint32_t minor;
};
struct ManagedTensorVersioned {  // capsule "dltensor_versioned"
  Version version;
  void* managerContext;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  Tensor tensor;
};
// `type.__dlpack_c_exchange_api__`: a capsule "dlpack_exchange_api" holding this table.
struct ExchangeApiHeader {
  Version version;
  ExchangeApiHeader* previous;
};
struct ExchangeApi {
  ExchangeApiHeader header;
  void* managedTensorAllocator;
  int (*managedTensorFromPyObjectNoSync)(void* object, ManagedTensorVersioned** out);
  void* managedTensorToPyObjectNoSync;
  // Fills *out, owning nothing: valid while the object lives unchanged.
  int (*dltensorFromPyObjectNoSync)(void* object, Tensor* out);
  // The producer's current stream on a device (torch: torch.cuda.current_stream()); may be null.
  int (*currentWorkStream)(int32_t deviceType, int32_t deviceId, void** stream);
};

}  // namespace dl

// Interned attribute names and constant arguments, created once with the GIL held and
// kept for the life of the process.
struct Names {
  PyObject* dlpack = PyUnicode_InternFromString("__dlpack__");
  PyObject* exchangeApi = PyUnicode_InternFromString("__dlpack_c_exchange_api__");
  PyObject* requiresGrad = PyUnicode_InternFromString("requires_grad");
  PyObject* isConj = PyUnicode_InternFromString("is_conj");
  PyObject* isNeg = PyUnicode_InternFromString("is_neg");
  PyObject* maxVersionKwnames = Py_BuildValue("(s)", "max_version");
  PyObject* maxVersion = Py_BuildValue("(ii)", 1, 0);
};

const Names& names() {
  static const Names* instance = new Names();
  return *instance;
}

// What a Python type offers, looked up once per type.
struct TypeInfo {
  const dl::ExchangeApi* exchange = nullptr;  // null: no usable C exchange table
  // torch.Tensor or a subclass, with the table's unowned form: torch has no read-only
  // tensors, so the form's missing read-only flag loses nothing.
  bool borrowable = false;
  bool hasDlpack = false;
  // torch.Tensor's state that DLPack does not carry (the C exchange table exports the
  // memory regardless of it; __dlpack__ refuses the first two with BufferError).
  bool hasRequiresGrad = false;
  bool hasIsConj = false;
  bool hasIsNeg = false;
};

// Whether the class of `type`'s MRO that defines `attribute` is torch.Tensor.
bool definedByTorchTensor(PyTypeObject* type, PyObject* attribute) {
  PyObject* mro = type->tp_mro;
  if (mro == nullptr || !PyTuple_Check(mro)) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); ++i) {
    auto* base = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i));
    if (base->tp_dict == nullptr || PyDict_GetItemWithError(base->tp_dict, attribute) == nullptr) continue;
    PyObject* module = PyDict_GetItemString(base->tp_dict, "__module__");
    return std::strcmp(base->tp_name, "Tensor") == 0 && module != nullptr && PyUnicode_Check(module) &&
           PyUnicode_CompareWithASCIIString(module, "torch") == 0;
  }
  PyErr_Clear();
  return false;
}

TypeInfo inspectType(PyTypeObject* type) {
  const Names& n = names();
  TypeInfo info;
  PyObject* api = _PyType_Lookup(type, n.exchangeApi);
  if (api != nullptr && PyCapsule_IsValid(api, "dlpack_exchange_api")) {
    auto* header = static_cast<dl::ExchangeApiHeader*>(PyCapsule_GetPointer(api, "dlpack_exchange_api"));
    while (header != nullptr && header->version.major > 1) {
      header = header->previous;
    }
    auto* table = reinterpret_cast<const dl::ExchangeApi*>(header);
    if (table != nullptr && table->header.version.major == 1 && table->managedTensorFromPyObjectNoSync != nullptr) {
      info.exchange = table;
      info.borrowable = table->dltensorFromPyObjectNoSync != nullptr && definedByTorchTensor(type, n.exchangeApi);
    }
  }
  info.hasDlpack = _PyType_Lookup(type, n.dlpack) != nullptr;
  info.hasRequiresGrad = _PyType_Lookup(type, n.requiresGrad) != nullptr;
  info.hasIsConj = _PyType_Lookup(type, n.isConj) != nullptr;
  info.hasIsNeg = _PyType_Lookup(type, n.isNeg) != nullptr;
  return info;
}

// GIL held. Entries keep a reference to their type, so a cached pointer never dangles.
const TypeInfo& typeInfo(PyTypeObject* type) {
  static auto* cache = new std::unordered_map<PyTypeObject*, TypeInfo>();
  static PyTypeObject* lastType = nullptr;
  static const TypeInfo* lastInfo = nullptr;
  if (type == lastType) {
    return *lastInfo;
  }
  auto it = cache->find(type);
  if (it == cache->end()) {
    it = cache->emplace(type, inspectType(type)).first;
    Py_INCREF(reinterpret_cast<PyObject*>(type));
  }
  lastType = type;
  lastInfo = &it->second;
  return it->second;
}

constexpr const char* kSupportedTypes =
    "float16, bfloat16, float32, float64, int8, uint8, int16, int32, int64, bool, complex64, complex128";

[[noreturn]] void throwUnsupportedType(const char* what, const std::string& name) {
  throw py::type_error(std::string(what) + ": unsupported dtype " + name + " (supported: " + kSupportedTypes + ")");
}

std::string dlpackTypeName(const dl::DataType& t) {
  static const char* const kLowPrecision[] = {
      "float8_e3m4",      "float8_e4m3",   "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
      "float8_e5m2fnuz", "float8_e8m0fnu", "float6_e2m3fn",      "float6_e3m2fn", "float4_e2m1fn"};
  const std::string bits = std::to_string(t.bits);
  switch (t.code) {
    case 0: return "int" + bits;
    case 1: return "uint" + bits;
    case 2: return "float" + bits;
    case 3: return "opaque handle";
    case 4: return "bfloat" + bits;
    case 5: return "complex" + bits;
    case 6: return "bool (" + bits + " bits)";
    default:
      if (t.code >= 7 && t.code <= 17) {
        return kLowPrecision[t.code - 7];
      }
      return "DLPack type code " + std::to_string(t.code) + " (" + bits + " bits)";
  }
}

DataType fromDlpackType(const dl::DataType& t, const char* what) {
  if (t.lanes != 1) {
    throwUnsupportedType(what, dlpackTypeName(t) + "x" + std::to_string(t.lanes) + " (vector lanes)");
  }
  switch (t.code) {
    case 0:
      switch (t.bits) {
        case 8: return DataType::kInt8;
        case 16: return DataType::kInt16;
        case 32: return DataType::kInt32;
        case 64: return DataType::kInt64;
        default: break;
      }
      break;
    case 1:
      if (t.bits == 8) {
        return DataType::kUInt8;
      }
      break;
    case 2:
      switch (t.bits) {
        case 16: return DataType::kFloat16;
        case 32: return DataType::kFloat32;
        case 64: return DataType::kFloat64;
        default: break;
      }
      break;
    case 4:
      if (t.bits == 16) {
        return DataType::kBFloat16;
      }
      break;
    case 5:
      if (t.bits == 64) {
        return DataType::kComplex64;
      }
      if (t.bits == 128) {
        return DataType::kComplex128;
      }
      break;
    case 6:
      if (t.bits == 8) {
        return DataType::kBool;
      }
      break;
    default:
      break;
  }
  throwUnsupportedType(what, dlpackTypeName(t));
}

// Python buffer-protocol format (struct module syntax) -> DataType.
DataType fromBufferFormat(const char* format, Py_ssize_t itemSize, const char* what) {
  const char* f = format != nullptr ? format : "B";
  const std::string original = f;
  if (*f == '@' || *f == '=' || *f == '<') {
    ++f;
  } else if ((*f == '>' || *f == '!') && itemSize > 1) {
    throwUnsupportedType(what, "big-endian buffer format '" + original + "'");
  } else if (*f == '>' || *f == '!') {
    ++f;
  }
  const std::string code = f;
  if (code == "?") {
    return DataType::kBool;
  }
  if (code == "b") {
    return DataType::kInt8;
  }
  if (code == "B" || code == "c") {
    return DataType::kUInt8;
  }
  if (code == "h" || code == "i" || code == "l" || code == "q" || code == "n") {
    switch (itemSize) {
      case 2: return DataType::kInt16;
      case 4: return DataType::kInt32;
      case 8: return DataType::kInt64;
      default: break;
    }
  }
  if (code == "H" || code == "I" || code == "L" || code == "Q" || code == "N") {
    throwUnsupportedType(what, "uint" + std::to_string(8 * itemSize));
  }
  if (code == "e") {
    return DataType::kFloat16;
  }
  if (code == "f") {
    return DataType::kFloat32;
  }
  if (code == "d") {
    return DataType::kFloat64;
  }
  if (code == "Zf") {
    return DataType::kComplex64;
  }
  if (code == "Zd") {
    return DataType::kComplex128;
  }
  throwUnsupportedType(what, "buffer format '" + original + "' (" + std::to_string(itemSize) + "-byte items)");
}

// Returns obj.<method>() as a bool; throws on a Python error.
bool callPredicate(PyObject* object, PyObject* method) {
  py::object result = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(object, method));
  if (!result) {
    throw py::error_already_set();
  }
  return PyObject_IsTrue(result.ptr()) == 1;
}

bool attributeIsTrue(PyObject* object, PyObject* name) {
  py::object value = py::reinterpret_steal<py::object>(PyObject_GetAttr(object, name));
  if (!value) {
    throw py::error_already_set();
  }
  return PyObject_IsTrue(value.ptr()) == 1;
}

[[noreturn]] void throwRequiresGrad(const char* what) {
  throw py::value_error(std::string(what) +
                        ": the tensor requires grad; call .detach() first (collectives write in place, "
                        "outside autograd)");
}

[[noreturn]] void throwConj(const char* what) {
  throw py::value_error(std::string(what) +
                        ": the tensor has its conjugate bit set; call .resolve_conj() first (its memory "
                        "holds the unconjugated values)");
}

[[noreturn]] void throwNeg(const char* what) {
  throw py::value_error(std::string(what) +
                        ": the tensor has its negative bit set; call .resolve_neg() first (its memory "
                        "holds the negated values)");
}

// __dlpack__ refused to export: say why in terms of what to do about it.
[[noreturn]] void translateBufferError(py::handle object, const TypeInfo& info, const char* what,
                                       py::error_already_set& error) {
  const Names& n = names();
  if (info.hasRequiresGrad && attributeIsTrue(object.ptr(), n.requiresGrad)) {
    throwRequiresGrad(what);
  }
  if (info.hasIsConj && callPredicate(object.ptr(), n.isConj)) {
    throwConj(what);
  }
  throw py::value_error(std::string(what) + ": the buffer cannot be exported: " + error.what());
}

bool isComplex(DataType type) { return type == DataType::kComplex64 || type == DataType::kComplex128; }

bool isFloating(DataType type) {
  switch (type) {
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kComplex64:
    case DataType::kComplex128:
      return true;
    default:
      return false;
  }
}

// The last torch tensors whose view bits (conjugate, negative) were found clear, by weak
// reference (GIL held): torch fixes these bits when it makes a tensor (a view with either
// bit is a new tensor), so calls on the same tensors again skip is_neg() and is_conj(),
// which go through torch's dispatcher (~60 ns each). Four: a call's input and output, and
// a caller alternating between two buffers. Only torch's private _set_neg/_set_conj change
// the bits in place, and are not looked for again.
constexpr size_t kViewBitsChecked = 4;
std::array<PyObject*, kViewBitsChecked> viewBitsCheckedOf{};  // weak references, or null
size_t nextViewBitsChecked = 0;

bool viewBitsChecked(PyObject* object) {
  for (PyObject* reference : viewBitsCheckedOf) {
    if (reference == nullptr) continue;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject* referent = nullptr;
    if (PyWeakref_GetRef(reference, &referent) < 0) {
      PyErr_Clear();
      continue;
    }
    Py_XDECREF(referent);  // only compared; `object` itself is held by the caller
    if (referent == object) return true;
#else
    if (PyWeakref_GetObject(reference) == object) return true;
#endif
  }
  return false;
}

void rememberViewBitsChecked(PyObject* object) {
  PyObject* reference = PyWeakref_NewRef(object, nullptr);
  if (reference == nullptr) {
    PyErr_Clear();  // a type without weak references: looked at every time
    return;
  }
  Py_XSETREF(viewBitsCheckedOf[nextViewBitsChecked], reference);
  nextViewBitsChecked = (nextViewBitsChecked + 1) % kViewBitsChecked;
}

}  // namespace

bool pythonIsFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

Buffer::Buffer(py::handle object, Access access, const char* what, Hold hold) {
  // The destructor does not run when a constructor throws: release what was taken here.
  try {
    acquire(object, access, what, hold);
  } catch (...) {
    release();
    throw;
  }
}

void Buffer::acquire(py::handle object, Access access, const char* what, Hold hold) {
  const TypeInfo& info = typeInfo(Py_TYPE(object.ptr()));
  if (info.exchange != nullptr) {
    fromExchangeApi(object, info.exchange, access, what, hold == Hold::kCall && info.borrowable);
    // The table exports the memory whatever the tensor's autograd and view state.
    const Names& n = names();
    if (info.hasRequiresGrad && isFloating(type_) && attributeIsTrue(object.ptr(), n.requiresGrad)) {
      throwRequiresGrad(what);
    }
    if (info.borrowable && viewBitsChecked(object.ptr())) return;
    if (info.hasIsConj && isComplex(type_) && callPredicate(object.ptr(), n.isConj)) {
      throwConj(what);
    }
  } else if (info.hasDlpack) {
    try {
      fromCapsule(object, access, what);
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_BufferError)) {
        throw;
      }
      translateBufferError(object, info, what, e);
    }
  } else {
    fromBufferProtocol(object, access, what);
    return;
  }
  // DLPack exports a negative-bit view's memory without the sign.
  if (info.hasIsNeg && callPredicate(object.ptr(), names().isNeg)) {
    throwNeg(what);
  }
  if (info.borrowable) rememberViewBitsChecked(object.ptr());
}

void Buffer::fromExchangeApi(py::handle object, const void* api, Access access, const char* what, bool borrow) {
  const auto* table = static_cast<const dl::ExchangeApi*>(api);
  dl::Tensor borrowed{};
  const dl::Tensor* tensor = &borrowed;
  const int failed = borrow ? table->dltensorFromPyObjectNoSync(object.ptr(), &borrowed) : [&] {
    dl::ManagedTensorVersioned* managed = nullptr;
    const int rc = table->managedTensorFromPyObjectNoSync(object.ptr(), &managed);
    if (rc == 0) {
      managed_ = managed;
      owner_ = Owner::kVersioned;
      tensor = &managed->tensor;
    }
    return rc;
  }();
  if (failed != 0) {
    // The producer cannot describe this tensor in DLPack (a meta or sparse tensor, ...);
    // torch reports that as RuntimeError with a C++ backtrace: keep the first line.
    py::error_already_set error;
    if (!error.matches(PyExc_BufferError) && !error.matches(PyExc_RuntimeError)) {
      throw error;
    }
    std::string message = py::str(error.value());
    message = message.substr(0, message.find('\n'));
    throw py::value_error(std::string(what) + ": the buffer cannot be exported: " + message);
  }
  if (!borrow && access == Access::kReadWrite &&
      (static_cast<dl::ManagedTensorVersioned*>(managed_)->flags & dl::kFlagReadOnly) != 0) {
    throw py::value_error(std::string(what) + ": the buffer is read-only, and the collective writes it in place");
  }
  readTensor(tensor, what);
  // The table exports without synchronising: CUDA work on the buffer is ordered after the
  // producer's current stream, which the device backend then waits for.
  if (device_.type == DeviceType::kCuda && table->currentWorkStream != nullptr) {
    void* stream = nullptr;
    if (table->currentWorkStream(dl::kCuda, tensor->device.deviceId, &stream) == 0) {
      setCurrentStream(device_, stream);
    }
  }
}

void Buffer::fromCapsule(py::handle object, Access access, const char* what) {
  const Names& n = names();
  PyObject* args[] = {object.ptr(), n.maxVersion};
  auto capsule = py::reinterpret_steal<py::object>(PyObject_VectorcallMethod(n.dlpack, args, 1, n.maxVersionKwnames));
  if (!capsule) {
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
      throw py::error_already_set();
    }
    PyErr_Clear();  // a producer from before DLPack 1.0 (no max_version keyword)
    capsule = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(object.ptr(), n.dlpack));
    if (!capsule) {
      throw py::error_already_set();
    }
  }
  // Renaming the capsule takes ownership: its destructor no longer calls the deleter,
  // release() does (the protocol's rule for consumers).
  if (PyCapsule_IsValid(capsule.ptr(), "dltensor_versioned")) {
    auto* managed = static_cast<dl::ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor_versioned"));
    PyCapsule_SetName(capsule.ptr(), "used_dltensor_versioned");
    managed_ = managed;
    owner_ = Owner::kVersioned;
    if (managed->version.major != 1) {
      throw py::buffer_error(std::string(what) + ": DLPack " + std::to_string(managed->version.major) + "." +
                             std::to_string(managed->version.minor) + " capsules are not supported (only 1.x)");
    }
    if (access == Access::kReadWrite && (managed->flags & dl::kFlagReadOnly) != 0) {
      throw py::value_error(std::string(what) + ": the buffer is read-only, and the collective writes it in place");
    }
    readTensor(&managed->tensor, what);
  } else if (PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    auto* managed = static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");
    managed_ = managed;
    owner_ = Owner::kLegacy;
    readTensor(&managed->tensor, what);
  } else {
    throw py::type_error(std::string(what) + ": " + Py_TYPE(object.ptr())->tp_name +
                         ".__dlpack__() did not return a DLPack capsule");
  }
}

void Buffer::readTensor(const void* tensorPtr, const char* what) {
  const auto& tensor = *static_cast<const dl::Tensor*>(tensorPtr);
  const int32_t device = tensor.device.deviceType;
  if (device == dl::kCuda) {
    device_ = Device{DeviceType::kCuda, tensor.device.deviceId};  // ProcessGroup picks its backend
    // __dlpack__() without a stream made the buffer ready for the legacy default stream
    // (the protocol's rule), which is what the device backend waits for unless told more.
    setCurrentStream(device_, nullptr);
  } else if (device != dl::kCpu && device != dl::kCudaHost) {
    throw py::value_error(std::string(what) + ": the buffer is on DLPack device type " + std::to_string(device) +
                          "; ringtree's collectives take host (CPU) and CUDA memory");
  }
  type_ = fromDlpackType(tensor.dtype, what);
  size_t count = 1;
  for (int32_t i = 0; i < tensor.ndim; ++i) {
    count *= static_cast<size_t>(tensor.shape[i]);
  }
  if (count > 0 && tensor.strides != nullptr) {
    int64_t expected = 1;
    for (int32_t i = tensor.ndim - 1; i >= 0; --i) {
      if (tensor.shape[i] != 1 && tensor.strides[i] != expected) {
        throw py::value_error(std::string(what) +
                              ": the buffer is non-contiguous; collectives need C-contiguous memory: call "
                              ".contiguous() (torch) or numpy.ascontiguousarray() first");
      }
      expected *= tensor.shape[i];
    }
  }
  count_ = count;
  rows_ = tensor.ndim > 0 ? static_cast<size_t>(tensor.shape[0]) : 1;
  data_ = static_cast<char*>(tensor.data) + tensor.byteOffset;
}

void Buffer::fromBufferProtocol(py::handle object, Access access, const char* what) {
  if (!PyObject_CheckBuffer(object.ptr())) {
    throw py::type_error(std::string(what) + ": expected a tensor or array (an object with __dlpack__ or the buffer "
                         "protocol), got " + Py_TYPE(object.ptr())->tp_name);
  }
  view_ = std::make_unique<Py_buffer>();
  if (PyObject_GetBuffer(object.ptr(), view_.get(), PyBUF_RECORDS_RO) != 0) {
    throw py::error_already_set();
  }
  owner_ = Owner::kView;
  if (access == Access::kReadWrite && view_->readonly) {
    throw py::value_error(std::string(what) + ": the buffer is read-only, and the collective writes it in place");
  }
  if (!PyBuffer_IsContiguous(view_.get(), 'C')) {
    throw py::value_error(std::string(what) +
                          ": the buffer is non-contiguous; collectives need C-contiguous memory: call "
                          ".contiguous() (torch) or numpy.ascontiguousarray() first");
  }
  type_ = fromBufferFormat(view_->format, view_->itemsize, what);
  data_ = view_->buf;
  count_ = view_->itemsize > 0 ? static_cast<size_t>(view_->len / view_->itemsize) : 0;
  rows_ = view_->ndim > 0 && view_->shape != nullptr ? static_cast<size_t>(view_->shape[0]) : (view_->ndim > 0 ? count_ : 1);
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(other.data_),
      count_(other.count_),
      rows_(other.rows_),
      type_(other.type_),
      device_(other.device_),
      owner_(std::exchange(other.owner_, Owner::kNone)),
      managed_(std::exchange(other.managed_, nullptr)),
      view_(std::move(other.view_)) {}

Buffer::~Buffer() { release(); }

void Buffer::release() noexcept {
  if (owner_ == Owner::kNone || pythonIsFinalizing()) {
    return;  // nothing held, or Python is going away: leak rather than call into it
  }
  const PythonRunsHere python;  // a deleter may run Python code (a capsule's, __del__)
  switch (owner_) {
    case Owner::kVersioned: {
      auto* managed = static_cast<dl::ManagedTensorVersioned*>(managed_);
      if (managed->deleter != nullptr) {
        managed->deleter(managed);
      }
      break;
    }
    case Owner::kLegacy: {
      auto* managed = static_cast<dl::ManagedTensor*>(managed_);
      if (managed->deleter != nullptr) {
        managed->deleter(managed);
      }
      break;
    }
    case Owner::kView: {
      const PyGILState_STATE state = PyGILState_Ensure();
      PyBuffer_Release(view_.get());
      PyGILState_Release(state);
      break;
    }
    case Owner::kNone:
      break;
  }
  owner_ = Owner::kNone;
}

}  // namespace ringtree::python
