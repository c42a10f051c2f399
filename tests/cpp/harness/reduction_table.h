#pragma once

// The reduction table's axes, and NaN tests on raw elements, for the tests of the CPU
// engine's kernels (reduce_ops_test), the CUDA kernels' functors (cuda_functors_test) and
// the CUDA kernels on a GPU (tests/cuda/reduce_kernels_test). Header-only.

#include <cmath>
#include <cstdint>
#include <cstring>

#include <ringtree/types.h>

namespace ringtree::test {

constexpr DataType kAllTypes[] = {
    DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,   DataType::kFloat64,
    DataType::kInt8,    DataType::kUInt8,    DataType::kInt16,     DataType::kInt32,
    DataType::kInt64,   DataType::kBool,     DataType::kComplex64, DataType::kComplex128,
};
constexpr ReduceOp kAllOps[] = {
    ReduceOp::kSum, ReduceOp::kAvg,  ReduceOp::kProduct, ReduceOp::kMin,       ReduceOp::kMax,
    ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor,    ReduceOp::kPremulSum,
};

// Whether the lane at `lane` (one element; one part of a complex one) is a NaN of `type`.
inline bool isNanLane(DataType type, const unsigned char* lane) {
  switch (type) {
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      uint16_t bits;
      std::memcpy(&bits, lane, 2);
      const uint16_t infinity = type == DataType::kFloat16 ? 0x7C00 : 0x7F80;
      return (bits & 0x7FFF) > infinity;
    }
    case DataType::kFloat32:
    case DataType::kComplex64: {
      float v;
      std::memcpy(&v, lane, 4);
      return std::isnan(v);
    }
    case DataType::kFloat64:
    case DataType::kComplex128: {
      double v;
      std::memcpy(&v, lane, 8);
      return std::isnan(v);
    }
    default:
      return false;
  }
}

}  // namespace ringtree::test
