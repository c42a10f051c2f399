#include "common/env.h"

#include <cstdlib>

namespace ringtree::env {

std::string getString(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::string(value);
}

std::string storeToken() { return getString("RINGTREE_STORE_TOKEN"); }

std::string algorithm() { return getString("RINGTREE_ALGO"); }

std::string logLevel() { return getString("RINGTREE_LOG_LEVEL", "warn"); }

std::string transport() { return getString("RINGTREE_TRANSPORT"); }

std::string shmArena() { return getString("RINGTREE_SHM_ARENA"); }

std::string socketIfname() { return getString("RINGTREE_SOCKET_IFNAME"); }

}  // namespace ringtree::env
