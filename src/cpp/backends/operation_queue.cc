#include "backends/operation_queue.h"

#include <algorithm>
#include <string>
#include <utility>

#include <ringtree/error.h>

namespace ringtree::detail {

std::shared_ptr<OperationQueue> OperationQueue::create() {
  return std::shared_ptr<OperationQueue>(new OperationQueue());
}

// shutdown() and abort() take worker_ before the worker ends, and the worker holds a
// reference until it returns: worker_ is never joinable here.
OperationQueue::~OperationQueue() = default;

void OperationQueue::throwRefused(const char* opName) const {
  throw Error(std::string(opName) + " on a ProcessGroup that has been " + (aborted_ ? "aborted" : "shut down"));
}

void OperationQueue::runErased(const char* opName, void (*invoke)(void*), void* operation) {
  uint32_t idle = 0;
  if (!state_.compare_exchange_strong(idle, kBusy, std::memory_order_acquire, std::memory_order_relaxed)) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed()) throwRefused(opName);
    // An inline call that was ending may have left the queue idle since.
    idle = 0;
    if (!state_.compare_exchange_strong(idle, kBusy, std::memory_order_acquire, std::memory_order_relaxed)) {
      auto work = newWork(opName, nullptr);
      queue_.push_back(Task{[invoke, operation] { invoke(operation); }, work, Start::kAtOnce});
      queueChanged();
      startWorkerLocked();
      lock.unlock();
      stateCv_.notify_all();  // after unlocking: the worker need not wake into a held mutex
      work->wait();
      return;
    }
  }
  // kBusy orders the inline calls one after the other: a plain increment is enough.
  inlineCalls_.store(inlineCalls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  struct Release {
    OperationQueue& queue;
    ~Release() { queue.endInline(); }
  } release{*this};
  invoke(operation);
}

void OperationQueue::endInline() {
  uint32_t busy = kBusy;
  if (state_.compare_exchange_strong(busy, 0, std::memory_order_release, std::memory_order_relaxed)) return;
  becomeIdle();
}

void OperationQueue::queueChanged() {
  if (queue_.empty()) {
    state_.fetch_and(~kQueued, std::memory_order_acq_rel);
  } else {
    state_.fetch_or(kQueued, std::memory_order_acq_rel);
  }
}

std::shared_ptr<Work> OperationQueue::submit(const char* opName, std::function<void()> operation,
                                             std::shared_ptr<void> keepAlive, Start start) {
  auto work = newWork(opName, std::move(keepAlive));
  bool wake = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed()) throwRefused(opName);
    queue_.push_back(Task{std::move(operation), work, start});
    queueChanged();
    startWorkerLocked();
    wake = start == Start::kAtOnce || !workerTimed_;
  }
  if (wake) stateCv_.notify_all();  // after unlocking: the worker need not wake into a held mutex
  return work;
}

void OperationQueue::leaveToWorker(const Work* target) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto queued = std::find_if(queue_.begin(), queue_.end(),
                                     [target](const Task& task) { return task.work.get() == target; });
    if (queued != queue_.end()) queued->start = Start::kAtOnce;
  }
  stateCv_.notify_all();
}

void OperationQueue::becomeIdle() {
  bool wanted = false;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    state_.fetch_and(~kBusy, std::memory_order_acq_rel);
    // Only the worker (for a queued operation, unless every one is left to a waiter while
    // the worker wakes by itself) and shutdown()/abort() (which close the queue before they
    // wait) wait for this: a call that ran alone wakes nobody.
    const bool needsWorker = std::any_of(queue_.begin(), queue_.end(),
                                         [](const Task& task) { return task.start == Start::kAtOnce; });
    wanted = closed() || (!queue_.empty() && (!workerTimed_ || needsWorker));
  }
  if (wanted) stateCv_.notify_all();
}

void OperationQueue::startWorkerLocked() {
  if (!worker_.joinable()) {
    worker_ = std::thread([self = shared_from_this()] { self->workerLoop(); });
  }
}

