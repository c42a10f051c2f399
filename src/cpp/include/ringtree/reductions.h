#pragma once

#include <cstddef>
#include <cstdint>

#include <ringtree/export.h>
#include <ringtree/types.h>

// The CPU engine's element-wise reductions, for code that moves the data itself and
// reduces with ringtree's semantics (the MPI backend's reduction operators, for one).
// The rules per type (float16/bfloat16 widened to float32 and rounded once per step, NaN
// propagation of MIN/MAX, bool as logical values, integer wrap-around) are the ones the
// collectives follow; see isSupported() in <ringtree/types.h> for what is defined.
// Thread-safe; no allocation.
namespace ringtree {

// Throws InvalidArgument, with the message every collective gives (`what` names the call),
// when !isSupported(type, op) or either value is outside its enum.
RINGTREE_API void checkReduction(const char* what, DataType type, ReduceOp op);

// inout[i] = inout[i] (op) in[i] for i < count. AVG and PREMUL_SUM reduce as SUM (scale
// with premultiply() before, or divideByRanks() after). `in` and `inout` must not overlap;
// any alignment. Throws InvalidArgument when !isSupported(type, op).
RINGTREE_API void reduceInto(void* inout, const void* in, size_t count, DataType type, ReduceOp op);

// data[i] *= factor, as PREMUL_SUM scales every rank's input before the sum. Throws
// InvalidArgument for bool, and for a non-finite factor on an integer type.
RINGTREE_API void premultiply(void* data, size_t count, DataType type, double factor);

// data[i] /= ranks, as AVG finishes a sum over `ranks` ranks (integers: truncated toward
// zero). Throws InvalidArgument when ranks <= 0 and for bool.
RINGTREE_API void divideByRanks(void* data, size_t count, DataType type, int64_t ranks);

}  // namespace ringtree
