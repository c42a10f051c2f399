#pragma once

// The per-element functions of ringtree's CUDA reduction kernels (reduce_kernels.cu).
//
// This header is compiled twice: by nvcc for the kernels, and by a plain C++ compiler for
// the host tests that check every functor against the CPU engine
// (tests/cpp/cuda_functors_test.cc). Everything CUDA-specific is behind `#ifdef
// __CUDACC__` (or `__CUDA_ARCH__` inside a function), so the header needs no CUDA header
// in a host build, and host and device run the same code.
//
// Semantics are the CPU engine's (src/cpp/algorithms/reduce_ops.h), bit for bit, NaN
// payloads included:
//  - float32/float64: IEEE arithmetic in the element type, rounded to nearest even. The
//    kernels are compiled without fast math (no flush to zero, IEEE division).
//  - float16/bfloat16: widened to float32 exactly, combined in float32, rounded back once
//    to nearest even (overflow to +-inf, subnormals kept, NaN quieted keeping the top of its
//    payload). The conversions below work on bit patterns, with integer arithmetic only.
//  - MIN/MAX on floating types: NaN if either element is NaN (inout's when inout is NaN,
//    else in's); equal elements, -0 and +0 included, give in's element.
//  - Integers wrap (two's complement) on SUM and PRODUCT.
//  - bool: a byte is true when non-zero, results are 0 or 1; SUM, MAX and BOR are OR;
//    PRODUCT, MIN and BAND are AND; BXOR is XOR.
//  - complex64/complex128: SUM (so AVG and PREMUL_SUM), scale and divide work on the real
//    and imaginary parts as two float32/float64 lanes.
//  - scale (PREMUL_SUM) and divide (AVG): see ScaleOp and DivideOp.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <ringtree/types.h>

#if defined(__CUDACC__)
#define RINGTREE_HOST_DEVICE __host__ __device__
#else
#define RINGTREE_HOST_DEVICE
#endif

namespace ringtree::gpu {

// --- Storage types ----------------------------------------------------------------------

// Storage of the element types that have no C++ arithmetic type of their own: distinct
// types, so that functors templated on the storage type tell them apart.
struct Half {
  uint16_t bits;  // IEEE binary16
};
struct BFloat16 {
  uint16_t bits;  // the top half of a float32
};
struct Bool {
  uint8_t byte;  // true when non-zero
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2 && sizeof(Bool) == 1,
              "storage types must have the size of the elements they hold");

// --- Bit casts and float16/bfloat16 conversions ------------------------------------------

RINGTREE_HOST_DEVICE inline uint32_t floatBits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

RINGTREE_HOST_DEVICE inline float floatFromBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

// binary16 -> float32, exact. Infinities stay infinite; a NaN keeps its payload (the float
// has the half's mantissa in its top bits); subnormals become normal float32 values.
RINGTREE_HOST_DEVICE inline float halfToFloat(uint16_t half) {
#if defined(__CUDA_ARCH__)
  // The device converts in one instruction, exactly (IEEE); NaNs keep the software path,
  // whose payload rule the CPU engine shares.
  if ((half & 0x7C00u) != 0x7C00u || (half & 0x3FFu) == 0) {
    float converted;
    asm("cvt.f32.f16 %0, %1;" : "=f"(converted) : "h"(half));
    return converted;
  }
#endif
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  uint32_t exponent = (half >> 10) & 0x1Fu;
  uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0x1Fu) {
    return floatFromBits(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) {
      return floatFromBits(sign);
    }
    // Subnormal: mantissa * 2^-24. Shift the leading one up to the implicit bit (bit 10);
    // the half's exponent field then reads 1 - shifts.
    exponent = 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;  // wraps below zero; the sum below brings it back in range
    }
    mantissa &= 0x3FFu;
  }
  return floatFromBits(sign | ((exponent + (127u - 15u)) << 23) | (mantissa << 13));
}

