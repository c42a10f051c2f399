// The reduction kernels of ringtree's CUDA library: one templated element-wise kernel for
// inout[i] = f(inout[i], in[i]) and one for data[i] = f(data[i]) (scale, divide), each
// instantiated once per functor that visitReduce / visitScale / visitDivide
// (reduce_kernels.cuh) can hand out.
//
// Both kernels read and write 16 bytes at a time where they can: when the pointers are at
// the same distance from a 16-byte boundary, a scalar head brings them to it, the middle
// moves in 16-byte vectors and a scalar tail finishes; otherwise every element goes alone.
// Threads walk their part with a grid-stride loop; the grid is capped at what the device
// holds at once (kBlocksPerSm blocks per multiprocessor).

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "reduce_kernels.cuh"

namespace ringtree::gpu {
namespace {

constexpr int kThreads = 512;
// 4 x 512 = 2048 threads: a full multiprocessor on sm_80 and sm_90.
constexpr int kBlocksPerSm = 4;
constexpr size_t kVectorBytes = 16;

// How a buffer of `count` elements (lanes) is cut: [0, head) scalar, then `vectors`
// 16-byte vectors, then the rest scalar.
struct Layout {
  size_t head;
  size_t vectors;
  size_t count;
};

// Elements of T in one vector.
template <typename T>
constexpr size_t kLanesOf = kVectorBytes / sizeof(T);

// One vector, seen whole (to load and store) and as elements (to combine).
template <typename T>
union Pack {
  uint4 raw;
  T lane[kLanesOf<T>];
};

// The index of the s-th scalar element: the head first, then the tail after the vectors.
__device__ __forceinline__ size_t scalarIndex(size_t s, const Layout& layout, size_t lanes) {
  return s < layout.head ? s : s + layout.vectors * lanes;
}

template <class Op>
__global__ void __launch_bounds__(kThreads)
    combineKernel(typename Op::Storage* __restrict__ inout, const typename Op::Storage* __restrict__ in,
                  Layout layout, Op op) {
  using T = typename Op::Storage;
  constexpr size_t kLanes = kLanesOf<T>;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  auto* vectorsOut = reinterpret_cast<uint4*>(inout + layout.head);
  const auto* vectorsIn = reinterpret_cast<const uint4*>(in + layout.head);
  for (size_t v = first; v < layout.vectors; v += stride) {
    Pack<T> a;
    Pack<T> b;
    a.raw = vectorsOut[v];
    b.raw = vectorsIn[v];
#pragma unroll
    for (size_t k = 0; k < kLanes; ++k) {
      a.lane[k] = op(a.lane[k], b.lane[k]);
    }
    vectorsOut[v] = a.raw;
  }

  const size_t scalars = layout.count - layout.vectors * kLanes;
  for (size_t s = first; s < scalars; s += stride) {
    const size_t i = scalarIndex(s, layout, kLanes);
    inout[i] = op(inout[i], in[i]);
  }
}

template <class Op>
__global__ void __launch_bounds__(kThreads)
    transformKernel(typename Op::Storage* __restrict__ data, Layout layout, Op op) {
  using T = typename Op::Storage;
  constexpr size_t kLanes = kLanesOf<T>;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  auto* vectors = reinterpret_cast<uint4*>(data + layout.head);
  for (size_t v = first; v < layout.vectors; v += stride) {
    Pack<T> a;
    a.raw = vectors[v];
#pragma unroll
    for (size_t k = 0; k < kLanes; ++k) {
      a.lane[k] = op(a.lane[k]);
    }
    vectors[v] = a.raw;
  }

  const size_t scalars = layout.count - layout.vectors * kLanes;
  for (size_t s = first; s < scalars; s += stride) {
    const size_t i = scalarIndex(s, layout, kLanes);
    data[i] = op(data[i]);
  }
}

// The cut of `count` lanes of `laneBytes` at a and b (b == a for one buffer).
Layout layoutOf(uintptr_t a, uintptr_t b, size_t count, size_t laneBytes) {
  const uintptr_t misalignment = a % kVectorBytes;
  if (misalignment != b % kVectorBytes) {
    return Layout{count, 0, count};
  }
  const size_t lanes = kVectorBytes / laneBytes;
  size_t head = misalignment == 0 ? 0 : (kVectorBytes - misalignment) / laneBytes;
  if (head > count) {
    head = count;
  }
  return Layout{head, (count - head) / lanes, count};
}

bool isAligned(const void* pointer, size_t laneBytes) {
  return reinterpret_cast<uintptr_t>(pointer) % laneBytes == 0;
}

// Multiprocessor counts by device ordinal, asked once per device (0: not asked yet).
constexpr int kCachedDevices = 64;
std::atomic<int> multiprocessors[kCachedDevices];

cudaError_t blockLimit(int* limit) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) {
    return error;
  }
  int count = device >= 0 && device < kCachedDevices ? multiprocessors[device].load(std::memory_order_relaxed) : 0;
  if (count == 0) {
    error = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    if (error != cudaSuccess) {
      return error;
    }
    if (device >= 0 && device < kCachedDevices) {
      multiprocessors[device].store(count, std::memory_order_relaxed);
    }
  }
  *limit = count * kBlocksPerSm;
  return cudaSuccess;
}

