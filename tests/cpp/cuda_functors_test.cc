// The CUDA kernels' per-element functors (src/cuda/reduce_kernels.cuh), run on the host:
// every (DataType, ReduceOp) that visitReduce hands out, applied element by element, equals
// the CPU engine's reduceFunction(type, op) (every instruction-set variant) bit for bit,
// except for NaN payloads; the same for scale and divide against algorithms::scale and
// algorithms::divide; the pairs and arguments the functors refuse are exactly those the CPU
// engine rejects. Values: random bit patterns, random values of like magnitude, and every
// pair of a list of special values (NaN, +-inf, +-0, subnormals, integer extremes); float16,
// bfloat16 and bool exhaustively on one side. The float16/bfloat16 conversions are checked
// on their own: decoding every pattern, and rounding ties and boundaries of every exponent.
// Built with or without CUDA: the header needs no CUDA header.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <ringtree/error.h>
#include <ringtree/types.h>

#include "algorithms/reduce_ops.h"
#include "harness/reduction_table.h"
#include "reduce_kernels.cuh"

namespace ringtree::gpu {
namespace {

using test::kAllOps;
using test::kAllTypes;
using test::isNanLane;

std::string describe(DataType type, ReduceOp op) {
  return std::string(dataTypeName(type)) + " " + reduceOpName(op);
}

// --- Values ----------------------------------------------------------------------------

// Bytes of `count` elements of `type` (lanes for complex types: real and imaginary parts are
// independent lanes), mixing special values, random bits and random values of moderate size.
class Values {
 public:
  explicit Values(uint64_t seed) : rng_(seed) {}

  // Pairs (a[i], b[i]) of elements: every pair of the type's special values, then `random`
  // pairs that are random bit patterns, values of like magnitude (so that sums round and
  // cancel), and small integers.
  void pairs(DataType type, size_t random, std::vector<unsigned char>* a, std::vector<unsigned char>* b) {
    const std::vector<unsigned char> specials = specialsOf(type);
    const size_t size = laneBytes(type);
    const size_t n = specials.size() / size;
    a->clear();
    b->clear();
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        a->insert(a->end(), specials.begin() + i * size, specials.begin() + (i + 1) * size);
        b->insert(b->end(), specials.begin() + j * size, specials.begin() + (j + 1) * size);
      }
    }
    for (size_t i = 0; i < random; ++i) {
      appendRandomPair(type, a, b);
    }
    if (isComplexType(type)) {  // whole elements: an even number of lanes
      if ((a->size() / size) % 2 != 0) {
        appendRandomPair(type, a, b);
      }
    }
  }

  // `count` single elements (lanes) for scale and divide: specials, then random values.
  std::vector<unsigned char> singles(DataType type, size_t random) {
    std::vector<unsigned char> out = specialsOf(type);
    std::vector<unsigned char> a;
    std::vector<unsigned char> b;
    for (size_t i = 0; i < random; ++i) {
      appendRandomPair(type, &a, &b);
    }
    out.insert(out.end(), a.begin(), a.end());
    out.insert(out.end(), b.begin(), b.end());
    if (isComplexType(type) && (out.size() / laneBytes(type)) % 2 != 0) {
      out.resize(out.size() - laneBytes(type));
    }
    return out;
  }

  static bool isComplexType(DataType type) {
    return type == DataType::kComplex64 || type == DataType::kComplex128;
  }

  // Bytes of one lane.
  static size_t laneBytes(DataType type) { return isComplexType(type) ? elementSize(type) / 2 : elementSize(type); }

  std::mt19937_64& rng() { return rng_; }

 private:
  template <typename T>
  static void push(std::vector<unsigned char>* out, T value) {
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out->insert(out->end(), bytes, bytes + sizeof(T));
  }

  template <typename T>
  static void pushAll(std::vector<unsigned char>* out, std::initializer_list<T> values) {
    for (T v : values) push(out, v);
  }