// float32 -> binary16, rounded to nearest even. Magnitudes from 65520 up (and infinities)
// give +-inf; results below 2^-14 are subnormal or zero, rounded at 2^-24; a NaN becomes a
// quiet NaN with the float's sign and the top 10 bits of its mantissa.
RINGTREE_HOST_DEVICE inline uint16_t floatToHalf(float value) {
  const uint32_t bits = floatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
#if defined(__CUDA_ARCH__)
  // Round to nearest even, overflow to infinity, subnormal results: IEEE's rounding, which
  // the software path below computes too (the two agree on every non-NaN float).
  uint16_t converted;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(converted) : "f"(value));
  return converted;
#endif
  if (magnitude >= 0x477FF000u) {  // >= 65520 = 65504 + half an ulp: rounds to infinity
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (magnitude >= 0x38800000u) {  // >= 2^-14: normal in binary16
    // Rebias the exponent, then round away the 13 low bits: adding 0xFFF plus the lowest
    // kept bit carries exactly when the dropped part is above half, or half with an odd
    // kept part. A carry out of the mantissa steps the exponent, as it should.
    const uint32_t rebiased = magnitude - ((127u - 15u) << 23);
    const uint32_t odd = (magnitude >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((rebiased + 0xFFFu + odd) >> 13));
  }
  // Below 2^-14: the result counts units of 2^-24. The value is significand * 2^(e - 150)
  // with e the float's exponent field (significand with its implicit bit), so the count is
  // significand >> (126 - e) before rounding. Float32 subnormals (e = 0) and everything
  // below 2^-25 round to zero.
  const uint32_t e = magnitude >> 23;
  const uint32_t shift = 126u - e;  // 14 (just below 2^-14) and up
  if (e == 0 || shift > 24u) {
    return static_cast<uint16_t>(sign);
  }
  const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  uint32_t units = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t halfUnit = 1u << (shift - 1u);
  if (rest > halfUnit || (rest == halfUnit && (units & 1u) != 0)) {
    ++units;  // may reach 0x400: the smallest normal, which is the right encoding
  }
  return static_cast<uint16_t>(sign | units);
}

// bfloat16 -> float32, exact (the bfloat16 is the float's top half).
RINGTREE_HOST_DEVICE inline float bfloat16ToFloat(uint16_t value) {
  return floatFromBits(static_cast<uint32_t>(value) << 16);
}

// float32 -> bfloat16, rounded to nearest even (subnormals included); overflow gives
// +-inf; a NaN becomes a quiet NaN keeping the sign and the top 7 bits of its mantissa.
RINGTREE_HOST_DEVICE inline uint16_t floatToBFloat16(float value) {
  const uint32_t bits = floatBits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when the
  // dropped half is above 0x8000, or equal to it with an odd kept half. The largest finite
  // floats carry into the exponent's all-ones pattern: infinity.
  const uint32_t odd = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + odd) >> 16);
}

// --- Elements: storage <-> the type they are combined in ----------------------------------

// Element<T>::Acc is the type T's elements are combined in; load widens a stored element
// to it (exactly), store rounds a combined value back (float16/bfloat16: to nearest even;
// bool: to 0 or 1).
template <typename T>
struct Element {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>,
                "plain elements are C++ integer or floating types; bool is stored as Bool");
  using Acc = T;
  RINGTREE_HOST_DEVICE static T load(T stored) { return stored; }
  RINGTREE_HOST_DEVICE static T store(T value) { return value; }
};

template <>
struct Element<Half> {
  using Acc = float;
  RINGTREE_HOST_DEVICE static float load(Half stored) { return halfToFloat(stored.bits); }
  RINGTREE_HOST_DEVICE static Half store(float value) { return Half{floatToHalf(value)}; }
};

template <>
struct Element<BFloat16> {
  using Acc = float;
  RINGTREE_HOST_DEVICE static float load(BFloat16 stored) { return bfloat16ToFloat(stored.bits); }
  RINGTREE_HOST_DEVICE static BFloat16 store(float value) { return BFloat16{floatToBFloat16(value)}; }
};

template <>
struct Element<Bool> {
  using Acc = bool;
  RINGTREE_HOST_DEVICE static bool load(Bool stored) { return stored.byte != 0; }
  RINGTREE_HOST_DEVICE static Bool store(bool value) { return Bool{static_cast<uint8_t>(value)}; }
};

