#pragma once

// Internal to reduce_ops.cc and reduce_ops_<isa>.cc: the table every instruction-set variant
// fills, the portable kernels and the loop shared by the vector kernels. (benchmarks/
// reduce_bench.cc also instantiates the portable kernels, unvectorised, as its scalar
// reference.)
//
// reduce_ops_<isa>.cc are compiled with their own -m flags and include this header, so
// everything defined here lives in an unnamed namespace: each file gets its own copy,
// compiled for its instruction set, and the linker can never hand an AVX-512 copy of a
// template to a caller in baseline code (as it could pick any one copy of an inline
// function with external linkage). For the same reason those files call nothing from the
// standard library but memcpy.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <ringtree/types.h>

#include "common/reduce_fn.h"

namespace ringtree::algorithms {

// The kernels of one instruction-set variant, indexed [DataType][ReduceOp]; nullptr where
// the op is not defined on the type. Fillers leave AVG and PREMUL_SUM null: reduce_ops.cc
// points them at SUM.
struct ReduceTable {
  ReduceFn fn[kNumDataTypes][kNumReduceOps];
};

#if defined(RINGTREE_REDUCE_X86)
// Fill table with the kernels of reduce_ops_avx2.cc / reduce_ops_avx512.cc. Call only on
// a CPU with those instructions.
void fillAvx2Kernels(ReduceTable& table);
void fillAvx512Kernels(ReduceTable& table);
#endif

namespace {

inline void setKernel(ReduceTable& table, DataType type, ReduceOp op, ReduceFn fn) {
  table.fn[static_cast<int>(type)][static_cast<int>(op)] = fn;
}

inline uint32_t floatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float bitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// IEEE binary16 -> float32, exact; a NaN keeps its payload.
inline float halfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1Fu;
  const uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0x1Fu) {
    return bitsToFloat(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    return bitsToFloat(sign | floatBits(static_cast<float>(mantissa) * 0x1p-24f));
  }
  return bitsToFloat(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

// float32 -> IEEE binary16, round to nearest even; overflow gives +-inf; a NaN is quieted
// and keeps the top of its payload (as vcvtps2ph with imm8 = 0).
inline uint16_t floatToHalf(float value) {
  const uint32_t bits = floatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
  if (magnitude >= 0x477FF000u) {  // >= 65520: rounds to infinity
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (magnitude < 0x38800000u) {  // < 2^-14: zero or subnormal in binary16
    // ulp(0.5f) = 2^-24, the binary16 subnormal step: the float addition rounds there.
    const float aligned = bitsToFloat(magnitude) + 0.5f;
    return static_cast<uint16_t>(sign | (floatBits(aligned) - floatBits(0.5f)));
  }
  const uint32_t odd = (magnitude >> 13) & 1u;
  const uint32_t rebiased = magnitude - ((127u - 15u) << 23);
  return static_cast<uint16_t>(sign | ((rebiased + 0xFFFu + odd) >> 13));
}

inline float bfloat16ToFloat(uint16_t value) {
  return bitsToFloat(static_cast<uint32_t>(value) << 16);
}

// float32 -> bfloat16, round to nearest even (subnormals included); overflow gives +-inf;
// a NaN is quieted and keeps the top of its payload.
inline uint16_t floatToBFloat16(float value) {
  const uint32_t bits = floatBits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// How an element is stored (Storage) and combined (Value).
template <typename T>
struct PlainCodec {
  using Storage = T;
  using Value = T;
  static T decode(T stored) { return stored; }
  static T encode(T value) { return value; }
};

struct HalfCodec {
  using Storage = uint16_t;
  using Value = float;
  static float decode(uint16_t stored) { return halfToFloat(stored); }
  static uint16_t encode(float value) { return floatToHalf(value); }
};

struct BFloat16Codec {
  using Storage = uint16_t;
  using Value = float;
  static float decode(uint16_t stored) { return bfloat16ToFloat(stored); }
  static uint16_t encode(float value) { return floatToBFloat16(value); }
};

struct BoolCodec {
  using Storage = uint8_t;
  using Value = bool;
  static bool decode(uint8_t stored) { return stored != 0; }
  static uint8_t encode(bool value) { return static_cast<uint8_t>(value); }
};

// Unsigned type in which T's SUM and PRODUCT wrap without undefined behaviour (at least
// unsigned int, so that uint16_t operands are not promoted to signed int).
template <typename T>
using WrapType = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

// a (op) b on one element; the semantics reduce_ops.h documents.
template <ReduceOp kOp, typename T>
T combine(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kMax || kOp == ReduceOp::kBor) {
      return a || b;
    } else if constexpr (kOp == ReduceOp::kBxor) {
      return a != b;
    } else {
      static_assert(kOp == ReduceOp::kProduct || kOp == ReduceOp::kMin || kOp == ReduceOp::kBand);
      return a && b;
    }
  } else if constexpr (kOp == ReduceOp::kSum) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
    } else {
      return a + b;
    }
  } else if constexpr (kOp == ReduceOp::kProduct) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b));
    } else {
      return a * b;
    }
  } else if constexpr (kOp == ReduceOp::kMin) {
    return a != a ? a : (a < b ? a : b);  // a != a: NaN
  } else if constexpr (kOp == ReduceOp::kMax) {
    return a != a ? a : (a > b ? a : b);
  } else if constexpr (kOp == ReduceOp::kBand) {
    return a & b;
  } else if constexpr (kOp == ReduceOp::kBor) {
    return a | b;
  } else {
    static_assert(kOp == ReduceOp::kBxor);
    return a ^ b;
  }
}