  static std::vector<unsigned char> specialsOf(DataType type) {
    std::vector<unsigned char> out;
    switch (type) {
      case DataType::kFloat16:
        pushAll<uint16_t>(&out, {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x8400, 0x3C00, 0xBC00, 0x3C01,
                                 0x1000, 0x3800, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7D01, 0x7FFF,
                                 0x4C00, 0x0003});
        break;
      case DataType::kBFloat16:
        pushAll<uint16_t>(&out, {0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x3F81, 0x3B80,
                                 0x3F00, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x7FFF, 0x0003});
        break;
      case DataType::kFloat32:
      case DataType::kComplex64:
        pushAll<uint32_t>(&out, {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007FFFFFu, 0x00800000u,
                                 0x3F800000u, 0xBF800000u, 0x3F800001u, 0x33800000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
                                 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FFFFFFFu,
                                 0x477FF000u, 0x38800000u, 0x33000000u, 0x3F000000u});
        break;
      case DataType::kFloat64:
      case DataType::kComplex128:
        pushAll<uint64_t>(&out, {0x0ull, 0x8000000000000000ull, 0x1ull, 0x8000000000000001ull,
                                 0x000FFFFFFFFFFFFFull, 0x0010000000000000ull, 0x3FF0000000000000ull,
                                 0xBFF0000000000000ull, 0x3FF0000000000001ull, 0x3CA0000000000000ull,
                                 0x7FEFFFFFFFFFFFFFull, 0xFFEFFFFFFFFFFFFFull, 0x7FF0000000000000ull,
                                 0xFFF0000000000000ull, 0x7FF8000000000000ull, 0xFFF8000000000000ull,
                                 0x7FF0000000000001ull, 0x3FE0000000000000ull});
        break;
      case DataType::kInt8:
        pushAll<int8_t>(&out, {-128, -127, -2, -1, 0, 1, 2, 3, 126, 127});
        break;
      case DataType::kUInt8:
        pushAll<uint8_t>(&out, {0, 1, 2, 3, 127, 128, 254, 255});
        break;
      case DataType::kInt16:
        pushAll<int16_t>(&out, {-32768, -32767, -256, -1, 0, 1, 2, 3, 255, 32766, 32767});
        break;
      case DataType::kInt32:
        pushAll<int32_t>(&out, {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::min() + 1,
                                -65536, -1, 0, 1, 2, 3, 65535, std::numeric_limits<int32_t>::max() - 1,
                                std::numeric_limits<int32_t>::max()});
        break;
      case DataType::kInt64:
        pushAll<int64_t>(&out, {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::min() + 1,
                                -(int64_t{1} << 53) - 1, -1, 0, 1, 2, 3, int64_t{1} << 53, (int64_t{1} << 53) + 1,
                                std::numeric_limits<int64_t>::max() - 1, std::numeric_limits<int64_t>::max()});
        break;
      case DataType::kBool:
        pushAll<uint8_t>(&out, {0, 1, 2, 0x80, 0xFF});
        break;
    }
    return out;
  }

  template <typename Bits>
  void appendFloatPair(std::vector<unsigned char>* a, std::vector<unsigned char>* b, int mantissaBits,
                       int exponentBits) {
    const Bits all = static_cast<Bits>(rng_());
    switch (rng_() % 4) {
      case 0:  // random bits on both sides
        push<Bits>(a, all);
        push<Bits>(b, static_cast<Bits>(rng_()));
        break;
      case 1: {  // like magnitude: the same exponent give or take a few, random signs
        const int bias = (1 << (exponentBits - 1)) - 1;
        const Bits exponentMask = static_cast<Bits>(((Bits{1} << exponentBits) - 1) << mantissaBits);
        const int e = static_cast<int>((all & exponentMask) >> mantissaBits);
        const int spread = static_cast<int>(rng_() % 7) - 3;
        const int e2 = std::max(0, std::min((1 << exponentBits) - 2, e == (2 * bias + 1) ? bias : e + spread));
        const Bits first = static_cast<Bits>((all & ~exponentMask) |
                                             (static_cast<Bits>(e == 2 * bias + 1 ? bias : e) << mantissaBits));
        const Bits second = static_cast<Bits>((static_cast<Bits>(rng_()) & ~exponentMask) |
                                              (static_cast<Bits>(e2) << mantissaBits));
        push<Bits>(a, first);
        push<Bits>(b, second);
        break;
      }
      case 2: {  // subnormal or tiny on both sides
        const Bits low = static_cast<Bits>((Bits{1} << (mantissaBits + 1)) - 1);
        const Bits sign = static_cast<Bits>(Bits{1} << (sizeof(Bits) * 8 - 1));
        push<Bits>(a, static_cast<Bits>((all & low) | (all & sign)));
        push<Bits>(b, static_cast<Bits>((static_cast<Bits>(rng_()) & low) | (static_cast<Bits>(rng_()) & sign)));
        break;
      }
      default: {  // small integer values, exact in every floating type
        push<Bits>(a, integerValued<Bits>(static_cast<int>(rng_() % 201) - 100));
        push<Bits>(b, integerValued<Bits>(static_cast<int>(rng_() % 201) - 100));
        break;
      }
    }
  }

