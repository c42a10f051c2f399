// Reduction kernels: every DataType x ReduceOp x instruction-set variant against a scalar
// reference written independently of the kernels (float16/bfloat16 are decoded with ldexp
// and rounded with nearbyint in double), at counts around every vector width, with
// misaligned pointers and guard bytes around both buffers. Variants the CPU lacks are
// skipped with the reason.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <ringtree/error.h>
#include <ringtree/types.h>

#include "algorithms/reduce_ops.h"
#include "harness/reduction_table.h"

namespace ringtree::algorithms {
namespace {

using test::kAllOps;
using test::kAllTypes;
constexpr size_t kCounts[] = {0, 1, 7, 15, 16, 17, 63, 64, 65, 1023, 4097};
constexpr size_t kGuardBytes = 64;
constexpr uint8_t kGuardByte = 0xA5;

std::string describe(DataType type, ReduceOp op) {
  return std::string(dataTypeName(type)) + " " + reduceOpName(op);
}

bool isInteger(DataType type) {
  return type == DataType::kInt8 || type == DataType::kUInt8 || type == DataType::kInt16 ||
         type == DataType::kInt32 || type == DataType::kInt64;
}

bool isComplex(DataType type) {
  return type == DataType::kComplex64 || type == DataType::kComplex128;
}

bool isBitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}

// --- float16 / bfloat16 reference, by value rather than by bit manipulation -------------

struct SmallFloat {
  int mantissaBits;
  int exponentBits;
  int bias;
};
constexpr SmallFloat kHalf{10, 5, 15};
constexpr SmallFloat kBFloat{7, 8, 127};

uint16_t infinityBits(const SmallFloat& f) {
  return static_cast<uint16_t>(((1 << f.exponentBits) - 1) << f.mantissaBits);
}

bool isNanBits(uint16_t bits, const SmallFloat& f) {
  const uint16_t inf = infinityBits(f);
  return (bits & inf) == inf && (bits & ((1 << f.mantissaBits) - 1)) != 0;
}

double decode(uint16_t bits, const SmallFloat& f) {
  const int exponent = (bits >> f.mantissaBits) & ((1 << f.exponentBits) - 1);
  const int mantissa = bits & ((1 << f.mantissaBits) - 1);
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  if (exponent == (1 << f.exponentBits) - 1) {
    return mantissa != 0 ? std::numeric_limits<double>::quiet_NaN()
                         : sign * std::numeric_limits<double>::infinity();
  }
  if (exponent == 0) {
    return sign * std::ldexp(mantissa, 1 - f.bias - f.mantissaBits);
  }
  return sign * std::ldexp((1 << f.mantissaBits) + mantissa, exponent - f.bias - f.mantissaBits);
}

// x (exact) rounded to nearest even in format f; NaN gives the canonical quiet NaN.
uint16_t encode(double x, const SmallFloat& f) {
  const uint16_t inf = infinityBits(f);
  if (std::isnan(x)) {
    return static_cast<uint16_t>(inf | (1 << (f.mantissaBits - 1)));
  }
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double magnitude = std::fabs(x);
  const int maxExponent = (1 << f.exponentBits) - 2 - f.bias;
  if (magnitude >= std::ldexp(1.0, maxExponent + 1)) {
    return static_cast<uint16_t>(sign | inf);
  }
  const int minExponent = 1 - f.bias;
  int exponent = magnitude == 0 ? minExponent : std::max(std::ilogb(magnitude), minExponent);
  double steps = std::nearbyint(magnitude / std::ldexp(1.0, exponent - f.mantissaBits));
  if (steps == std::ldexp(1.0, f.mantissaBits + 1)) {  // rounded up into the next binade
    steps /= 2;
    ++exponent;
  }
  if (exponent > maxExponent) {
    return static_cast<uint16_t>(sign | inf);
  }
  if (exponent == minExponent) {  // subnormal and the first normal binade share this form
    return static_cast<uint16_t>(sign | static_cast<int>(steps));
  }
  const int mantissa = static_cast<int>(steps) - (1 << f.mantissaBits);
  return static_cast<uint16_t>(sign | ((exponent + f.bias) << f.mantissaBits) | mantissa);
}

// --- the scalar reference ----------------------------------------------------------------

double combineReal(ReduceOp op, double x, double y) {
  switch (op) {
    case ReduceOp::kProduct:
      return x * y;
    case ReduceOp::kMin:
      if (std::isnan(x)) return x;
      if (std::isnan(y)) return y;
      return x < y ? x : y;
    case ReduceOp::kMax:
      if (std::isnan(x)) return x;
      if (std::isnan(y)) return y;
      return x > y ? x : y;
    default:
      return x + y;
  }
}

template <typename T>
T combineInteger(ReduceOp op, T x, T y) {
  const auto ux = static_cast<uint64_t>(static_cast<int64_t>(x));
  const auto uy = static_cast<uint64_t>(static_cast<int64_t>(y));
  switch (op) {
    case ReduceOp::kProduct:
      return static_cast<T>(ux * uy);
    case ReduceOp::kMin:
      return std::min(x, y);
    case ReduceOp::kMax:
      return std::max(x, y);
    case ReduceOp::kBand:
      return static_cast<T>(ux & uy);
    case ReduceOp::kBor:
      return static_cast<T>(ux | uy);
    case ReduceOp::kBxor:
      return static_cast<T>(ux ^ uy);
    default:
      return static_cast<T>(ux + uy);
  }
}

bool combineBool(ReduceOp op, bool x, bool y) {
  switch (op) {
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      return x && y;
    case ReduceOp::kBxor:
      return x != y;
    default:
      return x || y;
  }
}

template <typename T, typename F>
void forEachLane(uint8_t* a, const uint8_t* b, size_t lanes, F f) {
  for (size_t i = 0; i < lanes; ++i) {
    T x;
    T y;
    std::memcpy(&x, a + i * sizeof(T), sizeof(T));
    std::memcpy(&y, b + i * sizeof(T), sizeof(T));
    x = f(x, y);
    std::memcpy(a + i * sizeof(T), &x, sizeof(T));
  }
}

template <typename T>
void referenceReal(ReduceOp op, uint8_t* a, const uint8_t* b, size_t lanes) {
  forEachLane<T>(a, b, lanes, [op](T x, T y) { return static_cast<T>(combineReal(op, x, y)); });
}

template <typename T>
void referenceInteger(ReduceOp op, uint8_t* a, const uint8_t* b, size_t count) {
  forEachLane<T>(a, b, count, [op](T x, T y) { return combineInteger(op, x, y); });
}

void referenceSmall(const SmallFloat& f, ReduceOp op, uint8_t* a, const uint8_t* b, size_t count) {
  forEachLane<uint16_t>(a, b, count, [&f, op](uint16_t x, uint16_t y) {
    return encode(combineReal(op, decode(x, f), decode(y, f)), f);
  });
}

// a[i] = a[i] (op) b[i], one element at a time.
void referenceReduce(DataType type, ReduceOp op, uint8_t* a, const uint8_t* b, size_t count) {
  switch (type) {
    case DataType::kFloat16:
      return referenceSmall(kHalf, op, a, b, count);
    case DataType::kBFloat16:
      return referenceSmall(kBFloat, op, a, b, count);
    case DataType::kFloat32:
      return referenceReal<float>(op, a, b, count);
    case DataType::kFloat64:
      return referenceReal<double>(op, a, b, count);
    case DataType::kComplex64:
      return referenceReal<float>(op, a, b, 2 * count);
    case DataType::kComplex128:
      return referenceReal<double>(op, a, b, 2 * count);
    case DataType::kInt8:
      return referenceInteger<int8_t>(op, a, b, count);
    case DataType::kUInt8:
      return referenceInteger<uint8_t>(op, a, b, count);
    case DataType::kInt16:
      return referenceInteger<int16_t>(op, a, b, count);
    case DataType::kInt32:
      return referenceInteger<int32_t>(op, a, b, count);
    case DataType::kInt64:
      return referenceInteger<int64_t>(op, a, b, count);
    case DataType::kBool:
      return forEachLane<uint8_t>(a, b, count, [op](uint8_t x, uint8_t y) {
        return static_cast<uint8_t>(combineBool(op, x != 0, y != 0));
      });
  }
}

// --- inputs --------------------------------------------------------------------------------

// count elements of type: integer-valued for floating types (small enough that sums and
// products are exact: |x| <= 30, bfloat16 |x| <= 15), every bit pattern for integer types,
// 0/1 for bool.
std::vector<uint8_t> makeInputs(DataType type, size_t count, std::mt19937_64& rng) {
  std::vector<uint8_t> bytes(count * elementSize(type));
  auto put = [&bytes](size_t i, const auto& value) {
    std::memcpy(bytes.data() + i * sizeof(value), &value, sizeof(value));
  };
  std::uniform_int_distribution<int> small(-30, 30);
  std::uniform_int_distribution<int> tiny(-15, 15);
  for (size_t i = 0; i < count; ++i) {
    switch (type) {
      case DataType::kFloat16:
        put(i, encode(small(rng), kHalf));
        break;
      case DataType::kBFloat16:
        put(i, encode(tiny(rng), kBFloat));
        break;
      case DataType::kFloat32:
        put(i, static_cast<float>(small(rng)));
        break;
      case DataType::kFloat64:
        put(i, static_cast<double>(small(rng)));
        break;
      case DataType::kComplex64:
        put(2 * i, static_cast<float>(small(rng)));
        put(2 * i + 1, static_cast<float>(small(rng)));
        break;
      case DataType::kComplex128:
        put(2 * i, static_cast<double>(small(rng)));
        put(2 * i + 1, static_cast<double>(small(rng)));
        break;
      case DataType::kBool:
        put(i, static_cast<uint8_t>(rng() & 1));
        break;
      default: {
        const uint64_t bits = rng();
        std::memcpy(bytes.data() + i * elementSize(type), &bits, elementSize(type));
        break;
      }
    }
  }
  return bytes;
}

// A byte buffer with `offset` bytes and kGuardBytes before the data and kGuardBytes after,
// the data starting at a 64-byte boundary + offset.
class GuardedBuffer {
 public:
  GuardedBuffer(const std::vector<uint8_t>& data, size_t offset)
      : storage_(data.size() + offset + 2 * kGuardBytes + 64, kGuardByte), size_(data.size()) {
    const auto base = reinterpret_cast<uintptr_t>(storage_.data()) + kGuardBytes;
    begin_ = reinterpret_cast<uint8_t*>((base + 63) / 64 * 64) + offset;
    std::copy(data.begin(), data.end(), begin_);
  }

