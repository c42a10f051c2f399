// copyBytes and streamingCopy (common/copy.h): every byte copied and nothing around it
// touched, for sizes on
// both sides of each of its thresholds, at every kind of distance between destination and
// source modulo a page (0, the short distances its vector loop takes, long ones) and at
// misaligned starts.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/copy.h"

namespace ringtree {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xA5;

// `bytes` at `pageOffset` within a page, with kGuard guard bytes on each side.
class PlacedBuffer {
 public:
  PlacedBuffer(size_t bytes, size_t pageOffset) : storage_(bytes + 3 * kPage, kGuardByte), bytes_(bytes) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(storage_.data()) + kPage;  // room for the front guard
    data_ = storage_.data() + kPage + (kPage - start % kPage) % kPage + pageOffset;
  }
  uint8_t* data() { return data_; }
  bool guardsIntact() const {
    for (size_t i = 1; i <= kGuard; ++i) {
      if (data_[-static_cast<std::ptrdiff_t>(i)] != kGuardByte || data_[bytes_ + i - 1] != kGuardByte) return false;
    }
    return true;
  }

 private:
  std::vector<uint8_t> storage_;
  size_t bytes_;
  uint8_t* data_;
};

TEST(CopyBytesTest, CopiesEveryByteAndNothingElseAtEveryDistance) {
  const std::vector<size_t> sizes = {0,
                                     1,
                                     63,
                                     64,
                                     kShortDistanceCopyMinBytes - 1,
                                     kShortDistanceCopyMinBytes,
                                     4097,
                                     (size_t{256} << 10) + 5,
                                     kShortDistanceCopyMaxBytes - 1,
                                     kShortDistanceCopyMaxBytes,
                                     kStreamingCopyBytes + 4097};
  const std::vector<size_t> sourceOffsets = {0, 5, 40};
  const std::vector<size_t> distances = {0, 1, 8, 16, kShortDistanceBytes - 1, kShortDistanceBytes, 63, 100, kPage - 8};
  for (size_t bytes : sizes) {
    std::vector<uint8_t> pattern(bytes);
    for (size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<uint8_t>(i * 131 + (i >> 8));
    const bool huge = bytes >= kStreamingCopyBytes;  // fewer cases: each takes a while
    for (size_t sourceOffset : huge ? std::vector<size_t>{5} : sourceOffsets) {
      for (size_t distance : huge ? std::vector<size_t>{0, 8} : distances) {
        PlacedBuffer src(bytes, sourceOffset);
        std::copy(pattern.begin(), pattern.end(), src.data());
        for (const auto copy : {&copyBytes, &streamingCopy}) {
          PlacedBuffer dst(bytes, (sourceOffset + distance) % kPage);
          copy(dst.data(), src.data(), bytes);
          const char* name = copy == &copyBytes ? "copyBytes" : "streamingCopy";
          EXPECT_TRUE(std::equal(pattern.begin(), pattern.end(), dst.data()))
              << name << ": " << bytes << " bytes, source offset " << sourceOffset << ", distance " << distance;
          EXPECT_TRUE(dst.guardsIntact()) << name << ": " << bytes << " bytes, distance " << distance;
        }
        EXPECT_TRUE(std::equal(pattern.begin(), pattern.end(), src.data())) << bytes << " bytes";
      }
    }
  }
}

TEST(CopyBytesTest, NothingToCopyAcceptsNullPointers) {
  copyBytes(nullptr, nullptr, 0);
  streamingCopy(nullptr, nullptr, 0);
}

}  // namespace
}  // namespace ringtree
