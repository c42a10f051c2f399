#pragma once

// The C interface of ringtree's CUDA library (libringtree_cuda.so, built from src/cuda
// when a CUDA toolkit is found). The core never includes a CUDA header: it opens the
// library at run time (backends/cuda/gpu_runtime.h) and drives the GPU through this
// table only, so a core built without CUDA runs CUDA buffers wherever the library and a
// driver are present. Plain C types: the library and the core share no C++ ABI.
//
// Handles (streams, events) are the CUDA runtime's, passed as void*. Every call works on
// the calling thread's current device (setDevice) and returns 0 on success, or the CUDA
// runtime's error code (errorString names it). A null stream is the legacy default stream.
//
// Element types and reduction ops are ringtree::DataType / ringtree::ReduceOp values.

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bumped when a member is removed or changes meaning; members are only appended.
#define RINGTREE_GPU_API_VERSION 1u
// What eventQuery returns while the work before the event has not finished
// (cudaErrorNotReady).
#define RINGTREE_GPU_NOT_READY 600

typedef struct RingtreeGpuApi {
  uint32_t version;     // RINGTREE_GPU_API_VERSION of the library
  uint32_t size;        // sizeof(RingtreeGpuApi) in the library
  int runtimeVersion;   // the CUDA runtime the library was built with (13000 = 13.0)

  const char* (*errorString)(int error);
  // The driver's CUDA version (13000 = 13.0); 0 when no driver is installed.
  int (*driverVersion)(int* version);
  int (*deviceCount)(int* count);
  int (*setDevice)(int device);
  int (*getDevice)(int* device);
  // The device that owns `pointer`'s memory, or -1 for host memory (pageable or pinned).
  int (*pointerDevice)(const void* pointer, int* device);

  // A non-blocking stream (no implicit ordering with the legacy default stream).
  int (*streamCreate)(void** stream);
  int (*streamDestroy)(void* stream);
  int (*streamWaitEvent)(void* stream, void* event);
  int (*streamSynchronize)(void* stream);
  // An event without timing.
  int (*eventCreate)(void** event);
  int (*eventDestroy)(void* event);
  int (*eventRecord)(void* event, void* stream);
  // 0 once the work recorded before the event finished, RINGTREE_GPU_NOT_READY before.
  int (*eventQuery)(void* event);
  int (*eventSynchronize)(void* event);

  int (*deviceMalloc)(void** pointer, size_t bytes);
  int (*deviceFree)(void* pointer);
  // Any direction (host or device memory on either side), ordered on `stream`.
  int (*memcpyAsync)(void* destination, const void* source, size_t bytes, void* stream);

  // The reduction kernels (src/cuda/reduce_kernels.cuh), on `stream`:
  //  reduce: inout[i] = inout[i] (op) in[i]; AVG and PREMUL_SUM reduce as SUM (the caller
  //          scales before or divides after), as the CPU engine's reduceFunction does.
  //  scale:  data[i] *= factor (PREMUL_SUM), divide: data[i] /= divisor (AVG); the CPU
  //          engine's scale() and divide() semantics.
  // An unsupported (type, op), or a pointer not aligned to its element's size, returns
  // cudaErrorInvalidValue (1).
  int (*reduce)(void* inout, const void* in, size_t count, int dataType, int reduceOp, void* stream);
  int (*scale)(void* data, size_t count, int dataType, double factor, void* stream);
  int (*divide)(void* data, size_t count, int dataType, int64_t divisor, void* stream);

  // Makes `device` the calling thread's device only where that device's primary context
  // is active already, and leaves the thread's device as it is otherwise (0 either way):
  // for putting back a thread's earlier device without creating a context there (a thread
  // that never chose a device reads device 0, and a context costs hundreds of MiB).
  int (*setDeviceIfActive)(int device);
} RingtreeGpuApi;

// The library's one exported symbol: its table when it speaks `version`, else null.
typedef const RingtreeGpuApi* (*RingtreeGpuApiEntry)(uint32_t version);
#define RINGTREE_GPU_API_ENTRY "ringtree_gpu_api"

#ifdef __cplusplus
}
#endif
