#include <ringtree/reductions.h>

#include "algorithms/reduce_ops.h"
#include "common/validation.h"

namespace ringtree {

void checkReduction(const char* what, DataType type, ReduceOp op) { validation::checkReduceOp(what, type, op); }

void reduceInto(void* inout, const void* in, size_t count, DataType type, ReduceOp op) {
  algorithms::reduceFunction(type, op)(inout, in, count);
}

void premultiply(void* data, size_t count, DataType type, double factor) {
  algorithms::scale(data, count, type, factor);
}

void divideByRanks(void* data, size_t count, DataType type, int64_t ranks) {
  algorithms::divide(data, count, type, ranks);
}

}  // namespace ringtree
