#pragma once

#include <sstream>
#include <string>

// Minimal leveled logging to stderr. The level comes from RINGTREE_LOG_LEVEL
// (error|warn|info|debug, default warn), read once at first use.
namespace ringtree::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

bool enabled(Level level);
void write(Level level, const std::string& message);

}  // namespace ringtree::log

#define RINGTREE_LOG(level, expr)                                          \
  do {                                                                     \
    if (::ringtree::log::enabled(::ringtree::log::Level::level)) {         \
      std::ostringstream ringtree_log_stream_;                             \
      ringtree_log_stream_ << expr;                                        \
      ::ringtree::log::write(::ringtree::log::Level::level, ringtree_log_stream_.str()); \
    }                                                                      \
  } while (0)

#define RINGTREE_WARN(expr) RINGTREE_LOG(kWarn, expr)
#define RINGTREE_INFO(expr) RINGTREE_LOG(kInfo, expr)
#define RINGTREE_DEBUG(expr) RINGTREE_LOG(kDebug, expr)