  // The bits of the integer v in the floating type of Bits' width (v is small: exact).
  template <typename Bits>
  static Bits integerValued(int v) {
    static_assert(sizeof(Bits) == 4 || sizeof(Bits) == 8, "float32 or float64 bits");
    Bits bits;
    if constexpr (sizeof(Bits) == 8) {
      const double d = v;
      std::memcpy(&bits, &d, 8);
    } else {
      const auto f = static_cast<float>(v);
      std::memcpy(&bits, &f, 4);
    }
    return bits;
  }

  template <typename T>
  void appendIntegerPair(std::vector<unsigned char>* a, std::vector<unsigned char>* b) {
    if (rng_() % 2 == 0) {
      push<T>(a, static_cast<T>(rng_()));
      push<T>(b, static_cast<T>(rng_()));
    } else {  // small values: quotients and products that do not saturate
      push<T>(a, static_cast<T>(static_cast<int>(rng_() % 23) - 11));
      push<T>(b, static_cast<T>(static_cast<int>(rng_() % 23) - 11));
    }
  }

  void appendRandomPair(DataType type, std::vector<unsigned char>* a, std::vector<unsigned char>* b) {
    switch (type) {
      case DataType::kFloat16:
        if (rng_() % 4 == 3) {  // small integer values
          push<uint16_t>(a, floatToHalf(static_cast<float>(static_cast<int>(rng_() % 201) - 100)));
          push<uint16_t>(b, floatToHalf(static_cast<float>(static_cast<int>(rng_() % 201) - 100)));
        } else {
          appendHalfLike(a, b, 10, 5);
        }
        break;
      case DataType::kBFloat16:
        if (rng_() % 4 == 3) {
          push<uint16_t>(a, floatToBFloat16(static_cast<float>(static_cast<int>(rng_() % 201) - 100)));
          push<uint16_t>(b, floatToBFloat16(static_cast<float>(static_cast<int>(rng_() % 201) - 100)));
        } else {
          appendHalfLike(a, b, 7, 8);
        }
        break;
      case DataType::kFloat32:
      case DataType::kComplex64:
        appendFloatPair<uint32_t>(a, b, 23, 8);
        break;
      case DataType::kFloat64:
      case DataType::kComplex128:
        appendFloatPair<uint64_t>(a, b, 52, 11);
        break;
      case DataType::kInt8:
        appendIntegerPair<int8_t>(a, b);
        break;
      case DataType::kUInt8:
        appendIntegerPair<uint8_t>(a, b);
        break;
      case DataType::kInt16:
        appendIntegerPair<int16_t>(a, b);
        break;
      case DataType::kInt32:
        appendIntegerPair<int32_t>(a, b);
        break;
      case DataType::kInt64:
        appendIntegerPair<int64_t>(a, b);
        break;
      case DataType::kBool:
        push<uint8_t>(a, static_cast<uint8_t>(rng_()));
        push<uint8_t>(b, static_cast<uint8_t>(rng_()));
        break;
    }
  }

  // float16/bfloat16: random bits, or like magnitude, the 16-bit way.
  void appendHalfLike(std::vector<unsigned char>* a, std::vector<unsigned char>* b, int mantissaBits,
                      int exponentBits) {
    const uint16_t all = static_cast<uint16_t>(rng_());
    if (rng_() % 2 == 0) {
      push<uint16_t>(a, all);
      push<uint16_t>(b, static_cast<uint16_t>(rng_()));
      return;
    }
    const int maxExponent = (1 << exponentBits) - 1;
    const uint16_t exponentMask = static_cast<uint16_t>(maxExponent << mantissaBits);
    int e = (all & exponentMask) >> mantissaBits;
    if (e == maxExponent) e = maxExponent / 2;
    const int e2 = std::max(0, std::min(maxExponent - 1, e + static_cast<int>(rng_() % 7) - 3));
    push<uint16_t>(a, static_cast<uint16_t>((all & ~exponentMask) | (e << mantissaBits)));
    push<uint16_t>(b, static_cast<uint16_t>((static_cast<uint16_t>(rng_()) & ~exponentMask) | (e2 << mantissaBits)));
  }

