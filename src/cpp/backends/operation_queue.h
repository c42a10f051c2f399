#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include <ringtree/work.h>

namespace ringtree::detail {

// Runs one engine's operations one at a time, in submission order, whichever thread
// submits them: the CPU engine's collectives over one communicator (which runs one
// collective at a time), the contract of ProcessGroup's sync and async forms.
//
//  - runSync: runs the operation on the calling thread when nothing is queued or running
//    (no hand-off, no allocation, no lock: a compare-and-swap of the state word in and
//    one out), else queues it and blocks until it ran; rethrows what it threw.
//  - submit: queues the operation for the worker thread (started on first use) and
//    returns its Work at once. The Work's unbounded wait() runs the queued operations up
//    to its own on the waiting thread when no other thread runs one (sparing the worker's
//    two wake-ups). With Start::kDeferred (small operations) the submission does not wake
//    a worker that was active within kIdleLinger: that worker wakes by itself every
//    kHandOffDelay and takes what no wait() ran by then, so an async call followed by
//    wait() costs no thread wake-up at all. A bounded wait() and a done callback (a
//    Future) wake the worker at once, since they leave the running to it.
//
// Always owned by a std::shared_ptr (create()): the worker thread and the Works' progress
// drivers hold references, so a Work callback may drop the engine's last reference to it
// from any thread. Operations must not use anything that their owner destroys before it
// called shutdown() or abort() (both wait until no operation runs any more).
//
// Threading: every member function may be called from any thread.
class OperationQueue : public std::enable_shared_from_this<OperationQueue> {
 public:
  static std::shared_ptr<OperationQueue> create();
  ~OperationQueue();
  OperationQueue(const OperationQueue&) = delete;
  OperationQueue& operator=(const OperationQueue&) = delete;

  // `opName` is a string literal naming the operation in messages. Both throw Error after
  // shutdown() or abort() ("<opName> on a ProcessGroup that has been shut down").
  template <typename Operation>
  void runSync(const char* opName, Operation& operation) {
    runErased(opName, &invokeErased<Operation>, &operation);
  }
  enum class Start { kAtOnce, kDeferred };
  std::shared_ptr<Work> submit(const char* opName, std::function<void()> operation, std::shared_ptr<void> keepAlive,
                               Start start = Start::kAtOnce);

  // A deferred operation is left this long to a wait() that runs it on its own thread;
  // for this long after its last operation the idle worker wakes at that period.
  static constexpr std::chrono::microseconds kHandOffDelay{200};
  static constexpr std::chrono::milliseconds kIdleLinger{20};

  // Refuses later submissions, lets the queued operations run in order, joins the worker
  // and returns once nothing runs (an inline call on another thread included). From a
  // Work callback on the worker it runs what is still queued itself (the worker ends
  // once the callback returns). Idempotent.
  void shutdown();
  bool isShutdown() const;

  // Refuses later submissions and fails the queued operations with Error without running
  // them ("<opName> on rank <rank> was aborted before it started ..."), then joins the
  // worker (which first finishes the operation it runs: the caller makes that fail
  // fast) and returns once nothing runs. `interrupt` is called after the queue was
  // emptied and before waiting (Communicator::abort). Idempotent.
  void abort(int rank, const std::function<void()>& interrupt);

  // How many runSync calls ran on the calling thread.
  uint64_t inlineCallCount() const { return inlineCalls_.load(std::memory_order_relaxed); }

 private:
  struct Task {
    std::function<void()> run;
    std::shared_ptr<Work> work;
    Start start;  // kDeferred: a waiter is expected to run it (see submit)
  };

  OperationQueue() = default;

  template <typename Operation>
  static void invokeErased(void* operation) {
    (*static_cast<Operation*>(operation))();
  }
  void runErased(const char* opName, void (*invoke)(void*), void* operation);
  [[noreturn]] void throwRefused(const char* opName) const;
  // Starts the worker on first use (the caller wakes it after releasing mutex_); mutex_ held.
  void startWorkerLocked();
  void workerLoop();
  // A Work whose unbounded wait() runs the queue up to it (runQueuedUpTo); a bounded
  // wait() or a callback leaves it to the worker instead (leaveToWorker).
  std::shared_ptr<Work> newWork(const char* opName, std::shared_ptr<void> keepAlive);
  // Marks target's queued operation kAtOnce (its Work is waited for or has a callback, so
  // the worker must run it as soon as the queue is free) and wakes the worker.
  void leaveToWorker(const Work* target);
  // Marks the running operation done (kBusy cleared) and wakes whoever waits for that;
  // takes mutex_.
  void becomeIdle();
  // The end of an inline runSync: clears kBusy by compare-and-swap when nothing was queued
  // and the queue was not closed meanwhile (nobody waits then), else becomeIdle().
  void endInline();
  // Whether an operation runs (mutex_ held: see state_).
  bool busy() const { return (state_.load(std::memory_order_acquire) & kBusy) != 0; }
  // Whether shutdown() or abort() closed the queue (final once true).
  bool closed() const { return (state_.load(std::memory_order_acquire) & kClosed) != 0; }
  // Mirrors queue_'s emptiness into kQueued; mutex_ held, after every change of queue_.
  void queueChanged();
  // Takes the first queued task and runs it on this thread (mutex_ held on entry and on
  // return, released while the task runs and while its Work finishes).
  void runFront(std::unique_lock<std::mutex>& lock);
  // Work::wait()'s progress driver: runs the queued tasks up to and including `target`'s
  // on the calling thread, while no other thread runs one and target is still queued
  // (when another thread runs one, target's is marked kAtOnce for the worker).
  void runQueuedUpTo(const Work* target);

  mutable std::mutex mutex_;
  // Signalled when a task is queued, when an operation finishes and at shutdown.
  std::condition_variable stateCv_;
  std::deque<Task> queue_;
  // The state the inline path of runSync reads and changes without mutex_: kBusy (an
  // operation runs: on the worker, inline or in a driver), kQueued (queue_ is not empty),
  // kClosed (shutdown() or abort() ran). kQueued and kClosed change under mutex_ only. kBusy is set by a
  // compare-and-swap from 0 (an inline call: nothing queued, running or closed) or under
  // mutex_ while kQueued is set (so no inline call races it), and cleared by a
  // compare-and-swap from kBusy alone (an inline call's end: nothing queued and not
  // closed, so nobody waits for it) or under mutex_. So whoever waits under mutex_ for
  // kBusy to clear (the worker, shutdown, abort) has set kQueued or kClosed first, and the
  // clearing takes mutex_ and notifies.
  static constexpr uint32_t kBusy = 1;
  static constexpr uint32_t kQueued = 2;
  static constexpr uint32_t kClosed = 4;
  std::atomic<uint32_t> state_{0};
  bool aborted_ = false;  // by abort(): says so in the refusals of later submissions
  bool workerTimed_ = false;  // the idle worker wakes by itself within kHandOffDelay
  std::thread worker_;
  std::atomic<uint64_t> inlineCalls_{0};
};

}  // namespace ringtree::detail
