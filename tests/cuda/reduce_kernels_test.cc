// ringtree's CUDA library through its C table (ringtree_gpu_api, src/cpp/backends/cuda/
// gpu_api.h), linked directly:
//  - without a device: the table's version and members, and every argument the kernels'
//    launchers refuse before touching the GPU (unsupported (type, op) pairs exactly where
//    !isSupported, values outside the enums, bool scale/divide, divisors <= 0, non-finite
//    integer factors); count 0 launches nothing;
//  - on a device (skipped when none is visible): every DataType x supported ReduceOp, scale
//    and divide, at counts {0, 1, 7, 16, 1000, 2^20 + 3}, with buffers at the same and at
//    different distances from a 16-byte boundary, against the CPU engine
//    (algorithms::reduceFunction / scale / divide) bit for bit (NaN payloads aside), with
//    guard elements around each buffer that must not change; pointer attributes, streams
//    and events.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <ringtree/error.h>
#include <ringtree/types.h>

#include "algorithms/reduce_ops.h"
#include "harness/reduction_table.h"
#include "backends/cuda/gpu_api.h"

extern "C" const RingtreeGpuApi* ringtree_gpu_api(uint32_t version);

namespace ringtree {
namespace {

constexpr int kInvalidValue = 1;  // cudaErrorInvalidValue

using test::kAllOps;
using test::kAllTypes;
using test::isNanLane;
constexpr size_t kCounts[] = {0, 1, 7, 16, 1000, (size_t{1} << 20) + 3};
// Element offsets of (inout, in) from a 16-byte-aligned allocation: both aligned, both
// equally misaligned (vector body with a scalar head), and differently misaligned.
constexpr size_t kOffsets[][2] = {{0, 0}, {1, 1}, {3, 3}, {0, 1}, {5, 2}};
constexpr size_t kGuard = 16;  // guard elements before and after each buffer
constexpr uint8_t kGuardByte = 0xA5;

std::string describe(DataType type, ReduceOp op) {
  return std::string(dataTypeName(type)) + " " + reduceOpName(op);
}

const RingtreeGpuApi* api() { return ringtree_gpu_api(RINGTREE_GPU_API_VERSION); }

bool isComplexType(DataType type) { return type == DataType::kComplex64 || type == DataType::kComplex128; }

size_t laneBytes(DataType type) { return isComplexType(type) ? elementSize(type) / 2 : elementSize(type); }

// Equal lane by lane, or NaN on both sides.
::testing::AssertionResult sameLanes(DataType type, const unsigned char* got, const unsigned char* want,
                                     size_t bytes) {
  const size_t size = laneBytes(type);
  size_t wrong = 0;
  size_t first = 0;
  for (size_t i = 0; i < bytes / size; ++i) {
    const unsigned char* g = got + i * size;
    const unsigned char* w = want + i * size;
    if (std::memcmp(g, w, size) != 0 && !(isNanLane(type, g) && isNanLane(type, w))) {
      if (wrong++ == 0) first = i;
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << bytes / size << " lanes differ, the first at lane "
                                       << first;
}

// Stores the small integer v as an element (lane) of `type`: exact in every type.
void storeInteger(DataType type, int v, unsigned char* p) {
  switch (type) {
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      uint16_t one = type == DataType::kFloat16 ? 0x3C00 : 0x3F80;
      algorithms::scale(&one, 1, type, v);  // 1 * v
      std::memcpy(p, &one, 2);
      break;
    }
    case DataType::kFloat32:
    case DataType::kComplex64: {
      const auto f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DataType::kFloat64:
    case DataType::kComplex128: {
      const auto d = static_cast<double>(v);
      std::memcpy(p, &d, 8);
      break;
    }
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kBool: {
      const auto n = static_cast<int8_t>(v);
      std::memcpy(p, &n, 1);
      break;
    }
    case DataType::kInt16: {
      const auto n = static_cast<int16_t>(v);
      std::memcpy(p, &n, 2);
      break;
    }
    case DataType::kInt32: {
      const auto n = static_cast<int32_t>(v);
      std::memcpy(p, &n, 4);
      break;
    }
    case DataType::kInt64: {
      const auto n = static_cast<int64_t>(v);
      std::memcpy(p, &n, 8);
      break;
    }
  }
}

// Random contents for `count` elements of `type`: a mix of random bit patterns (for
// floating types NaN, infinities and subnormals among them) and small integer values.
std::vector<unsigned char> randomElements(DataType type, size_t count, std::mt19937_64& rng) {
  std::vector<unsigned char> out(count * elementSize(type));
  const size_t lane = laneBytes(type);
  for (size_t i = 0; i < out.size() / lane; ++i) {
    const uint64_t bits = rng();
    if (bits % 3 == 0) {
      std::memcpy(out.data() + i * lane, &bits, lane);
    } else {
      storeInteger(type, static_cast<int>(rng() % 41) - 20, out.data() + i * lane);
    }
  }
  return out;
}

// --- Without a device --------------------------------------------------------------------

TEST(GpuKernelApiTest, TableSpeaksItsVersionOnly) {
  const RingtreeGpuApi* table = api();
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->version, RINGTREE_GPU_API_VERSION);
  EXPECT_EQ(table->size, sizeof(RingtreeGpuApi));
  EXPECT_GE(table->runtimeVersion, 11000);
  EXPECT_EQ(ringtree_gpu_api(RINGTREE_GPU_API_VERSION + 1), nullptr);
  EXPECT_EQ(ringtree_gpu_api(0), nullptr);
  EXPECT_EQ(api(), table) << "one table for the life of the process";
  for (auto member : {reinterpret_cast<const void*>(table->errorString), reinterpret_cast<const void*>(table->driverVersion),
                      reinterpret_cast<const void*>(table->deviceCount), reinterpret_cast<const void*>(table->setDevice),
                      reinterpret_cast<const void*>(table->getDevice), reinterpret_cast<const void*>(table->pointerDevice),
                      reinterpret_cast<const void*>(table->streamCreate), reinterpret_cast<const void*>(table->streamDestroy),
                      reinterpret_cast<const void*>(table->streamWaitEvent),
                      reinterpret_cast<const void*>(table->streamSynchronize),
                      reinterpret_cast<const void*>(table->eventCreate), reinterpret_cast<const void*>(table->eventDestroy),
                      reinterpret_cast<const void*>(table->eventRecord), reinterpret_cast<const void*>(table->eventQuery),
                      reinterpret_cast<const void*>(table->eventSynchronize),
                      reinterpret_cast<const void*>(table->deviceMalloc), reinterpret_cast<const void*>(table->deviceFree),
                      reinterpret_cast<const void*>(table->memcpyAsync), reinterpret_cast<const void*>(table->reduce),
                      reinterpret_cast<const void*>(table->scale), reinterpret_cast<const void*>(table->divide)}) {
    EXPECT_NE(member, nullptr);
  }
  EXPECT_NE(table->errorString(kInvalidValue), nullptr);
  EXPECT_NE(table->errorString(RINGTREE_GPU_NOT_READY), nullptr);
}

// Argument checks come before any CUDA call, so they run here without a device; with
// count 0 a valid call launches nothing and succeeds.
TEST(GpuKernelApiTest, UnsupportedPairsAreExactlyTheCpuEnginesOnes) {
  const RingtreeGpuApi* table = api();
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      const int result = table->reduce(nullptr, nullptr, 0, static_cast<int>(type), static_cast<int>(op), nullptr);
      EXPECT_EQ(result, isSupported(type, op) ? 0 : kInvalidValue) << describe(type, op);
    }
  }
  for (int type : {-1, kNumDataTypes, 255, 1 << 20}) {
    EXPECT_EQ(table->reduce(nullptr, nullptr, 0, type, 0, nullptr), kInvalidValue) << type;
    EXPECT_EQ(table->scale(nullptr, 0, type, 2.0, nullptr), kInvalidValue) << type;
    EXPECT_EQ(table->divide(nullptr, 0, type, 2, nullptr), kInvalidValue) << type;
  }
  for (int op : {-1, kNumReduceOps, 255}) {
    EXPECT_EQ(table->reduce(nullptr, nullptr, 0, static_cast<int>(DataType::kFloat32), op, nullptr), kInvalidValue);
  }
}

TEST(GpuKernelApiTest, ScaleAndDivideRefuseWhatTheCpuEngineRejects) {
  const RingtreeGpuApi* table = api();
  for (DataType type : kAllTypes) {
    for (double factor : {2.0, 0.0, -1.5, HUGE_VAL, -HUGE_VAL, std::nan("")}) {
      bool cpuAccepts = true;
      try {
        algorithms::scale(nullptr, 0, type, factor);
      } catch (const InvalidArgument&) {
        cpuAccepts = false;
      }
      EXPECT_EQ(table->scale(nullptr, 0, static_cast<int>(type), factor, nullptr), cpuAccepts ? 0 : kInvalidValue)
          << dataTypeName(type) << " * " << factor;
    }
    for (int64_t divisor : {int64_t{1}, int64_t{3}, int64_t{0}, int64_t{-2}}) {
      bool cpuAccepts = true;
      try {
        algorithms::divide(nullptr, 0, type, divisor);
      } catch (const InvalidArgument&) {
        cpuAccepts = false;
      }
      EXPECT_EQ(table->divide(nullptr, 0, static_cast<int>(type), divisor, nullptr), cpuAccepts ? 0 : kInvalidValue)
          << dataTypeName(type) << " / " << divisor;
    }
  }
}

// --- On a device -------------------------------------------------------------------------

class GpuKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    table_ = api();
    ASSERT_NE(table_, nullptr);
    int devices = 0;
    const int result = table_->deviceCount(&devices);
    if (result != 0 || devices <= 0) {
      GTEST_SKIP() << "no CUDA device: " << (result != 0 ? table_->errorString(result) : "none visible");
    }
    ASSERT_EQ(table_->setDevice(0), 0);
    ASSERT_EQ(table_->streamCreate(&stream_), 0);
    // Room for the largest case: complex128 at the largest count, plus offsets and guards.
    capacity_ = (kCounts[std::size(kCounts) - 1] + 2 * kGuard + 8) * 16;
    ASSERT_EQ(table_->deviceMalloc(&a_, capacity_), 0);
    ASSERT_EQ(table_->deviceMalloc(&b_, capacity_), 0);
  }

  void TearDown() override {
    if (table_ == nullptr) return;
    if (a_ != nullptr) {
      EXPECT_EQ(table_->deviceFree(a_), 0);
    }
    if (b_ != nullptr) {
      EXPECT_EQ(table_->deviceFree(b_), 0);
    }
    if (stream_ != nullptr) {
      EXPECT_EQ(table_->streamDestroy(stream_), 0);
    }
  }

  void upload(void* device, const std::vector<unsigned char>& host) {
    ASSERT_EQ(table_->memcpyAsync(device, host.data(), host.size(), stream_), 0);
  }

  std::vector<unsigned char> download(const void* device, size_t bytes) {
    std::vector<unsigned char> host(bytes);
    EXPECT_EQ(table_->memcpyAsync(host.data(), device, bytes, stream_), 0);
    EXPECT_EQ(table_->streamSynchronize(stream_), 0);
    return host;
  }

  // A buffer image: guard bytes, then `count` elements of `data` at element `offset`.
  static std::vector<unsigned char> image(DataType type, const unsigned char* data, size_t count, size_t offset) {
    const size_t size = elementSize(type);
    std::vector<unsigned char> out((offset + count + 2 * kGuard) * size, kGuardByte);
    std::memcpy(out.data() + (kGuard + offset) * size, data, count * size);
    return out;
  }

  const RingtreeGpuApi* table_ = nullptr;
  void* stream_ = nullptr;
  void* a_ = nullptr;
  void* b_ = nullptr;
  size_t capacity_ = 0;
};