  uint8_t* data() { return begin_; }
  std::vector<uint8_t> contents() const { return {begin_, begin_ + size_}; }
  // Whether every byte outside the data still holds kGuardByte.
  bool guardsIntact() const {
    const uint8_t* const first = storage_.data();
    const uint8_t* const last = first + storage_.size();
    return std::all_of(first, static_cast<const uint8_t*>(begin_), [](uint8_t v) { return v == kGuardByte; }) &&
           std::all_of(static_cast<const uint8_t*>(begin_ + size_), last,
                       [](uint8_t v) { return v == kGuardByte; });
  }

 private:
  std::vector<uint8_t> storage_;
  size_t size_;
  uint8_t* begin_;
};

// Runs fn on copies of a and b at the given byte offsets; checks the result against the
// reference, that b is unchanged and that no guard byte was touched.
void expectMatchesReference(ReduceFn fn, DataType type, ReduceOp op, const std::vector<uint8_t>& a,
                            const std::vector<uint8_t>& b, size_t count, size_t offsetA,
                            size_t offsetB) {
  GuardedBuffer inout(a, offsetA);
  GuardedBuffer in(b, offsetB);
  fn(inout.data(), in.data(), count);
  std::vector<uint8_t> expected = a;
  referenceReduce(type, op, expected.data(), b.data(), count);
  const std::string where = describe(type, op) + " count " + std::to_string(count) +
                            " offsets " + std::to_string(offsetA) + "/" + std::to_string(offsetB);
  EXPECT_EQ(inout.contents(), expected) << where;
  EXPECT_EQ(in.contents(), b) << where << ": input modified";
  EXPECT_TRUE(inout.guardsIntact()) << where << ": wrote outside inout";
  EXPECT_TRUE(in.guardsIntact()) << where << ": wrote outside in";
}

template <typename T>
std::vector<uint8_t> bytesOf(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

template <typename T>
std::vector<T> valuesOf(const std::vector<uint8_t>& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

// The bits of element i of a buffer of type (at most 8 bytes), zero-extended.
uint64_t elementBits(const std::vector<uint8_t>& bytes, DataType type, size_t i) {
  uint64_t bits = 0;
  std::memcpy(&bits, bytes.data() + i * elementSize(type), elementSize(type));
  return bits;
}

// Whether bits (from elementBits) are a NaN of the floating type.
bool isNanElement(DataType type, uint64_t bits) {
  switch (type) {
    case DataType::kFloat16:
      return isNanBits(static_cast<uint16_t>(bits), kHalf);
    case DataType::kBFloat16:
      return isNanBits(static_cast<uint16_t>(bits), kBFloat);
    case DataType::kFloat32:
      return (bits & 0x7FFFFFFFu) > 0x7F800000u;
    default:
      return (bits & 0x7FFFFFFFFFFFFFFFu) > 0x7FF0000000000000u;
  }
}

// --- the table ---------------------------------------------------------------------------

TEST(ReduceOpsTest, SupportFollowsTheRules) {
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      bool expected = true;
      if (isComplex(type)) {
        expected = op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kPremulSum;
      } else if (isBitwise(op)) {
        expected = isInteger(type) || type == DataType::kBool;
      } else if (type == DataType::kBool) {
        expected = op != ReduceOp::kAvg && op != ReduceOp::kPremulSum;
      }
      EXPECT_EQ(isSupported(type, op), expected) << describe(type, op);
    }
  }
  EXPECT_FALSE(isSupported(static_cast<DataType>(kNumDataTypes), ReduceOp::kSum));
  EXPECT_FALSE(isSupported(DataType::kFloat32, static_cast<ReduceOp>(kNumReduceOps)));
}

TEST(ReduceOpsTest, NamesAndSizes) {
  EXPECT_STREQ(dataTypeName(DataType::kBFloat16), "bfloat16");
  EXPECT_STREQ(dataTypeName(DataType::kComplex128), "complex128");
  EXPECT_STREQ(reduceOpName(ReduceOp::kPremulSum), "PREMUL_SUM");
  EXPECT_STREQ(reduceOpName(ReduceOp::kBxor), "BXOR");
  EXPECT_EQ(elementSize(DataType::kFloat16), 2u);
  EXPECT_EQ(elementSize(DataType::kBool), 1u);
  EXPECT_EQ(elementSize(DataType::kComplex64), 8u);
  EXPECT_EQ(elementSize(DataType::kComplex128), 16u);
  EXPECT_THROW(elementSize(static_cast<DataType>(200)), InvalidArgument);
  EXPECT_STREQ(dataTypeName(static_cast<DataType>(200)), "unknown");
}

TEST(ReduceOpsTest, UnsupportedCombinationsThrowNamingOpAndType) {
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (isSupported(type, op)) {
        EXPECT_NE(reduceFunction(type, op), nullptr) << describe(type, op);
        continue;
      }
      try {
        reduceFunction(type, op);
        ADD_FAILURE() << describe(type, op) << " did not throw";
      } catch (const InvalidArgument& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find(std::string("ReduceOp.") + reduceOpName(op)), std::string::npos) << message;
        EXPECT_NE(message.find(dataTypeName(type)), std::string::npos) << message;
      }
    }
  }
  auto messageOf = [](DataType type, ReduceOp op) -> std::string {
    try {
      reduceFunction(type, op);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(messageOf(DataType::kComplex64, ReduceOp::kMax), "the reduction does not support ReduceOp.MAX on complex64 buffers (complex buffers support SUM, AVG and PREMUL_SUM)");
  EXPECT_EQ(messageOf(DataType::kFloat32, ReduceOp::kBand),
            "the reduction does not support ReduceOp.BAND on float32 buffers (bitwise ops need integer or bool "
            "buffers)");
  EXPECT_EQ(messageOf(DataType::kBool, ReduceOp::kAvg), "the reduction does not support ReduceOp.AVG on bool buffers (bool buffers support SUM, PRODUCT, MIN, MAX, BAND, BOR and BXOR)");
  EXPECT_THROW(reduceFunction(static_cast<DataType>(kNumDataTypes), ReduceOp::kSum), InvalidArgument);
  EXPECT_THROW(reduceFunction(DataType::kFloat32, static_cast<ReduceOp>(kNumReduceOps)), InvalidArgument);
}

TEST(ReduceOpsTest, AvgAndPremulSumReduceWithSum) {
  for (DataType type : kAllTypes) {
    if (type == DataType::kBool) continue;
    EXPECT_EQ(reduceFunction(type, ReduceOp::kAvg), reduceFunction(type, ReduceOp::kSum));
    EXPECT_EQ(reduceFunction(type, ReduceOp::kPremulSum), reduceFunction(type, ReduceOp::kSum));
  }
}

TEST(ReduceOpsTest, DispatchPicksTheWidestAvailableVariant) {
  const ReduceIsa best = bestReduceIsa();
  EXPECT_TRUE(isReduceIsaAvailable(best));
  EXPECT_TRUE(isReduceIsaAvailable(ReduceIsa::kBaseline));
  for (int i = static_cast<int>(best) + 1; i < kNumReduceIsas; ++i) {
    EXPECT_FALSE(isReduceIsaAvailable(static_cast<ReduceIsa>(i)));
  }
  for (DataType type : kAllTypes) {
    EXPECT_EQ(reduceFunction(type, ReduceOp::kSum), reduceFunction(type, ReduceOp::kSum, best));
  }
  std::printf("reduction kernels in use: %s\n", reduceIsaName(best));
}

// --- the kernels, per instruction-set variant --------------------------------------------

class ReduceKernelTest : public ::testing::TestWithParam<ReduceIsa> {
 protected:
  void SetUp() override {
    if (!isReduceIsaAvailable(GetParam())) {
      GTEST_SKIP() << "the " << reduceIsaName(GetParam())
                   << " kernels are not available (CPU lacks the instructions, or not an x86-64 build)";
    }
  }
  ReduceFn kernel(DataType type, ReduceOp op) const { return reduceFunction(type, op, GetParam()); }
};

TEST_P(ReduceKernelTest, EveryTypeAndOpMatchesTheReference) {
  std::mt19937_64 rng(42);
  for (DataType type : kAllTypes) {
    const size_t size = elementSize(type);
    const std::vector<size_t> offsets =
        size == 1 ? std::vector<size_t>{0, 1} : std::vector<size_t>{0, size, 1};
    for (ReduceOp op : kAllOps) {
      if (!isSupported(type, op)) {
        EXPECT_THROW(kernel(type, op), InvalidArgument) << describe(type, op);
        continue;
      }
      const ReduceFn fn = kernel(type, op);
      for (size_t count : kCounts) {
        const std::vector<uint8_t> a = makeInputs(type, count, rng);
        const std::vector<uint8_t> b = makeInputs(type, count, rng);
        for (size_t offsetA : offsets) {
          for (size_t offsetB : offsets) {
            expectMatchesReference(fn, type, op, a, b, count, offsetA, offsetB);
          }
        }
      }
    }
  }
}

// Random bit patterns (NaN, inf, subnormal, huge, tiny, ...): every result must be the exact
// result correctly rounded (for float16/bfloat16, one float32 operation and one rounding
// give exactly that), NaN where the reference is NaN.
TEST_P(ReduceKernelTest, FloatingKernelsRoundCorrectlyOnRandomBits) {
  std::mt19937_64 rng(7);
  constexpr size_t kCount = 4099;
  for (DataType type : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
      for (int round = 0; round < 4; ++round) {
        std::vector<uint8_t> a(kCount * elementSize(type));
        std::vector<uint8_t> b(a.size());
        for (auto* v : {&a, &b}) {
          for (size_t i = 0; i < v->size(); i += 8) {
            const uint64_t bits = rng();
            std::memcpy(v->data() + i, &bits, std::min<size_t>(8, v->size() - i));
          }
        }
        GuardedBuffer inout(a, 0);
        kernel(type, op)(inout.data(), b.data(), kCount);
        std::vector<uint8_t> expected = a;
        referenceReduce(type, op, expected.data(), b.data(), kCount);
        const std::vector<uint8_t> got = inout.contents();
        for (size_t i = 0; i < kCount; ++i) {
          const uint64_t want = elementBits(expected, type, i);
          const uint64_t have = elementBits(got, type, i);
          if (isNanElement(type, want) || isNanElement(type, have)) {
            ASSERT_EQ(isNanElement(type, have), isNanElement(type, want)) << describe(type, op) << " element " << i;
          } else {
            ASSERT_EQ(have, want) << describe(type, op) << " element " << i << std::hex << ": 0x"
                                  << elementBits(a, type, i) << ", 0x" << elementBits(b, type, i);
          }
        }
      }
    }
  }
}