  std::mt19937_64 rng_;
};

// --- Comparison ------------------------------------------------------------------------

std::string hexLane(const unsigned char* lane, size_t size) {
  std::ostringstream out;
  out << "0x" << std::hex;
  for (size_t k = size; k-- > 0;) {
    out << ((lane[k] >> 4) & 0xF) << (lane[k] & 0xF);
  }
  return out.str();
}

// Lane by lane: equal bytes, or NaN on both sides. Reports the first few differences.
::testing::AssertionResult sameLanes(DataType type, const std::vector<unsigned char>& got,
                                     const std::vector<unsigned char>& want, const std::vector<unsigned char>* a,
                                     const std::vector<unsigned char>* b) {
  const size_t size = Values::laneBytes(type);
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes differ";
  }
  size_t wrong = 0;
  std::ostringstream report;
  for (size_t i = 0; i < got.size() / size; ++i) {
    const unsigned char* g = got.data() + i * size;
    const unsigned char* w = want.data() + i * size;
    if (std::memcmp(g, w, size) == 0 || (isNanLane(type, g) && isNanLane(type, w))) {
      continue;
    }
    if (++wrong <= 5) {
      report << "\n  lane " << i;
      if (a != nullptr) report << ": a " << hexLane(a->data() + i * size, size);
      if (b != nullptr) report << " b " << hexLane(b->data() + i * size, size);
      report << " -> functor " << hexLane(g, size) << ", CPU " << hexLane(w, size);
    }
  }
  if (wrong == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << wrong << " of " << got.size() / size << " lanes differ" << report.str();
}

// Applies a binary functor lane by lane: inout[i] = f(inout[i], in[i]).
struct ApplyCombine {
  std::vector<unsigned char>* inout;
  const std::vector<unsigned char>* in;
  size_t lanesSeen = 0;

  template <class Op>
  void operator()(Op op, size_t lanes) {
    using T = typename Op::Storage;
    lanesSeen = lanes;
    for (size_t i = 0; i < inout->size() / sizeof(T); ++i) {
      T x;
      T y;
      std::memcpy(&x, inout->data() + i * sizeof(T), sizeof(T));
      std::memcpy(&y, in->data() + i * sizeof(T), sizeof(T));
      const T r = op(x, y);
      std::memcpy(inout->data() + i * sizeof(T), &r, sizeof(T));
    }
  }
};

// Applies a unary functor lane by lane: data[i] = f(data[i]).
struct ApplyTransform {
  std::vector<unsigned char>* data;
  size_t lanesSeen = 0;

  template <class Op>
  void operator()(Op op, size_t lanes) {
    using T = typename Op::Storage;
    lanesSeen = lanes;
    for (size_t i = 0; i < data->size() / sizeof(T); ++i) {
      T x;
      std::memcpy(&x, data->data() + i * sizeof(T), sizeof(T));
      const T r = op(x);
      std::memcpy(data->data() + i * sizeof(T), &r, sizeof(T));
    }
  }
};

size_t elementsOf(DataType type, const std::vector<unsigned char>& bytes) { return bytes.size() / elementSize(type); }

// --- The (type, op) table --------------------------------------------------------------

TEST(CudaFunctorTest, DefinedPairsAreExactlyTheSupportedOnes) {
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      EXPECT_EQ(isDefined(type, op), isSupported(type, op)) << describe(type, op);
      bool called = false;
      const bool defined = visitReduce(type, op, [&](auto, size_t) { called = true; });
      EXPECT_EQ(defined, isSupported(type, op)) << describe(type, op);
      EXPECT_EQ(called, defined) << describe(type, op);
    }
  }
  // Values outside the enums.
  for (int type = kNumDataTypes; type < 256; type += 37) {
    EXPECT_FALSE(isDefined(static_cast<DataType>(type), ReduceOp::kSum)) << type;
    EXPECT_FALSE(visitReduce(static_cast<DataType>(type), ReduceOp::kSum, [](auto, size_t) {})) << type;
    EXPECT_FALSE(visitScale(static_cast<DataType>(type), 2.0, [](auto, size_t) {})) << type;
    EXPECT_FALSE(visitDivide(static_cast<DataType>(type), 2, [](auto, size_t) {})) << type;
  }
  for (int op = kNumReduceOps; op < 256; op += 41) {
    EXPECT_FALSE(isDefined(DataType::kFloat32, static_cast<ReduceOp>(op))) << op;
    EXPECT_FALSE(visitReduce(DataType::kFloat32, static_cast<ReduceOp>(op), [](auto, size_t) {})) << op;
  }
}

