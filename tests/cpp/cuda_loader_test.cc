// The run-time loaders of NCCL (backends/cuda/nccl_loader.h) and of ringtree's CUDA
// library (backends/cuda/gpu_runtime.h), against stand-in libraries built from
// fakes/fake_nccl.cc and fakes/fake_gpu_library.cc: where they look and in which order,
// that the first candidate that loads is the one used, what they take from it, and the
// message of every way a library can be missing or unusable. Nothing here needs a real
// NCCL, CUDA library or GPU, and a machine that has them passes the same way.

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <ringtree/error.h>

#include "backends/cuda/gpu_runtime.h"
#include "backends/cuda/nccl_loader.h"

// Paths of the stand-in libraries, defined by tests/cpp/CMakeLists.txt.
#if !defined(RINGTREE_FAKE_NCCL_FULL) || !defined(RINGTREE_FAKE_GPU_GOOD) || !defined(RINGTREE_TEST_CORE_FOLDER)
#error "the stand-in libraries' paths come from tests/cpp/CMakeLists.txt"
#endif

namespace ringtree::cuda {
namespace {

namespace fs = std::filesystem;

const std::string kFakeNcclFull = RINGTREE_FAKE_NCCL_FULL;                // 2.28.7, every function
const std::string kFakeNcclOld = RINGTREE_FAKE_NCCL_OLD;                  // 2.8.4
const std::string kFakeNcclNoInitRank = RINGTREE_FAKE_NCCL_NO_INIT_RANK;  // no ncclCommInitRank
const std::string kFakeNcclNoOptional = RINGTREE_FAKE_NCCL_NO_OPTIONAL;   // 2.10.4, no optional function
const std::string kFakeNcclPreloaded = RINGTREE_FAKE_NCCL_PRELOADED;      // only PreloadedLibraryIsFound opens it
const std::string kFakeGpuGood = RINGTREE_FAKE_GPU_GOOD;                  // version 1, driver 13.0, 1 device
const std::string kFakeGpuWrongVersion = RINGTREE_FAKE_GPU_WRONG_VERSION;  // answers version 2 only
const std::string kFakeGpuShortTable = RINGTREE_FAKE_GPU_SHORT_TABLE;      // version 1, size one member short
const std::string kFakeGpuDriverError = RINGTREE_FAKE_GPU_DRIVER_ERROR;    // driverVersion fails with 35
const std::string kFakeGpuNoDriver = RINGTREE_FAKE_GPU_NO_DRIVER;          // driver version 0
const std::string kFakeGpuNoDevices = RINGTREE_FAKE_GPU_NO_DEVICES;        // 0 devices
const std::string kFakeGpuDeviceError = RINGTREE_FAKE_GPU_DEVICE_ERROR;    // deviceCount fails with 100

// Sets (or, with nullopt, unsets) an environment variable for the life of the object,
// then restores what it was.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* previous = std::getenv(name)) previous_ = previous;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (previous_) {
      setenv(name_.c_str(), previous_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> previous_;
};

// A fresh folder, removed with what it holds when the object goes.
class TemporaryFolder {
 public:
  TemporaryFolder() {
    std::string pattern = (fs::temp_directory_path() / "ringtree-loader-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TemporaryFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;

  const std::string& path() const { return path_; }
  // A file `name` in the folder holding `content`; returns its path.
  std::string write(const std::string& name, const std::string& content) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file) << content;
    return file;
  }

