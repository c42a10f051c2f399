#pragma once

#include <ringtree/export.h>

namespace ringtree {

// For a front that embeds ringtree in a runtime with a lock of its own (the Python
// bindings and the GIL): lets the thread that makes a call be told once, when the call
// goes from a short spin (a few microseconds, waiting for a peer that is about to answer)
// to a real wait, so that it can let go of what must not be held while waiting. A call
// that completes at once, or after a short spin, never runs the hook: a front can keep
// its lock through those, and release it only for a call that waits.
//
// Install for the duration of a blocking call, on its thread:
//
//   ringtree::BeforeWaiting hook([](void* self) { /* release the lock */ return true; }, this);
//   ringtree::allreduce(comm, ...);  // runs the hook at most once, before its first wait
//   // (take the lock back if the hook released it)
//
// Where the library waits on a caller's thread (pair and arena waits, blocking
// point-to-point calls, a collective queued behind others, Work::wait, blocking socket
// I/O) it calls notify() before it first yields its core, sleeps or polls: after at most
// a few dozen spin passes, never later. Waits on the library's own threads never run a
// hook. Work callbacks the library runs on the caller's thread are the caller's code: a
// hook may run inside one.
//
// Thread-local. Installs nest: one saves the hook it replaces, and its destruction
// restores that one; a null hook masks the one it replaces (for code of the front's own
// that runs inside a call, which must not have the front's lock let go from under it). A hook returns whether it is done: true uninstalls it (it runs once),
// false keeps it for the next wait (one that found nothing to let go of this time, the
// caller's own code having released it for a while). It may run with the library's locks
// held: it must not block, throw, nor call into ringtree.
class RINGTREE_API BeforeWaiting {
 public:
  using Hook = bool (*)(void* context);

  BeforeWaiting(Hook hook, void* context);
  ~BeforeWaiting();
  BeforeWaiting(const BeforeWaiting&) = delete;
  BeforeWaiting& operator=(const BeforeWaiting&) = delete;

  // Runs the calling thread's hook, if one is installed, and uninstalls it if it is done.
  static void notify();

 private:
  Hook previousHook_;
  void* previousContext_;
};

}  // namespace ringtree