// Blocks for `items` work items (vectors plus scalar elements), capped by the device.
cudaError_t gridFor(const Layout& layout, size_t lanes, unsigned* blocks) {
  int limit = 0;
  const cudaError_t error = blockLimit(&limit);
  if (error != cudaSuccess) {
    return error;
  }
  const size_t items = layout.vectors + (layout.count - layout.vectors * lanes);
  const size_t wanted = (items + kThreads - 1) / kThreads;
  *blocks = static_cast<unsigned>(wanted < static_cast<size_t>(limit) ? wanted : static_cast<size_t>(limit));
  return cudaSuccess;
}

template <class Op>
cudaError_t launchCombine(void* inout, const void* in, size_t count, const Op& op, cudaStream_t stream) {
  using T = typename Op::Storage;
  if (!isAligned(inout, sizeof(T)) || !isAligned(in, sizeof(T))) {
    return cudaErrorInvalidValue;
  }
  Layout layout = layoutOf(reinterpret_cast<uintptr_t>(inout), reinterpret_cast<uintptr_t>(in), count, sizeof(T));
  unsigned blocks = 0;
  const cudaError_t error = gridFor(layout, kLanesOf<T>, &blocks);
  if (error != cudaSuccess) {
    return error;
  }
  auto* a = static_cast<T*>(inout);
  const auto* b = static_cast<const T*>(in);
  Op f = op;
  void* args[] = {&a, &b, &layout, &f};
  return cudaLaunchKernel(&combineKernel<Op>, dim3(blocks), dim3(kThreads), args, 0, stream);
}

template <class Op>
cudaError_t launchTransform(void* data, size_t count, const Op& op, cudaStream_t stream) {
  using T = typename Op::Storage;
  if (!isAligned(data, sizeof(T))) {
    return cudaErrorInvalidValue;
  }
  const auto address = reinterpret_cast<uintptr_t>(data);
  Layout layout = layoutOf(address, address, count, sizeof(T));
  unsigned blocks = 0;
  const cudaError_t error = gridFor(layout, kLanesOf<T>, &blocks);
  if (error != cudaSuccess) {
    return error;
  }
  auto* a = static_cast<T*>(data);
  Op f = op;
  void* args[] = {&a, &layout, &f};
  return cudaLaunchKernel(&transformKernel<Op>, dim3(blocks), dim3(kThreads), args, 0, stream);
}

bool isDataType(int value) { return value >= 0 && value < kNumDataTypes; }

}  // namespace

cudaError_t launchReduce(void* inout, const void* in, size_t count, int dataType, int reduceOp,
                         cudaStream_t stream) {
  if (!isDataType(dataType) || reduceOp < 0 || reduceOp >= kNumReduceOps) {
    return cudaErrorInvalidValue;
  }
  cudaError_t result = cudaSuccess;
  const bool defined = visitReduce(static_cast<DataType>(dataType), static_cast<ReduceOp>(reduceOp),
                                   [&](auto op, size_t lanes) {
                                     if (count > 0) {
                                       result = launchCombine(inout, in, count * lanes, op, stream);
                                     }
                                   });
  return defined ? result : cudaErrorInvalidValue;
}

cudaError_t launchScale(void* data, size_t count, int dataType, double factor, cudaStream_t stream) {
  if (!isDataType(dataType)) {
    return cudaErrorInvalidValue;
  }
  cudaError_t result = cudaSuccess;
  const bool defined = visitScale(static_cast<DataType>(dataType), factor, [&](auto op, size_t lanes) {
    if (count > 0) {
      result = launchTransform(data, count * lanes, op, stream);
    }
  });
  return defined ? result : cudaErrorInvalidValue;
}

cudaError_t launchDivide(void* data, size_t count, int dataType, int64_t divisor, cudaStream_t stream) {
  if (!isDataType(dataType)) {
    return cudaErrorInvalidValue;
  }
  cudaError_t result = cudaSuccess;
  const bool defined = visitDivide(static_cast<DataType>(dataType), divisor, [&](auto op, size_t lanes) {
    if (count > 0) {
      result = launchTransform(data, count * lanes, op, stream);
    }
  });
  return defined ? result : cudaErrorInvalidValue;
}

}  // namespace ringtree::gpu
