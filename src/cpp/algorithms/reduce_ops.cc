#include "algorithms/reduce_ops.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include <ringtree/error.h>

#include "algorithms/reduce_kernels.h"
#include "common/validation.h"

namespace ringtree::algorithms {

namespace {

// Every variant's table, filled once (the first time a kernel is asked for).
struct Tables {
  ReduceTable table[kNumReduceIsas];
  bool available[kNumReduceIsas];
  ReduceIsa best;
};

bool cpuSupports(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::kBaseline:
      return true;
#if defined(RINGTREE_REDUCE_X86)
    case ReduceIsa::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case ReduceIsa::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#endif
    default:
      return false;
  }
}

// AVG and PREMUL_SUM reduce with SUM (the caller divides or scales), where defined.
void aliasScaledSums(ReduceTable& table) {
  for (int type = 0; type < kNumDataTypes; ++type) {
    for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kPremulSum}) {
      if (isSupported(static_cast<DataType>(type), op)) {
        table.fn[type][static_cast<int>(op)] = table.fn[type][static_cast<int>(ReduceOp::kSum)];
      }
    }
  }
}

Tables buildTables() {
  Tables tables{};
  tables.best = ReduceIsa::kBaseline;
  for (int i = 0; i < kNumReduceIsas; ++i) {
    const auto isa = static_cast<ReduceIsa>(i);
    tables.available[i] = cpuSupports(isa);
    if (!tables.available[i]) {
      continue;
    }
    switch (isa) {
      case ReduceIsa::kBaseline:
        fillPortableKernels(tables.table[i]);
        break;
#if defined(RINGTREE_REDUCE_X86)
      case ReduceIsa::kAvx2:
        fillAvx2Kernels(tables.table[i]);
        break;
      case ReduceIsa::kAvx512:
        fillAvx512Kernels(tables.table[i]);
        break;
#endif
      default:
        break;
    }
    aliasScaledSums(tables.table[i]);
    tables.best = isa;
  }
  return tables;
}

const Tables& tables() {
  static const Tables instance = buildTables();
  return instance;
}

// The name the reduction table's errors give the caller's operation.
constexpr const char* kTable = "the reduction";

ReduceFn lookUp(const ReduceTable& table, DataType type, ReduceOp op) {
  validation::checkReduceOp(kTable, type, op);
  const ReduceFn fn = table.fn[static_cast<int>(type)][static_cast<int>(op)];
  return fn;
}

// Applies f to every element of a buffer of Codec's storage (lanes = count, or 2 * count for
// complex types), in place.
template <class Codec, class F>
void transform(void* data, size_t lanes, F f) {
  using Storage = typename Codec::Storage;
  auto* bytes = static_cast<unsigned char*>(data);
  for (size_t i = 0; i < lanes; ++i) {
    Storage x;
    std::memcpy(&x, bytes + i * sizeof(Storage), sizeof(Storage));
    x = Codec::encode(f(Codec::decode(x)));
    std::memcpy(bytes + i * sizeof(Storage), &x, sizeof(Storage));
  }
}

// double -> T: truncated toward zero, saturated to T's range (x is not NaN).
template <typename T>
T truncateSaturated(double x) {
  if (x >= static_cast<double>(std::numeric_limits<T>::max())) {
    return std::numeric_limits<T>::max();
  }
  if (x <= static_cast<double>(std::numeric_limits<T>::min())) {
    return std::numeric_limits<T>::min();
  }
  return static_cast<T>(x);
}

// Floating lanes (float16/bfloat16 by way of float32): x * factor computed in double.
template <class Codec>
void scaleFloating(void* data, size_t lanes, double factor) {
  using Value = typename Codec::Value;
  transform<Codec>(data, lanes,
                   [factor](Value x) { return static_cast<Value>(static_cast<double>(x) * factor); });
}

template <typename T>
void scaleInteger(void* data, size_t count, DataType type, double factor) {
  if (!std::isfinite(factor)) {
    throw InvalidArgument("ReduceOp.PREMUL_SUM on " + std::string(dataTypeName(type)) +
                          " needs a finite factor, got " + std::to_string(factor));
  }
  transform<PlainCodec<T>>(data, count, [factor](T x) {
    return truncateSaturated<T>(static_cast<double>(x) * factor);
  });
}

