#pragma once

#include <cstdint>
#include <string>

// Every RINGTREE_* environment variable the C++ core reads is declared here, once, with
// its default and meaning. Values are read when asked for (not cached), so tests can set
// them per case.
namespace ringtree::env {

// RINGTREE_STORE_TOKEN: shared secret for TcpStore (client and server). Default: none.
std::string storeToken();

// RINGTREE_LOG_LEVEL: error|warn|info|debug. Default: warn.
std::string logLevel();

// Reads an environment variable; returns fallback when it is unset.
std::string getString(const char* name, const std::string& fallback = "");

}  // namespace ringtree::env