TEST(CudaFunctorTest, ComplexTypesAreTwoLanesPerElement) {
  for (DataType type : {DataType::kComplex64, DataType::kComplex128}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kPremulSum}) {
      size_t lanes = 0;
      ASSERT_TRUE(visitReduce(type, op, [&](auto f, size_t n) {
        lanes = n;
        EXPECT_EQ(sizeof(typename decltype(f)::Storage) * 2, elementSize(type));
      }));
      EXPECT_EQ(lanes, 2u) << describe(type, op);
    }
  }
}

// --- Reductions against the CPU engine -------------------------------------------------

// Every pair's functor over `a` (x) `b`, against the CPU's reduceFunction of every variant.
void expectReduceMatchesCpu(DataType type, ReduceOp op, const std::vector<unsigned char>& a,
                            const std::vector<unsigned char>& b) {
  std::vector<unsigned char> got = a;
  ApplyCombine apply{&got, &b};
  ASSERT_TRUE(visitReduce(type, op, apply)) << describe(type, op);
  for (int i = 0; i < algorithms::kNumReduceIsas; ++i) {
    const auto isa = static_cast<algorithms::ReduceIsa>(i);
    if (!algorithms::isReduceIsaAvailable(isa)) continue;
    std::vector<unsigned char> want = a;
    algorithms::reduceFunction(type, op, isa)(want.data(), b.data(), elementsOf(type, a));
    EXPECT_TRUE(sameLanes(type, got, want, &a, &b)) << describe(type, op) << " vs " << algorithms::reduceIsaName(isa);
  }
  // And the default the engine uses.
  std::vector<unsigned char> want = a;
  algorithms::reduceFunction(type, op)(want.data(), b.data(), elementsOf(type, a));
  EXPECT_TRUE(sameLanes(type, got, want, &a, &b)) << describe(type, op);
}

TEST(CudaFunctorTest, EverySupportedPairMatchesTheCpuEngine) {
  Values values(20240607);
  for (DataType type : kAllTypes) {
    std::vector<unsigned char> a;
    std::vector<unsigned char> b;
    values.pairs(type, 200000, &a, &b);
    for (ReduceOp op : kAllOps) {
      if (!isSupported(type, op)) continue;
      SCOPED_TRACE(describe(type, op));
      expectReduceMatchesCpu(type, op, a, b);
    }
  }
}

// float16 and bfloat16: every bit pattern against 48 random partners, both ways round, and
// every pattern against every special value's neighbourhood; bool: all 256 x 256 bytes.
TEST(CudaFunctorTest, SmallTypesExhaustively) {
  std::mt19937_64 rng(7);
  for (DataType type : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<unsigned char> a;
    std::vector<unsigned char> b;
    for (uint32_t x = 0; x < 0x10000u; ++x) {
      for (int k = 0; k < 48; ++k) {
        const auto y = static_cast<uint16_t>(rng());
        const auto xs = static_cast<uint16_t>(x);
        const uint16_t first = k % 2 == 0 ? xs : y;
        const uint16_t second = k % 2 == 0 ? y : xs;
        a.push_back(static_cast<unsigned char>(first & 0xFF));
        a.push_back(static_cast<unsigned char>(first >> 8));
        b.push_back(static_cast<unsigned char>(second & 0xFF));
        b.push_back(static_cast<unsigned char>(second >> 8));
      }
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
      SCOPED_TRACE(describe(type, op));
      expectReduceMatchesCpu(type, op, a, b);
    }
  }
  std::vector<unsigned char> a;
  std::vector<unsigned char> b;
  for (int x = 0; x < 256; ++x) {
    for (int y = 0; y < 256; ++y) {
      a.push_back(static_cast<unsigned char>(x));
      b.push_back(static_cast<unsigned char>(y));
    }
  }
  for (ReduceOp op : kAllOps) {
    if (!isSupported(DataType::kBool, op)) continue;
    SCOPED_TRACE(describe(DataType::kBool, op));
    expectReduceMatchesCpu(DataType::kBool, op, a, b);
  }
}

