#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>

#include <ringtree/communicator.h>
#include <ringtree/export.h>
#include <ringtree/options.h>
#include <ringtree/types.h>
#include <ringtree/work.h>

namespace ringtree {

// The CPU backend (torch's "gloo" role): runs the collectives of <ringtree/collectives.h>
// over one Communicator, synchronously or asynchronously, in submission order.
//
// Every collective comes in two forms:
//  - synchronous (`allreduce(...)`): returns when this rank's part is done. When nothing
//    is queued or running it runs directly on the calling thread (the fast path: no
//    thread hand-off, no allocation besides the algorithm's); otherwise it is queued
//    behind the pending operations and the caller blocks until it ran.
//  - asynchronous (`allreduceAsync(...)`): queued to the group's worker thread (started on
//    first use); returns at once with a Work. The buffer must stay valid and untouched
//    until the Work completes; `keepAlive` (any owner of it) is held until then.
//
// Operations run one at a time in submission order, whichever thread submits them, so
// every rank must submit the same operations in the same order. Errors: invalid
// arguments (root out of range, op not defined on the type: see isSupported) throw
// InvalidArgument from the submitting call, before anything is queued. Errors of the
// operation itself (NetworkError, TimeoutError, CollectiveMismatchError, see
// collectives.h) are thrown by the synchronous form and stored in the Work of the
// asynchronous one; after one of them the communicator is unusable, and every later
// operation fails at once.
//
// Threading: every member function may be called from any thread. Nothing else may use
// the communicator while the group exists. Work callbacks run on the thread that ran the
// operation; they may submit, shut the group down or drop the last reference to it (the
// worker then ends when the callback returns), and wait (on the worker, only for a group
// owned by a std::shared_ptr: see below).
//
// A Work::wait() without a timeout on a group owned by a std::shared_ptr runs the queued
// operations up to its own on the waiting thread when the worker has not taken them yet
// (in submission order, one at a time, as the worker would), which spares two thread
// wake-ups; otherwise it sleeps until the worker finished its operation.
class RINGTREE_API ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  explicit ProcessGroup(std::shared_ptr<Communicator> communicator);
  // shutdown().
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return communicator_->rank(); }
  int size() const { return communicator_->size(); }
  Communicator& communicator() { return *communicator_; }

  // In place over `count` elements of `type` at `buffer`; see collectives.h.
  void allreduce(void* buffer, size_t count, DataType type, const AllreduceOptions& options = {});
  std::shared_ptr<Work> allreduceAsync(void* buffer, size_t count, DataType type,
                                       const AllreduceOptions& options = {},
                                       std::shared_ptr<void> keepAlive = nullptr);

  void broadcast(void* buffer, size_t count, DataType type, const BroadcastOptions& options = {});
  std::shared_ptr<Work> broadcastAsync(void* buffer, size_t count, DataType type,
                                       const BroadcastOptions& options = {},
                                       std::shared_ptr<void> keepAlive = nullptr);

  void reduce(void* buffer, size_t count, DataType type, const ReduceOptions& options = {});
  std::shared_ptr<Work> reduceAsync(void* buffer, size_t count, DataType type,
                                    const ReduceOptions& options = {},
                                    std::shared_ptr<void> keepAlive = nullptr);

  void barrier(const BarrierOptions& options = {});
  std::shared_ptr<Work> barrierAsync(const BarrierOptions& options = {});

  // Any other operation on communicator() (allgather, gather, scatter, reduceScatter,
  // alltoall of collectives.h, or a sequence of them that forms one logical call), run
  // under the rules above: `run` is the synchronous form (inline when the group is idle;
  // `operation` is called exactly once, on this or the worker thread, and is not copied),
  // `runAsync` the asynchronous one. The caller validates arguments before submitting.
  // `opName` is a string literal naming the operation in messages.
  template <typename Operation>
  void run(const char* opName, Operation&& operation) {
    runErased(opName, &invokeErased<std::remove_reference_t<Operation>>, &operation);
  }
  std::shared_ptr<Work> runAsync(const char* opName, std::function<void()> operation,
                                 std::shared_ptr<void> keepAlive = nullptr);

  // Stops the group: later submissions throw Error. Operations already queued still run,
  // in order (each bounded by its deadline), then the worker thread is joined; returns
  // once nothing runs any more (an inline call on another thread included). Idempotent.
  // From a Work callback on the worker it runs what is still queued itself.
  void shutdown();
  bool isShutdown() const;

  // Aborts the group: refuses later submissions (as shutdown() does), fails the queued
  // operations with Error without running them, makes the running one fail within about
  // 100 ms with Error wherever it waits (Communicator::abort), waits for it, stops the
  // worker thread, and then closes the communicator's connections and node arena (its
  // peers see this rank leave). Returns once all that is done. Idempotent. Must not be
  // called from a Work callback.
  void abort();

  // How many synchronous calls ran on the calling thread (the fast path). A debug
  // counter for tests.
  uint64_t inlineCallCount() const { return inlineCalls_.load(std::memory_order_relaxed); }

 private:
  struct Task {
    std::function<void()> run;
    std::shared_ptr<Work> work;
  };

  template <typename Operation>
  static void invokeErased(void* operation) {
    (*static_cast<Operation*>(operation))();
  }
  // Runs invoke(operation) on this thread when the group is idle, else queues it and waits.
  void runErased(const char* opName, void (*invoke)(void*), void* operation);
  // Runs `operation` on this thread when the group is idle, else queues it and waits.
  template <typename Operation>
  void runSync(const char* opName, Operation& operation);
  std::shared_ptr<Work> submit(const char* opName, std::function<void()> operation,
                               std::shared_ptr<void> keepAlive);
  // Starts the worker on first use (the caller wakes it after releasing mutex_); mutex_ held.
  void startWorkerLocked();
  void workerLoop(const std::atomic<bool>& alive);
  // A Work whose unbounded wait() runs the queue up to it (see runQueuedUpTo) when the
  // group is owned by a std::shared_ptr.
  std::shared_ptr<Work> newWork(const char* opName, std::shared_ptr<void> keepAlive);
  // Takes the first queued task and runs it on this thread (mutex_ held on entry and on
  // return, released while the task runs and while its Work finishes). Returns false,
  // with mutex_ not held, when `alive` (the worker's flag) turned false meanwhile: a Work
  // callback destroyed the group.
  bool runFront(std::unique_lock<std::mutex>& lock, const std::atomic<bool>* alive);
  // Work::wait()'s progress driver: runs the queued tasks up to and including `target`'s
  // on the calling thread, while no other thread runs one and target is still queued.
  void runQueuedUpTo(const Work* target);
  void checkRoot(const char* opName, int root) const;

  std::shared_ptr<Communicator> communicator_;
  mutable std::mutex mutex_;
  // Signalled when a task is queued, when an operation finishes and at shutdown.
  std::condition_variable stateCv_;
  std::deque<Task> queue_;
  bool busy_ = false;  // an operation is running (on the worker or inline)
  bool shutdown_ = false;
  bool aborted_ = false;  // by abort(): says so in the refusals of later submissions
  std::thread worker_;
  std::atomic<uint64_t> inlineCalls_{0};
  // Cleared by the destructor; the worker checks it after each Work's callbacks.
  std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
};

}  // namespace ringtree
