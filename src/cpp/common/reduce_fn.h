#pragma once

#include <cstddef>

namespace ringtree {

// An element-wise reduction step: inout[i] = inout[i] (op) in[i] for i < count, on
// elements of one fixed type. `in` and `inout` may be unaligned and must not overlap.
// Produced by algorithms/reduce_ops.h; transports call it to reduce data as it arrives.
using ReduceFn = void (*)(void* inout, const void* in, size_t count);

}  // namespace ringtree
