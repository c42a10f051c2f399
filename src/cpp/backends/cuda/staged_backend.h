#pragma once

#include <memory>

#include <ringtree/device_backend.h>

#include "backends/cuda/gpu_api.h"

// The backend of CUDA buffers where NCCL cannot serve a group: ranks that share one GPU
// (NCCL refuses two ranks on one device) or a process without a usable NCCL. Every
// operation copies its device buffers to host memory, runs on the group's CPU engine
// (DeviceBackendContext::host), and copies the results back -- so it supports everything
// the CPU engine does (every collective, every dtype and op, receives from any source) at
// the speed of two PCIe copies plus the CPU collective.
//
// Ordering: an operation first waits on the host for the caller's current stream
// (setCurrentStream), and returns once the results are back in device memory; an
// asynchronous submission runs the same way and returns a completed Work. Failures are the
// CPU engine's (a peer killed mid-collective, a timeout: NetworkError, TimeoutError naming
// the rank), or Error naming the CUDA call that failed.
namespace ringtree::cuda {

// Throws InvalidArgument when context.host is null.
std::unique_ptr<DeviceBackend> makeStagedBackend(const DeviceBackendContext& context, const RingtreeGpuApi& gpu);

}  // namespace ringtree::cuda
