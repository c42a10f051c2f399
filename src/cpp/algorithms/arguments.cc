#include "algorithms/arguments.h"

#include <limits>
#include <string>

#include <ringtree/error.h>

namespace ringtree::algorithms {

size_t checkedBytes(const char* call, size_t count, DataType type) {
  const size_t es = elementSize(type);
  if (count > std::numeric_limits<size_t>::max() / es) {
    throw InvalidArgument(std::string(call) + ": " + std::to_string(count) + " elements of " + dataTypeName(type) +
                          " do not fit in the address space");
  }
  return count * es;
}

size_t checkedTotal(const char* call, const char* what, const size_t* counts, int size, DataType type) {
  if (counts == nullptr) {
    throw InvalidArgument(std::string(call) + ": " + what + " is null");
  }
  size_t total = 0;
  for (int r = 0; r < size; ++r) {
    if (counts[r] > std::numeric_limits<size_t>::max() - total) {
      throw InvalidArgument(std::string(call) + ": the sum of " + what + " does not fit in size_t");
    }
    total += counts[r];
  }
  checkedBytes(call, total, type);
  return total;
}

size_t checkedBlocksTotal(const char* call, size_t count, int size, DataType type) {
  const auto blocks = static_cast<size_t>(size);
  if (count > std::numeric_limits<size_t>::max() / blocks) {
    throw InvalidArgument(std::string(call) + ": " + std::to_string(size) + " blocks of " + std::to_string(count) +
                          " elements do not fit in size_t");
  }
  checkedBytes(call, count * blocks, type);
  return count * blocks;
}

void checkRoot(const char* call, int root, int size) {
  if (root < 0 || root >= size) {
    throw InvalidArgument(std::string(call) + ": root " + std::to_string(root) + " is not a rank of this group of " +
                          std::to_string(size));
  }
}

void checkBuffer(const char* call, const char* what, const void* buffer, size_t count) {
  if (buffer == nullptr && count > 0) {
    throw InvalidArgument(std::string(call) + ": " + what + " is null but should hold " + std::to_string(count) +
                          " elements");
  }
}

void checkBuffers(const char* call, const char* what, const void* const* buffers, int size, const size_t* counts,
                  size_t count) {
  if (buffers == nullptr) {
    throw InvalidArgument(std::string(call) + ": " + what + " is null (expected an array of " + std::to_string(size) +
                          " buffers, one per rank)");
  }
  for (int r = 0; r < size; ++r) {
    const size_t expected = counts != nullptr ? counts[r] : count;
    if (buffers[r] == nullptr && expected > 0) {
      throw InvalidArgument(std::string(call) + ": " + what + "[" + std::to_string(r) + "] is null but should hold " +
                            std::to_string(expected) + " elements");
    }
  }
}

}  // namespace ringtree::algorithms