 private:
  std::string path_;
};

std::string realPath(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

// The folder holding `folder`, as the loader derives the wheels' site-packages.
std::string parentOf(const std::string& folder) { return fs::path(folder).parent_path().string(); }

// The message of the ringtree::Error `call` throws; fails the test when it throws none.
std::string errorOf(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a ringtree::Error";
  return "";
}

// Expects `message` to contain each of `parts`.
void expectContains(const std::string& message, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "message:  " << message << "\nlacks:    " << part;
  }
}

// ---- ncclVersionString ----------------------------------------------------------------

TEST(NcclLoaderTest, VersionStringReadsBothCodeSchemes) {
  EXPECT_EQ(ncclVersionString(22807), "2.28.7");
  EXPECT_EQ(ncclVersionString(21000), "2.10.0");
  EXPECT_EQ(ncclVersionString(21903), "2.19.3");
  EXPECT_EQ(ncclVersionString(30001), "3.0.1");
  // Codes before 2.9: major*1000 + minor*100 + patch.
  EXPECT_EQ(ncclVersionString(2708), "2.7.8");
  EXPECT_EQ(ncclVersionString(2804), "2.8.4");
}

// ---- coreLibraryFolder and the candidate lists -----------------------------------------

TEST(GpuLoaderTest, CoreLibraryFolderIsTheFolderOfTheFileHoldingTheCore) {
  const std::string folder = coreLibraryFolder();
  ASSERT_FALSE(folder.empty());
  EXPECT_EQ(folder.front(), '/');
  EXPECT_NE(folder.back(), '/');
  EXPECT_EQ(realPath(folder), realPath(RINGTREE_TEST_CORE_FOLDER));
}

TEST(NcclLoaderTest, CandidatesWithoutConfiguredPath) {
  const ScopedEnv path("RINGTREE_NCCL_PATH", std::nullopt);
  const std::string site = parentOf(coreLibraryFolder());
  const std::vector<std::string> expected = {
      "loaded:libnccl.so.2",
      site + "/nvidia/nccl/lib/libnccl.so.2",
      site + "/nvidia/cu13/lib/libnccl.so.2",
      "libnccl.so.2",
  };
  EXPECT_EQ(ncclCandidates(), expected);
  const ScopedEnv empty("RINGTREE_NCCL_PATH", "");
  EXPECT_EQ(ncclCandidates(), expected);
}

TEST(NcclLoaderTest, ConfiguredFileComesAfterTheWheelsAndBeforeTheSystem) {
  const std::string file = "/opt/somewhere/libnccl-custom.so.2";  // need not exist
  const ScopedEnv path("RINGTREE_NCCL_PATH", file);
  const std::string site = parentOf(coreLibraryFolder());
  const std::vector<std::string> expected = {
      "loaded:libnccl.so.2",
      site + "/nvidia/nccl/lib/libnccl.so.2",
      site + "/nvidia/cu13/lib/libnccl.so.2",
      file,
      "libnccl.so.2",
  };
  EXPECT_EQ(ncclCandidates(), expected);
}

TEST(NcclLoaderTest, ConfiguredFolderNamesTheLibraryInIt) {
  const TemporaryFolder folder;
  for (const std::string& configured : {folder.path(), folder.path() + "/"}) {
    SCOPED_TRACE(configured);
    const ScopedEnv path("RINGTREE_NCCL_PATH", configured);
    const std::vector<std::string> candidates = ncclCandidates();
    ASSERT_EQ(candidates.size(), 5u);
    EXPECT_EQ(candidates[3], folder.path() + "/libnccl.so.2");
    EXPECT_EQ(candidates[4], "libnccl.so.2");
  }
}

TEST(NcclLoaderTest, ConfiguredFolderLoads) {
  const TemporaryFolder folder;
  fs::create_symlink(kFakeNcclFull, folder.path() + "/libnccl.so.2");
  const ScopedEnv path("RINGTREE_NCCL_PATH", folder.path());
  const std::vector<std::string> candidates = ncclCandidates();
  ASSERT_EQ(candidates.size(), 5u);
  const auto api = loadNcclFrom({candidates[3]});
  EXPECT_EQ(api->path, folder.path() + "/libnccl.so.2");
  EXPECT_EQ(api->version, 22807);
}

TEST(GpuLoaderTest, CandidatesWithoutConfiguredLibrary) {
  const ScopedEnv library("RINGTREE_CUDA_LIBRARY", std::nullopt);
  const std::vector<std::string> expected = {coreLibraryFolder() + "/libringtree_cuda.so", "libringtree_cuda.so"};
  EXPECT_EQ(gpuRuntimeCandidates(), expected);
  const ScopedEnv empty("RINGTREE_CUDA_LIBRARY", "");
  EXPECT_EQ(gpuRuntimeCandidates(), expected);
}

TEST(GpuLoaderTest, ConfiguredLibraryComesFirst) {
  const ScopedEnv library("RINGTREE_CUDA_LIBRARY", "/opt/elsewhere/libringtree_cuda.so");
  const std::vector<std::string> expected = {"/opt/elsewhere/libringtree_cuda.so",
                                             coreLibraryFolder() + "/libringtree_cuda.so", "libringtree_cuda.so"};
  EXPECT_EQ(gpuRuntimeCandidates(), expected);
}

// ---- loadNcclFrom ------------------------------------------------------------------------

// The address `name` has in the already opened library `path`.
void* symbolOf(const std::string& path, const char* name) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(handle, nullptr) << path << " is not loaded";
  if (handle == nullptr) return nullptr;
  void* address = dlsym(handle, name);
  dlclose(handle);  // drops the reference NOLOAD took; the loader's stays
  return address;
}

template <typename Function>
void* addressOf(Function* function) {
  return reinterpret_cast<void*>(function);
}

TEST(NcclLoaderTest, FillsEveryMemberFromTheLibrary) {
  const auto api = loadNcclFrom({kFakeNcclFull});
  EXPECT_EQ(api->path, kFakeNcclFull);
  EXPECT_EQ(api->version, 22807);
  const std::pair<const char*, void*> members[] = {
      {"ncclGetVersion", addressOf(api->getVersion)},
      {"ncclGetErrorString", addressOf(api->getErrorString)},
      {"ncclGetLastError", addressOf(api->getLastError)},
      {"ncclGetUniqueId", addressOf(api->getUniqueId)},
      {"ncclCommInitRank", addressOf(api->commInitRank)},
      {"ncclCommSplit", addressOf(api->commSplit)},
      {"ncclCommDestroy", addressOf(api->commDestroy)},
      {"ncclCommAbort", addressOf(api->commAbort)},
      {"ncclCommGetAsyncError", addressOf(api->commGetAsyncError)},
      {"ncclAllReduce", addressOf(api->allReduce)},
      {"ncclBroadcast", addressOf(api->broadcast)},
      {"ncclReduce", addressOf(api->reduce)},
      {"ncclAllGather", addressOf(api->allGather)},
      {"ncclReduceScatter", addressOf(api->reduceScatter)},
      {"ncclSend", addressOf(api->send)},
      {"ncclRecv", addressOf(api->recv)},
      {"ncclGroupStart", addressOf(api->groupStart)},
      {"ncclGroupEnd", addressOf(api->groupEnd)},
      {"ncclRedOpCreatePreMulSum", addressOf(api->redOpCreatePreMulSum)},
      {"ncclRedOpDestroy", addressOf(api->redOpDestroy)},
  };
  for (const auto& [name, address] : members) {
    SCOPED_TRACE(name);
    EXPECT_NE(address, nullptr);
    EXPECT_EQ(address, symbolOf(kFakeNcclFull, name));
  }
  int version = 0;
  EXPECT_EQ(api->getVersion(&version), kNcclSuccess);
  EXPECT_EQ(version, 22807);
}

TEST(NcclLoaderTest, OptionalFunctionsAreNullWhenAbsent) {
  const auto api = loadNcclFrom({kFakeNcclNoOptional});
  EXPECT_EQ(api->version, 21004);
  EXPECT_EQ(api->getLastError, nullptr);
  EXPECT_EQ(api->commSplit, nullptr);
  EXPECT_EQ(api->redOpCreatePreMulSum, nullptr);
  EXPECT_EQ(api->redOpDestroy, nullptr);
  EXPECT_NE(api->commInitRank, nullptr);
  EXPECT_NE(api->allReduce, nullptr);
  EXPECT_NE(api->groupEnd, nullptr);
}

TEST(NcclLoaderTest, FirstCandidateThatExistsWins) {
  const TemporaryFolder folder;
  const std::string missing = folder.path() + "/libnccl.so.2";
  EXPECT_EQ(loadNcclFrom({missing, "libringtree_no_such_nccl.so.2", kFakeNcclNoOptional, kFakeNcclFull})->path,
            kFakeNcclNoOptional);
  EXPECT_EQ(loadNcclFrom({missing, kFakeNcclFull, kFakeNcclNoOptional})->path, kFakeNcclFull);
  // The first one that exists is used even when it is unusable and a later one is not.
  expectContains(errorOf([&] { loadNcclFrom({missing, kFakeNcclOld, kFakeNcclFull}); }), {"is too old"});
}

TEST(NcclLoaderTest, TooOldNamesVersionAndFile) {
  expectContains(errorOf([] { loadNcclFrom({kFakeNcclOld}); }),
                 {"NCCL 2.8.4 at " + kFakeNcclOld + " is too old: ringtree needs 2.10 or later", "RINGTREE_NCCL_PATH"});
}

TEST(NcclLoaderTest, MissingRequiredFunctionIsNamed) {
  expectContains(errorOf([] { loadNcclFrom({kFakeNcclNoInitRank}); }),
                 {kFakeNcclNoInitRank + " has no ncclCommInitRank: not a usable NCCL"});
}

TEST(NcclLoaderTest, NoneFoundNamesEveryCandidateAndTheRemedy) {
  const TemporaryFolder folder;
  const std::string missing = folder.path() + "/libnccl.so.2";
  const std::string message = errorOf([&] { loadNcclFrom({"loaded:libringtree_no_such_nccl.so.2", missing,
                                                          "libringtree_no_such_nccl.so.2"}); });
  expectContains(message, {"NCCL is not available: no libnccl.so.2 was found (tried: "
                           "loaded:libringtree_no_such_nccl.so.2, " +
                               missing + ", libringtree_no_such_nccl.so.2)",
                           "install nvidia-nccl-cu13 (or -cu12) or set RINGTREE_NCCL_PATH"});
  EXPECT_EQ(message.find("libnccl.so.2 loaded"), std::string::npos) << message;
  expectContains(errorOf([] { loadNcclFrom({}); }), {"(tried: nothing)"});
}

TEST(NcclLoaderTest, FileThatDoesNotLoadIsReportedWithTheLoaderError) {
  const TemporaryFolder folder;
  const std::string broken = folder.write("libnccl.so.2", "not a shared library\n");
  const std::string message = errorOf([&] { loadNcclFrom({broken}); });
  expectContains(message, {"NCCL is not available: no libnccl.so.2 loaded (tried: " + broken + "); " + broken + ": ",
                           "install nvidia-nccl-cu13 (or -cu12) or set RINGTREE_NCCL_PATH"});
  // A later candidate that loads is used.
  EXPECT_EQ(loadNcclFrom({broken, kFakeNcclFull})->path, kFakeNcclFull);
}

TEST(NcclLoaderTest, PreloadedLibraryIsFound) {
  const std::string name = fs::path(kFakeNcclPreloaded).filename().string();  // its soname
  const std::string candidate = "loaded:" + name;
  void* before = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (before == nullptr) {
    expectContains(errorOf([&] { loadNcclFrom({candidate}); }), {"no libnccl.so.2 was found"});
  } else {
    dlclose(before);
  }
  void* handle = dlopen(kFakeNcclPreloaded.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  const auto api = loadNcclFrom({candidate, kFakeNcclOld});
  EXPECT_EQ(realPath(api->path), realPath(kFakeNcclPreloaded));
  EXPECT_EQ(api->version, 22807);
  // A bare name the dynamic loader resolves is reported as the file it found.
  const auto byName = loadNcclFrom({name});
  EXPECT_EQ(realPath(byName->path), realPath(kFakeNcclPreloaded));
  EXPECT_EQ(byName->path.front(), '/');
}

TEST(NcclLoaderTest, LoadNcclGivesTheSameOutcomeEveryTime) {
  // Whatever this machine has (a real NCCL or none), the second call repeats the first.
  std::shared_ptr<const NcclApi> first;
  std::string firstError;
  try {
    first = loadNccl();
  } catch (const Error& error) {
    firstError = error.what();
  }
  if (first) {
    EXPECT_EQ(loadNccl(), first);
    EXPECT_GE(first->version, kMinNcclVersion);
  } else {
    EXPECT_EQ(errorOf([] { loadNccl(); }), firstError);
  }
}

// ---- loadGpuRuntimeFrom ------------------------------------------------------------------

TEST(GpuLoaderTest, GoodLibraryGivesItsTable) {
  const RingtreeGpuApi& api = loadGpuRuntimeFrom({kFakeGpuGood});
  using Entry = const RingtreeGpuApi* (*)(uint32_t);
  const auto entry = reinterpret_cast<Entry>(symbolOf(kFakeGpuGood, RINGTREE_GPU_API_ENTRY));
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(&api, entry(RINGTREE_GPU_API_VERSION));
  EXPECT_EQ(api.version, RINGTREE_GPU_API_VERSION);
  EXPECT_EQ(api.size, sizeof(RingtreeGpuApi));
  EXPECT_EQ(api.runtimeVersion, 13000);
  int devices = 0;
  EXPECT_EQ(api.deviceCount(&devices), 0);
  EXPECT_EQ(devices, 1);
}

TEST(GpuLoaderTest, FirstCandidateThatLoadsWins) {
  const TemporaryFolder folder;
  const std::string missing = folder.path() + "/libringtree_cuda.so";
  const std::string broken = folder.write("broken_libringtree_cuda.so", "not a shared library\n");
  const RingtreeGpuApi& good = loadGpuRuntimeFrom({kFakeGpuGood});
  EXPECT_EQ(&loadGpuRuntimeFrom({missing, "libringtree_no_such_cuda.so", broken, kFakeGpuGood, kFakeGpuNoDevices}),
            &good);
  // The first one that loads is used even when it is unusable and a later one is not.
  expectContains(errorOf([&] { loadGpuRuntimeFrom({missing, kFakeGpuNoDevices, kFakeGpuGood}); }),
                 {"no CUDA device is visible"});
}

TEST(GpuLoaderTest, NoLibrarySaysTheBuildHasNoCuda) {
  const TemporaryFolder folder;
  const std::string missing = folder.path() + "/libringtree_cuda.so";
  expectContains(errorOf([&] { loadGpuRuntimeFrom({missing, "libringtree_no_such_cuda.so"}); }),
                 {"CUDA buffers need ringtree's CUDA library, which this build does not have (no libringtree_cuda.so "
                  "in " + coreLibraryFolder(),
                  "tried: " + missing + ", libringtree_no_such_cuda.so",
                  "build with a CUDA toolkit, RINGTREE_USE_CUDA=ON", "RINGTREE_CUDA_LIBRARY"});
}

TEST(GpuLoaderTest, LibraryThatDoesNotLoadIsReportedWithTheLoaderError) {
  const TemporaryFolder folder;
  const std::string broken = folder.write("libringtree_cuda.so", "not a shared library\n");
  const std::string message = errorOf([&] { loadGpuRuntimeFrom({broken}); });
  expectContains(message, {"ringtree's CUDA library did not load (tried: " + broken + "); " + broken + ": ",
                           "install the CUDA runtime it was built with"});
  EXPECT_EQ(message.find("this build does not have"), std::string::npos) << message;
}

TEST(GpuLoaderTest, LibraryWithoutEntryIsNotOurs) {
  expectContains(errorOf([] { loadGpuRuntimeFrom({kFakeNcclFull}); }),
                 {kFakeNcclFull + " has no ringtree_gpu_api: not ringtree's CUDA library"});
}

TEST(GpuLoaderTest, OtherInterfaceVersionIsRefused) {
  expectContains(errorOf([] { loadGpuRuntimeFrom({kFakeGpuWrongVersion}); }),
                 {kFakeGpuWrongVersion + " does not speak version 1 of ringtree's GPU interface",
                  "use the libringtree_cuda.so built with this one"});
}

TEST(GpuLoaderTest, ShortTableIsRefused) {
  expectContains(errorOf([] { loadGpuRuntimeFrom({kFakeGpuShortTable}); }),
                 {kFakeGpuShortTable + " returned version 1 of ringtree's GPU interface (" +
                      std::to_string(sizeof(RingtreeGpuApi) - sizeof(void*)) + " bytes)",
                  "(" + std::to_string(sizeof(RingtreeGpuApi)) + " bytes)"});
}

TEST(GpuLoaderTest, DriverFailureIsNamed) {
  expectContains(errorOf([] { loadGpuRuntimeFrom({kFakeGpuDriverError}); }),
                 {"no CUDA driver: stand-in: the driver is older than the runtime (CUDA error 35)"});
}

TEST(GpuLoaderTest, MissingDriverIsNamed) {
  expectContains(errorOf([] { loadGpuRuntimeFrom({kFakeGpuNoDriver}); }),
                 {"no CUDA driver: no NVIDIA driver is installed", kFakeGpuNoDriver, "CUDA 13.0"});
}

TEST(GpuLoaderTest, NoDeviceNamesCudaVisibleDevices) {
  {
    const ScopedEnv visible("CUDA_VISIBLE_DEVICES", "3,5");
    expectContains(errorOf([] { loadGpuRuntimeFrom({kFakeGpuNoDevices}); }),
                   {"no CUDA device is visible (CUDA_VISIBLE_DEVICES=3,5)"});
  }
  {
    const ScopedEnv visible("CUDA_VISIBLE_DEVICES", "");
    expectContains(errorOf([] { loadGpuRuntimeFrom({kFakeGpuNoDevices}); }),
                   {"no CUDA device is visible (CUDA_VISIBLE_DEVICES=)"});
  }
  {
    const ScopedEnv visible("CUDA_VISIBLE_DEVICES", std::nullopt);
    expectContains(errorOf([] { loadGpuRuntimeFrom({kFakeGpuNoDevices}); }),
                   {"no CUDA device is visible (CUDA_VISIBLE_DEVICES unset)"});
  }
}

TEST(GpuLoaderTest, DeviceCountFailureIsNamed) {
  const ScopedEnv visible("CUDA_VISIBLE_DEVICES", "7");
  expectContains(errorOf([] { loadGpuRuntimeFrom({kFakeGpuDeviceError}); }),
                 {"no CUDA device is visible (CUDA_VISIBLE_DEVICES=7): stand-in: the driver sees no device (CUDA "
                  "error 100)",
                  "the driver supports CUDA 13.0"});
}

TEST(GpuLoaderTest, LoadGpuRuntimeGivesTheSameOutcomeEveryTime) {
  // Whatever this machine has (ringtree's CUDA library and a GPU, or not), the second
  // call repeats the first.
  const RingtreeGpuApi* first = nullptr;
  std::string firstError;
  try {
    first = &loadGpuRuntime();
  } catch (const Error& error) {
    firstError = error.what();
  }
  if (first != nullptr) {
    EXPECT_EQ(&loadGpuRuntime(), first);
  } else {
    EXPECT_EQ(errorOf([] { loadGpuRuntime(); }), firstError);
  }
}

}  // namespace
}  // namespace ringtree::cuda