struct SmallCase {
  uint16_t a;
  uint16_t b;
  ReduceOp op;
  uint16_t expected;
  const char* what;
};

// Runs each case on 37 copies (main loop and tail lanes alike) and checks every result.
void expectSmallCases(ReduceIsa isa, DataType type, const std::vector<SmallCase>& cases) {
  constexpr size_t kCopies = 37;
  for (const SmallCase& c : cases) {
    std::vector<uint16_t> a(kCopies, c.a);
    const std::vector<uint16_t> b(kCopies, c.b);
    reduceFunction(type, c.op, isa)(a.data(), b.data(), kCopies);
    for (size_t i = 0; i < kCopies; ++i) {
      ASSERT_EQ(a[i], c.expected) << dataTypeName(type) << ": " << c.what << " (lane " << i << ")" << std::hex
                                  << " got 0x" << a[i] << " want 0x" << c.expected;
    }
  }
}

TEST_P(ReduceKernelTest, Float16Rounding) {
  expectSmallCases(GetParam(), DataType::kFloat16, {
      {0x3C00, 0x1000, ReduceOp::kSum, 0x3C00, "1 + 2^-11: tie, to even (down)"},
      {0x3C01, 0x1000, ReduceOp::kSum, 0x3C02, "(1 + 2^-10) + 2^-11: tie, to even (up)"},
      {0x3C00, 0x1001, ReduceOp::kSum, 0x3C01, "just above the tie rounds up"},
      {0x7BFF, 0x7BFF, ReduceOp::kSum, 0x7C00, "65504 + 65504 overflows to inf"},
      {0x7BFF, 0x4C00, ReduceOp::kSum, 0x7C00, "65504 + 16 = 65520: tie, to even = inf"},
      {0x7BFF, 0x4800, ReduceOp::kSum, 0x7BFF, "65504 + 8 rounds back to 65504"},
      {0xFBFF, 0x4000, ReduceOp::kProduct, 0xFC00, "-65504 * 2 = -inf"},
      {0x7C00, 0x3C00, ReduceOp::kSum, 0x7C00, "inf + 1 = inf"},
      {0x0001, 0x0001, ReduceOp::kSum, 0x0002, "subnormal + subnormal"},
      {0x03FF, 0x0001, ReduceOp::kSum, 0x0400, "largest subnormal + ulp = smallest normal"},
      {0x0001, 0x3800, ReduceOp::kProduct, 0x0000, "2^-24 * 0.5: tie, to even = 0"},
      {0x0003, 0x3800, ReduceOp::kProduct, 0x0002, "3 * 2^-24 * 0.5: tie, to even = 2 * 2^-24"},
      {0x8001, 0x3800, ReduceOp::kProduct, 0x8000, "-2^-25 rounds to -0"},
      {0x0400, 0x3800, ReduceOp::kProduct, 0x0200, "smallest normal * 0.5 = subnormal"},
      {0x8000, 0x0000, ReduceOp::kSum, 0x0000, "-0 + 0 = +0"},
      {0x8000, 0x8000, ReduceOp::kSum, 0x8000, "-0 + -0 = -0"},
  });
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    for (auto [a, b] : {std::pair<uint16_t, uint16_t>{0x7E00, 0x3C00}, {0x3C00, 0x7E00}, {0x7D00, 0x3C00},
                        {0x7C00, 0x7E00}, {0xFE00, 0x7E00}}) {
      std::vector<uint16_t> x(19, a);
      const std::vector<uint16_t> y(19, b);
      reduceFunction(DataType::kFloat16, op, GetParam())(x.data(), y.data(), x.size());
      for (uint16_t r : x) {
        EXPECT_TRUE(isNanBits(r, kHalf)) << reduceOpName(op) << std::hex << " 0x" << a << " 0x" << b << " -> 0x" << r;
      }
    }
  }
  std::vector<uint16_t> infinities(5, 0x7C00);
  const std::vector<uint16_t> negative(5, 0xFC00);
  reduceFunction(DataType::kFloat16, ReduceOp::kSum, GetParam())(infinities.data(), negative.data(), 5);
  EXPECT_TRUE(isNanBits(infinities[4], kHalf)) << "inf + -inf is NaN";
}

