#include <ringtree/types.h>

#include <string>

#include <ringtree/error.h>

namespace ringtree {

namespace {

bool isValid(DataType type) { return static_cast<int>(type) < kNumDataTypes; }

bool isComplex(DataType type) {
  return type == DataType::kComplex64 || type == DataType::kComplex128;
}

bool isInteger(DataType type) {
  switch (type) {
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kInt16:
    case DataType::kInt32:
    case DataType::kInt64:
      return true;
    default:
      return false;
  }
}

}  // namespace

// Throws InvalidArgument for a value outside the enum (e.g. a corrupted fingerprint).
size_t elementSize(DataType type) {
  switch (type) {
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kBool:
      return 1;
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kInt16:
      return 2;
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat64:
    case DataType::kInt64:
    case DataType::kComplex64:
      return 8;
    case DataType::kComplex128:
      return 16;
  }
  throw InvalidArgument("unknown DataType " + std::to_string(static_cast<int>(type)));
}

// Returns "unknown" for a value outside the enum.
const char* dataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat16:
      return "float16";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kInt8:
      return "int8";
    case DataType::kUInt8:
      return "uint8";
    case DataType::kInt16:
      return "int16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kBool:
      return "bool";
    case DataType::kComplex64:
      return "complex64";
    case DataType::kComplex128:
      return "complex128";
  }
  return "unknown";
}

// Returns "unknown" for a value outside the enum.
const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "SUM";
    case ReduceOp::kAvg:
      return "AVG";
    case ReduceOp::kProduct:
      return "PRODUCT";
    case ReduceOp::kMin:
      return "MIN";
    case ReduceOp::kMax:
      return "MAX";
    case ReduceOp::kBand:
      return "BAND";
    case ReduceOp::kBor:
      return "BOR";
    case ReduceOp::kBxor:
      return "BXOR";
    case ReduceOp::kPremulSum:
      return "PREMUL_SUM";
  }
  return "unknown";
}

// The rules of types.h, plus: bool has no AVG and no PREMUL_SUM (a mean or a scaled sum of
// truth values is not a truth value). False for values outside either enum.
bool isSupported(DataType type, ReduceOp op) {
  if (!isValid(type)) {
    return false;
  }
  switch (op) {
    case ReduceOp::kSum:
      return true;
    case ReduceOp::kAvg:
    case ReduceOp::kPremulSum:
      return type != DataType::kBool;
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return !isComplex(type);
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return isInteger(type) || type == DataType::kBool;
  }
  return false;
}

}  // namespace ringtree