// A few results spelled out, so that a shared mistake of the functors and the CPU shows.
TEST(CudaFunctorTest, DocumentedCases) {
  EXPECT_EQ(SumOp<Half>{}(Half{0x3C00}, Half{0x1000}).bits, 0x3C00) << "1 + 2^-11: tie to even, down";
  EXPECT_EQ(SumOp<Half>{}(Half{0x3C01}, Half{0x1000}).bits, 0x3C02) << "tie to even, up";
  EXPECT_EQ(SumOp<Half>{}(Half{0x7BFF}, Half{0x4C00}).bits, 0x7C00) << "65504 + 16 = inf";
  EXPECT_EQ(ProductOp<Half>{}(Half{0x0001}, Half{0x3800}).bits, 0x0000) << "2^-25: tie to even = 0";
  EXPECT_EQ(SumOp<BFloat16>{}(BFloat16{0x3F81}, BFloat16{0x3B80}).bits, 0x3F82);
  EXPECT_EQ(MinOp<Half>{}(Half{0x8000}, Half{0x0000}).bits, 0x0000) << "-0 vs +0: in's";
  EXPECT_EQ(MaxOp<Half>{}(Half{0x0000}, Half{0x8000}).bits, 0x8000) << "+0 vs -0: in's";
  EXPECT_EQ(MinOp<Half>{}(Half{0x7E01}, Half{0x7E02}).bits, 0x7E01) << "NaN vs NaN: inout's";
  EXPECT_EQ(MaxOp<Half>{}(Half{0x3C00}, Half{0x7D00}).bits, 0x7F00) << "in's NaN, quieted";
  EXPECT_TRUE(std::isnan(MinOp<float>{}(1.0f, std::nanf(""))));
  EXPECT_EQ(SumOp<int8_t>{}(127, 1), -128);
  EXPECT_EQ(ProductOp<int16_t>{}(-32768, -1), -32768);
  EXPECT_EQ(ProductOp<int64_t>{}(std::numeric_limits<int64_t>::min(), -1), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(SumOp<uint8_t>{}(255, 2), 1);
  EXPECT_EQ(SumOp<Bool>{}(Bool{2}, Bool{0}).byte, 1);
  EXPECT_EQ(BxorOp<Bool>{}(Bool{2}, Bool{1}).byte, 0);
  EXPECT_EQ(BandOp<Bool>{}(Bool{2}, Bool{1}).byte, 1);
  EXPECT_EQ(ScaleOp<int8_t>{2.5}(-51), -127);
  EXPECT_EQ(ScaleOp<int8_t>{3.0}(-51), -128) << "saturates";
  EXPECT_EQ(ScaleOp<uint8_t>{-1.0}(5), 0) << "saturates at 0";
  EXPECT_EQ(ScaleOp<int64_t>{1e300}(1), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(DivideOp<int32_t>(2)(-7), -3) << "toward zero";
  EXPECT_EQ(DivideOp<int32_t>(int64_t{1} << 31)(std::numeric_limits<int32_t>::min()), -1);
  EXPECT_EQ(DivideOp<int64_t>(3)(std::numeric_limits<int64_t>::min()), std::numeric_limits<int64_t>::min() / 3);
  EXPECT_EQ(DivideOp<float>(3)(6.0f), 2.0f);
}

// --- float16/bfloat16 conversions ------------------------------------------------------

// The value of a binary16 / bfloat16 pattern, by arithmetic (not bit manipulation).
double smallFloatValue(uint16_t bits, int mantissaBits, int exponentBits) {
  const int bias = (1 << (exponentBits - 1)) - 1;
  const int exponent = (bits >> mantissaBits) & ((1 << exponentBits) - 1);
  const int mantissa = bits & ((1 << mantissaBits) - 1);
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  if (exponent == (1 << exponentBits) - 1) {
    return mantissa == 0 ? sign * HUGE_VAL : std::nan("");
  }
  if (exponent == 0) {
    return sign * std::ldexp(mantissa, 1 - bias - mantissaBits);
  }
  return sign * std::ldexp(mantissa + (1 << mantissaBits), exponent - bias - mantissaBits);
}

TEST(CudaFunctorTest, DecodingEveryPatternIsExact) {
  for (uint32_t x = 0; x < 0x10000u; ++x) {
    const auto bits = static_cast<uint16_t>(x);
    for (const auto& [name, decoded, value] :
         {std::tuple<const char*, float, double>{"float16", halfToFloat(bits), smallFloatValue(bits, 10, 5)},
          std::tuple<const char*, float, double>{"bfloat16", bfloat16ToFloat(bits), smallFloatValue(bits, 7, 8)}}) {
      if (std::isnan(value)) {
        ASSERT_TRUE(std::isnan(decoded)) << name << " 0x" << std::hex << x;
        continue;
      }
      ASSERT_EQ(static_cast<double>(decoded), value) << name << " 0x" << std::hex << x;
      ASSERT_EQ(std::signbit(decoded), (x & 0x8000u) != 0) << name << " 0x" << std::hex << x;
    }
    // NaN payloads survive decoding (the top of the float's mantissa).
    if ((x & 0x7C00u) == 0x7C00u && (x & 0x3FFu) != 0) {
      ASSERT_EQ(floatBits(halfToFloat(bits)), ((x & 0x8000u) << 16) | 0x7F800000u | ((x & 0x3FFu) << 13));
    }
    // Encoding a decoded value gives it back (NaN: quieted).
    const bool halfNan = (x & 0x7C00u) == 0x7C00u && (x & 0x3FFu) != 0;
    ASSERT_EQ(floatToHalf(halfToFloat(bits)), halfNan ? (x | 0x200u) : x) << std::hex << x;
    const bool bfloatNan = (x & 0x7F80u) == 0x7F80u && (x & 0x7Fu) != 0;
    ASSERT_EQ(floatToBFloat16(bfloat16ToFloat(bits)), bfloatNan ? (x | 0x40u) : x) << std::hex << x;
  }
}

// Floats that probe float32 -> float16/bfloat16 rounding: for every exponent, both signs and
// every rounding position, the exact ties, one ulp either side, with random high bits; plus
// random floats.
std::vector<uint32_t> roundingProbes() {
  std::mt19937_64 rng(11);
  std::vector<uint32_t> out;
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (int position = 0; position < 23; ++position) {
        for (int r = 0; r < 4; ++r) {
          // High mantissa bits random, bit `position` set, lower bits clear: a tie when
          // `position` is the first dropped bit; +-1 around it.
          const uint32_t high = static_cast<uint32_t>(rng()) & ~((2u << position) - 1u) & 0x7FFFFFu;
          const uint32_t tie = sign | (exponent << 23) | high | (1u << position);
          out.push_back(tie);
          out.push_back(tie + 1u);
          out.push_back(tie - 1u);
        }
      }
    }
  }
  for (int i = 0; i < 1000000; ++i) {
    out.push_back(static_cast<uint32_t>(rng()));
  }
  for (uint32_t bits : {0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x38800000u, 0x387FFFFFu, 0x33000000u, 0x33000001u,
                        0x32FFFFFFu, 0x7F7FFFFFu, 0x7F7F7FFFu, 0x7F7F8000u, 0x00000001u, 0x007FFFFFu}) {
    out.push_back(bits);
    out.push_back(bits | 0x80000000u);
  }
  return out;
}