TEST_P(ReduceKernelTest, BFloat16Rounding) {
  expectSmallCases(GetParam(), DataType::kBFloat16, {
      {0x3F80, 0x3B80, ReduceOp::kSum, 0x3F80, "1 + 2^-8: tie, to even (down)"},
      {0x3F81, 0x3B80, ReduceOp::kSum, 0x3F82, "(1 + 2^-7) + 2^-8: tie, to even (up)"},
      {0x3F80, 0x3B81, ReduceOp::kSum, 0x3F81, "just above the tie rounds up"},
      {0x7F7F, 0x7F7F, ReduceOp::kSum, 0x7F80, "max + max overflows to inf"},
      {0xFF7F, 0x4000, ReduceOp::kProduct, 0xFF80, "-max * 2 = -inf"},
      {0x7F80, 0x3F80, ReduceOp::kSum, 0x7F80, "inf + 1 = inf"},
      {0x0001, 0x0001, ReduceOp::kSum, 0x0002, "subnormal + subnormal"},
      {0x007F, 0x0001, ReduceOp::kSum, 0x0080, "largest subnormal + ulp = smallest normal"},
      {0x0001, 0x3F00, ReduceOp::kProduct, 0x0000, "2^-133 * 0.5: tie, to even = 0"},
      {0x0003, 0x3F00, ReduceOp::kProduct, 0x0002, "3 * 2^-133 * 0.5: tie, to even = 2 * 2^-133"},
      {0x0080, 0x3F00, ReduceOp::kProduct, 0x0040, "smallest normal * 0.5 = subnormal"},
      {0x8000, 0x0000, ReduceOp::kSum, 0x0000, "-0 + 0 = +0"},
  });
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    for (auto [a, b] : {std::pair<uint16_t, uint16_t>{0x7FC0, 0x3F80}, {0x3F80, 0x7FC0}, {0x7F81, 0x3F80},
                        {0x7F80, 0x7FC0}, {0xFFC0, 0x7FC0}}) {
      std::vector<uint16_t> x(19, a);
      const std::vector<uint16_t> y(19, b);
      reduceFunction(DataType::kBFloat16, op, GetParam())(x.data(), y.data(), x.size());
      for (uint16_t r : x) {
        EXPECT_TRUE(isNanBits(r, kBFloat)) << reduceOpName(op) << std::hex << " 0x" << a << " 0x" << b << " -> 0x" << r;
      }
    }
  }
}

