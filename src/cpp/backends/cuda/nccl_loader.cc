#include "backends/cuda/nccl_loader.h"

#include <dlfcn.h>

#include <exception>
#include <utility>

#include <ringtree/error.h>

#include "backends/cuda/gpu_runtime.h"
#include "backends/cuda/library_files.h"
#include "common/env.h"
#include "common/logging.h"

namespace ringtree::cuda {
namespace {

constexpr const char* kNcclLibrary = "libnccl.so.2";
// A candidate naming a library this process may already hold: "loaded:<name>".
constexpr const char* kLoadedPrefix = "loaded:";
constexpr const char* kInstallHint = "install nvidia-nccl-cu13 (or -cu12) or set RINGTREE_NCCL_PATH";

// A library opened from one candidate, and how messages name it.
struct OpenedLibrary {
  void* handle = nullptr;
  std::string path;         // the file (what NcclApi::path holds)
  std::string description;  // the file, and whether this process had loaded it already
};

// Opens `candidate`; an empty handle when it is not there. When it is there but does not
// load (not a library, a dependency missing), *failure gets dlerror()'s text.
OpenedLibrary openCandidate(const std::string& candidate, std::string* failure) {
  OpenedLibrary opened;
  if (startsWith(candidate, kLoadedPrefix)) {
    const std::string name = candidate.substr(std::string(kLoadedPrefix).size());
    dlerror();
    opened.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (opened.handle == nullptr) return opened;
    opened.path = fileOf(opened.handle, name);
    opened.description = opened.path + " (already loaded in this process)";
    return opened;
  }
  const bool isPath = candidate.find('/') != std::string::npos;
  if (isPath && !pathExists(candidate)) return opened;
  dlerror();
  opened.handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (opened.handle == nullptr) {
    const std::string error = dlerrorText();
    // A bare name the dynamic loader did not find is absent, not broken.
    if (isPath || !startsWith(error, candidate + ": cannot open shared object file")) *failure = error;
    return opened;
  }
  // A bare name is reported as the file the dynamic loader found for it.
  opened.path = isPath ? candidate : fileOf(opened.handle, candidate);
  opened.description = opened.path;
  return opened;
}

template <typename Function>
Function* lookup(void* handle, const char* name) {
  return reinterpret_cast<Function*>(dlsym(handle, name));
}

template <typename Function>
void bindRequired(const OpenedLibrary& library, const char* name, Function*& slot) {
  slot = lookup<Function>(library.handle, name);
  if (slot == nullptr) throw Error(library.description + " has no " + name + ": not a usable NCCL");
}

template <typename Function>
void bindOptional(const OpenedLibrary& library, const char* name, Function*& slot) {
  slot = lookup<Function>(library.handle, name);
}

// "2.10" from a version code.
std::string majorMinor(int code) {
  const std::string full = ncclVersionString(code);
  return full.substr(0, full.find_last_of('.'));
}

std::shared_ptr<const NcclApi> bindNccl(const OpenedLibrary& library) {
  auto api = std::make_shared<NcclApi>();
  api->path = library.path;
  // The version first: an NCCL too old to be driven gets that said rather than a
  // function it lacks.
  bindRequired(library, "ncclGetVersion", api->getVersion);
  int version = 0;
  const int result = api->getVersion(&version);
  if (result != kNcclSuccess) {
    throw Error(library.description + ": ncclGetVersion failed (NCCL error " + std::to_string(result) +
                "): not a usable NCCL");
  }
  if (version < kMinNcclVersion) {
    throw Error("NCCL " + ncclVersionString(version) + " at " + library.description + " is too old: ringtree needs " +
                majorMinor(kMinNcclVersion) +
                " or later; install a newer one (nvidia-nccl-cu13 or -cu12) or point RINGTREE_NCCL_PATH at one");
  }
  api->version = version;

  bindRequired(library, "ncclGetErrorString", api->getErrorString);
  bindOptional(library, "ncclGetLastError", api->getLastError);
  bindRequired(library, "ncclGetUniqueId", api->getUniqueId);
  bindRequired(library, "ncclCommInitRank", api->commInitRank);
  bindOptional(library, "ncclCommSplit", api->commSplit);
  bindRequired(library, "ncclCommDestroy", api->commDestroy);
  bindRequired(library, "ncclCommAbort", api->commAbort);
  bindRequired(library, "ncclCommGetAsyncError", api->commGetAsyncError);
  bindRequired(library, "ncclAllReduce", api->allReduce);
  bindRequired(library, "ncclBroadcast", api->broadcast);
  bindRequired(library, "ncclReduce", api->reduce);
  bindRequired(library, "ncclAllGather", api->allGather);
  bindRequired(library, "ncclReduceScatter", api->reduceScatter);
  bindRequired(library, "ncclSend", api->send);
  bindRequired(library, "ncclRecv", api->recv);
  bindRequired(library, "ncclGroupStart", api->groupStart);
  bindRequired(library, "ncclGroupEnd", api->groupEnd);
  bindOptional(library, "ncclRedOpCreatePreMulSum", api->redOpCreatePreMulSum);
  bindOptional(library, "ncclRedOpDestroy", api->redOpDestroy);
  return api;
}

}  // namespace

std::string ncclVersionString(int code) {
  // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 +
  // patch before.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code % 10000 / 100 : code % 1000 / 100;
  const int patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::vector<std::string> ncclCandidates() {
  std::vector<std::string> candidates;
  candidates.push_back(std::string(kLoadedPrefix) + kNcclLibrary);
  const std::string sitePackages = folderOf(coreLibraryFolder());
  candidates.push_back(joinPath(sitePackages, std::string("nvidia/nccl/lib/") + kNcclLibrary));
  candidates.push_back(joinPath(sitePackages, std::string("nvidia/cu13/lib/") + kNcclLibrary));
  const std::string configured = env::ncclPath();
  if (!configured.empty()) {
    candidates.push_back(isDirectory(configured) ? joinPath(configured, kNcclLibrary) : configured);
  }
  candidates.push_back(kNcclLibrary);
  return candidates;
}

std::shared_ptr<const NcclApi> loadNcclFrom(const std::vector<std::string>& candidates) {
  std::vector<std::pair<std::string, std::string>> failures;  // (candidate, dlerror text)
  for (const std::string& candidate : candidates) {
    std::string failure;
    const OpenedLibrary library = openCandidate(candidate, &failure);
    if (library.handle != nullptr) return bindNccl(library);
    if (!failure.empty()) failures.emplace_back(candidate, failure);
  }
  std::string tried;
  for (const std::string& candidate : candidates) tried += (tried.empty() ? "" : ", ") + candidate;
  if (tried.empty()) tried = "nothing";
  std::string message = std::string("NCCL is not available: no ") + kNcclLibrary +
                        (failures.empty() ? " was found" : " loaded") + " (tried: " + tried + ")";
  for (const auto& [candidate, failure] : failures) message += "; " + loadFailure(candidate, failure);
  throw Error(message + "; " + kInstallHint);
}

std::shared_ptr<const NcclApi> loadNccl() {
  struct Outcome {
    std::shared_ptr<const NcclApi> api;
    std::exception_ptr error;
  };
  // A function-local static: initialised by exactly one thread, the others wait for it.
  static const Outcome outcome = [] {
    Outcome loaded;
    try {
      loaded.api = loadNcclFrom(ncclCandidates());
      RINGTREE_INFO("NCCL " << ncclVersionString(loaded.api->version) << " from " << loaded.api->path);
    } catch (...) {
      loaded.error = std::current_exception();
    }
    return loaded;
  }();
  if (outcome.error) std::rethrow_exception(outcome.error);
  return outcome.api;
}

}  // namespace ringtree::cuda
