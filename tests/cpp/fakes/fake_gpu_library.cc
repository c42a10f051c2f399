// A stand-in for libringtree_cuda.so in the loader tests: the entry symbol and a table
// whose functions do nothing, with no CUDA behind them. Compile definitions pick the
// variant:
//   FAKE_GPU_SPEAKS=<version>       the one interface version the entry answers (default:
//                                   RINGTREE_GPU_API_VERSION)
//   FAKE_GPU_SHORT_TABLE=1          the table reports a size one member short
//   FAKE_GPU_DRIVER_RESULT=<code>   what driverVersion returns (default 0)
//   FAKE_GPU_DRIVER_VERSION=<code>  the driver version it reports (default 13000; 0 is
//                                   what CUDA reports without a driver)
//   FAKE_GPU_DEVICE_RESULT=<code>   what deviceCount returns (default 0)
//   FAKE_GPU_DEVICE_COUNT=<n>       the device count it reports (default 1)

#include "backends/cuda/gpu_api.h"

#ifndef FAKE_GPU_SPEAKS
#define FAKE_GPU_SPEAKS RINGTREE_GPU_API_VERSION
#endif
#ifndef FAKE_GPU_SHORT_TABLE
#define FAKE_GPU_SHORT_TABLE 0
#endif
#ifndef FAKE_GPU_DRIVER_RESULT
#define FAKE_GPU_DRIVER_RESULT 0
#endif
#ifndef FAKE_GPU_DRIVER_VERSION
#define FAKE_GPU_DRIVER_VERSION 13000
#endif
#ifndef FAKE_GPU_DEVICE_RESULT
#define FAKE_GPU_DEVICE_RESULT 0
#endif
#ifndef FAKE_GPU_DEVICE_COUNT
#define FAKE_GPU_DEVICE_COUNT 1
#endif

namespace {

// The codes the variants return, in the CUDA runtime's numbering.
constexpr int kInsufficientDriver = 35;
constexpr int kNoDevice = 100;

const char* errorString(int error) {
  switch (error) {
    case 0:
      return "no error";
    case kInsufficientDriver:
      return "stand-in: the driver is older than the runtime";
    case kNoDevice:
      return "stand-in: the driver sees no device";
    default:
      return "stand-in: some CUDA error";
  }
}
int driverVersion(int* version) {
  *version = FAKE_GPU_DRIVER_VERSION;
  return FAKE_GPU_DRIVER_RESULT;
}
int deviceCount(int* count) {
  *count = FAKE_GPU_DEVICE_COUNT;
  return FAKE_GPU_DEVICE_RESULT;
}
int setDevice(int) { return 0; }
int getDevice(int* device) {
  *device = 0;
  return 0;
}
int pointerDevice(const void*, int* device) {
  *device = -1;
  return 0;
}
int streamCreate(void** stream) {
  *stream = nullptr;
  return 0;
}
int streamDestroy(void*) { return 0; }
int streamWaitEvent(void*, void*) { return 0; }
int streamSynchronize(void*) { return 0; }
int eventCreate(void** event) {
  *event = nullptr;
  return 0;
}
int eventDestroy(void*) { return 0; }
int eventRecord(void*, void*) { return 0; }
int eventQuery(void*) { return 0; }
int eventSynchronize(void*) { return 0; }
int deviceMalloc(void** pointer, size_t) {
  *pointer = nullptr;
  return 0;
}
int deviceFree(void*) { return 0; }
int memcpyAsync(void*, const void*, size_t, void*) { return 0; }
int reduce(void*, const void*, size_t, int, int, void*) { return 0; }
int scale(void*, size_t, int, double, void*) { return 0; }
int divide(void*, size_t, int, int64_t, void*) { return 0; }
int setDeviceIfActive(int) { return 0; }

const RingtreeGpuApi kTable = {
    FAKE_GPU_SPEAKS,
    static_cast<uint32_t>(sizeof(RingtreeGpuApi) - (FAKE_GPU_SHORT_TABLE ? sizeof(void*) : 0)),
    13000,
    errorString,
    driverVersion,
    deviceCount,
    setDevice,
    getDevice,
    pointerDevice,
    streamCreate,
    streamDestroy,
    streamWaitEvent,
    streamSynchronize,
    eventCreate,
    eventDestroy,
    eventRecord,
    eventQuery,
    eventSynchronize,
    deviceMalloc,
    deviceFree,
    memcpyAsync,
    reduce,
    scale,
    divide,
    setDeviceIfActive,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const RingtreeGpuApi* ringtree_gpu_api(uint32_t version) {
  return version == FAKE_GPU_SPEAKS ? &kTable : nullptr;
}