template <typename T>
void expectMinMaxPropagatesNan(ReduceIsa isa, DataType type) {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const T inf = std::numeric_limits<T>::infinity();
  const std::vector<T> a = {nan, 1, nan, -inf, inf, nan, 2, -0.0, 0.0, 3};
  const std::vector<T> b = {1, nan, nan, nan, nan, -inf, 1, 0.0, -0.0, 3};
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    for (size_t copies : {size_t{1}, size_t{5}}) {  // 10 and 50 elements: tail and main loop
      std::vector<T> x;
      std::vector<T> y;
      for (size_t i = 0; i < copies; ++i) {
        x.insert(x.end(), a.begin(), a.end());
        y.insert(y.end(), b.begin(), b.end());
      }
      reduceFunction(type, op, isa)(x.data(), y.data(), x.size());
      for (size_t i = 0; i < x.size(); i += a.size()) {
        const std::string where = std::string(dataTypeName(type)) + " " + reduceOpName(op);
        for (size_t j = 0; j < 6; ++j) {
          EXPECT_TRUE(std::isnan(x[i + j])) << where << " case " << j;
        }
        EXPECT_EQ(x[i + 6], op == ReduceOp::kMin ? 1 : 2) << where;
        // Equal elements give in's: min/max(-0, +0) = +0 and min/max(+0, -0) = -0.
        EXPECT_FALSE(std::signbit(x[i + 7])) << where;
        EXPECT_TRUE(std::signbit(x[i + 8])) << where;
        EXPECT_EQ(x[i + 9], 3) << where;
      }
    }
  }
}

