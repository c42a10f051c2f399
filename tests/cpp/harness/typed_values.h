#pragma once

// Writing small integers as elements of every DataType, for tests whose expected results
// must be exact (sums and products of small integers involve no rounding). Header-only.

#include <cmath>
#include <cstdint>
#include <cstring>

#include <ringtree/types.h>

namespace ringtree::test {

// float16 bits of v. Exactly representable small integers only (|v| <= 2048).
inline uint16_t toHalf(double v) {
  if (v == 0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  double a = std::fabs(v);
  int exponent = 0;
  while (a >= 2) { a /= 2; ++exponent; }
  const auto mantissa = static_cast<uint16_t>(std::lround((a - 1) * 1024));
  return static_cast<uint16_t>(sign | ((exponent + 15) << 10) | mantissa);
}

// bfloat16 bits of v. Exact for small integers, which have no low mantissa bits.
inline uint16_t toBFloat16(double v) {
  const float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

// Writes v as one element of type at out (complex: v - vi; bool: v != 0).
inline void store(DataType type, double v, void* out) {
  switch (type) {
    case DataType::kFloat16: { uint16_t h = toHalf(v); std::memcpy(out, &h, 2); break; }
    case DataType::kBFloat16: { uint16_t h = toBFloat16(v); std::memcpy(out, &h, 2); break; }
    case DataType::kFloat32: { float f = static_cast<float>(v); std::memcpy(out, &f, 4); break; }
    case DataType::kFloat64: std::memcpy(out, &v, 8); break;
    case DataType::kInt8: { int8_t x = static_cast<int8_t>(v); std::memcpy(out, &x, 1); break; }
    case DataType::kUInt8: { uint8_t x = static_cast<uint8_t>(v); std::memcpy(out, &x, 1); break; }
    case DataType::kInt16: { int16_t x = static_cast<int16_t>(v); std::memcpy(out, &x, 2); break; }
    case DataType::kInt32: { int32_t x = static_cast<int32_t>(v); std::memcpy(out, &x, 4); break; }
    case DataType::kInt64: { int64_t x = static_cast<int64_t>(v); std::memcpy(out, &x, 8); break; }
    case DataType::kBool: { uint8_t x = v != 0; std::memcpy(out, &x, 1); break; }
    case DataType::kComplex64: {
      float f[2] = {static_cast<float>(v), static_cast<float>(-v)};
      std::memcpy(out, f, 8);
      break;
    }
    case DataType::kComplex128: { double d[2] = {v, -v}; std::memcpy(out, d, 16); break; }
  }
}

}  // namespace ringtree::test
