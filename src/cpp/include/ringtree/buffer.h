#pragma once

#include <complex>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <ringtree/export.h>
#include <ringtree/types.h>

namespace ringtree {

// Where a buffer's memory lives. The numeric values are part of the Python binding:
// append, never reorder.
enum class DeviceType : uint8_t {
  kCpu = 0,   // host memory (CUDA pinned host memory included)
  kCuda = 1,  // CUDA device memory
};
constexpr int kNumDeviceTypes = 2;

// "cpu", "cuda".
RINGTREE_API const char* deviceTypeName(DeviceType type);

// A device: its type and, for kCuda, the CUDA device ordinal (0 for kCpu).
struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
};

inline bool operator==(const Device& a, const Device& b) { return a.type == b.type && a.index == b.index; }
inline bool operator!=(const Device& a, const Device& b) { return !(a == b); }

// "cpu", "cuda:1".
RINGTREE_API std::string deviceName(const Device& device);

// The DataType of a C++ element type: dataTypeOf<float>() == DataType::kFloat32, ...
// (float, double, the fixed-width integers of types.h, bool, std::complex<float|double>).
template <typename T>
constexpr DataType dataTypeOf();
template <> constexpr DataType dataTypeOf<float>() { return DataType::kFloat32; }
template <> constexpr DataType dataTypeOf<double>() { return DataType::kFloat64; }
template <> constexpr DataType dataTypeOf<int8_t>() { return DataType::kInt8; }
template <> constexpr DataType dataTypeOf<uint8_t>() { return DataType::kUInt8; }
template <> constexpr DataType dataTypeOf<int16_t>() { return DataType::kInt16; }
template <> constexpr DataType dataTypeOf<int32_t>() { return DataType::kInt32; }
template <> constexpr DataType dataTypeOf<int64_t>() { return DataType::kInt64; }
template <> constexpr DataType dataTypeOf<bool>() { return DataType::kBool; }
template <> constexpr DataType dataTypeOf<std::complex<float>>() { return DataType::kComplex64; }
template <> constexpr DataType dataTypeOf<std::complex<double>>() { return DataType::kComplex128; }

// What ProcessGroup's operations take: `count` contiguous elements of `type` at `data`,
// on `device`. It does not own the memory; the operation that takes it says how long the
// memory must stay valid (synchronous calls: until they return; asynchronous ones: until
// their Work completes). Buffers an operation only reads (inputs, a broadcast root's
// buffer) are never written. `data` may be null when count is 0.
//
// `rows` is the size of the buffer's leading dimension, for the operations that cut a
// buffer by rows (ProcessGroup::alltoallSingle's split sizes): count / rows elements a row.
// 0 means a flat buffer: count rows of one element each.
struct BufferView {
  void* data = nullptr;
  size_t count = 0;
  DataType type = DataType::kFloat32;
  Device device{};
  size_t rows = 0;

  BufferView() = default;
  BufferView(void* data, size_t count, DataType type, Device device = {}, size_t rows = 0)
      : data(data), count(count), type(type), device(device), rows(rows) {}
  // Host memory of a C++ element type: BufferView(vector.data(), vector.size()).
  template <typename T>
  BufferView(T* data, size_t count) : data(const_cast<void*>(static_cast<const void*>(data))), count(count),
                                      type(dataTypeOf<std::remove_const_t<T>>()) {}

  // The leading dimension: `rows`, or `count` for a flat buffer.
  size_t leadingRows() const { return rows == 0 ? count : rows; }
  // Its size in bytes (count elements of `type`).
  size_t bytes() const { return count * elementSize(type); }
};

}  // namespace ringtree