TEST_P(ReduceKernelTest, MinMaxPropagateNan) {
  expectMinMaxPropagatesNan<float>(GetParam(), DataType::kFloat32);
  expectMinMaxPropagatesNan<double>(GetParam(), DataType::kFloat64);
  // float16 / bfloat16: NaN, 1, NaN in a against 1, NaN, NaN in b; and -0 vs +0.
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    expectSmallCases(GetParam(), DataType::kFloat16, {{0x8000, 0x0000, op, 0x0000, "(-0, +0) gives in's +0"},
                                                      {0x0000, 0x8000, op, 0x8000, "(+0, -0) gives in's -0"},
                                                      {0x7E01, 0x3C00, op, 0x7E01, "a's NaN payload kept"},
                                                      {0x3C00, 0x7E01, op, 0x7E01, "b's NaN payload kept"},
                                                      {0x7D01, 0x3C00, op, 0x7F01, "signalling NaN comes out quiet"}});
    expectSmallCases(GetParam(), DataType::kBFloat16, {{0x8000, 0x0000, op, 0x0000, "(-0, +0) gives in's +0"},
                                                       {0x7FC1, 0x3F80, op, 0x7FC1, "a's NaN payload kept"},
                                                       {0x3F80, 0x7FC1, op, 0x7FC1, "b's NaN payload kept"},
                                                       {0x7F81, 0x3F80, op, 0x7FC1, "signalling NaN comes out quiet"}});
  }
}

template <typename T>
void expectWraps(ReduceIsa isa, DataType type, ReduceOp op, T a, T b, T expected) {
  std::vector<T> x(21, a);
  const std::vector<T> y(21, b);
  reduceFunction(type, op, isa)(x.data(), y.data(), x.size());
  for (T v : x) {
    ASSERT_EQ(v, expected) << dataTypeName(type) << " " << reduceOpName(op) << " " << +a << ", " << +b;
  }
}

TEST_P(ReduceKernelTest, IntegerOverflowWraps) {
  const ReduceIsa isa = GetParam();
  expectWraps<int8_t>(isa, DataType::kInt8, ReduceOp::kSum, 127, 1, -128);
  expectWraps<int8_t>(isa, DataType::kInt8, ReduceOp::kProduct, 16, 16, 0);
  expectWraps<int8_t>(isa, DataType::kInt8, ReduceOp::kProduct, -128, -1, -128);
  expectWraps<uint8_t>(isa, DataType::kUInt8, ReduceOp::kSum, 255, 1, 0);
  expectWraps<uint8_t>(isa, DataType::kUInt8, ReduceOp::kProduct, 16, 17, 16);
  expectWraps<int16_t>(isa, DataType::kInt16, ReduceOp::kSum, 32767, 1, -32768);
  expectWraps<int16_t>(isa, DataType::kInt16, ReduceOp::kProduct, -32768, -1, -32768);
  expectWraps<int32_t>(isa, DataType::kInt32, ReduceOp::kSum, std::numeric_limits<int32_t>::max(), 1,
                       std::numeric_limits<int32_t>::min());
  expectWraps<int32_t>(isa, DataType::kInt32, ReduceOp::kProduct, 65536, 65536, 0);
  expectWraps<int32_t>(isa, DataType::kInt32, ReduceOp::kProduct, 65537, 65537, 131073);
  expectWraps<int64_t>(isa, DataType::kInt64, ReduceOp::kSum, std::numeric_limits<int64_t>::max(), 1,
                       std::numeric_limits<int64_t>::min());
  expectWraps<int64_t>(isa, DataType::kInt64, ReduceOp::kProduct, int64_t{1} << 32, int64_t{1} << 32, 0);
  expectWraps<int64_t>(isa, DataType::kInt64, ReduceOp::kProduct, (int64_t{1} << 62) + 1, 3,
                       static_cast<int64_t>((uint64_t{1} << 62) * 3 + 3));
  expectWraps<int64_t>(isa, DataType::kInt64, ReduceOp::kProduct, -3, 5, -15);
  expectWraps<int64_t>(isa, DataType::kInt64, ReduceOp::kMin, std::numeric_limits<int64_t>::min(), -1,
                       std::numeric_limits<int64_t>::min());
  expectWraps<int64_t>(isa, DataType::kInt64, ReduceOp::kMax, -1, int64_t{1} << 40, int64_t{1} << 40);
}

