#pragma once

#include <memory>

#include <ringtree/device_backend.h>

#include "backends/cuda/gpu_api.h"
#include "backends/cuda/nccl_api.h"

// The backend of CUDA buffers: NCCL for what NCCL does, ringtree's CUDA kernels
// (gpu_api.h) for what it does not (bitwise ops, integer AVG and PREMUL_SUM, int16 and
// bool reductions: a ring over ncclSend/ncclRecv reducing with ringtree's kernel).
//
// One NCCL communicator per group, made on the group's first CUDA buffer from a unique id
// that rank 0 publishes in the group's store; its device is that buffer's, and every later
// CUDA buffer of the group must be on it. Operations run on a stream of the backend's own,
// after the work the caller enqueued on its current stream (setCurrentStream) before the
// call:
//  - synchronous: the caller's stream then waits for the operation (torch's NCCL
//    semantics), so the call returns once it is enqueued -- except barrier, which returns
//    once every rank reached it.
//  - asynchronous: the Work completes when the operation finished on the GPU; wait()
//    blocks until then (so the caller's stream is ordered after it too), within its own
//    timeout.
// A watchdog thread completes Works, polls NCCL's asynchronous errors and enforces the
// group's timeout: an error or an operation that outlives the timeout aborts the
// communicator (ncclCommAbort), fails every pending operation with an error naming the
// rank, the operation and the cause (Error for NCCL's errors, TimeoutError for the
// timeout), and every later call rethrows it.
//
// Point-to-point: NCCL has no tags (the tag is ignored, as torch's NCCL backend does) and
// no receive from any source (InvalidArgument). send/recv are ordered like synchronous
// collectives.
namespace ringtree::cuda {

// The backend of `context`'s group over the given tables (the real ones, or stand-ins in
// tests): exchanges the unique id through context.store and creates the communicator on
// context.device. Throws Error when NCCL fails to set up, StoreError when rank 0's id
// does not arrive within context.timeout.
std::unique_ptr<DeviceBackend> makeNcclBackend(const DeviceBackendContext& context, const RingtreeGpuApi& gpu,
                                               std::shared_ptr<const NcclApi> nccl);

}  // namespace ringtree::cuda