// The range of the integer element types (usable in device code, unlike numeric_limits
// without relaxed constexpr).
template <typename T>
struct IntRange;
template <>
struct IntRange<int8_t> {
  static constexpr int8_t kMin = -128;
  static constexpr int8_t kMax = 127;
};
template <>
struct IntRange<uint8_t> {
  static constexpr uint8_t kMin = 0;
  static constexpr uint8_t kMax = 255;
};
template <>
struct IntRange<int16_t> {
  static constexpr int16_t kMin = -32768;
  static constexpr int16_t kMax = 32767;
};
template <>
struct IntRange<int32_t> {
  static constexpr int32_t kMin = -2147483647 - 1;
  static constexpr int32_t kMax = 2147483647;
};
template <>
struct IntRange<int64_t> {
  static constexpr int64_t kMin = -9223372036854775807LL - 1;
  static constexpr int64_t kMax = 9223372036854775807LL;
};

// --- The reduction functors --------------------------------------------------------------

// The unsigned type in which integer T wraps without undefined behaviour: at least
// unsigned int, so that narrow operands are not promoted to (signed) int.
template <typename T>
using WrapType = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <typename A>
RINGTREE_HOST_DEVICE inline bool isNan(A a) {
  if constexpr (std::is_floating_point_v<A>) {
    return a != a;
  } else {
    return false;
  }
}

// a (op) b on combined values (Element<T>::Acc), for kOp among SUM, PRODUCT, MIN, MAX,
// BAND, BOR, BXOR. Bitwise ops do not compile for floating types.
template <ReduceOp kOp, typename A>
RINGTREE_HOST_DEVICE inline A combine(A a, A b) {
  if constexpr (std::is_same_v<A, bool>) {
    if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kMax || kOp == ReduceOp::kBor) {
      return a || b;
    } else if constexpr (kOp == ReduceOp::kBxor) {
      return a != b;
    } else {
      static_assert(kOp == ReduceOp::kProduct || kOp == ReduceOp::kMin || kOp == ReduceOp::kBand,
                    "not a reduction of bool");
      return a && b;
    }
  } else if constexpr (kOp == ReduceOp::kSum) {
    if constexpr (std::is_integral_v<A>) {
      return static_cast<A>(static_cast<WrapType<A>>(a) + static_cast<WrapType<A>>(b));
    } else {
      return a + b;
    }
  } else if constexpr (kOp == ReduceOp::kProduct) {
    if constexpr (std::is_integral_v<A>) {
      return static_cast<A>(static_cast<WrapType<A>>(a) * static_cast<WrapType<A>>(b));
    } else {
      return a * b;
    }
  } else if constexpr (kOp == ReduceOp::kMin) {
    return isNan(a) ? a : (a < b ? a : b);
  } else if constexpr (kOp == ReduceOp::kMax) {
    return isNan(a) ? a : (a > b ? a : b);
  } else {
    static_assert(std::is_integral_v<A>, "bitwise reductions are defined on integers and bool only");
    if constexpr (kOp == ReduceOp::kBand) {
      return static_cast<A>(a & b);
    } else if constexpr (kOp == ReduceOp::kBor) {
      return static_cast<A>(a | b);
    } else {
      static_assert(kOp == ReduceOp::kBxor, "not an element-wise reduction");
      return static_cast<A>(a ^ b);
    }
  }
}

// The functor of one op on elements stored as T: f(inout, in) is the new inout element.
// Pure, no state: default-construct it anywhere, on the host or on the device.
template <ReduceOp kOp, typename T>
struct CombineOp {
  using Storage = T;
  RINGTREE_HOST_DEVICE T operator()(T inout, T in) const {
    using E = Element<T>;
    return E::store(combine<kOp>(E::load(inout), E::load(in)));
  }
};

template <typename T>
using SumOp = CombineOp<ReduceOp::kSum, T>;
template <typename T>
using ProductOp = CombineOp<ReduceOp::kProduct, T>;
template <typename T>
using MinOp = CombineOp<ReduceOp::kMin, T>;
template <typename T>
using MaxOp = CombineOp<ReduceOp::kMax, T>;
template <typename T>
using BandOp = CombineOp<ReduceOp::kBand, T>;
template <typename T>
using BorOp = CombineOp<ReduceOp::kBor, T>;
template <typename T>
using BxorOp = CombineOp<ReduceOp::kBxor, T>;