TEST_P(ReduceKernelTest, BoolIsLogicalAndCanonical) {
  const std::vector<uint8_t> a = {0, 0, 1, 1, 2, 0x80, 2, 0xFF};
  const std::vector<uint8_t> b = {0, 1, 0, 1, 0, 0x40, 3, 1};
  const auto run = [&](ReduceOp op) {
    std::vector<uint8_t> x = a;
    reduceFunction(DataType::kBool, op, GetParam())(x.data(), b.data(), x.size());
    return x;
  };
  const std::vector<uint8_t> orResult = {0, 1, 1, 1, 1, 1, 1, 1};
  const std::vector<uint8_t> andResult = {0, 0, 0, 1, 0, 1, 1, 1};
  const std::vector<uint8_t> xorResult = {0, 1, 1, 0, 1, 0, 0, 0};
  EXPECT_EQ(run(ReduceOp::kSum), orResult);
  EXPECT_EQ(run(ReduceOp::kMax), orResult);
  EXPECT_EQ(run(ReduceOp::kBor), orResult);
  EXPECT_EQ(run(ReduceOp::kProduct), andResult);
  EXPECT_EQ(run(ReduceOp::kMin), andResult);
  EXPECT_EQ(run(ReduceOp::kBand), andResult);
  EXPECT_EQ(run(ReduceOp::kBxor), xorResult);
}

INSTANTIATE_TEST_SUITE_P(Isa, ReduceKernelTest,
                         ::testing::Values(ReduceIsa::kBaseline, ReduceIsa::kAvx2, ReduceIsa::kAvx512),
                         [](const ::testing::TestParamInfo<ReduceIsa>& info) {
                           return std::string(reduceIsaName(info.param));
                         });

// --- scale and divide ----------------------------------------------------------------------

// Runs f(data, count) on the bytes of values placed one byte off alignment; count is the
// number of elements, of `lanes` values each (2 for complex types).
template <typename T, typename F>
std::vector<T> onMisaligned(const std::vector<T>& values, F f, size_t lanes = 1) {
  GuardedBuffer buffer(bytesOf(values), 1);
  f(buffer.data(), values.size() / lanes);
  EXPECT_TRUE(buffer.guardsIntact());
  return valuesOf<T>(buffer.contents());
}

TEST(ScaleTest, FloatingTypes) {
  const auto scaleBy = [](DataType type, double factor) {
    return [type, factor](void* data, size_t count) { scale(data, count, type, factor); };
  };
  EXPECT_EQ(onMisaligned<float>({1, 2, 3, -4, 0}, scaleBy(DataType::kFloat32, 0.5)),
            (std::vector<float>{0.5f, 1, 1.5f, -2, 0}));
  EXPECT_EQ(onMisaligned<float>({1, 3}, scaleBy(DataType::kFloat32, 0.1)),
            (std::vector<float>{static_cast<float>(0.1), static_cast<float>(3 * 0.1)}));
  EXPECT_EQ(onMisaligned<double>({1, -3}, scaleBy(DataType::kFloat64, 0.25)), (std::vector<double>{0.25, -0.75}));
  EXPECT_EQ(onMisaligned<uint16_t>({encode(3, kHalf), encode(-6, kHalf)}, scaleBy(DataType::kFloat16, 0.5)),
            (std::vector<uint16_t>{encode(1.5, kHalf), encode(-3, kHalf)}));
  EXPECT_EQ(onMisaligned<uint16_t>({encode(60000, kHalf)}, scaleBy(DataType::kFloat16, 2)),
            (std::vector<uint16_t>{0x7C00}));
  EXPECT_EQ(onMisaligned<uint16_t>({encode(3, kBFloat), encode(-6, kBFloat)}, scaleBy(DataType::kBFloat16, 0.5)),
            (std::vector<uint16_t>{encode(1.5, kBFloat), encode(-3, kBFloat)}));
  // complex: (1 + 2i) * 0.5, (-4 + 8i) * 0.5
  EXPECT_EQ(onMisaligned<float>({1, 2, -4, 8}, scaleBy(DataType::kComplex64, 0.5), 2),
            (std::vector<float>{0.5f, 1, -2, 4}));
  EXPECT_EQ(onMisaligned<double>({1, 2}, scaleBy(DataType::kComplex128, -2), 2), (std::vector<double>{-2, -4}));
}

TEST(ScaleTest, IntegersTruncateTowardZeroAndSaturate) {
  const auto scaleBy = [](DataType type, double factor) {
    return [type, factor](void* data, size_t count) { scale(data, count, type, factor); };
  };
  EXPECT_EQ(onMisaligned<int8_t>({7, -7, 100, -100, 1}, scaleBy(DataType::kInt8, 0.5)),
            (std::vector<int8_t>{3, -3, 50, -50, 0}));
  EXPECT_EQ(onMisaligned<int8_t>({100, -100}, scaleBy(DataType::kInt8, 2)), (std::vector<int8_t>{127, -128}));
  EXPECT_EQ(onMisaligned<uint8_t>({200, 7}, scaleBy(DataType::kUInt8, 1.5)), (std::vector<uint8_t>{255, 10}));
  EXPECT_EQ(onMisaligned<uint8_t>({200}, scaleBy(DataType::kUInt8, -1)), (std::vector<uint8_t>{0}));
  EXPECT_EQ(onMisaligned<int16_t>({-32768, 5}, scaleBy(DataType::kInt16, 0.5)), (std::vector<int16_t>{-16384, 2}));
  EXPECT_EQ(onMisaligned<int32_t>({7, -7}, scaleBy(DataType::kInt32, -0.5)), (std::vector<int32_t>{-3, 3}));
  EXPECT_EQ(onMisaligned<int64_t>({int64_t{1} << 52, -9}, scaleBy(DataType::kInt64, 3)),
            (std::vector<int64_t>{int64_t{3} << 52, -27}));
  EXPECT_EQ(onMisaligned<int64_t>({int64_t{1} << 62}, scaleBy(DataType::kInt64, 4)),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::max()}));
  int32_t value = 1;
  EXPECT_THROW(scale(&value, 1, DataType::kInt32, std::numeric_limits<double>::quiet_NaN()), InvalidArgument);
  EXPECT_THROW(scale(&value, 1, DataType::kInt32, std::numeric_limits<double>::infinity()), InvalidArgument);
}

