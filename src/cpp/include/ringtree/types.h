#pragma once

#include <cstddef>
#include <cstdint>

#include <ringtree/export.h>

namespace ringtree {

// Element types of the buffers collectives work on. The numeric values are part of the
// wire format (collective fingerprints) and of the Python binding: append, never reorder.
enum class DataType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt16 = 6,
  kInt32 = 7,
  kInt64 = 8,
  kBool = 9,
  kComplex64 = 10,
  kComplex128 = 11,
};
constexpr int kNumDataTypes = 12;

// Reduction operations; values equal torch.distributed's ReduceOp.RedOpType.
//  - kAvg: the sum divided by the number of ranks (integers: truncated toward zero).
//  - kPremulSum: every input multiplied by a factor before summing.
//  - kBand/kBor/kBxor: integer and bool types only.
//  - complex types support kSum, kAvg and kPremulSum only.
//  - bool: kSum and kMax are logical OR, kProduct and kMin logical AND (as torch's gloo
//    and NCCL backends do); kAvg and kPremulSum are not supported.
enum class ReduceOp : uint8_t {
  kSum = 0,
  kAvg = 1,
  kProduct = 2,
  kMin = 3,
  kMax = 4,
  kBand = 5,
  kBor = 6,
  kBxor = 7,
  kPremulSum = 8,
};
constexpr int kNumReduceOps = 9;

// Size in bytes of one element of type.
RINGTREE_API size_t elementSize(DataType type);
// "float32", "bfloat16", ... (torch's names).
RINGTREE_API const char* dataTypeName(DataType type);
// "SUM", "AVG", ... (torch's names).
RINGTREE_API const char* reduceOpName(ReduceOp op);
// Whether op is defined on type (see the rules above).
RINGTREE_API bool isSupported(DataType type, ReduceOp op);

}  // namespace ringtree
