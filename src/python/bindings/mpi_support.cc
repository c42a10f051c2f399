#include "mpi_support.h"

#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include <ringtree/error.h>
#include <ringtree/reductions.h>
#include <ringtree/types.h>

#include "borrowed_buffer.h"
#include "mpi_fast_calls.h"
#include "mpi_request_work.h"

namespace py = pybind11;

namespace ringtree::python {

namespace {

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
  initBorrowedBuffer(m);
  initRequestWork(m);
  initMpiFastCalls(m);
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