// Floating lanes (float16/bfloat16 by way of float32): x / divisor, rounded to nearest.
template <class Codec>
void divideFloating(void* data, size_t lanes, int64_t divisor) {
  using Value = typename Codec::Value;
  if constexpr (std::is_same_v<Value, float>) {
    // Below 2^24 the divisor is exact in float32, so the float32 quotient is the correctly
    // rounded one, as a double division rounded to float32 would be; and it vectorises
    // twice as wide.
    if (divisor < (int64_t{1} << 24)) {
      const auto d = static_cast<float>(divisor);
      transform<Codec>(data, lanes, [d](float x) { return x / d; });
      return;
    }
  }
  const auto d = static_cast<double>(divisor);
  transform<Codec>(data, lanes, [d](Value x) { return static_cast<Value>(static_cast<double>(x) / d); });
}

template <typename T>
void divideInteger(void* data, size_t count, int64_t divisor) {
  transform<PlainCodec<T>>(data, count,
                           [divisor](T x) { return static_cast<T>(static_cast<int64_t>(x) / divisor); });
}

}  // namespace

ReduceFn reduceFunction(DataType type, ReduceOp op) {
  const Tables& all = tables();
  return lookUp(all.table[static_cast<int>(all.best)], type, op);
}

ReduceFn reduceFunction(DataType type, ReduceOp op, ReduceIsa isa) {
  if (!isReduceIsaAvailable(isa)) {
    throw InvalidArgument(std::string("the ") + reduceIsaName(isa) +
                          " reduction kernels are not available on this CPU or build");
  }
  return lookUp(tables().table[static_cast<int>(isa)], type, op);
}

const char* reduceIsaName(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::kBaseline:
      return "baseline";
    case ReduceIsa::kAvx2:
      return "avx2";
    case ReduceIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool isReduceIsaAvailable(ReduceIsa isa) {
  return static_cast<int>(isa) < kNumReduceIsas && tables().available[static_cast<int>(isa)];
}

ReduceIsa bestReduceIsa() { return tables().best; }

void scale(void* data, size_t count, DataType type, double factor) {
  (void)elementSize(type);  // throws for a type outside the enum
  switch (type) {
    case DataType::kFloat16:
      return scaleFloating<HalfCodec>(data, count, factor);
    case DataType::kBFloat16:
      return scaleFloating<BFloat16Codec>(data, count, factor);
    case DataType::kFloat32:
      return scaleFloating<PlainCodec<float>>(data, count, factor);
    case DataType::kFloat64:
      return scaleFloating<PlainCodec<double>>(data, count, factor);
    case DataType::kComplex64:
      return scaleFloating<PlainCodec<float>>(data, 2 * count, factor);
    case DataType::kComplex128:
      return scaleFloating<PlainCodec<double>>(data, 2 * count, factor);
    case DataType::kInt8:
      return scaleInteger<int8_t>(data, count, type, factor);
    case DataType::kUInt8:
      return scaleInteger<uint8_t>(data, count, type, factor);
    case DataType::kInt16:
      return scaleInteger<int16_t>(data, count, type, factor);
    case DataType::kInt32:
      return scaleInteger<int32_t>(data, count, type, factor);
    case DataType::kInt64:
      return scaleInteger<int64_t>(data, count, type, factor);
    case DataType::kBool:
      break;
  }
  validation::checkReduceOp(kTable, type, ReduceOp::kPremulSum);
}

void divide(void* data, size_t count, DataType type, int64_t divisor) {
  (void)elementSize(type);  // throws for a type outside the enum
  if (divisor <= 0) {
    throw InvalidArgument("ReduceOp.AVG needs a positive divisor (the number of ranks), got " +
                          std::to_string(divisor));
  }
  switch (type) {
    case DataType::kFloat16:
      return divideFloating<HalfCodec>(data, count, divisor);
    case DataType::kBFloat16:
      return divideFloating<BFloat16Codec>(data, count, divisor);
    case DataType::kFloat32:
      return divideFloating<PlainCodec<float>>(data, count, divisor);
    case DataType::kFloat64:
      return divideFloating<PlainCodec<double>>(data, count, divisor);
    case DataType::kComplex64:
      return divideFloating<PlainCodec<float>>(data, 2 * count, divisor);
    case DataType::kComplex128:
      return divideFloating<PlainCodec<double>>(data, 2 * count, divisor);
    case DataType::kInt8:
      return divideInteger<int8_t>(data, count, divisor);
    case DataType::kUInt8:
      return divideInteger<uint8_t>(data, count, divisor);
    case DataType::kInt16:
      return divideInteger<int16_t>(data, count, divisor);
    case DataType::kInt32:
      return divideInteger<int32_t>(data, count, divisor);
    case DataType::kInt64:
      return divideInteger<int64_t>(data, count, divisor);
    case DataType::kBool:
      break;
  }
  validation::checkReduceOp(kTable, type, ReduceOp::kAvg);
}

}  // namespace ringtree::algorithms
