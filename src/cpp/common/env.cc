#include "common/env.h"

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <set>

#include <ringtree/error.h>

namespace ringtree::env {

std::string getString(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::string(value);
}

std::string storeToken() { return getString("RINGTREE_STORE_TOKEN"); }

namespace {

// Every value RINGTREE_ALGO had when read (a handful in a process's life), so that the
// one current stays valid for whoever still reads it.
std::atomic<const std::string*> currentAlgorithm{nullptr};

}  // namespace

void readAlgorithm() {
  static std::mutex mutex;
  static std::set<std::string>* seen = new std::set<std::string>();
  const std::string value = getString("RINGTREE_ALGO");
  const std::lock_guard<std::mutex> lock(mutex);
  currentAlgorithm.store(&*seen->insert(value).first, std::memory_order_release);
}

const std::string& algorithm() {
  const std::string* current = currentAlgorithm.load(std::memory_order_acquire);
  if (current == nullptr) {
    readAlgorithm();
    current = currentAlgorithm.load(std::memory_order_acquire);
  }
  return *current;
}

std::string logLevel() { return getString("RINGTREE_LOG_LEVEL", "warn"); }

std::string transport() { return getString("RINGTREE_TRANSPORT"); }

std::string shmArena() { return getString("RINGTREE_SHM_ARENA"); }

std::string connectMode() { return getString("RINGTREE_CONNECT"); }

std::string socketIfname() { return getString("RINGTREE_SOCKET_IFNAME"); }

size_t flightRecorderEntries() {
  constexpr size_t kDefault = 2048;
  constexpr size_t kMinimum = 2;
  const std::string text = getString("RINGTREE_FLIGHT_RECORDER_ENTRIES");
  if (text.empty()) return kDefault;
  size_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    throw InvalidArgument("RINGTREE_FLIGHT_RECORDER_ENTRIES must be a non-negative integer, got '" + text + "'");
  }
  return value < kMinimum ? kMinimum : value;
}

std::string flightRecorderDir() { return getString("RINGTREE_FLIGHT_RECORDER_DIR"); }

std::string ncclPath() { return getString("RINGTREE_NCCL_PATH"); }

std::string cudaLibrary() { return getString("RINGTREE_CUDA_LIBRARY"); }

std::string cudaBackend() { return getString("RINGTREE_CUDA_BACKEND"); }

}  // namespace ringtree::env
