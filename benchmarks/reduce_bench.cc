// Reduction kernel throughput: inout[i] = inout[i] op in[i], in GB/s of inout bytes per
// second (1 GB = 1e9 B; the memory traffic is 3x that: two reads and a write), next to
// memcpy and streamingCopy() of the same number of bytes. Columns: the scalar reference (the
// portable kernel compiled here without vectorisation), each instruction-set variant of the
// library, and the speed-up of the dispatched variant over the scalar one. A second table:
// memcpy, copyBytes() and streamingCopy() with the destination 0, 16 and 64 bytes past a
// page-aligned source (the short distances copyBytes() takes apart from memcpy).
//
// Buffers are 4 KiB-aligned and pre-faulted. Every sample times enough calls to move at
// least 16 MiB; contenders are interleaved sample by sample (so drifts of the machine hit
// them alike) and each cell is the best of the samples: on a shared, oversubscribed
// machine preemption only ever slows a sample down, and the median of a loaded run
// measures the load.
//
// Usage: reduce_bench [--samples N]   (default 15)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <ringtree/types.h>

#include "algorithms/reduce_kernels.h"
#include "algorithms/reduce_ops.h"
#include "common/copy.h"

namespace ringtree::algorithms {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSizes[] = {size_t{32} << 10, size_t{1} << 20, size_t{64} << 20};
constexpr size_t kBytesPerSample = size_t{16} << 20;

struct Case {
  DataType type;
  ReduceOp op;
  ReduceFn scalar;
};

const Case kCases[] = {
    {DataType::kFloat32, ReduceOp::kSum, &portableKernel<PlainCodec<float>, ReduceOp::kSum>},
    {DataType::kFloat32, ReduceOp::kMax, &portableKernel<PlainCodec<float>, ReduceOp::kMax>},
    {DataType::kFloat64, ReduceOp::kSum, &portableKernel<PlainCodec<double>, ReduceOp::kSum>},
    {DataType::kFloat64, ReduceOp::kMax, &portableKernel<PlainCodec<double>, ReduceOp::kMax>},
    {DataType::kFloat16, ReduceOp::kSum, &portableKernel<HalfCodec, ReduceOp::kSum>},
    {DataType::kFloat16, ReduceOp::kMax, &portableKernel<HalfCodec, ReduceOp::kMax>},
    {DataType::kBFloat16, ReduceOp::kSum, &portableKernel<BFloat16Codec, ReduceOp::kSum>},
    {DataType::kBFloat16, ReduceOp::kMax, &portableKernel<BFloat16Codec, ReduceOp::kMax>},
    {DataType::kInt32, ReduceOp::kSum, &portableKernel<PlainCodec<int32_t>, ReduceOp::kSum>},
    {DataType::kInt32, ReduceOp::kMax, &portableKernel<PlainCodec<int32_t>, ReduceOp::kMax>},
};

// A pre-faulted, page-aligned buffer.
class Buffer {
 public:
  explicit Buffer(size_t bytes) : data_(static_cast<unsigned char*>(std::aligned_alloc(4096, bytes))) {
    if (data_ == nullptr) {
      std::fprintf(stderr, "out of memory\n");
      std::exit(1);
    }
  }
  ~Buffer() { std::free(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  unsigned char* data() { return data_; }

 private:
  unsigned char* data_;
};

// count elements of type, all equal to one (bit patterns chosen per type), so that repeated
// SUMs stay finite and normal (float16 saturates at 2048, float32 at 2^24).
void fillOnes(unsigned char* data, DataType type, size_t count) {
  const size_t size = elementSize(type);
  unsigned char one[8] = {};
  switch (type) {
    case DataType::kFloat16: {
      const uint16_t bits = 0x3C00;
      std::memcpy(one, &bits, 2);
      break;
    }
    case DataType::kBFloat16: {
      const uint16_t bits = 0x3F80;
      std::memcpy(one, &bits, 2);
      break;
    }
    case DataType::kFloat32: {
      const float value = 1;
      std::memcpy(one, &value, 4);
      break;
    }
    case DataType::kFloat64: {
      const double value = 1;
      std::memcpy(one, &value, 8);
      break;
    }
    default: {
      const int32_t value = 1;
      std::memcpy(one, &value, 4);
      break;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    std::memcpy(data + i * size, one, size);
  }
}

// The best GB/s (bytes / time) of each contender over `samples` interleaved samples.
std::vector<double> measure(const std::vector<std::function<void()>>& contenders, size_t bytes,
                            int samples) {
  const size_t calls = std::max<size_t>(1, kBytesPerSample / bytes);
  std::vector<double> best(contenders.size(), 0.0);
  for (const auto& run : contenders) {
    run();  // warm-up: caches, page tables, frequency
  }
  for (int sample = 0; sample < samples; ++sample) {
    for (size_t c = 0; c < contenders.size(); ++c) {
      const auto start = Clock::now();
      for (size_t call = 0; call < calls; ++call) {
        contenders[c]();
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      best[c] = std::max(best[c], static_cast<double>(bytes * calls) / seconds / 1e9);
    }
  }
  return best;
}

std::string sizeName(size_t bytes) {
  return bytes >= (size_t{1} << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}

int run(int samples) {
  const ReduceIsa best = bestReduceIsa();
  std::printf("reduce_bench: inout op= in, GB/s of inout bytes (1e9 B/s), best of %d samples; "
              "dispatched variant: %s\n",
              samples, reduceIsaName(best));
  std::printf("%-8s %-9s %-4s %8s %9s %8s %9s %8s %8s %10s\n", "size", "type", "op", "memcpy",
              "streaming", "scalar", "baseline", "avx2", "avx512", "x scalar");
  const size_t largest = kSizes[sizeof(kSizes) / sizeof(kSizes[0]) - 1];
  Buffer inout(largest);
  Buffer in(largest);
  for (size_t bytes : kSizes) {
    for (const Case& c : kCases) {
      const size_t count = bytes / elementSize(c.type);
      fillOnes(inout.data(), c.type, count);
      fillOnes(in.data(), c.type, count);
      std::vector<std::function<void()>> contenders;
      contenders.emplace_back([&] { std::memcpy(inout.data(), in.data(), bytes); });
      contenders.emplace_back([&] { streamingCopy(inout.data(), in.data(), bytes); });
      contenders.emplace_back([&] { c.scalar(inout.data(), in.data(), count); });
      std::vector<int> column(kNumReduceIsas, -1);  // index into contenders, -1: unavailable
      for (int i = 0; i < kNumReduceIsas; ++i) {
        const auto isa = static_cast<ReduceIsa>(i);
        if (isReduceIsaAvailable(isa)) {
          const ReduceFn fn = reduceFunction(c.type, c.op, isa);
          column[i] = static_cast<int>(contenders.size());
          contenders.emplace_back([&inout, &in, fn, count] { fn(inout.data(), in.data(), count); });
        }
      }
      const std::vector<double> rate = measure(contenders, bytes, samples);
      std::printf("%-8s %-9s %-4s %8.1f %9.1f %8.1f", sizeName(bytes).c_str(), dataTypeName(c.type),
                  reduceOpName(c.op), rate[0], rate[1], rate[2]);
      for (int i = 0; i < kNumReduceIsas; ++i) {
        if (column[i] < 0) {
          std::printf(" %*s", i == 0 ? 9 : 8, "-");
        } else {
          std::printf(" %*.1f", i == 0 ? 9 : 8, rate[static_cast<size_t>(column[i])]);
        }
      }
      std::printf(" %9.1fx\n", rate[static_cast<size_t>(column[static_cast<int>(best)])] / rate[2]);
    }
  }
  return 0;
}

// GB/s of memcpy, copyBytes() and streamingCopy() with dst `distance` bytes past a
// page-aligned src.
int runCopies(int samples) {
  constexpr size_t kDistances[] = {0, 16, 64};
  constexpr size_t kCopySizes[] = {size_t{4} << 10, size_t{256} << 10, size_t{4} << 20, size_t{64} << 20};
  const size_t largest = kCopySizes[sizeof(kCopySizes) / sizeof(kCopySizes[0]) - 1];
  Buffer src(largest);
  Buffer dst(largest + 4096);
  std::memset(src.data(), 1, largest);
  std::memset(dst.data(), 2, largest + 4096);
  std::printf("\ncopies, GB/s, dst = page-aligned src + distance, best of %d samples\n", samples);
  std::printf("%-8s %8s %8s %9s %9s\n", "size", "distance", "memcpy", "copyBytes", "streaming");
  for (size_t bytes : kCopySizes) {
    for (size_t distance : kDistances) {
      unsigned char* to = dst.data() + distance;
      const std::vector<std::function<void()>> contenders = {
          [&] { std::memcpy(to, src.data(), bytes); }, [&] { copyBytes(to, src.data(), bytes); },
          [&] { streamingCopy(to, src.data(), bytes); }};
      const std::vector<double> rate = measure(contenders, bytes, samples);
      std::printf("%-8s %8zu %8.1f %9.1f %9.1f\n", sizeName(bytes).c_str(), distance, rate[0], rate[1], rate[2]);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ringtree::algorithms

int main(int argc, char** argv) {
  int samples = 15;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--samples") == 0 && i + 1 < argc) {
      samples = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--samples N]\n", argv[0]);
      return 2;
    }
  }
  const int status = ringtree::algorithms::run(samples);
  return status != 0 ? status : ringtree::algorithms::runCopies(samples);
}
