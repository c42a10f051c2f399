#pragma once

#include <cstddef>

#include <ringtree/types.h>

// Argument checks of the collectives over per-rank buffers (collectives.h), run before
// any data moves. Each throws InvalidArgument with a message that starts with the call's
// name ("allgather: ...") and names the offending argument.
namespace ringtree::algorithms {

// count * elementSize(type); throws when that does not fit in size_t.
size_t checkedBytes(const char* call, size_t count, DataType type);

// The sum of counts[0 .. size); throws when `counts` (named `what`) is null or when the
// sum, or the sum in bytes, does not fit in size_t.
size_t checkedTotal(const char* call, const char* what, const size_t* counts, int size, DataType type);

// count * size, the elements of `size` blocks of count; throws when that, or the same in
// bytes, does not fit in size_t.
size_t checkedBlocksTotal(const char* call, size_t count, int size, DataType type);

// Throws unless 0 <= root < size.
void checkRoot(const char* call, int root, int size);

// Throws when `buffer` (named `what`) is null while it should hold count > 0 elements.
void checkBuffer(const char* call, const char* what, const void* buffer, size_t count);

// Throws when the array `buffers` (named `what`, one pointer per rank) is null, or when
// buffers[r] is null while it should hold counts[r] > 0 elements (counts == nullptr:
// every buffer holds `count` elements).
void checkBuffers(const char* call, const char* what, const void* const* buffers, int size, const size_t* counts,
                  size_t count = 0);

}  // namespace ringtree::algorithms
