#include "common/logging.h"

#include <unistd.h>

#include <cstdio>

#include "common/env.h"

namespace ringtree::log {

namespace {
Level levelFromEnv() {
  const std::string name = env::logLevel();
  if (name == "error") return Level::kError;
  if (name == "info") return Level::kInfo;
  if (name == "debug") return Level::kDebug;
  return Level::kWarn;
}

const char* levelName(Level level) {
  switch (level) {
    case Level::kError: return "ERROR";
    case Level::kWarn: return "WARN";
    case Level::kInfo: return "INFO";
    case Level::kDebug: return "DEBUG";
  }
  return "?";
}
}  // namespace

bool enabled(Level level) {
  static const Level threshold = levelFromEnv();
  return static_cast<int>(level) <= static_cast<int>(threshold);
}

void write(Level level, const std::string& message) {
  // One fprintf per line so that lines from several threads do not interleave.
  std::fprintf(stderr, "[ringtree %s pid %d] %s\n", levelName(level), static_cast<int>(getpid()),
               message.c_str());
}

}  // namespace ringtree::log