// --- scale (PREMUL_SUM) and divide (AVG) -------------------------------------------------

// double -> integer T: truncated toward zero, saturated to T's range. x must not be NaN.
template <typename T>
RINGTREE_HOST_DEVICE inline T truncateSaturated(double x) {
  if (x >= static_cast<double>(IntRange<T>::kMax)) {
    return IntRange<T>::kMax;
  }
  if (x <= static_cast<double>(IntRange<T>::kMin)) {
    return IntRange<T>::kMin;
  }
  return static_cast<T>(x);
}

// x -> x * factor, the CPU engine's scale() on one element (lane):
//  - floating types: the product of the widened element and factor in double, rounded to
//    Acc (float16/bfloat16 by way of float32: two roundings, as the CPU does);
//  - integer types: the double product truncated toward zero and saturated to the type's
//    range (exact while |x * factor| < 2^53). factor must be finite (visitScale refuses
//    others, as scale() throws).
// Not defined on bool.
template <typename T>
struct ScaleOp {
  using Storage = T;
  double factor;

  RINGTREE_HOST_DEVICE T operator()(T x) const {
    using E = Element<T>;
    using Acc = typename E::Acc;
    static_assert(!std::is_same_v<Acc, bool>, "bool has no PREMUL_SUM");
    if constexpr (std::is_integral_v<Acc>) {
      return truncateSaturated<T>(static_cast<double>(x) * factor);
    } else {
      return E::store(static_cast<Acc>(static_cast<double>(E::load(x)) * factor));
    }
  }
};

// x -> x / divisor, the CPU engine's divide() on one element (lane); divisor > 0 (the
// number of ranks):
//  - float32 (float16/bfloat16 by way of float32): a float32 division when divisor < 2^24
//    (exact in float32, so the quotient is correctly rounded), else a double division
//    rounded to float32;
//  - float64: a double division;
//  - integer types: division truncated toward zero (in 32 bits when both fit, which gives
//    the same quotient faster on the device).
// A division, not a multiplication by 1/divisor: a sum of integer values divides exactly
// whenever the quotient is representable. Not defined on bool. Construct on the host.
template <typename T>
struct DivideOp {
  using Storage = T;
  using Acc = typename Element<T>::Acc;
  static_assert(!std::is_same_v<Acc, bool>, "bool has no AVG");

  int64_t divisor;
  double divisorDouble;
  float divisorFloat;
  bool narrow;  // float32 division / 32-bit integer division

  explicit DivideOp(int64_t d)
      : divisor(d),
        divisorDouble(static_cast<double>(d)),
        divisorFloat(static_cast<float>(d)),
        narrow(std::is_integral_v<Acc> ? (sizeof(T) <= 4 && d <= IntRange<int32_t>::kMax)
                                       : (std::is_same_v<Acc, float> && d < (int64_t{1} << 24))) {}

  RINGTREE_HOST_DEVICE T operator()(T x) const {
    using E = Element<T>;
    if constexpr (std::is_integral_v<Acc>) {
      if constexpr (sizeof(T) <= 4) {
        if (narrow) {
          return static_cast<T>(static_cast<int32_t>(x) / static_cast<int32_t>(divisor));
        }
      }
      return static_cast<T>(static_cast<int64_t>(x) / divisor);
    } else if constexpr (std::is_same_v<Acc, float>) {
      const float value = E::load(x);
      if (narrow) {
        return E::store(value / divisorFloat);
      }
      return E::store(static_cast<float>(static_cast<double>(value) / divisorDouble));
    } else {
      return E::store(E::load(x) / divisorDouble);
    }
  }
};

// --- Which functor serves a (type, op) ---------------------------------------------------

