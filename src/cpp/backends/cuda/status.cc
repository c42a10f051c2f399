#include <ringtree/cuda.h>

#include <cmath>
#include <exception>
#include <string>

#include <ringtree/error.h>

#include "backends/cuda/gpu_runtime.h"
#include "backends/cuda/nccl_loader.h"

namespace ringtree {

CudaStatus cudaStatus() {
  CudaStatus status;
  try {
    const RingtreeGpuApi& gpu = cuda::loadGpuRuntime();
    status.runtimeVersion = gpu.runtimeVersion;
    gpu.driverVersion(&status.driverVersion);
    gpu.deviceCount(&status.deviceCount);
    status.available = status.deviceCount > 0;
  } catch (const std::exception& error) {
    status.reason = error.what();
  }
  return status;
}

NcclStatus ncclStatus() {
  NcclStatus status;
  try {
    const std::shared_ptr<const cuda::NcclApi> nccl = cuda::loadNccl();
    status.available = true;
    status.version = nccl->version;
    status.path = nccl->path;
  } catch (const std::exception& error) {
    status.reason = error.what();
  }
  return status;
}

namespace {

void checkKernel(const char* kernel, int result, const RingtreeGpuApi& gpu) {
  if (result != 0) throw Error(std::string(kernel) + ": the CUDA kernel failed: " + gpu.errorString(result));
}

}  // namespace

void cudaReduce(void* inout, const void* in, size_t count, DataType type, ReduceOp op, void* stream) {
  if (!isSupported(type, op)) {
    throw InvalidArgument(std::string("cudaReduce: ReduceOp.") + reduceOpName(op) + " is not supported for " +
                          dataTypeName(type));
  }
  const RingtreeGpuApi& gpu = cuda::loadGpuRuntime();
  checkKernel("cudaReduce", gpu.reduce(inout, in, count, static_cast<int>(type), static_cast<int>(op), stream), gpu);
}

void cudaScale(void* data, size_t count, DataType type, double factor, void* stream) {
  if (type == DataType::kBool) throw InvalidArgument("cudaScale: bool cannot be scaled");
  const bool integer = type == DataType::kInt8 || type == DataType::kUInt8 || type == DataType::kInt16 ||
                       type == DataType::kInt32 || type == DataType::kInt64;
  if (integer && !std::isfinite(factor)) {
    throw InvalidArgument(std::string("cudaScale: scaling ") + dataTypeName(type) + " needs a finite factor, got " +
                          std::to_string(factor));
  }
  const RingtreeGpuApi& gpu = cuda::loadGpuRuntime();
  checkKernel("cudaScale", gpu.scale(data, count, static_cast<int>(type), factor, stream), gpu);
}

void cudaDivide(void* data, size_t count, DataType type, int64_t divisor, void* stream) {
  if (type == DataType::kBool || divisor <= 0) {
    throw InvalidArgument("cudaDivide: needs a non-bool type and a positive divisor, got " +
                          std::string(dataTypeName(type)) + " and " + std::to_string(divisor));
  }
  const RingtreeGpuApi& gpu = cuda::loadGpuRuntime();
  checkKernel("cudaDivide", gpu.divide(data, count, static_cast<int>(type), divisor, stream), gpu);
}

}  // namespace ringtree
