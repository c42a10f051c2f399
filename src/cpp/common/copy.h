#pragma once

#include <cstddef>
#include <cstdint>

namespace ringtree {

// streamingCopy writes copies of at least this size with non-temporal stores.
constexpr size_t kStreamingCopyBytes = size_t{16} << 20;
// Copies of [kShortDistanceCopyMinBytes, kShortDistanceCopyMaxBytes) whose destination
// lies at a short distance past the source take a vector loop (see copyBytes).
constexpr size_t kShortDistanceCopyMinBytes = 1024;
constexpr size_t kShortDistanceCopyMaxBytes = size_t{512} << 10;
constexpr size_t kShortDistanceBytes = 32;

// Whether dst lies 1 to kShortDistanceBytes - 1 bytes past src modulo a 4 KiB page: where
// `rep movsb` is slow on Zen 4 (see copyBytes), whether glibc's memcpy or the kernel's
// copy to user memory (process_vm_readv, recv) runs it.
inline bool isShortCopyDistance(const void* dst, const void* src) {
  const uintptr_t distance = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) % 4096;
  return distance > 0 && distance < kShortDistanceBytes;
}

// memcpy(dst, src, bytes) for payloads: no overlap, any alignment, and null pointers
// allowed when bytes is 0. On x86-64, for kShortDistanceCopyMinBytes to
// kShortDistanceCopyMaxBytes at a short distance (isShortCopyDistance: dst - src modulo
// 4096 is 1 to 31 bytes), it copies with unaligned 16-byte loads and stores instead.
// glibc 2.36 copies 2 KiB to 512 KiB with `rep movsb` here (its vector loop above), which
// on Zen 4 runs at those distances ~15x slower (2.3-3.0 GB/s instead of 21-77 at distance
// 0; 32 bytes and more: 30-50 GB/s, measured on the project machine); the loop keeps
// 25-52 GB/s. Such distances are common: ring positions
// move by header sizes, and buffers of two processes made by the same program often lie
// a few bytes apart (16-byte aligned heap blocks, tensor views).
void copyBytes(void* dst, const void* src, size_t bytes);

// copyBytes, except that from kStreamingCopyBytes on (x86-64) dst is written with
// non-temporal stores, around the caches: for a destination nobody reads soon (dst is not
// in cache afterwards). Measured on the project machine (Zen 4, 32 MiB L3, KVM guest),
// 16-256 MiB copy about 1.5x faster than glibc's memcpy, whose own non-temporal threshold
// there comes out at 240 MiB (CPUID reports a 320 MiB L3). It ends with a store fence, so
// that, as after memcpy on x86, the data is visible to other cores before any later store
// (such as the flag announcing it).
void streamingCopy(void* dst, const void* src, size_t bytes);

}  // namespace ringtree