TEST(ScaleTest, BoolIsRejected) {
  uint8_t flag = 1;
  try {
    scale(&flag, 1, DataType::kBool, 2.0);
    ADD_FAILURE() << "scale on bool did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "the reduction does not support ReduceOp.PREMUL_SUM on bool buffers (bool buffers support SUM, PRODUCT, MIN, MAX, BAND, BOR and BXOR)");
  }
  EXPECT_EQ(flag, 1);
}

TEST(DivideTest, FloatingTypesDivideExactly) {
  const auto divideBy = [](DataType type, int64_t divisor) {
    return [type, divisor](void* data, size_t count) { divide(data, count, type, divisor); };
  };
  EXPECT_EQ(onMisaligned<float>({7, -9, 12, 1}, divideBy(DataType::kFloat32, 2)),
            (std::vector<float>{3.5f, -4.5f, 6, 0.5f}));
  EXPECT_EQ(onMisaligned<float>({1, 2}, divideBy(DataType::kFloat32, 3)), (std::vector<float>{1.0f / 3, 2.0f / 3}));
  // 49 / 49 is exactly 1 only as a division: 49 * (1 / 49.) is 0.9999999999999999 in double.
  EXPECT_EQ(onMisaligned<double>({49, 98}, divideBy(DataType::kFloat64, 49)), (std::vector<double>{1, 2}));
  EXPECT_EQ(onMisaligned<float>({1}, divideBy(DataType::kFloat32, (int64_t{1} << 40) + 1)),
            (std::vector<float>{static_cast<float>(1.0 / static_cast<double>((int64_t{1} << 40) + 1))}));
  EXPECT_EQ(onMisaligned<uint16_t>({encode(6, kHalf), encode(-1, kHalf)}, divideBy(DataType::kFloat16, 4)),
            (std::vector<uint16_t>{encode(1.5, kHalf), encode(-0.25, kHalf)}));
  EXPECT_EQ(onMisaligned<uint16_t>({encode(6, kBFloat), encode(-1, kBFloat)}, divideBy(DataType::kBFloat16, 4)),
            (std::vector<uint16_t>{encode(1.5, kBFloat), encode(-0.25, kBFloat)}));
  EXPECT_EQ(onMisaligned<float>({6, -4, 2, 1}, divideBy(DataType::kComplex64, 4), 2),
            (std::vector<float>{1.5f, -1, 0.5f, 0.25f}));
  EXPECT_EQ(onMisaligned<double>({6, -4}, divideBy(DataType::kComplex128, 8), 2), (std::vector<double>{0.75, -0.5}));
}

TEST(DivideTest, IntegersTruncateTowardZero) {
  const auto divideBy = [](DataType type, int64_t divisor) {
    return [type, divisor](void* data, size_t count) { divide(data, count, type, divisor); };
  };
  EXPECT_EQ(onMisaligned<int8_t>({7, -7, -128, 127}, divideBy(DataType::kInt8, 2)),
            (std::vector<int8_t>{3, -3, -64, 63}));
  EXPECT_EQ(onMisaligned<uint8_t>({255, 1}, divideBy(DataType::kUInt8, 2)), (std::vector<uint8_t>{127, 0}));
  EXPECT_EQ(onMisaligned<uint8_t>({255}, divideBy(DataType::kUInt8, 1000)), (std::vector<uint8_t>{0}));
  EXPECT_EQ(onMisaligned<int16_t>({-32768, 9}, divideBy(DataType::kInt16, 3)), (std::vector<int16_t>{-10922, 3}));
  EXPECT_EQ(onMisaligned<int32_t>({-7, 7}, divideBy(DataType::kInt32, 4)), (std::vector<int32_t>{-1, 1}));
  EXPECT_EQ(onMisaligned<int64_t>({std::numeric_limits<int64_t>::min(), -5}, divideBy(DataType::kInt64, 2)),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min() / 2, -2}));
}

TEST(DivideTest, BoolAndBadDivisorsAreRejected) {
  uint8_t flag = 1;
  try {
    divide(&flag, 1, DataType::kBool, 2);
    ADD_FAILURE() << "divide on bool did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("does not support ReduceOp.AVG on bool buffers"), std::string::npos) << e.what();
  }
  float value = 1;
  EXPECT_THROW(divide(&value, 1, DataType::kFloat32, 0), InvalidArgument);
  EXPECT_THROW(divide(&value, 1, DataType::kFloat32, -2), InvalidArgument);
  EXPECT_EQ(value, 1);
  divide(nullptr, 0, DataType::kFloat32, 3);
  scale(nullptr, 0, DataType::kFloat64, 3);
}

}  // namespace
}  // namespace ringtree::algorithms
