#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <ringtree/export.h>
#include <ringtree/types.h>

// What this process has for CUDA buffers. ringtree's core never links CUDA or NCCL: it
// opens ringtree's CUDA library (libringtree_cuda.so) and NCCL when a group first meets a
// CUDA buffer, and these report whether that would work, without creating anything.
namespace ringtree {

struct CudaStatus {
  bool available = false;  // the library, a driver and at least one device
  std::string reason;      // why not, when !available (what is missing, where it looked)
  int deviceCount = 0;
  int driverVersion = 0;   // 13000 = CUDA 13.0
  int runtimeVersion = 0;  // the CUDA runtime the library was built with
};

struct NcclStatus {
  bool available = false;  // a usable libnccl (version kMinNcclVersion or later)
  std::string reason;      // why not, when !available
  int version = 0;         // ncclGetVersion's code: 22807 = 2.28.7
  std::string path;        // the library file
};

// Loads (once per process) and reports. Thread-safe; never throws for what is missing.
RINGTREE_API CudaStatus cudaStatus();
RINGTREE_API NcclStatus ncclStatus();

// ringtree's CUDA reduction kernels, on device memory of the calling thread's current
// device, enqueued on `stream` (a cudaStream_t; null: the legacy default stream), for
// tests and benchmarks of the kernels themselves (collectives call them internally):
//  - cudaReduce: inout[i] = inout[i] (op) in[i] (AVG and PREMUL_SUM reduce as SUM);
//  - cudaScale: data[i] *= factor; cudaDivide: data[i] /= divisor;
// with the CPU engine's semantics (algorithms' reduceFunction, scale, divide). Throws
// InvalidArgument for what isSupported refuses, Error when CUDA buffers cannot be used
// here or the launch fails.
RINGTREE_API void cudaReduce(void* inout, const void* in, size_t count, DataType type, ReduceOp op, void* stream);
RINGTREE_API void cudaScale(void* data, size_t count, DataType type, double factor, void* stream);
RINGTREE_API void cudaDivide(void* data, size_t count, DataType type, int64_t divisor, void* stream);

}  // namespace ringtree