// The CPU engine's float32 -> float16/bfloat16 rounding, reached through scale(): a 1.0
// element times factor f is f, rounded once from double to float32 (exact for a float f)
// and once to the element type.
uint16_t cpuRound(DataType type, float f) {
  uint16_t one = type == DataType::kFloat16 ? 0x3C00 : 0x3F80;
  algorithms::scale(&one, 1, type, static_cast<double>(f));
  return one;
}

TEST(CudaFunctorTest, EncodingRoundsLikeTheCpuEngine) {
  size_t wrong = 0;
  for (uint32_t bits : roundingProbes()) {
    const float f = floatFromBits(bits);
    const uint16_t half = floatToHalf(f);
    const uint16_t bfloat = floatToBFloat16(f);
    if (half != cpuRound(DataType::kFloat16, f) && ++wrong < 10) {
      ADD_FAILURE() << "float16 of 0x" << std::hex << bits << ": 0x" << half << ", CPU 0x"
                    << cpuRound(DataType::kFloat16, f);
    }
    if (bfloat != cpuRound(DataType::kBFloat16, f) && ++wrong < 10) {
      ADD_FAILURE() << "bfloat16 of 0x" << std::hex << bits << ": 0x" << bfloat << ", CPU 0x"
                    << cpuRound(DataType::kBFloat16, f);
    }
  }
  EXPECT_EQ(wrong, 0u);
}

