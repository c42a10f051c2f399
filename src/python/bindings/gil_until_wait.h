#pragma once

#include <Python.h>

#include <cstddef>
#include <optional>

#include <ringtree/before_waiting.h>

namespace ringtree::python {

// Host calls on at most this many bytes keep the GIL until they wait (GilUntilWait, and
// isend/irecv's posts): larger ones copy or reduce long enough that other Python threads
// should not wait for them, and they gain nothing measurable from keeping it.
constexpr size_t kHoldGilBytes = size_t{64} << 10;

// The GIL through a synchronous call: with `hold` (host buffers of at most kHoldGilBytes),
// kept until the call, after a short spin, starts to wait for a peer or for something
// slow (BeforeWaiting), released then, and taken back when the call returns. A call that
// completes at once or after a short spin (its data had arrived or was about to, a send
// the ring took) spares the ~80 ns of releasing and retaking it; one that waits releases
// it before it yields its core or sleeps, so other threads (another rank's thread in this
// process, the engine's thread letting go of a buffer) wait a few microseconds at most.
// Without `hold` (a device buffer, whose backend may block without going through a wait
// site, or a large call) it is released at once.
//
// Declared after the call's buffers, so that they are let go with the GIL held, and in a
// scope of its own, so that the call's result is made with it held.
class GilUntilWait {
 public:
  explicit GilUntilWait(bool hold) {
    if (hold) {
      thread_ = PyThreadState_Get();
      hook_.emplace(&releaseGil, this);
    } else {
      saved_ = PyEval_SaveThread();
    }
  }
  ~GilUntilWait() {
    if (saved_ != nullptr) PyEval_RestoreThread(saved_);
  }
  GilUntilWait(const GilUntilWait&) = delete;
  GilUntilWait& operator=(const GilUntilWait&) = delete;

 private:
  static PyThreadState* currentThreadState() {
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked();
#else
    return _PyThreadState_UncheckedGet();
#endif
  }

  // The hook, on the call's thread. It holds the GIL as the call's caller unless code of
  // the caller's released it for a while (a Work callback that waits in Python): nothing
  // to do then, and the hook stays for the call's next wait. Python code that the call
  // runs on this thread masks the hook (PythonRunsHere).
  static bool releaseGil(void* self) {
    auto* gil = static_cast<GilUntilWait*>(self);
    if (currentThreadState() != gil->thread_) return false;
    gil->saved_ = PyEval_SaveThread();
    return true;
  }

  PyThreadState* thread_ = nullptr;
  PyThreadState* saved_ = nullptr;
  std::optional<BeforeWaiting> hook_;
};

// Python code run on a thread inside a library call (a Work's done callback, a Python
// store's method, a release that may run __del__): a GilUntilWait of the call must not
// release the GIL from under it. Masks the thread's hook while it lives.
class PythonRunsHere {
 public:
  PythonRunsHere() : mask_(nullptr, nullptr) {}

 private:
  BeforeWaiting mask_;
};

}  // namespace ringtree::python
