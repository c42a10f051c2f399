#include <ringtree/process_group.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "communicator_impl.h"

namespace ringtree {

namespace {

void checkOp(const char* opName, DataType type, ReduceOp op) {
  if (!isSupported(type, op)) {
    std::string message = std::string(opName) + " does not support ReduceOp." + reduceOpName(op) + " on " +
                          dataTypeName(type) + " buffers";
    if (type == DataType::kComplex64 || type == DataType::kComplex128) {
      message += " (complex buffers support SUM, AVG and PREMUL_SUM)";
    }
    throw InvalidArgument(message);
  }
}

}  // namespace

ProcessGroup::ProcessGroup(std::shared_ptr<Communicator> communicator) : communicator_(std::move(communicator)) {
  if (!communicator_) {
    throw InvalidArgument("ProcessGroup needs a communicator, got null");
  }
}

ProcessGroup::~ProcessGroup() {
  shutdown();
  alive_->store(false);  // a worker that ran this from a Work callback must not touch *this
}

void ProcessGroup::checkRoot(const char* opName, int root) const {
  if (root < 0 || root >= size()) {
    throw InvalidArgument(std::string(opName) + ": root " + std::to_string(root) + " is not a rank of this group of " +
                          std::to_string(size()) + " ranks");
  }
}

template <typename Operation>
void ProcessGroup::runSync(const char* opName, Operation& operation) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (shutdown_) {
    throw Error(std::string(opName) + " on a ProcessGroup that has been " + (aborted_ ? "aborted" : "shut down"));
  }
  if (!busy_ && queue_.empty()) {
    busy_ = true;
    lock.unlock();
    inlineCalls_.fetch_add(1, std::memory_order_relaxed);
    struct Release {
      ProcessGroup& group;
      ~Release() {
        std::lock_guard<std::mutex> guard(group.mutex_);
        group.busy_ = false;
        group.stateCv_.notify_all();
      }
    } release{*this};
    operation();
    return;
  }
  auto work = newWork(opName, nullptr);
  queue_.push_back(Task{[&operation] { operation(); }, work});
  startWorkerLocked();
  lock.unlock();
  stateCv_.notify_all();  // after unlocking: the worker need not wake into a held mutex
  work->wait();
}

void ProcessGroup::runErased(const char* opName, void (*invoke)(void*), void* operation) {
  auto call = [invoke, operation] { invoke(operation); };
  runSync(opName, call);
}

std::shared_ptr<Work> ProcessGroup::runAsync(const char* opName, std::function<void()> operation,
                                             std::shared_ptr<void> keepAlive) {
  return submit(opName, std::move(operation), std::move(keepAlive));
}

void ProcessGroup::startWorkerLocked() {
  if (!worker_.joinable()) {
    worker_ = std::thread([this, alive = alive_] { workerLoop(*alive); });
  }
}

std::shared_ptr<Work> ProcessGroup::newWork(const char* opName, std::shared_ptr<void> keepAlive) {
  auto work = std::make_shared<Work>(opName, std::move(keepAlive));
  std::weak_ptr<ProcessGroup> group = weak_from_this();
  if (!group.expired()) {
    work->setProgressDriver([group = std::move(group), target = work.get()](Work::Deadline deadline) {
      if (deadline != Work::Deadline::max()) return;  // a bounded wait() must not start an operation
      if (const auto alive = group.lock()) alive->runQueuedUpTo(target);
    });
  }
  return work;
}

std::shared_ptr<Work> ProcessGroup::submit(const char* opName, std::function<void()> operation,
                                           std::shared_ptr<void> keepAlive) {
  auto work = newWork(opName, std::move(keepAlive));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shutdown_) {
      throw Error(std::string(opName) + " on a ProcessGroup that has been " + (aborted_ ? "aborted" : "shut down"));
    }
    queue_.push_back(Task{std::move(operation), work});
    startWorkerLocked();
  }
  stateCv_.notify_all();  // after unlocking: the worker need not wake into a held mutex
  return work;
}

void ProcessGroup::workerLoop(const std::atomic<bool>& alive) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    stateCv_.wait(lock, [this] { return (!queue_.empty() && !busy_) || (shutdown_ && queue_.empty()); });
    if (queue_.empty()) {
      return;  // shut down and drained
    }
    if (!runFront(lock, &alive)) return;  // a Work callback destroyed the group
  }
}

bool ProcessGroup::runFront(std::unique_lock<std::mutex>& lock, const std::atomic<bool>* alive) {
  Task task = std::move(queue_.front());
  queue_.pop_front();
  busy_ = true;
  lock.unlock();
  std::exception_ptr error;
  try {
    task.run();
  } catch (...) {
    error = std::current_exception();
  }
  task.run = nullptr;
  lock.lock();
  busy_ = false;  // before finish(): a caller woken by it finds the group idle
  stateCv_.notify_all();
  lock.unlock();
  task.work->finish(error);
  task.work.reset();
  if (alive != nullptr && !alive->load()) return false;
  lock.lock();
  return true;
}

