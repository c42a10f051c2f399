#pragma once

#include <cstddef>
#include <cstdint>

#include <ringtree/types.h>

#include "common/reduce_fn.h"

// Element-wise reduction kernels of the CPU engine: one ReduceFn per (DataType, ReduceOp),
// chosen once per process for the best instruction set of this CPU.
//
// Semantics, the same for every instruction-set variant (bit for bit, except which NaN
// payload a NaN result carries):
//  - float32/float64: IEEE arithmetic in the element type, round-to-nearest-even (whatever
//    the caller set in MXCSR applies: with flush-to-zero set, subnormals flush).
//  - float16/bfloat16: both elements are widened to float32 (exactly), combined in float32
//    and rounded back once, to nearest even; overflow gives +-inf, subnormals are kept, NaN
//    stays NaN. The result of one step is therefore the correctly rounded result of the
//    exact operation. A reduction over n ranks rounds after every step (n - 1 roundings,
//    as NCCL does), so it can differ from rounding a float32 total once.
//  - MIN/MAX of floating types propagate NaN like torch.minimum/maximum: if either element
//    is NaN the result is NaN (inout's NaN when inout is NaN, else in's). Equal elements,
//    -0 and +0 included, give in's element.
//  - Integers wrap on overflow (two's complement) for SUM and PRODUCT.
//  - bool: a byte is true when it is non-zero; results are 0 or 1. SUM and MAX are logical
//    OR, PRODUCT and MIN logical AND (as torch's gloo and NCCL backends do), BAND/BOR/BXOR are
//    logical AND/OR/XOR. AVG and PREMUL_SUM are not defined on bool.
//  - complex64/complex128: SUM only (element-wise on the real and imaginary parts).
namespace ringtree::algorithms {

// The kernel computing inout[i] = inout[i] (op) in[i] on elements of type. AVG and
// PREMUL_SUM return the SUM kernel: the caller scales with divide() after, or with
// scale() before. Throws InvalidArgument when !isSupported(type, op), with a message naming
// the op and the type, or for values outside the enums. Cheap (a table look-up); thread-safe.
ReduceFn reduceFunction(DataType type, ReduceOp op);

// data[i] *= factor, in place, for PREMUL_SUM. Floating and complex types: the product is
// computed in double and rounded to the element type (float16/bfloat16 by way of float32;
// complex: both parts scaled). Integer types: the double product truncated toward zero and
// saturated to the type's range (exact while |data[i] * factor| < 2^53). Throws
// InvalidArgument for bool, and for a non-finite factor on an integer type.
void scale(void* data, size_t count, DataType type, double factor);

// data[i] /= divisor, in place, for AVG (divisor = number of ranks). Floating and complex
// types: x / divisor rounded to nearest (float16/bfloat16 by way of float32) -- a division,
// not a multiplication by 1/divisor, so a sum of integer values divides exactly whenever the
// quotient is representable. Integer types: division truncated toward zero. Throws
// InvalidArgument when divisor <= 0, and for bool ("ReduceOp.AVG is not supported for bool").
void divide(void* data, size_t count, DataType type, int64_t divisor);

// Instruction-set variants of the kernels, exposed for tests and benchmarks.
//  - kBaseline: portable C++ (on x86-64: SSE2, auto-vectorised by the compiler).
//  - kAvx2: AVX2 + F16C (x86-64 only).
//  - kAvx512: AVX-512 F/BW/VL/DQ + AVX2 + F16C (x86-64 only).
enum class ReduceIsa : uint8_t { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr int kNumReduceIsas = 3;

// "baseline", "avx2", "avx512".
const char* reduceIsaName(ReduceIsa isa);
// Whether isa was compiled in and this CPU (and OS) supports it.
bool isReduceIsaAvailable(ReduceIsa isa);
// The variant reduceFunction(type, op) uses: the widest available one.
ReduceIsa bestReduceIsa();
// The kernel of a given variant. Throws InvalidArgument like reduceFunction(type, op), and
// when !isReduceIsaAvailable(isa).
ReduceFn reduceFunction(DataType type, ReduceOp op, ReduceIsa isa);

}  // namespace ringtree::algorithms
