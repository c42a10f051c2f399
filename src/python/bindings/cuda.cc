#include "cuda.h"

#include <cstddef>
#include <cstdint>

#include <ringtree/cuda.h>
#include <ringtree/device_backend.h>
#include <ringtree/types.h>

namespace py = pybind11;

namespace ringtree::python {

void initCuda(py::module_& m) {
  m.def(
      "_cuda_status",
      [] {
        const CudaStatus status = [] {
          py::gil_scoped_release release;
          return cudaStatus();
        }();
        py::dict result;
        result["available"] = status.available;
        result["reason"] = status.reason;
        result["device_count"] = status.deviceCount;
        result["driver_version"] = status.driverVersion;
        result["runtime_version"] = status.runtimeVersion;
        return result;
      },
      "Whether ringtree's CUDA library, a driver and a device are there (loads the library once).");
  m.def(
      "_nccl_status",
      [] {
        const NcclStatus status = [] {
          py::gil_scoped_release release;
          return ncclStatus();
        }();
        py::dict result;
        result["available"] = status.available;
        result["reason"] = status.reason;
        result["version"] = status.version;
        result["path"] = status.path;
        return result;
      },
      "Whether a usable NCCL is there, its version code and file (loads it once).");
  m.def(
      "_set_current_stream",
      [](int device, uintptr_t stream) {
        setCurrentStream(Device{DeviceType::kCuda, device}, reinterpret_cast<void*>(stream));
      },
      py::arg("device"), py::arg("stream"),
      "Makes `stream` (a cudaStream_t) this thread's current stream of CUDA device `device` for ringtree "
      "(what a Work.wait() then orders after the operation).");
  // The kernels on raw device pointers (tests and benchmarks pass tensor.data_ptr()).
  m.def(
      "_cuda_reduce",
      [](uintptr_t inout, uintptr_t in, size_t count, int type, int op, uintptr_t stream) {
        cudaReduce(reinterpret_cast<void*>(inout), reinterpret_cast<const void*>(in), count,
                   static_cast<DataType>(type), static_cast<ReduceOp>(op), reinterpret_cast<void*>(stream));
      },
      py::arg("inout"), py::arg("input"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("stream"),
      py::call_guard<py::gil_scoped_release>(),
      "inout[i] = inout[i] (op) input[i] with ringtree's CUDA kernel (dtype, op: DataType / ReduceOp values).");
  m.def(
      "_cuda_scale",
      [](uintptr_t data, size_t count, int type, double factor, uintptr_t stream) {
        cudaScale(reinterpret_cast<void*>(data), count, static_cast<DataType>(type), factor,
                  reinterpret_cast<void*>(stream));
      },
      py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("factor"), py::arg("stream"),
      py::call_guard<py::gil_scoped_release>(), "data[i] *= factor with ringtree's CUDA kernel.");
  m.def(
      "_cuda_divide",
      [](uintptr_t data, size_t count, int type, int64_t divisor, uintptr_t stream) {
        cudaDivide(reinterpret_cast<void*>(data), count, static_cast<DataType>(type), divisor,
                   reinterpret_cast<void*>(stream));
      },
      py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("divisor"), py::arg("stream"),
      py::call_guard<py::gil_scoped_release>(), "data[i] /= divisor with ringtree's CUDA kernel.");
}

}  // namespace ringtree::python
