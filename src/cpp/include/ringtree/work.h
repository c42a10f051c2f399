#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include <ringtree/export.h>

namespace ringtree {

// The handle of one operation that runs asynchronously (see ProcessGroup's *Async calls):
// its completion state, its error, and whatever the caller asked to keep alive while it
// runs. Like torch's c10d::Work.
//
// Threading: every member function may be called from any thread at any time. The
// object is created pending by whoever queues the operation, completed exactly once by
// whoever runs it (finish()), and then never changes again.
class RINGTREE_API Work {
 public:
  using Callback = std::function<void(Work&)>;
  // Lets a waiter make the operation progress on its own thread instead of sleeping
  // until another thread finishes it. Called by wait(), without the Work's lock, while
  // the Work is not completed, with the time wait() must return by (time_point::max():
  // no limit). It returns once the operation is done (whoever completed it may still be
  // about to call finish()), once the deadline passed, or at once when this thread
  // cannot drive it; wait() then sleeps until finish() as it would without one. It may
  // finish this and other Works on the calling thread. addCallback() on a pending Work
  // calls it with Deadline::min() (the operation may have finished meanwhile): nobody
  // may wait for the operation, so it must return at once, having told whoever runs the
  // operation not to leave it to a waiter. Must not throw.
  using Deadline = std::chrono::steady_clock::time_point;
  using ProgressDriver = std::function<void(Deadline deadline)>;

  // A pending Work for the operation named `opName` (a string literal: "allreduce", ...,
  // used in messages). `keepAlive` is held until the operation finishes and released
  // (on the finishing thread) before the Work is marked completed, so when wait() returns
  // it has been released.
  explicit Work(const char* opName, std::shared_ptr<void> keepAlive = nullptr);
  // A Work for an operation that finished before its Work was made (a point-to-point
  // operation that completed while it was posted): completed, with `error` (null:
  // success) and, for a receive, the rank its message came from (-1 otherwise).
  static std::shared_ptr<Work> completed(const char* opName, std::exception_ptr error, int sourceRank = -1);
  ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the operation finished, or until `timeout` passed (zero: no limit),
  // driving it through the progress driver first when one was set. An operation of a
  // device stream with a stream wait (setStreamWait) that is still running is not waited
  // for on the host: the waiting thread's current stream is made to wait for it, and
  // wait() returns true at once (torch's NCCL semantics); its error, if it fails, reaches
  // the Work (exception(), callbacks) and later calls.
  // Returns true once the operation finished successfully; rethrows the operation's
  // exception (the same object on every call) when it failed. Throws TimeoutError when
  // the timeout passes first: the operation itself keeps running, and a later wait()
  // can still see it finish. 0, or a timeout past the steady clock's range: no limit.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // Whether the operation finished (successfully or not). Never blocks.
  bool isCompleted() const;
  // Whether the operation finished without an error (false while it runs).
  bool isSuccess() const;
  // The operation's error; null while it runs and when it succeeded.
  std::exception_ptr exception() const;

  // The name given at construction ("allreduce", ...).
  const char* opName() const { return opName_; }

  // For a point-to-point receive: the rank the message came from, set by whoever
  // completes it before finish() (meaningful once isSuccess()); -1 for other operations.
  int sourceRank() const;
  void setSourceRank(int rank);

  // Runs `callback(*this)` once the operation finished: on the thread that finishes it,
  // after waiters were woken, or at once on the calling thread if it already finished.
  // Callbacks registered before completion run in registration order. A callback must
  // not block on other operations of the same ProcessGroup (it may run on that group's
  // worker) and should not throw: an exception escaping it is logged and dropped.
  void addCallback(Callback callback);

  // Sets the progress driver wait() uses (see ProgressDriver). For whoever creates the
  // Work, before any other thread can see it; at most once.
  void setProgressDriver(ProgressDriver driver);

  // For an operation that runs on a device stream: makes the calling thread's current
  // stream of the device wait for the operation, and returns true; false when it could
  // not (wait() then blocks the host as usual). Must not throw.
  using StreamWait = std::function<bool()>;
  // Sets it (see wait()). For whoever creates the Work, before any other thread can see
  // it; at most once.
  void setStreamWait(StreamWait streamWait);

  // Completes the Work: releases the keep-alive, records `error` (null: success), wakes
  // every waiter, then runs the callbacks. For the code that runs the operation; must be
  // called exactly once (a second call throws InvalidArgument).
  void finish(std::exception_ptr error = nullptr);
  // finish() for an engine that runs operations one after another: `onCompleted` runs on
  // this thread once the Work reads completed, before its waiters wake and its callbacks
  // run. Releasing there what the next operation needs means no operation starts, and so
  // no later Work completes, before this one reads completed; and a woken waiter or a
  // callback that calls into the engine finds it free. `onCompleted` must not throw.
  void finish(std::exception_ptr error, const std::function<void()>& onCompleted);

 private:
  const char* opName_;
  mutable std::mutex mutex_;
  std::condition_variable completedCv_;
  // Set (release) under mutex_ once exception_ and sourceRank_ hold their final values;
  // read without the lock by the calls that only ask whether it finished.
  std::atomic<bool> completed_{false};
  bool finishing_ = false;
  std::exception_ptr exception_;
  int sourceRank_ = -1;
  std::shared_ptr<void> keepAlive_;
  std::vector<Callback> callbacks_;
  ProgressDriver progressDriver_;  // immutable once the Work is shared
  StreamWait streamWait_;          // immutable once the Work is shared
};

}  // namespace ringtree