// --- scale and divide against the CPU engine -------------------------------------------

TEST(CudaFunctorTest, ScaleMatchesTheCpuEngine) {
  Values values(99);
  const double factors[] = {0.0,  -0.0,    1.0,     -1.0,   0.5,    2.0,     3.0,      1.0 / 3.0,
                            1e-3, 1e300,   -1e300,  1e-300, 65504., 65520.,  0x1p31,   0x1p63,
                            -0x1p63, 0x1p-24, 1e-45, 0.1,   7.25,   -123.456, HUGE_VAL, -HUGE_VAL,
                            std::nan("")};
  std::mt19937_64& rng = values.rng();
  std::vector<double> all(std::begin(factors), std::end(factors));
  for (int i = 0; i < 16; ++i) {
    all.push_back(std::ldexp(std::uniform_real_distribution<double>(-1.0, 1.0)(rng), static_cast<int>(rng() % 80) - 40));
  }
  for (DataType type : kAllTypes) {
    const std::vector<unsigned char> data = values.singles(type, 20000);
    for (double factor : all) {
      SCOPED_TRACE(std::string(dataTypeName(type)) + " * " + std::to_string(factor));
      std::vector<unsigned char> got = data;
      ApplyTransform apply{&got};
      const bool accepted = visitScale(type, factor, apply);
      std::vector<unsigned char> want = data;
      bool cpuAccepted = true;
      try {
        algorithms::scale(want.data(), elementsOf(type, want), type, factor);
      } catch (const InvalidArgument&) {
        cpuAccepted = false;
      }
      ASSERT_EQ(accepted, cpuAccepted);
      if (accepted) {
        EXPECT_EQ(apply.lanesSeen, Values::isComplexType(type) ? 2u : 1u);
        EXPECT_TRUE(sameLanes(type, got, want, &data, nullptr));
      }
    }
  }
}

TEST(CudaFunctorTest, DivideMatchesTheCpuEngine) {
  Values values(123);
  const int64_t divisors[] = {1,
                              2,
                              3,
                              7,
                              8,
                              1000,
                              (int64_t{1} << 24) - 1,
                              int64_t{1} << 24,
                              (int64_t{1} << 24) + 1,
                              (int64_t{1} << 31) - 1,
                              int64_t{1} << 31,
                              int64_t{1} << 40,
                              std::numeric_limits<int64_t>::max(),
                              0,
                              -1,
                              std::numeric_limits<int64_t>::min()};
  for (DataType type : kAllTypes) {
    const std::vector<unsigned char> data = values.singles(type, 20000);
    for (int64_t divisor : divisors) {
      SCOPED_TRACE(std::string(dataTypeName(type)) + " / " + std::to_string(divisor));
      std::vector<unsigned char> got = data;
      ApplyTransform apply{&got};
      const bool accepted = visitDivide(type, divisor, apply);
      std::vector<unsigned char> want = data;
      bool cpuAccepted = true;
      try {
        algorithms::divide(want.data(), elementsOf(type, want), type, divisor);
      } catch (const InvalidArgument&) {
        cpuAccepted = false;
      }
      ASSERT_EQ(accepted, cpuAccepted);
      if (accepted) {
        EXPECT_TRUE(sameLanes(type, got, want, &data, nullptr));
      }
    }
  }
}

// Sums of integer values divide exactly: the AVG of 1..n ranks' small integers.
TEST(CudaFunctorTest, AverageOfIntegerValuedSumsIsExact) {
  for (int ranks = 1; ranks <= 8; ++ranks) {
    for (int sum = -1000; sum <= 1000; ++sum) {
      if (sum % ranks != 0) continue;
      const auto expected = static_cast<float>(sum / ranks);
      EXPECT_EQ(DivideOp<float>(ranks)(static_cast<float>(sum)), expected);
      EXPECT_EQ(halfToFloat(DivideOp<Half>(ranks)(Half{floatToHalf(static_cast<float>(sum))}).bits), expected);
      EXPECT_EQ(DivideOp<double>(ranks)(static_cast<double>(sum)), static_cast<double>(sum / ranks));
    }
  }
}

}  // namespace
}  // namespace ringtree::gpu
