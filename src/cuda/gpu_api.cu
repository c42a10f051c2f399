// RingtreeGpuApi (src/cpp/backends/cuda/gpu_api.h): thin wrappers over the CUDA runtime,
// linked statically into libringtree_cuda.so, and the library's one exported symbol.
//
// Every wrapper returns the runtime's error code as an int (0 = cudaSuccess) and works on
// the calling thread's current device. A null stream means the legacy default stream.

#include <cuda_runtime.h>

#include "backends/cuda/gpu_api.h"
#include "reduce_kernels.cuh"

static_assert(RINGTREE_GPU_NOT_READY == cudaErrorNotReady, "gpu_api.h's not-ready code is cudaErrorNotReady");
static_assert(cudaErrorInvalidValue == 1, "gpu_api.h promises 1 for an unsupported (type, op)");

namespace ringtree::gpu {
namespace {

cudaStream_t toStream(void* stream) {
  return stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream);
}

const char* errorString(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

// cudaDriverGetVersion reports 0, successfully, when no driver is installed; the loader
// tells that apart (gpu_runtime.cc).
int driverVersion(int* version) { return cudaDriverGetVersion(version); }

int deviceCount(int* count) { return cudaGetDeviceCount(count); }
int setDevice(int device) { return cudaSetDevice(device); }
int getDevice(int* device) { return cudaGetDevice(device); }

// Device memory and managed memory name their device; host memory, pinned or not, is -1.
int pointerDevice(const void* pointer, int* device) {
  cudaPointerAttributes attributes{};
  const cudaError_t error = cudaPointerGetAttributes(&attributes, pointer);
  if (error == cudaErrorInvalidValue) {
    // Memory the runtime does not know (older drivers say so with an error): host memory.
    // Clear the error, so the next call's cudaGetLastError does not report it.
    (void)cudaGetLastError();
    *device = -1;
    return cudaSuccess;
  }
  if (error != cudaSuccess) {
    return error;
  }
  switch (attributes.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
      *device = attributes.device;
      break;
    default:  // cudaMemoryTypeHost, cudaMemoryTypeUnregistered
      *device = -1;
      break;
  }
  return cudaSuccess;
}

int streamCreate(void** stream) {
  cudaStream_t created = nullptr;
  const cudaError_t error = cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking);
  if (error == cudaSuccess) {
    *stream = created;
  }
  return error;
}

int streamDestroy(void* stream) { return cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }

int streamWaitEvent(void* stream, void* event) {
  return cudaStreamWaitEvent(toStream(stream), static_cast<cudaEvent_t>(event), 0);
}

int streamSynchronize(void* stream) { return cudaStreamSynchronize(toStream(stream)); }

int eventCreate(void** event) {
  cudaEvent_t created = nullptr;
  const cudaError_t error = cudaEventCreateWithFlags(&created, cudaEventDisableTiming);
  if (error == cudaSuccess) {
    *event = created;
  }
  return error;
}

int eventDestroy(void* event) { return cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

int eventRecord(void* event, void* stream) {
  return cudaEventRecord(static_cast<cudaEvent_t>(event), toStream(stream));
}

int eventQuery(void* event) { return cudaEventQuery(static_cast<cudaEvent_t>(event)); }

int eventSynchronize(void* event) { return cudaEventSynchronize(static_cast<cudaEvent_t>(event)); }

int deviceMalloc(void** pointer, size_t bytes) { return cudaMalloc(pointer, bytes); }

int deviceFree(void* pointer) { return cudaFree(pointer); }

int memcpyAsync(void* destination, const void* source, size_t bytes, void* stream) {
  return cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, toStream(stream));
}

int reduce(void* inout, const void* in, size_t count, int dataType, int reduceOp, void* stream) {
  return launchReduce(inout, in, count, dataType, reduceOp, toStream(stream));
}

int scale(void* data, size_t count, int dataType, double factor, void* stream) {
  return launchScale(data, count, dataType, factor, toStream(stream));
}

int divide(void* data, size_t count, int dataType, int64_t divisor, void* stream) {
  return launchDivide(data, count, dataType, divisor, toStream(stream));
}

// The driver's cuDeviceGet and cuDevicePrimaryCtxGetState (CUresult and CUdevice are ints),
// found through the runtime: the library does not link the driver library.
using DeviceGetFunction = int (*)(int* device, int ordinal);
using PrimaryContextStateFunction = int (*)(int device, unsigned int* flags, int* active);

void* driverFunction(const char* name) {
  void* function = nullptr;
#if CUDART_VERSION >= 12000
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t error = cudaGetDriverEntryPointByVersion(name, &function, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t error = cudaGetDriverEntryPoint(name, &function, cudaEnableDefault, &found);
#endif
  const bool ok = error == cudaSuccess && found == cudaDriverEntryPointSuccess;
#else  // CUDA 11.3-11.8
  const cudaError_t error = cudaGetDriverEntryPoint(name, &function, cudaEnableDefault);
  const bool ok = error == cudaSuccess;
#endif
  if (error != cudaSuccess) (void)cudaGetLastError();
  return ok ? function : nullptr;
}

// Where the driver cannot say whether the context is active, the device is set (what
// setDevice does): a context too many rather than a thread left on the wrong device.
int setDeviceIfActive(int device) {
  static const auto deviceGet = reinterpret_cast<DeviceGetFunction>(driverFunction("cuDeviceGet"));
  static const auto contextState =
      reinterpret_cast<PrimaryContextStateFunction>(driverFunction("cuDevicePrimaryCtxGetState"));
  int handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (deviceGet != nullptr && contextState != nullptr && deviceGet(&handle, device) == 0 &&
      contextState(handle, &flags, &active) == 0 && active == 0) {
    return cudaSuccess;
  }
  return cudaSetDevice(device);
}

RingtreeGpuApi makeApi() {
  RingtreeGpuApi api{};
  api.version = RINGTREE_GPU_API_VERSION;
  api.size = sizeof(RingtreeGpuApi);
  api.runtimeVersion = CUDART_VERSION;
  api.errorString = &errorString;
  api.driverVersion = &driverVersion;
  api.deviceCount = &deviceCount;
  api.setDevice = &setDevice;
  api.getDevice = &getDevice;
  api.pointerDevice = &pointerDevice;
  api.streamCreate = &streamCreate;
  api.streamDestroy = &streamDestroy;
  api.streamWaitEvent = &streamWaitEvent;
  api.streamSynchronize = &streamSynchronize;
  api.eventCreate = &eventCreate;
  api.eventDestroy = &eventDestroy;
  api.eventRecord = &eventRecord;
  api.eventQuery = &eventQuery;
  api.eventSynchronize = &eventSynchronize;
  api.deviceMalloc = &deviceMalloc;
  api.deviceFree = &deviceFree;
  api.memcpyAsync = &memcpyAsync;
  api.reduce = &reduce;
  api.scale = &scale;
  api.divide = &divide;
  api.setDeviceIfActive = &setDeviceIfActive;
  return api;
}

}  // namespace
}  // namespace ringtree::gpu

// The table when the caller speaks this library's version, else null. Touches no CUDA
// state: safe to call where no driver or device exists. Thread-safe.
extern "C" __attribute__((visibility("default"))) const RingtreeGpuApi* ringtree_gpu_api(uint32_t version) {
  static const RingtreeGpuApi api = ringtree::gpu::makeApi();
  return version == RINGTREE_GPU_API_VERSION ? &api : nullptr;
}
