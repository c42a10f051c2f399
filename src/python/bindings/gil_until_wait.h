#pragma once

#include <Python.h>

#include <optional>

#include <ringtree/before_waiting.h>

namespace ringtree::python {

// The GIL through a synchronous call on host buffers: kept until the call, after a short
// spin, starts to wait for a peer (BeforeWaiting), released then, and taken back when the
// call returns. A call that completes at once or after a short spin (its data had arrived
// or was about to, a send the ring took) spares the ~80 ns of releasing and retaking it;
// one that waits releases it before it yields its core or sleeps, so other threads
// (another rank's thread in this process, the engine's thread letting go of a buffer)
// wait for it a few microseconds at most. With hostOnly false (a device buffer, whose
// backend may block without going through a wait site) it is released at once.
//
// Declared after the call's buffers, so that they are let go with the GIL held.
class GilUntilWait {
 public:
  explicit GilUntilWait(bool hostOnly) {
    if (hostOnly) {
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
  // The hook: on the call's thread, which holds the GIL unless code inside the call
  // released it for a while (a Work callback that waits): nothing to do then, and the hook
  // stays for the call's next wait.
  static bool releaseGil(void* self) {
    if (PyGILState_Check() == 0) return false;
    static_cast<GilUntilWait*>(self)->saved_ = PyEval_SaveThread();
    return true;
  }

  PyThreadState* saved_ = nullptr;
  std::optional<BeforeWaiting> hook_;
};

}  // namespace ringtree::python
