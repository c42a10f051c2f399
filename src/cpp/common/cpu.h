#pragma once

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

}  // namespace ringtree
