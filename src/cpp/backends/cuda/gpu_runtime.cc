#include "backends/cuda/gpu_runtime.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <utility>

#include <ringtree/error.h>

#include "backends/cuda/library_files.h"
#include "common/env.h"
#include "common/logging.h"

namespace ringtree::cuda {
namespace {

constexpr const char* kGpuLibrary = "libringtree_cuda.so";

std::string absolutePath(const std::string& path) {
  if (startsWith(path, "/")) return path;
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

// Opens `candidate`; null when it is not there. When it is there but does not load (a
// dependency such as the CUDA runtime missing), *failure gets dlerror()'s text.
void* openCandidate(const std::string& candidate, std::string* failure) {
  const bool isPath = candidate.find('/') != std::string::npos;
  if (isPath && !pathExists(candidate)) return nullptr;
  dlerror();
  void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const std::string error = dlerrorText();
    // A bare name the dynamic loader did not find is absent, not broken.
    if (isPath || !startsWith(error, candidate + ": cannot open shared object file")) *failure = error;
  }
  return handle;
}

// "<text> (CUDA error <code>)" through the library's own errorString.
std::string describeError(const RingtreeGpuApi& api, int error) {
  const char* text = api.errorString(error);
  return std::string(text != nullptr ? text : "unknown error") + " (CUDA error " + std::to_string(error) + ")";
}

// "13.0" from a CUDA version code (13000).
std::string cudaVersionString(int code) { return std::to_string(code / 1000) + "." + std::to_string(code % 1000 / 10); }

std::string visibleDevicesSetting() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible == nullptr ? "CUDA_VISIBLE_DEVICES unset" : std::string("CUDA_VISIBLE_DEVICES=") + visible;
}

// Checks the table `path`'s entry returned: the interface version, its size, every
// function present; then a driver and at least one device.
void checkTable(const RingtreeGpuApi& api, const std::string& path) {
  if (api.version != RINGTREE_GPU_API_VERSION || api.size < sizeof(RingtreeGpuApi)) {
    throw Error(path + " returned version " + std::to_string(api.version) + " of ringtree's GPU interface (" +
                std::to_string(api.size) + " bytes) when asked for version " +
                std::to_string(RINGTREE_GPU_API_VERSION) + " (" + std::to_string(sizeof(RingtreeGpuApi)) +
                " bytes): it belongs to another ringtree release; use the " + kGpuLibrary +
                " built with this one");
  }
  const std::pair<const char*, bool> members[] = {
      {"errorString", api.errorString != nullptr},
      {"driverVersion", api.driverVersion != nullptr},
      {"deviceCount", api.deviceCount != nullptr},
      {"setDevice", api.setDevice != nullptr},
      {"getDevice", api.getDevice != nullptr},
      {"pointerDevice", api.pointerDevice != nullptr},
      {"streamCreate", api.streamCreate != nullptr},
      {"streamDestroy", api.streamDestroy != nullptr},
      {"streamWaitEvent", api.streamWaitEvent != nullptr},
      {"streamSynchronize", api.streamSynchronize != nullptr},
      {"eventCreate", api.eventCreate != nullptr},
      {"eventDestroy", api.eventDestroy != nullptr},
      {"eventRecord", api.eventRecord != nullptr},
      {"eventQuery", api.eventQuery != nullptr},
      {"eventSynchronize", api.eventSynchronize != nullptr},
      {"deviceMalloc", api.deviceMalloc != nullptr},
      {"deviceFree", api.deviceFree != nullptr},
      {"memcpyAsync", api.memcpyAsync != nullptr},
      {"reduce", api.reduce != nullptr},
      {"scale", api.scale != nullptr},
      {"divide", api.divide != nullptr},
      {"setDeviceIfActive", api.setDeviceIfActive != nullptr},
  };
  for (const auto& [name, present] : members) {
    if (!present) throw Error(path + "'s GPU interface has no " + name + ": not a usable ringtree CUDA library");
  }

  int driver = 0;
  const int driverResult = api.driverVersion(&driver);
  if (driverResult != 0) throw Error("no CUDA driver: " + describeError(api, driverResult));
  if (driver == 0) {
    throw Error("no CUDA driver: no NVIDIA driver is installed (ringtree's CUDA library " + path +
                " was built with CUDA " + cudaVersionString(api.runtimeVersion) + ")");
  }
  int devices = 0;
  const int deviceResult = api.deviceCount(&devices);
  if (deviceResult != 0) {
    throw Error("no CUDA device is visible (" + visibleDevicesSetting() + "): " + describeError(api, deviceResult) +
                "; the driver supports CUDA " + cudaVersionString(driver) +
                ", ringtree's CUDA library was built with " + cudaVersionString(api.runtimeVersion));
  }
  if (devices <= 0) throw Error("no CUDA device is visible (" + visibleDevicesSetting() + ")");
}

}  // namespace