void ProcessGroup::runQueuedUpTo(const Work* target) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (busy_) return;  // the worker (or an inline call) runs one: it also runs target's
    const auto queued = std::find_if(queue_.begin(), queue_.end(),
                                     [target](const Task& task) { return task.work.get() == target; });
    if (queued == queue_.end()) return;  // taken by another thread, or dropped by abort()
    const bool last = queued == queue_.begin();
    runFront(lock, nullptr);  // the driver holds a reference: the group outlives the task
    if (last) return;
  }
}

void ProcessGroup::shutdown() {
  std::unique_lock<std::mutex> lock(mutex_);
  shutdown_ = true;
  stateCv_.notify_all();
  std::thread worker = std::move(worker_);
  if (worker.joinable() && worker.get_id() == std::this_thread::get_id()) {
    // From a Work callback on the worker: it cannot join itself. It runs what is still
    // queued here and ends once the callback returns (see ~ProcessGroup).
    worker.detach();
    for (;;) {
      stateCv_.wait(lock, [this] { return !busy_; });  // an inline call on another thread runs first
      if (queue_.empty()) break;
      runFront(lock, nullptr);
    }
  }
  if (worker.joinable()) {
    lock.unlock();
    worker.join();
    lock.lock();
  }
  stateCv_.wait(lock, [this] { return !busy_ && queue_.empty(); });
}

void ProcessGroup::abort() {
  std::deque<Task> dropped;
  std::thread worker;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = true;
    aborted_ = true;
    dropped.swap(queue_);
    worker = std::move(worker_);
  }
  stateCv_.notify_all();
  communicator_->abort();
  for (Task& task : dropped) {
    task.work->finish(std::make_exception_ptr(Error(std::string(task.work->opName()) + " on rank " +
                                                    std::to_string(rank()) +
                                                    " was aborted before it started: its process group was aborted")));
  }
  if (worker.joinable()) {
    if (worker.get_id() == std::this_thread::get_id()) {
      worker.detach();  // from a Work callback on the worker: it ends once the callback returns
    } else {
      worker.join();
    }
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stateCv_.wait(lock, [this] { return !busy_; });
  }
  communicator_->impl().releaseConnections();
}

bool ProcessGroup::isShutdown() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shutdown_;
}

void ProcessGroup::allreduce(void* buffer, size_t count, DataType type, const AllreduceOptions& options) {
  checkOp("allreduce", type, options.op);
  auto operation = [&] { ringtree::allreduce(*communicator_, buffer, count, type, options); };
  runSync("allreduce", operation);
}

std::shared_ptr<Work> ProcessGroup::allreduceAsync(void* buffer, size_t count, DataType type,
                                                   const AllreduceOptions& options, std::shared_ptr<void> keepAlive) {
  checkOp("allreduce", type, options.op);
  return submit(
      "allreduce",
      [this, buffer, count, type, options] { ringtree::allreduce(*communicator_, buffer, count, type, options); },
      std::move(keepAlive));
}

void ProcessGroup::broadcast(void* buffer, size_t count, DataType type, const BroadcastOptions& options) {
  checkRoot("broadcast", options.root);
  auto operation = [&] { ringtree::broadcast(*communicator_, buffer, count, type, options); };
  runSync("broadcast", operation);
}

std::shared_ptr<Work> ProcessGroup::broadcastAsync(void* buffer, size_t count, DataType type,
                                                   const BroadcastOptions& options, std::shared_ptr<void> keepAlive) {
  checkRoot("broadcast", options.root);
  return submit(
      "broadcast",
      [this, buffer, count, type, options] { ringtree::broadcast(*communicator_, buffer, count, type, options); },
      std::move(keepAlive));
}

void ProcessGroup::reduce(void* buffer, size_t count, DataType type, const ReduceOptions& options) {
  checkRoot("reduce", options.root);
  checkOp("reduce", type, options.op);
  auto operation = [&] { ringtree::reduce(*communicator_, buffer, count, type, options); };
  runSync("reduce", operation);
}

std::shared_ptr<Work> ProcessGroup::reduceAsync(void* buffer, size_t count, DataType type,
                                                const ReduceOptions& options, std::shared_ptr<void> keepAlive) {
  checkRoot("reduce", options.root);
  checkOp("reduce", type, options.op);
  return submit(
      "reduce",
      [this, buffer, count, type, options] { ringtree::reduce(*communicator_, buffer, count, type, options); },
      std::move(keepAlive));
}

void ProcessGroup::barrier(const BarrierOptions& options) {
  auto operation = [&] { ringtree::barrier(*communicator_, options); };
  runSync("barrier", operation);
}

std::shared_ptr<Work> ProcessGroup::barrierAsync(const BarrierOptions& options) {
  return submit(
      "barrier", [this, options] { ringtree::barrier(*communicator_, options); }, nullptr);
}

}  // namespace ringtree