TEST_F(GpuKernelTest, EveryTypeAndOpMatchesTheCpuEngine) {
  std::mt19937_64 rng(2024);
  const size_t most = kCounts[std::size(kCounts) - 1];
  for (DataType type : kAllTypes) {
    const size_t size = elementSize(type);
    const std::vector<unsigned char> x = randomElements(type, most, rng);
    const std::vector<unsigned char> y = randomElements(type, most, rng);
    for (ReduceOp op : kAllOps) {
      if (!isSupported(type, op)) continue;
      const ReduceFn reference = algorithms::reduceFunction(type, op);
      for (size_t count : kCounts) {
        for (const auto& offsets : kOffsets) {
          SCOPED_TRACE(describe(type, op) + " count " + std::to_string(count) + " offsets " +
                       std::to_string(offsets[0]) + "," + std::to_string(offsets[1]));
          const std::vector<unsigned char> inout = image(type, x.data(), count, offsets[0]);
          const std::vector<unsigned char> in = image(type, y.data(), count, offsets[1]);
          upload(a_, inout);
          upload(b_, in);
          auto* deviceInout = static_cast<unsigned char*>(a_) + (kGuard + offsets[0]) * size;
          const auto* deviceIn = static_cast<const unsigned char*>(b_) + (kGuard + offsets[1]) * size;
          ASSERT_EQ(table_->reduce(deviceInout, deviceIn, count, static_cast<int>(type), static_cast<int>(op), stream_),
                    0);
          const std::vector<unsigned char> got = download(a_, inout.size());
          const std::vector<unsigned char> gotIn = download(b_, in.size());

          std::vector<unsigned char> want = inout;
          reference(want.data() + (kGuard + offsets[0]) * size, in.data() + (kGuard + offsets[1]) * size, count);
          ASSERT_TRUE(sameLanes(type, got.data(), want.data(), got.size()));
          ASSERT_EQ(gotIn, in) << "the input buffer changed";
        }
      }
    }
  }
}

