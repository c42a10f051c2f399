#pragma once

#include <sched.h>

#include <ringtree/before_waiting.h>

namespace ringtree {

// One spin-wait step: tells the core this thread is busy-waiting (x86 PAUSE, Arm YIELD),
// which saves power and hands execution resources to a sibling hyper-thread.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Where a spin-wait on a caller's thread turns into a wait: runs the caller's hook
// (BeforeWaiting: the Python bindings release the GIL there, a short spin keeps it), then
// gives up the core. Every spin-wait of a caller's thread yields through this.
inline void yieldCore() {
  BeforeWaiting::notify();
  sched_yield();
}

// Asks for the cache line at `address` in a writable state ahead of a store to it (x86
// PREFETCHW, which processors without it run as a no-op), so that the store does not wait
// for the line to be taken from another core's cache. A hint: no effect on memory.
inline void prefetchForWrite(const void* address) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(address)));
#else
  __builtin_prefetch(address, 1);
#endif
}

// The cores this process may run on (its affinity mask when it was first asked; 1 when
// that cannot be read).
inline int usableCores() {
  static const int cores = [] {
    cpu_set_t set;
    return ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  }();
  return cores;
}

// How many idle passes of a spin-wait for `ranks` processes of one host only pause the
// core before each further one also yields it: a peer on another core answers within a
// microsecond or two, and a sched_yield costs ~0.5 us on the project machine; when the
// ranks outnumber the cores the peer may need this one, so every pass yields.
inline int pausesBeforeYield(int ranks) { return ranks > usableCores() ? 0 : 32; }

}  // namespace ringtree
