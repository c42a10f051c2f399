#include "common/env.h"

#include <cstdlib>

namespace ringtree::env {

std::string getString(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::string(value);
}

std::string storeToken() { return getString("RINGTREE_STORE_TOKEN"); }

std::string logLevel() { return getString("RINGTREE_LOG_LEVEL", "warn"); }

}  // namespace ringtree::env
