#pragma once

#include <string>
#include <vector>

#include "backends/cuda/gpu_api.h"

// Opening ringtree's CUDA library (libringtree_cuda.so, see gpu_api.h) at run time.
namespace ringtree::cuda {

// Where loadGpuRuntime() looks, in order: RINGTREE_CUDA_LIBRARY (the file), then
// libringtree_cuda.so in the folder of the file holding ringtree's core (the Python
// package's folder, or the installed lib/), then the dynamic loader's search path.
std::vector<std::string> gpuRuntimeCandidates();

// Opens the first candidate that loads and returns its table (valid for the life of the
// process), checked for a driver and at least one device. Throws ringtree::Error naming
// what is missing: the library (every candidate tried; "ringtree was built without
// CUDA" when none exists), an API version it does not speak, the driver, or a device.
const RingtreeGpuApi& loadGpuRuntimeFrom(const std::vector<std::string>& candidates);

// loadGpuRuntimeFrom(gpuRuntimeCandidates()), once per process: later calls return the
// same table or rethrow the same error.
const RingtreeGpuApi& loadGpuRuntime();

// The folder of the file (shared object or executable) that holds ringtree's core,
// without a trailing slash.
std::string coreLibraryFolder();

}  // namespace ringtree::cuda