// Whether op is defined on type: ringtree::isSupported's rules (src/cpp/types.cc), restated
// here because the CUDA library does not link the core. False outside either enum.
inline bool isDefined(DataType type, ReduceOp op) {
  if (static_cast<int>(type) >= kNumDataTypes) {
    return false;
  }
  const bool complexType = type == DataType::kComplex64 || type == DataType::kComplex128;
  const bool integerType = type == DataType::kInt8 || type == DataType::kUInt8 || type == DataType::kInt16 ||
                           type == DataType::kInt32 || type == DataType::kInt64;
  switch (op) {
    case ReduceOp::kSum:
      return true;
    case ReduceOp::kAvg:
    case ReduceOp::kPremulSum:
      return type != DataType::kBool;
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return !complexType;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return integerType || type == DataType::kBool;
  }
  return false;
}

namespace detail {

template <typename T, class Visitor>
bool visitCombine(ReduceOp op, Visitor& visit) {
  switch (op) {
    case ReduceOp::kSum:
      visit(SumOp<T>{}, size_t{1});
      return true;
    case ReduceOp::kProduct:
      visit(ProductOp<T>{}, size_t{1});
      return true;
    case ReduceOp::kMin:
      visit(MinOp<T>{}, size_t{1});
      return true;
    case ReduceOp::kMax:
      visit(MaxOp<T>{}, size_t{1});
      return true;
    default:
      break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case ReduceOp::kBand:
        visit(BandOp<T>{}, size_t{1});
        return true;
      case ReduceOp::kBor:
        visit(BorOp<T>{}, size_t{1});
        return true;
      case ReduceOp::kBxor:
        visit(BxorOp<T>{}, size_t{1});
        return true;
      default:
        break;
    }
  }
  return false;
}

}  // namespace detail

// Calls visit(functor, lanes) with the functor that computes inout = inout (op) in on
// elements of `type`, where every element is `lanes` consecutive Storage values (2 for the
// complex types, else 1), and returns true; returns false, calling nothing, when
// !isDefined(type, op). AVG and PREMUL_SUM get the SUM functor (the caller divides after, or
// scales before), as the CPU engine's reduceFunction does. bool's ops that are the same
// function share one functor (SUM, MAX, BOR: OR; PRODUCT, MIN, BAND: AND), so the kernels
// are instantiated once for each. Host only; the kernels and the host tests both dispatch
// through it.
template <class Visitor>
bool visitReduce(DataType type, ReduceOp op, Visitor&& visit) {
  if (!isDefined(type, op)) {
    return false;
  }
  if (op == ReduceOp::kAvg || op == ReduceOp::kPremulSum) {
    op = ReduceOp::kSum;
  }
  switch (type) {
    case DataType::kFloat16:
      return detail::visitCombine<Half>(op, visit);
    case DataType::kBFloat16:
      return detail::visitCombine<BFloat16>(op, visit);
    case DataType::kFloat32:
      return detail::visitCombine<float>(op, visit);
    case DataType::kFloat64:
      return detail::visitCombine<double>(op, visit);
    case DataType::kInt8:
      return detail::visitCombine<int8_t>(op, visit);
    case DataType::kUInt8:
      return detail::visitCombine<uint8_t>(op, visit);
    case DataType::kInt16:
      return detail::visitCombine<int16_t>(op, visit);
    case DataType::kInt32:
      return detail::visitCombine<int32_t>(op, visit);
    case DataType::kInt64:
      return detail::visitCombine<int64_t>(op, visit);
    case DataType::kBool:
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMax:
        case ReduceOp::kBor:
          visit(SumOp<Bool>{}, size_t{1});
          return true;
        case ReduceOp::kProduct:
        case ReduceOp::kMin:
        case ReduceOp::kBand:
          visit(ProductOp<Bool>{}, size_t{1});
          return true;
        case ReduceOp::kBxor:
          visit(BxorOp<Bool>{}, size_t{1});
          return true;
        default:
          return false;
      }
    case DataType::kComplex64:
      visit(SumOp<float>{}, size_t{2});
      return true;
    case DataType::kComplex128:
      visit(SumOp<double>{}, size_t{2});
      return true;
  }
  return false;
}

