#pragma once

// Small helpers shared by the C++ test programs.

#include <gtest/gtest.h>

#include <cstdlib>
#include <exception>
#include <string>

namespace ringtree::test {

// Whether ThreadSanitizer or AddressSanitizer instruments this program (RINGTREE_SANITIZE).
// Performance reports skip there: their figures would measure the instrumentation, and
// their loops take minutes.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

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