TEST_F(GpuKernelTest, ScaleAndDivideMatchTheCpuEngine) {
  std::mt19937_64 rng(77);
  const size_t most = kCounts[std::size(kCounts) - 1];
  for (DataType type : kAllTypes) {
    if (type == DataType::kBool) continue;
    const size_t size = elementSize(type);
    const std::vector<unsigned char> x = randomElements(type, most, rng);
    for (size_t count : kCounts) {
      for (size_t offset : {size_t{0}, size_t{1}, size_t{3}}) {
        for (double factor : {0.5, 3.0, -1.25, 1e-3, 1.0 / 3.0}) {
          SCOPED_TRACE(std::string(dataTypeName(type)) + " * " + std::to_string(factor) + " count " +
                       std::to_string(count) + " offset " + std::to_string(offset));
          const std::vector<unsigned char> data = image(type, x.data(), count, offset);
          upload(a_, data);
          ASSERT_EQ(table_->scale(static_cast<unsigned char*>(a_) + (kGuard + offset) * size, count,
                                  static_cast<int>(type), factor, stream_),
                    0);
          const std::vector<unsigned char> got = download(a_, data.size());
          std::vector<unsigned char> want = data;
          algorithms::scale(want.data() + (kGuard + offset) * size, count, type, factor);
          ASSERT_TRUE(sameLanes(type, got.data(), want.data(), got.size()));
        }
        for (int64_t divisor : {int64_t{1}, int64_t{3}, int64_t{8}, (int64_t{1} << 24) + 1, int64_t{1} << 40}) {
          SCOPED_TRACE(std::string(dataTypeName(type)) + " / " + std::to_string(divisor) + " count " +
                       std::to_string(count) + " offset " + std::to_string(offset));
          const std::vector<unsigned char> data = image(type, x.data(), count, offset);
          upload(a_, data);
          ASSERT_EQ(table_->divide(static_cast<unsigned char*>(a_) + (kGuard + offset) * size, count,
                                   static_cast<int>(type), divisor, stream_),
                    0);
          const std::vector<unsigned char> got = download(a_, data.size());
          std::vector<unsigned char> want = data;
          algorithms::divide(want.data() + (kGuard + offset) * size, count, type, divisor);
          ASSERT_TRUE(sameLanes(type, got.data(), want.data(), got.size()));
        }
      }
    }
  }
}