// The portable kernel: one element at a time, left to the compiler to vectorise. Elements
// are accessed through memcpy, so any alignment is fine.
template <class Codec, ReduceOp kOp>
void portableKernel(void* inout, const void* in, size_t count) {
  using Storage = typename Codec::Storage;
  auto* __restrict a = static_cast<unsigned char*>(inout);
  const auto* __restrict b = static_cast<const unsigned char*>(in);
  for (size_t i = 0; i < count; ++i) {
    Storage x;
    Storage y;
    std::memcpy(&x, a + i * sizeof(Storage), sizeof(Storage));
    std::memcpy(&y, b + i * sizeof(Storage), sizeof(Storage));
    const Storage result = Codec::encode(combine<kOp>(Codec::decode(x), Codec::decode(y)));
    std::memcpy(a + i * sizeof(Storage), &result, sizeof(Storage));
  }
}

// A complex SUM: the real-valued SUM kernel over twice as many lanes.
template <ReduceFn kLaneKernel>
void complexSumKernel(void* inout, const void* in, size_t count) {
  kLaneKernel(inout, in, 2 * count);
}

template <class Codec>
void setPortableArithmetic(ReduceTable& table, DataType type) {
  setKernel(table, type, ReduceOp::kSum, &portableKernel<Codec, ReduceOp::kSum>);
  setKernel(table, type, ReduceOp::kProduct, &portableKernel<Codec, ReduceOp::kProduct>);
  setKernel(table, type, ReduceOp::kMin, &portableKernel<Codec, ReduceOp::kMin>);
  setKernel(table, type, ReduceOp::kMax, &portableKernel<Codec, ReduceOp::kMax>);
}

template <class Codec>
void setPortableBitwise(ReduceTable& table, DataType type) {
  setKernel(table, type, ReduceOp::kBand, &portableKernel<Codec, ReduceOp::kBand>);
  setKernel(table, type, ReduceOp::kBor, &portableKernel<Codec, ReduceOp::kBor>);
  setKernel(table, type, ReduceOp::kBxor, &portableKernel<Codec, ReduceOp::kBxor>);
}

