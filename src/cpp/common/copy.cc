#include "common/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ringtree {

namespace {

#if defined(__SSE2__)
// 64 bytes a step, with unaligned loads; `Store` writes one 16-byte vector.
template <typename Store>
void copyLines(unsigned char* to, const unsigned char* from, size_t bytes, Store store) {
  for (; bytes >= 64; bytes -= 64, to += 64, from += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 48));
    store(to, a);
    store(to + 16, b);
    store(to + 32, c);
    store(to + 48, d);
  }
  std::memcpy(to, from, bytes);
}
#endif

}  // namespace

void copyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
#if defined(__SSE2__)
  if (bytes >= kShortDistanceCopyMinBytes && bytes < kShortDistanceCopyMaxBytes && isShortCopyDistance(dst, src)) {
    copyLines(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes,
              [](unsigned char* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); });
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

void streamingCopy(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  if (bytes >= kStreamingCopyBytes) {
    auto* to = static_cast<unsigned char*>(dst);
    const auto* from = static_cast<const unsigned char*>(src);
    // Whole 64-byte lines of dst, so that the write-combining buffers flush full lines.
    const size_t head = (64 - reinterpret_cast<uintptr_t>(to) % 64) % 64;
    std::memcpy(to, from, head);
    copyLines(to + head, from + head, bytes - head,
              [](unsigned char* p, __m128i v) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), v); });
    _mm_sfence();
    return;
  }
#endif
  copyBytes(dst, src, bytes);
}

}  // namespace ringtree
