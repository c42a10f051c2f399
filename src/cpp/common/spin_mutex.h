#pragma once

#include <sched.h>
#include <time.h>

#include <atomic>

#include <ringtree/before_waiting.h>

#include "common/cpu.h"

namespace ringtree {

// A mutex for short critical sections taken very often (a connection shared by several
// communicators: transport/mux/link.h): lock() is one atomic exchange when it is free and
// unlock() one release store, against two read-modify-writes for a pthread mutex. A
// waiter spins briefly, then yields the core, then sleeps in 50 us steps, so that a
// holder that copies a large message (or was preempted, with ranks outnumbering cores)
// is not fought for the CPU. Not fair, not recursive. Meets BasicLockable and Lockable
// (std::lock_guard, std::unique_lock).
class SpinMutex {
 public:
  void lock() noexcept {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    lockContended();
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  void lockContended() noexcept {
    for (int round = 0;; ++round) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (round < kSpinRounds) {
          cpuRelax();
          ++round;
          continue;
        }
        // Its holder is slow: a wait (the caller's hook runs at most once).
        if (round < kSpinRounds + kYieldRounds) {
          yieldCore();
        } else {
          BeforeWaiting::notify();
          const timespec nap{0, 50 * 1000};
          nanosleep(&nap, nullptr);
        }
        ++round;
      }
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }

  static constexpr int kSpinRounds = 128;
  static constexpr int kYieldRounds = 256;
  std::atomic<bool> locked_{false};
};

}  // namespace ringtree