// Integer-valued sums over several "ranks", then AVG's divide: exact, as the CPU engine.
TEST_F(GpuKernelTest, AverageOfIntegerValuedDataIsExact) {
  const size_t count = 4099;
  for (DataType type : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                        DataType::kInt32, DataType::kInt64}) {
    SCOPED_TRACE(dataTypeName(type));
    const size_t size = elementSize(type);
    const int ranks = 6;
    std::vector<std::vector<unsigned char>> inputs;
    for (int r = 0; r < ranks; ++r) {
      std::vector<unsigned char> bytes(count * size);
      for (size_t i = 0; i < count; ++i) {
        storeInteger(type, (static_cast<int>(i % 11) - 5) * (r + 1), bytes.data() + i * size);
      }
      inputs.push_back(std::move(bytes));
    }
    upload(a_, inputs[0]);
    std::vector<unsigned char> want = inputs[0];
    for (int r = 1; r < ranks; ++r) {
      upload(b_, inputs[static_cast<size_t>(r)]);
      ASSERT_EQ(table_->reduce(a_, b_, count, static_cast<int>(type), static_cast<int>(ReduceOp::kAvg), stream_), 0);
      ASSERT_EQ(table_->streamSynchronize(stream_), 0);  // b_ is reused
      algorithms::reduceFunction(type, ReduceOp::kAvg)(want.data(), inputs[static_cast<size_t>(r)].data(), count);
    }
    ASSERT_EQ(table_->divide(a_, count, static_cast<int>(type), ranks, stream_), 0);
    algorithms::divide(want.data(), count, type, ranks);
    const std::vector<unsigned char> got = download(a_, count * size);
    EXPECT_EQ(got, want);
  }
}

