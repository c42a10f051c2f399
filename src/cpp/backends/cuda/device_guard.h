#pragma once

#include "backends/cuda/gpu_api.h"

namespace ringtree::cuda {

// Makes `device` the calling thread's device for a scope and puts the previous one back
// where it has a context (setDeviceIfActive: a thread that never chose a device reads
// device 0, and putting that back would make a context on GPU 0 for every rank; such a
// thread keeps `device`). result() is what setting `device` returned (0 when it was the
// thread's device already).
class DeviceGuard {
 public:
  DeviceGuard(const RingtreeGpuApi& gpu, int device) : gpu_(gpu) {
    if (gpu_.getDevice(&previous_) != 0) previous_ = -1;
    if (previous_ != device) result_ = gpu_.setDevice(device);
  }
  ~DeviceGuard() {
    int current = -1;
    if (previous_ >= 0 && gpu_.getDevice(&current) == 0 && current != previous_) gpu_.setDeviceIfActive(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  int result() const { return result_; }

 private:
  const RingtreeGpuApi& gpu_;
  int previous_ = -1;
  int result_ = 0;
};

}  // namespace ringtree::cuda