// Every kernel (AVG and PREMUL_SUM aside), portable versions compiled for the including
// file's instruction set.
inline void fillPortableKernels(ReduceTable& table) {
  for (auto& row : table.fn) {
    for (ReduceFn& fn : row) {
      fn = nullptr;
    }
  }
  setPortableArithmetic<HalfCodec>(table, DataType::kFloat16);
  setPortableArithmetic<BFloat16Codec>(table, DataType::kBFloat16);
  setPortableArithmetic<PlainCodec<float>>(table, DataType::kFloat32);
  setPortableArithmetic<PlainCodec<double>>(table, DataType::kFloat64);
  setPortableArithmetic<PlainCodec<int8_t>>(table, DataType::kInt8);
  setPortableArithmetic<PlainCodec<uint8_t>>(table, DataType::kUInt8);
  setPortableArithmetic<PlainCodec<int16_t>>(table, DataType::kInt16);
  setPortableArithmetic<PlainCodec<int32_t>>(table, DataType::kInt32);
  setPortableArithmetic<PlainCodec<int64_t>>(table, DataType::kInt64);
  setPortableArithmetic<BoolCodec>(table, DataType::kBool);
  setPortableBitwise<PlainCodec<int8_t>>(table, DataType::kInt8);
  setPortableBitwise<PlainCodec<uint8_t>>(table, DataType::kUInt8);
  setPortableBitwise<PlainCodec<int16_t>>(table, DataType::kInt16);
  setPortableBitwise<PlainCodec<int32_t>>(table, DataType::kInt32);
  setPortableBitwise<PlainCodec<int64_t>>(table, DataType::kInt64);
  setPortableBitwise<BoolCodec>(table, DataType::kBool);
  setKernel(table, DataType::kComplex64, ReduceOp::kSum,
            &complexSumKernel<&portableKernel<PlainCodec<float>, ReduceOp::kSum>>);
  setKernel(table, DataType::kComplex128, ReduceOp::kSum,
            &complexSumKernel<&portableKernel<PlainCodec<double>, ReduceOp::kSum>>);
}

// a (op) b on vector registers of V, for the arithmetic ops. V (a struct of static
// functions in reduce_ops_<isa>.cc) provides Reg, kLanes, kElementBytes, load/store of kLanes
// elements, loadPartial/storePartial of fewer (untouched beyond n), add, mul, min, max.
template <class V, ReduceOp kOp>
typename V::Reg combineVectors(typename V::Reg a, typename V::Reg b) {
  if constexpr (kOp == ReduceOp::kSum) {
    return V::add(a, b);
  } else if constexpr (kOp == ReduceOp::kProduct) {
    return V::mul(a, b);
  } else if constexpr (kOp == ReduceOp::kMin) {
    return V::min(a, b);
  } else {
    static_assert(kOp == ReduceOp::kMax);
    return V::max(a, b);
  }
}

// The vector kernel: four registers per iteration, then one, then a partial one.
template <class V, ReduceOp kOp>
void vectorKernel(void* inout, const void* in, size_t count) {
  constexpr size_t kStride = V::kLanes * V::kElementBytes;
  auto* a = static_cast<unsigned char*>(inout);
  const auto* b = static_cast<const unsigned char*>(in);
  size_t left = count;
  for (; left >= 4 * V::kLanes; left -= 4 * V::kLanes, a += 4 * kStride, b += 4 * kStride) {
    const typename V::Reg x0 = V::load(a);
    const typename V::Reg x1 = V::load(a + kStride);
    const typename V::Reg x2 = V::load(a + 2 * kStride);
    const typename V::Reg x3 = V::load(a + 3 * kStride);
    const typename V::Reg y0 = V::load(b);
    const typename V::Reg y1 = V::load(b + kStride);
    const typename V::Reg y2 = V::load(b + 2 * kStride);
    const typename V::Reg y3 = V::load(b + 3 * kStride);
    V::store(a, combineVectors<V, kOp>(x0, y0));
    V::store(a + kStride, combineVectors<V, kOp>(x1, y1));
    V::store(a + 2 * kStride, combineVectors<V, kOp>(x2, y2));
    V::store(a + 3 * kStride, combineVectors<V, kOp>(x3, y3));
  }
  for (; left >= V::kLanes; left -= V::kLanes, a += kStride, b += kStride) {
    V::store(a, combineVectors<V, kOp>(V::load(a), V::load(b)));
  }
  if (left > 0) {
    V::storePartial(a, combineVectors<V, kOp>(V::loadPartial(a, left), V::loadPartial(b, left)),
                    left);
  }
}

template <class V>
void setVectorArithmetic(ReduceTable& table, DataType type) {
  setKernel(table, type, ReduceOp::kSum, &vectorKernel<V, ReduceOp::kSum>);
  setKernel(table, type, ReduceOp::kProduct, &vectorKernel<V, ReduceOp::kProduct>);
  setKernel(table, type, ReduceOp::kMin, &vectorKernel<V, ReduceOp::kMin>);
  setKernel(table, type, ReduceOp::kMax, &vectorKernel<V, ReduceOp::kMax>);
}

}  // namespace
}  // namespace ringtree::algorithms