TEST_F(GpuKernelTest, PointersNotAlignedToTheirElementAreRefused) {
  auto* odd = static_cast<unsigned char*>(a_) + 1;
  EXPECT_EQ(table_->reduce(odd, b_, 4, static_cast<int>(DataType::kFloat32), static_cast<int>(ReduceOp::kSum), stream_),
            kInvalidValue);
  EXPECT_EQ(table_->reduce(a_, static_cast<unsigned char*>(b_) + 2, 4, static_cast<int>(DataType::kFloat64),
                           static_cast<int>(ReduceOp::kMax), stream_),
            kInvalidValue);
  EXPECT_EQ(table_->scale(odd, 4, static_cast<int>(DataType::kFloat16), 2.0, stream_), kInvalidValue);
  EXPECT_EQ(table_->divide(odd, 4, static_cast<int>(DataType::kInt32), 2, stream_), kInvalidValue);
  // Byte-sized elements have no alignment to keep.
  EXPECT_EQ(table_->reduce(odd, b_, 4, static_cast<int>(DataType::kInt8), static_cast<int>(ReduceOp::kSum), stream_), 0);
  EXPECT_EQ(table_->streamSynchronize(stream_), 0);
}

TEST_F(GpuKernelTest, PointersStreamsAndEvents) {
  int device = -2;
  ASSERT_EQ(table_->getDevice(&device), 0);
  EXPECT_EQ(device, 0);
  int owner = -2;
  ASSERT_EQ(table_->pointerDevice(a_, &owner), 0);
  EXPECT_EQ(owner, 0);
  std::vector<int> host(16);
  ASSERT_EQ(table_->pointerDevice(host.data(), &owner), 0);
  EXPECT_EQ(owner, -1) << "pageable host memory";
  int version = 0;
  ASSERT_EQ(table_->driverVersion(&version), 0);
  EXPECT_GT(version, 0);

  void* event = nullptr;
  ASSERT_EQ(table_->eventCreate(&event), 0);
  std::vector<unsigned char> ones(1 << 20, 1);
  upload(a_, ones);
  upload(b_, ones);
  ASSERT_EQ(table_->reduce(a_, b_, ones.size(), static_cast<int>(DataType::kUInt8), static_cast<int>(ReduceOp::kSum),
                           stream_),
            0);
  ASSERT_EQ(table_->eventRecord(event, stream_), 0);
  // Another stream ordered after the event sees the result.
  void* other = nullptr;
  ASSERT_EQ(table_->streamCreate(&other), 0);
  ASSERT_EQ(table_->streamWaitEvent(other, event), 0);
  std::vector<unsigned char> back(ones.size());
  ASSERT_EQ(table_->memcpyAsync(back.data(), a_, back.size(), other), 0);
  ASSERT_EQ(table_->streamSynchronize(other), 0);
  ASSERT_EQ(table_->eventSynchronize(event), 0);
  EXPECT_EQ(table_->eventQuery(event), 0);
  EXPECT_EQ(back, std::vector<unsigned char>(ones.size(), 2));
  EXPECT_EQ(table_->streamDestroy(other), 0);
  EXPECT_EQ(table_->eventDestroy(event), 0);
  // The legacy default stream (null) works too.
  ASSERT_EQ(table_->reduce(a_, b_, 16, static_cast<int>(DataType::kUInt8), static_cast<int>(ReduceOp::kSum), nullptr),
            0);
  ASSERT_EQ(table_->streamSynchronize(nullptr), 0);
}

}  // namespace
}  // namespace ringtree
