#pragma once

// Small helpers shared by the C++ test programs.

#include <dirent.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

namespace ringtree::test {

// Bounds of the suite's timing assertions. The suite runs on loaded two-core machines
// (builds and other test programs beside it), where a thread may wait a second or more
// for a core, so an upper bound here tells "at once" or "near its deadline" apart from
// "after a fallback timeout" or "never", not fast from slow; every test keeps the
// fallbacks it could pass through (its own waits and timeouts) well beyond these.
//
// What needs no waiting (a peer's failure or departure reaching a rank, an abort, a
// refusal, a wake-up, a zero timeout) is over within kPrompt.
constexpr std::chrono::milliseconds kPrompt(5000);
// A timeout fires after its deadline (tests keep that lower bound) and at most kLateBy
// after it.
constexpr std::chrono::milliseconds kLateBy(3000);

// True when part occurs in text.
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Whole milliseconds since start, on the steady clock.
inline std::chrono::milliseconds elapsedSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
}

// Waits until another thread sets flag; throws std::runtime_error after timeout (that
// thread failed before it got there).
inline void waitForFlag(const std::atomic<bool>& flag,
                        std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("the other rank never got there");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Polls pred every 5 ms until it holds (true) or timeout passes (pred's last answer).
inline bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout = std::chrono::seconds(3)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// Counts threads that reached a point; lets the others wait for them, bounded (10 s),
// so that no rank closes its connections while another still waits for its own deadline.
class Arrivals {
 public:
  void arrive() { ++count_; }
  void waitFor(int count) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (count_ < count && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

 private:
  std::atomic<int> count_{0};
};

// Sets a flag when it goes out of scope, however the scope ends: keeps a thread that waits
// for it (waitForFlag) from waiting out its timeout after a failed expectation.
class SetOnExit {
 public:
  explicit SetOnExit(std::atomic<bool>& flag) : flag_(flag) {}
  ~SetOnExit() { flag_ = true; }
  SetOnExit(const SetOnExit&) = delete;
  SetOnExit& operator=(const SetOnExit&) = delete;

 private:
  std::atomic<bool>& flag_;
};

// The names in /dev/shm now, less POSIX semaphores ("sem.*", which unrelated processes
// create and remove at any time; ringtree creates none): ringtree names no segment there,
// so a test compares this set before and after.
inline std::set<std::string> devShmEntries() {
  std::set<std::string> names;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != ".." && name.rfind("sem.", 0) != 0) names.insert(name);
    }
    ::closedir(dir);
  }
  return names;
}

// Sets an environment variable for the lifetime of the object and restores the previous
// state after it. Set it before ranks start and let it go after they are joined: getenv
// is not safe against a concurrent setenv.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    hadOld_ = old != nullptr;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (hadOld_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool hadOld_ = false;
};

// Runs one case of a grid: an exception from fn comes back as std::runtime_error with the
// case's name (name(), called only then) in front, so that a rank's failure names the
// case and not only the rank.
template <typename Name, typename Fn>
void runNamedCase(const Name& name, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    throw std::runtime_error(name() + ": " + e.what());
  }
}

// Runs fn, which must throw E; returns the exception's message ("" after recording a
// failure).
template <typename E, typename Fn>
std::string messageOf(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw an exception of another type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

}  // namespace ringtree::test
