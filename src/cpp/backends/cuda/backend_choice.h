#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ringtree/device_backend.h>

// Which backend serves a group's CUDA buffers: NCCL where it can, host staging through
// the CPU engine where it cannot (ranks sharing a GPU, a rank without a usable NCCL).
namespace ringtree::cuda {

// What one rank tells the others before the choice.
struct CudaRankRecord {
  std::string gpu;         // the physical GPU: this machine's boot id and its ordinal (see gpuIdentity)
  bool ncclUsable = false;
  std::string forced;      // its RINGTREE_CUDA_BACKEND (every rank must have the same)
};

// This process's name for the physical GPU `device` (a CUDA ordinal): the machine's boot
// id, then the entry `device` of CUDA_VISIBLE_DEVICES when it is set, else the ordinal.
// Two processes of one machine name one GPU alike whatever subset each sees.
std::string gpuIdentity(int device, const std::string& visibleDevices);

// "nccl" or "staged" for a group whose ranks sent `records` (one per rank, in rank order),
// under RINGTREE_CUDA_BACKEND = `forced` ("" or "auto": NCCL unless two ranks share a GPU
// or one lacks NCCL). Sets `why` to the reason when the answer is "staged". Throws
// InvalidArgument for another value of `forced`, and Error when "nccl" is forced but
// cannot serve the group.
std::string chooseCudaBackend(const std::vector<CudaRankRecord>& records, const std::string& forced, std::string* why);

// The factory registered for DeviceType::kCuda: loads ringtree's CUDA library (its error
// says what is missing), exchanges the ranks' records through the group's store, and makes
// the chosen backend (nccl_backend.h or staged_backend.h). Throws InvalidArgument on every
// rank when the ranks' RINGTREE_CUDA_BACKEND differ.
std::unique_ptr<DeviceBackend> makeDefaultCudaBackend(const DeviceBackendContext& context);

}  // namespace ringtree::cuda