std::shared_ptr<Work> OperationQueue::newWork(const char* opName, std::shared_ptr<void> keepAlive) {
  auto work = std::make_shared<Work>(opName, std::move(keepAlive));
  work->setProgressDriver([queue = weak_from_this(), target = work.get()](Work::Deadline deadline) {
    const auto alive = queue.lock();
    if (!alive) return;
    if (deadline == Work::Deadline::max()) {
      alive->runQueuedUpTo(target);
    } else {
      alive->leaveToWorker(target);  // a bounded wait() must not start an operation, nor may a callback wait
    }
  });
  return work;
}

void OperationQueue::workerLoop() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mutex_);
  const auto ready = [this] { return (!queue_.empty() && !busy()) || (closed() && queue_.empty()); };
  Clock::time_point lingerUntil = Clock::now() + kIdleLinger;
  for (;;) {
    // Recently active: timed sleeps, which deferred submissions need not interrupt.
    while (!ready() && Clock::now() < lingerUntil) {
      workerTimed_ = true;
      stateCv_.wait_for(lock, kHandOffDelay);
    }
    workerTimed_ = false;
    stateCv_.wait(lock, ready);
    if (queue_.empty()) {
      return;  // shut down and drained
    }
    runFront(lock);
    lingerUntil = Clock::now() + kIdleLinger;
  }
}

void OperationQueue::runFront(std::unique_lock<std::mutex>& lock) {
  Task task = std::move(queue_.front());
  queue_.pop_front();
  state_.fetch_or(kBusy, std::memory_order_acq_rel);  // before kQueued may clear (see state_)
  queueChanged();
  lock.unlock();
  std::exception_ptr error;
  try {
    task.run();
  } catch (...) {
    error = std::current_exception();
  }
  task.run = nullptr;
  // The queue is free once the Work reads completed, before its waiters wake and its
  // callbacks run (which may call in or shut the queue down): so the next operation
  // starts only after this one completed, and a woken caller finds the queue idle.
  task.work->finish(error, [this] { becomeIdle(); });
  task.work.reset();
  lock.lock();
}

void OperationQueue::runQueuedUpTo(const Work* target) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    const auto queued = std::find_if(queue_.begin(), queue_.end(),
                                     [target](const Task& task) { return task.work.get() == target; });
    if (queued == queue_.end()) return;  // taken by another thread, or dropped by abort()
    if (busy()) {
      // Another thread runs one; the caller sleeps until target's is done, so the worker
      // must take it as soon as the queue is free.
      queued->start = Start::kAtOnce;
      return;
    }
    const bool last = queued == queue_.begin();
    runFront(lock);
    if (last) return;
  }
}

void OperationQueue::shutdown() {
  std::unique_lock<std::mutex> lock(mutex_);
  state_.fetch_or(kClosed, std::memory_order_acq_rel);
  stateCv_.notify_all();
  std::thread worker = std::move(worker_);
  if (worker.joinable() && worker.get_id() == std::this_thread::get_id()) {
    // From a Work callback on the worker: it cannot join itself. It runs what is still
    // queued here and ends once the callback returns (workerLoop sees the queue drained).
    worker.detach();
    for (;;) {
      stateCv_.wait(lock, [this] { return !busy(); });  // an inline call on another thread runs first
      if (queue_.empty()) break;
      runFront(lock);
    }
  }
  if (worker.joinable()) {
    lock.unlock();
    worker.join();
    lock.lock();
  }
  stateCv_.wait(lock, [this] { return !busy() && queue_.empty(); });
}

void OperationQueue::abort(int rank, const std::function<void()>& interrupt) {
  std::deque<Task> dropped;
  std::thread worker;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;
    state_.fetch_or(kClosed, std::memory_order_acq_rel);
    dropped.swap(queue_);
    queueChanged();
    worker = std::move(worker_);
  }
  stateCv_.notify_all();
  interrupt();
  for (Task& task : dropped) {
    task.work->finish(std::make_exception_ptr(Error(std::string(task.work->opName()) + " on rank " +
                                                    std::to_string(rank) +
                                                    " was aborted before it started: its process group was aborted")));
  }
  if (worker.joinable()) {
    if (worker.get_id() == std::this_thread::get_id()) {
      worker.detach();  // from a Work callback on the worker: it ends once the callback returns
    } else {
      worker.join();
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  stateCv_.wait(lock, [this] { return !busy(); });
}

bool OperationQueue::isShutdown() const { return closed(); }

}  // namespace ringtree::detail
