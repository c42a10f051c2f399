#include <ringtree/work.h>

#include <string>
#include <utility>

#include <ringtree/before_waiting.h>
#include <ringtree/error.h>

#include "common/logging.h"

namespace ringtree {

Work::Work(const char* opName, std::shared_ptr<void> keepAlive)
    : opName_(opName), keepAlive_(std::move(keepAlive)) {}

Work::~Work() = default;

std::shared_ptr<Work> Work::completed(const char* opName, std::exception_ptr error, int sourceRank) {
  auto work = std::make_shared<Work>(opName);
  // Nobody else sees it yet: no lock needed.
  work->finishing_ = true;
  work->exception_ = std::move(error);
  work->sourceRank_ = sourceRank;
  work->completed_.store(true, std::memory_order_release);
  return work;
}

bool Work::wait(std::chrono::milliseconds timeout) {
  if (completed_.load(std::memory_order_acquire)) {  // exception_ is final then
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }
  BeforeWaiting::notify();
  using Clock = std::chrono::steady_clock;
  Clock::time_point deadline = Clock::time_point::max();
  if (timeout.count() > 0) {  // one past the clock's range is no limit (rather than an overflowed deadline)
    const Clock::time_point now = Clock::now();
    if (timeout < std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now)) deadline = now + timeout;
  }
  const bool limited = deadline != Clock::time_point::max();
  if (streamWait_ && !isCompleted() && streamWait_()) return true;
  if (progressDriver_ && !isCompleted()) progressDriver_(deadline);
  std::unique_lock<std::mutex> lock(mutex_);
  auto done = [this] { return completed_.load(std::memory_order_relaxed); };
  if (!limited) {
    completedCv_.wait(lock, done);
  } else if (!completedCv_.wait_until(lock, deadline, done)) {
    throw TimeoutError(std::string("Work.wait() timed out after ") + std::to_string(timeout.count()) +
                       " ms; the " + opName_ + " is still running (wait again to see it finish)");
  }
  if (exception_) {
    std::rethrow_exception(exception_);
  }
  return true;
}

void Work::setProgressDriver(ProgressDriver driver) { progressDriver_ = std::move(driver); }

void Work::setStreamWait(StreamWait streamWait) { streamWait_ = std::move(streamWait); }

bool Work::isCompleted() const { return completed_.load(std::memory_order_acquire); }

bool Work::isSuccess() const { return completed_.load(std::memory_order_acquire) && !exception_; }

int Work::sourceRank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sourceRank_;
}

void Work::setSourceRank(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  sourceRank_ = rank;
}

std::exception_ptr Work::exception() const {
  return completed_.load(std::memory_order_acquire) ? exception_ : nullptr;  // final once completed
}

void Work::addCallback(Callback callback) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!completed_.load(std::memory_order_relaxed)) {
      callbacks_.push_back(std::move(callback));
      lock.unlock();
      // Nobody may wait for it: tell whoever runs it (Deadline::min(): drive nothing here).
      if (progressDriver_) progressDriver_(Deadline::min());
      return;
    }
  }
  callback(*this);
}

void Work::finish(std::exception_ptr error) { finish(std::move(error), [] {}); }

void Work::finish(std::exception_ptr error, const std::function<void()>& onCompleted) {
  std::shared_ptr<void> keepAlive;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finishing_) {
      throw InvalidArgument(std::string("Work::finish called twice for one ") + opName_);
    }
    finishing_ = true;
    keepAlive = std::move(keepAlive_);
  }
  // Released outside the lock: releasing a Python buffer may have to take the GIL.
  keepAlive.reset();
  std::vector<Callback> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exception_ = std::move(error);
    completed_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  onCompleted();
  completedCv_.notify_all();
  for (auto& callback : callbacks) {
    try {
      callback(*this);
    } catch (const std::exception& e) {
      RINGTREE_WARN("a completion callback of a " << opName_ << " threw; ignored: " << e.what());
    } catch (...) {
      RINGTREE_WARN("a completion callback of a " << opName_ << " threw a non-std exception; ignored");
    }
  }
}

}  // namespace ringtree
