// The coalesced collectives: several buffers as one operation, built on the collectives
// of one buffer. Small buffers are packed into one scratch buffer so that they share one
// round of latency; every rank decides what to pack from the element counts, which agree
// across ranks, so all ranks make the same calls.

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include <ringtree/collectives.h>

#include "common/copy.h"
#include "common/validation.h"

namespace ringtree {

namespace {

// Buffers (per-rank parts, for reduce-scatter) smaller than this are packed; larger ones
// run in place one by one, where packing would only add two copies.
constexpr size_t kPackBelowBytes = 256 * 1024;

std::byte* byteAt(const void* base, size_t offset) {
  return static_cast<std::byte*>(const_cast<void*>(base)) + offset;
}

}  // namespace

void allreduceCoalesced(Communicator& comm, void* const* buffers, const size_t* counts, size_t n, DataType type,
                        const AllreduceOptions& options) {
  const char* op = "allreduce_coalesced";
  if (n == 0) return;
  validation::checkReduceOp(op, type, options.op);
  validation::checkedTotal(op, "counts", counts, static_cast<int>(n), type);
  validation::checkBuffers(op, "buffers", buffers, static_cast<int>(n), counts);
  const size_t elementBytes = elementSize(type);
  auto packed = [&](size_t i) { return counts[i] > 0 && counts[i] * elementBytes < kPackBelowBytes; };
  size_t packedCount = 0;
  for (size_t i = 0; i < n; ++i) packedCount += packed(i) ? counts[i] : 0;
  if (packedCount > 0) {
    std::unique_ptr<std::byte[]> scratch(new std::byte[packedCount * elementBytes]);
    std::byte* cursor = scratch.get();
    for (size_t i = 0; i < n; ++i) {
      if (!packed(i)) continue;
      copyBytes(cursor, buffers[i], counts[i] * elementBytes);
      cursor += counts[i] * elementBytes;
    }
    allreduce(comm, scratch.get(), packedCount, type, options);
    cursor = scratch.get();
    for (size_t i = 0; i < n; ++i) {
      if (!packed(i)) continue;
      copyBytes(buffers[i], cursor, counts[i] * elementBytes);
      cursor += counts[i] * elementBytes;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!packed(i) && counts[i] > 0) allreduce(comm, buffers[i], counts[i], type, options);
  }
}

void allgatherCoalesced(Communicator& comm, const void* const* inputs, size_t n, void* const* outputs,
                        const size_t* outputCounts, DataType type, const AllgatherOptions& options) {
  const char* op = "allgather_coalesced";
  if (n == 0) return;
  const auto size = static_cast<size_t>(comm.size());
  const auto rank = static_cast<size_t>(comm.rank());
  validation::checkedTotal(op, "outputCounts", outputCounts, static_cast<int>(size * n), type);
  validation::checkBuffers(op, "outputs", outputs, static_cast<int>(size * n), outputCounts);
  validation::checkBuffers(op, "inputs", inputs, static_cast<int>(n), outputCounts + rank * n);
  const size_t elementBytes = elementSize(type);
  std::vector<size_t> counts(size, 0);  // of every rank's packed inputs
  size_t total = 0;
  for (size_t r = 0; r < size; ++r) {
    for (size_t i = 0; i < n; ++i) counts[r] += outputCounts[r * n + i];
    total += counts[r];
  }
  std::unique_ptr<std::byte[]> scratch(new std::byte[total * elementBytes]);
  std::vector<void*> slots(size);
  std::byte* cursor = scratch.get();
  for (size_t r = 0; r < size; ++r) {
    slots[r] = cursor;
    cursor += counts[r] * elementBytes;
  }
  cursor = static_cast<std::byte*>(slots[rank]);
  for (size_t i = 0; i < n; ++i) {
    const size_t bytes = outputCounts[rank * n + i] * elementBytes;
    copyBytes(cursor, inputs[i], bytes);
    cursor += bytes;
  }
  allgather(comm, slots[rank], slots.data(), counts.data(), type, options);
  for (size_t r = 0; r < size; ++r) {
    cursor = static_cast<std::byte*>(slots[r]);
    for (size_t i = 0; i < n; ++i) {
      const size_t bytes = outputCounts[r * n + i] * elementBytes;
      copyBytes(outputs[r * n + i], cursor, bytes);
      cursor += bytes;
    }
  }
}

void reduceScatterCoalesced(Communicator& comm, const void* const* inputs, void* const* outputs, const size_t* counts,
                            size_t n, DataType type, const ReduceScatterOptions& options) {
  const char* op = "reduce_scatter_coalesced";
  if (n == 0) return;
  const int size = comm.size();
  const auto parts = static_cast<size_t>(size);
  const auto rank = static_cast<size_t>(comm.rank());
  validation::checkReduceOp(op, type, options.op);
  const size_t total = validation::checkedTotal(op, "counts", counts, static_cast<int>(n), type);
  validation::checkedBlocksTotal(op, total, size, type);
  validation::checkBuffers(op, "outputs", outputs, static_cast<int>(n), counts);
  validation::checkBuffers(op, "inputs", inputs, static_cast<int>(n), counts);
  const size_t elementBytes = elementSize(type);
  auto packed = [&](size_t i) { return counts[i] > 0 && counts[i] * elementBytes < kPackBelowBytes; };
  size_t packedCount = 0;  // elements of each rank's packed part
  for (size_t i = 0; i < n; ++i) packedCount += packed(i) ? counts[i] : 0;
  if (packedCount > 0) {
    // Block r of the scratch: part r of every packed input, in order.
    const size_t blockBytes = packedCount * elementBytes;
    std::unique_ptr<std::byte[]> scratch(new std::byte[parts * blockBytes]);
    std::vector<const void*> blocks(parts);
    for (size_t r = 0; r < parts; ++r) {
      std::byte* cursor = scratch.get() + r * blockBytes;
      blocks[r] = cursor;
      for (size_t i = 0; i < n; ++i) {
        if (!packed(i)) continue;
        const size_t bytes = counts[i] * elementBytes;
        copyBytes(cursor, byteAt(inputs[i], r * bytes), bytes);
        cursor += bytes;
      }
    }
    const std::vector<size_t> blockCounts(parts, packedCount);
    void* own = const_cast<void*>(blocks[rank]);
    reduceScatter(comm, blocks.data(), own, blockCounts.data(), type, options);
    const std::byte* cursor = static_cast<const std::byte*>(own);
    for (size_t i = 0; i < n; ++i) {
      if (!packed(i)) continue;
      copyBytes(outputs[i], cursor, counts[i] * elementBytes);
      cursor += counts[i] * elementBytes;
    }
  }
  std::vector<const void*> partsOfInput(parts);
  for (size_t i = 0; i < n; ++i) {
    if (packed(i) || counts[i] == 0) continue;
    const size_t bytes = counts[i] * elementBytes;
    for (size_t r = 0; r < parts; ++r) partsOfInput[r] = byteAt(inputs[i], r * bytes);
    const std::vector<size_t> partCounts(parts, counts[i]);
    reduceScatter(comm, partsOfInput.data(), outputs[i], partCounts.data(), type, options);
  }
}

}  // namespace ringtree