// Calls visit(ScaleOp<T>{factor}, lanes) for elements of `type` and returns true; false,
// calling nothing, where the CPU engine's scale() throws: bool, a type outside the enum, or
// a non-finite factor on an integer type. Host only.
template <class Visitor>
bool visitScale(DataType type, double factor, Visitor&& visit) {
  switch (type) {
    case DataType::kFloat16:
      visit(ScaleOp<Half>{factor}, size_t{1});
      return true;
    case DataType::kBFloat16:
      visit(ScaleOp<BFloat16>{factor}, size_t{1});
      return true;
    case DataType::kFloat32:
      visit(ScaleOp<float>{factor}, size_t{1});
      return true;
    case DataType::kFloat64:
      visit(ScaleOp<double>{factor}, size_t{1});
      return true;
    case DataType::kComplex64:
      visit(ScaleOp<float>{factor}, size_t{2});
      return true;
    case DataType::kComplex128:
      visit(ScaleOp<double>{factor}, size_t{2});
      return true;
    default:
      break;
  }
  if (!std::isfinite(factor)) {
    return false;  // integer types need a finite factor; bool and others fail below anyway
  }
  switch (type) {
    case DataType::kInt8:
      visit(ScaleOp<int8_t>{factor}, size_t{1});
      return true;
    case DataType::kUInt8:
      visit(ScaleOp<uint8_t>{factor}, size_t{1});
      return true;
    case DataType::kInt16:
      visit(ScaleOp<int16_t>{factor}, size_t{1});
      return true;
    case DataType::kInt32:
      visit(ScaleOp<int32_t>{factor}, size_t{1});
      return true;
    case DataType::kInt64:
      visit(ScaleOp<int64_t>{factor}, size_t{1});
      return true;
    default:
      return false;  // bool, or outside the enum
  }
}

// Calls visit(DivideOp<T>(divisor), lanes) for elements of `type` and returns true; false,
// calling nothing, where the CPU engine's divide() throws: divisor <= 0, bool, or a type
// outside the enum. Host only.
template <class Visitor>
bool visitDivide(DataType type, int64_t divisor, Visitor&& visit) {
  if (divisor <= 0) {
    return false;
  }
  switch (type) {
    case DataType::kFloat16:
      visit(DivideOp<Half>(divisor), size_t{1});
      return true;
    case DataType::kBFloat16:
      visit(DivideOp<BFloat16>(divisor), size_t{1});
      return true;
    case DataType::kFloat32:
      visit(DivideOp<float>(divisor), size_t{1});
      return true;
    case DataType::kFloat64:
      visit(DivideOp<double>(divisor), size_t{1});
      return true;
    case DataType::kComplex64:
      visit(DivideOp<float>(divisor), size_t{2});
      return true;
    case DataType::kComplex128:
      visit(DivideOp<double>(divisor), size_t{2});
      return true;
    case DataType::kInt8:
      visit(DivideOp<int8_t>(divisor), size_t{1});
      return true;
    case DataType::kUInt8:
      visit(DivideOp<uint8_t>(divisor), size_t{1});
      return true;
    case DataType::kInt16:
      visit(DivideOp<int16_t>(divisor), size_t{1});
      return true;
    case DataType::kInt32:
      visit(DivideOp<int32_t>(divisor), size_t{1});
      return true;
    case DataType::kInt64:
      visit(DivideOp<int64_t>(divisor), size_t{1});
      return true;
    case DataType::kBool:
      return false;
  }
  return false;
}

#if defined(__CUDACC__)
// The kernels' launchers (reduce_kernels.cu), behind RingtreeGpuApi's reduce, scale and
// divide (gpu_api.h). They enqueue on `stream` and return at once: cudaSuccess, the launch's
// error, or cudaErrorInvalidValue for a pair visitReduce/visitScale/visitDivide refuses,
// a dataType or reduceOp outside its enum, or a pointer not aligned to its element's
// storage (lane) size. count == 0 launches nothing (pointers may then be null) once the
// arguments are valid. `inout` and `in` must not overlap.
cudaError_t launchReduce(void* inout, const void* in, size_t count, int dataType, int reduceOp,
                         cudaStream_t stream);
cudaError_t launchScale(void* data, size_t count, int dataType, double factor, cudaStream_t stream);
cudaError_t launchDivide(void* data, size_t count, int dataType, int64_t divisor, cudaStream_t stream);
#endif

}  // namespace ringtree::gpu
