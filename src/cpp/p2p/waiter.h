#pragma once

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <exception>
#include <utility>

#include <ringtree/before_waiting.h>

#include "common/cpu.h"
#include "common/socket.h"

namespace ringtree::detail {

// How a progress loop that found nothing to do waits: it pauses the core, also yields it
// after `pausesBeforeYield` idle passes (see common/cpu.h), and after `spinTime` without
// progress it is time to sleep. Until it yields, the clock is read on every kClockPasses-th
// idle pass only: a pass that finds nothing costs little more than a clock read, and the
// spin time need not be exact.
class Backoff {
 public:
  Backoff(std::chrono::microseconds spinTime, int pausesBeforeYield)
      : spinTime_(spinTime), pausesBeforeYield_(pausesBeforeYield) {}

  // After a pass that moved something (or after a sleep): spin afresh.
  void restart() {
    idlePasses_ = 0;
    spinStart_ = {};
  }
  // Whether the spin time has passed since the first idle pass that read the clock. Once
  // every pass yields, each reads the clock (the system call dwarfs it).
  bool spunOut() {
    if (idlePasses_ % kClockPasses != 0 && idlePasses_ <= pausesBeforeYield_) return false;
    const auto now = net::Clock::now();
    if (spinStart_ == net::Clock::time_point{}) {
      spinStart_ = now;
      return false;
    }
    return now - spinStart_ >= spinTime_;
  }
  // Between two passes that moved nothing.
  void pause() {
    cpuRelax();
    if (++idlePasses_ > pausesBeforeYield_) yieldCore();
  }

 private:
  static constexpr int kClockPasses = 8;

  std::chrono::microseconds spinTime_;
  int pausesBeforeYield_;
  net::Clock::time_point spinStart_{};
  int idlePasses_ = 0;
};

// The outcome of one operation, awaited by one thread (the owner, which keeps the Waiter
// on its stack) and delivered by whichever thread completes the operation. The owner may
// sleep in poll() on other descriptors at the same time (connections it drives itself):
// it adds the Waiter's descriptor to the set, and a completion from another thread wakes
// it, as does nudge() (something it drives needs a look). A completion or nudge that
// finds the owner awake costs no system call.
//
// The descriptor is an eventfd made on the first sleep (never on a call that does not
// sleep) and closed with the Waiter. If none can be made, the owner sleeps in slices of
// kNoWakeSleepMs instead.
//
// How: the owner goes kAwake -> kSleeping before it sleeps; whoever takes it out of
// kSleeping (finish() to kFinished, nudge() to kAwake) writes the eventfd once, and the
// owner, finding after its sleep that it was taken out, waits for that write and
// consumes it. So no wake-up is lost, none is left over, and none comes after the owner
// has let the Waiter go.
//
// Threading: finish() exactly once, from any thread; nudge() from any thread that knows
// the Waiter exists (the owner's engine lock guarantees it); the rest on the owner's
// thread. The owner destroys the Waiter only once nobody can call finish() or nudge() any
// more (finished() returned true, or it was never handed out for finish() and is no
// longer reachable under the engine lock) and any sleep it prepared ended with wokeUp().
class Waiter {
 public:
  // How long a sleep without a wake-up descriptor lasts.
  static constexpr int kNoWakeSleepMs = 1;

  Waiter() = default;
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  // Stores the outcome (error, or null and the rank a receive's message came from) and
  // lets the owner go, waking it if it sleeps.
  void finish(std::exception_ptr error, int sourceRank) noexcept {
    error_ = std::move(error);
    sourceRank_ = sourceRank;
    if (state_.exchange(kFinished, std::memory_order_acq_rel) == kSleeping) signal();
  }

  // Wakes the owner if it sleeps: it returns from its poll(), not finished.
  void nudge() noexcept {
    int expected = kSleeping;
    if (state_.compare_exchange_strong(expected, kAwake, std::memory_order_acq_rel)) signal();
  }

  bool finished() const { return state_.load(std::memory_order_acquire) == kFinished; }

  // Owner, before it sleeps in poll(): fills *wake with the descriptor to add to the set
  // (fd -1 when none could be made: sleep at most kNoWakeSleepMs then). Returns false,
  // and the owner must not sleep, when the operation has finished already.
  bool prepareToSleep(pollfd* wake) {
    *wake = pollfd{-1, POLLIN, 0};
    if (!wakeFd_.valid()) wakeFd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wakeFd_.valid()) return !finished();
    int expected = kAwake;
    if (!state_.compare_exchange_strong(expected, kSleeping, std::memory_order_acq_rel)) return false;
    wake->fd = wakeFd_.fd();
    return true;
  }

  // Owner, after the poll() that followed prepareToSleep(), whatever woke it. When
  // finish() or nudge() took it out of its sleep meanwhile, waits for their wake-up write
  // and consumes it.
  void wokeUp() {
    int expected = kSleeping;
    if (!wakeFd_.valid() || state_.compare_exchange_strong(expected, kAwake, std::memory_order_acq_rel)) return;
    pollfd wake{wakeFd_.fd(), POLLIN, 0};
    uint64_t count = 0;
    while (::read(wakeFd_.fd(), &count, sizeof(count)) < 0) {
      if (errno == EAGAIN) ::poll(&wake, 1, -1);  // the write is a few instructions away
    }
  }

  // Owner: spins for `spinTime` (see Backoff), then sleeps until the operation finished.
  void wait(std::chrono::microseconds spinTime, int pausesBeforeYield) {
    Backoff backoff(spinTime, pausesBeforeYield);
    while (!finished() && !backoff.spunOut()) backoff.pause();
    while (!finished()) {
      BeforeWaiting::notify();
      pollfd wake;
      if (!prepareToSleep(&wake)) break;
      ::poll(&wake, 1, wake.fd < 0 ? kNoWakeSleepMs : -1);
      wokeUp();
    }
  }

  // Owner, once finished(): rethrows the operation's error, or returns its source rank.
  int outcome() const {
    if (error_) std::rethrow_exception(error_);
    return sourceRank_;
  }
  // Owner, once finished(): the operation's error (null on success) and source rank.
  const std::exception_ptr& error() const { return error_; }
  int sourceRank() const { return sourceRank_; }

 private:
  enum State : int { kAwake, kSleeping, kFinished };

  // The one write owed by whoever took the owner out of kSleeping: the owner waits for
  // it, so the Waiter lives on until it is done.
  void signal() noexcept {
    const uint64_t one = 1;
    while (::write(wakeFd_.fd(), &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }

  std::atomic<int> state_{kAwake};
  std::exception_ptr error_;  // written by finish() before state_ becomes kFinished
  int sourceRank_ = -1;
  net::Socket wakeFd_;  // the owner's eventfd; see signal()
};

}  // namespace ringtree::detail