std::string coreLibraryFolder() {
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(reinterpret_cast<void*>(&coreLibraryFolder), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) !=
          0 &&
      map != nullptr && map->l_name != nullptr && map->l_name[0] != '\0') {
    return folderOf(absolutePath(map->l_name));
  }
  // The core is part of the executable (a static libringtree), whose link map has no name.
  char executable[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", executable, sizeof(executable) - 1);
  if (length > 0) return folderOf(std::string(executable, static_cast<size_t>(length)));
  if (info.dli_fname != nullptr && info.dli_fname[0] != '\0') return folderOf(absolutePath(info.dli_fname));
  return ".";
}

std::vector<std::string> gpuRuntimeCandidates() {
  std::vector<std::string> candidates;
  const std::string configured = env::cudaLibrary();
  if (!configured.empty()) candidates.push_back(configured);
  candidates.push_back(joinPath(coreLibraryFolder(), kGpuLibrary));
  candidates.push_back(kGpuLibrary);
  return candidates;
}

const RingtreeGpuApi& loadGpuRuntimeFrom(const std::vector<std::string>& candidates) {
  void* handle = nullptr;
  std::string path;
  std::vector<std::pair<std::string, std::string>> failures;  // (candidate, dlerror text)
  for (const std::string& candidate : candidates) {
    std::string failure;
    handle = openCandidate(candidate, &failure);
    if (handle != nullptr) {
      path = candidate.find('/') != std::string::npos ? candidate : fileOf(handle, candidate);
      break;
    }
    if (!failure.empty()) failures.emplace_back(candidate, failure);
  }
  if (handle == nullptr) {
    std::string tried;
    for (const std::string& candidate : candidates) tried += (tried.empty() ? "" : ", ") + candidate;
    if (tried.empty()) tried = "nothing";
    if (failures.empty()) {
      throw Error(std::string("CUDA buffers need ringtree's CUDA library, which this build does not have (no ") +
                  kGpuLibrary + " in " + coreLibraryFolder() + "; tried: " + tried +
                  "; build with a CUDA toolkit, RINGTREE_USE_CUDA=ON, or set RINGTREE_CUDA_LIBRARY)");
    }
    std::string message = "ringtree's CUDA library did not load (tried: " + tried + ")";
    for (const auto& [candidate, failure] : failures) message += "; " + loadFailure(candidate, failure);
    throw Error(message + "; install the CUDA runtime it was built with (e.g. the nvidia-cuda-runtime wheel) or "
                          "rebuild it");
  }

  dlerror();
  const auto entry = reinterpret_cast<RingtreeGpuApiEntry>(dlsym(handle, RINGTREE_GPU_API_ENTRY));
  if (entry == nullptr) {
    throw Error(path + " has no " + RINGTREE_GPU_API_ENTRY + ": not ringtree's CUDA library (" + dlerrorText() + ")");
  }
  const RingtreeGpuApi* api = entry(RINGTREE_GPU_API_VERSION);
  if (api == nullptr) {
    throw Error(path + " does not speak version " + std::to_string(RINGTREE_GPU_API_VERSION) +
                " of ringtree's GPU interface: it belongs to another ringtree release; use the " + kGpuLibrary +
                " built with this one");
  }
  checkTable(*api, path);
  RINGTREE_INFO("ringtree's CUDA library " << path << " (CUDA runtime " << cudaVersionString(api->runtimeVersion)
                                           << ")");
  return *api;
}

const RingtreeGpuApi& loadGpuRuntime() {
  struct Outcome {
    const RingtreeGpuApi* api = nullptr;
    std::exception_ptr error;
  };
  // A function-local static: initialised by exactly one thread, the others wait for it.
  static const Outcome outcome = [] {
    Outcome loaded;
    try {
      loaded.api = &loadGpuRuntimeFrom(gpuRuntimeCandidates());
    } catch (...) {
      loaded.error = std::current_exception();
    }
    return loaded;
  }();
  if (outcome.error) std::rethrow_exception(outcome.error);
  return *outcome.api;
}

}  // namespace ringtree::cuda
