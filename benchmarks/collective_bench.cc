// Collective latency and bandwidth through the public C++ API, nccl-tests style: one row
// per size with time, algbw and busbw, and #wrong from a checked run. Rank 0 prints.
//
// Usage: collective_bench [allreduce|broadcast|reduce|barrier] [options]
//   --nproc N          fork N local ranks that meet through a FileStore in a temporary
//                      directory; without it, this process is one rank of a job started by
//                      ringtree-run --no-python (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
//   -b, -e SIZE        smallest, largest size in bytes (K/M/G suffixes, 1024-based;
//                      default 8 and 64M)
//   -f F               multiply the size by F at each step (default 2)
//   -n N, -w N         timed and warm-up operations per size (default 20 and 5)
//   -c 0|1             1: before timing, run each size once on integer-valued data and
//                      count the wrong elements over all ranks (default 1)
//   -d TYPE            float32, float64, int8, uint8, int32, int64 (default float32)
//   -o OP              sum, prod, min, max, avg (default sum)
//   -r RANK            root of broadcast and reduce (default 0)
//   --algo NAME        an algorithm of <ringtree/options.h> (default auto)
//   --transport KIND   auto, tcp or shm (default auto)
//
// time: the per-rank average over the timed operations, maximum over the ranks (us).
// algbw = size / time; busbw = algbw * 2(n-1)/n for allreduce, algbw for broadcast and
// reduce (nccl-tests' definitions). Exit status 1 when an element is wrong or a rank fails.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <ringtree/ringtree.h>

namespace ringtree {
namespace {

enum class Collective { kAllreduce, kBroadcast, kReduce, kBarrier };

struct Options {
  Collective collective = Collective::kAllreduce;
  const char* collectiveName = "allreduce";
  size_t minBytes = 8;
  size_t maxBytes = size_t{64} << 20;
  double factor = 2.0;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  const char* opName = "sum";
  int root = 0;
  Algorithm algorithm = Algorithm::kAuto;
  TransportKind transport = TransportKind::kAuto;
  int nproc = 0;
};

[[noreturn]] void usageError(const std::string& message) {
  throw InvalidArgument("collective_bench: " + message + " (see the header of collective_bench.cc)");
}

size_t parseBytes(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  double scale = 1.0;
  if (*end == 'K' || *end == 'k') {
    scale = 1024.0;
  } else if (*end == 'M' || *end == 'm') {
    scale = 1024.0 * 1024.0;
  } else if (*end == 'G' || *end == 'g') {
    scale = 1024.0 * 1024.0 * 1024.0;
  }
  const char* rest = scale == 1.0 ? end : end + 1;
  if (end == text.c_str() || value < 0 || *rest != '\0') {
    usageError("bad size '" + text + "'");
  }
  return static_cast<size_t>(value * scale);
}

Options parseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        usageError(arg + " needs a value");
      }
      return argv[++i];
    };
    if (arg == "allreduce") {
      o.collective = Collective::kAllreduce;
      o.collectiveName = "allreduce";
    } else if (arg == "broadcast") {
      o.collective = Collective::kBroadcast;
      o.collectiveName = "broadcast";
    } else if (arg == "reduce") {
      o.collective = Collective::kReduce;
      o.collectiveName = "reduce";
    } else if (arg == "barrier") {
      o.collective = Collective::kBarrier;
      o.collectiveName = "barrier";
    } else if (arg == "-b") {
      o.minBytes = parseBytes(value());
    } else if (arg == "-e") {
      o.maxBytes = parseBytes(value());
    } else if (arg == "-f") {
      o.factor = std::atof(value().c_str());
    } else if (arg == "-n") {
      o.iters = std::atoi(value().c_str());
    } else if (arg == "-w") {
      o.warmup = std::atoi(value().c_str());
    } else if (arg == "-c") {
      o.check = std::atoi(value().c_str()) != 0;
    } else if (arg == "-r") {
      o.root = std::atoi(value().c_str());
    } else if (arg == "--nproc") {
      o.nproc = std::atoi(value().c_str());
    } else if (arg == "--algo") {
      o.algorithm = parseAlgorithm(value().c_str());
    } else if (arg == "-d") {
      const std::string name = value();
      const DataType types[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt8,
                                DataType::kUInt8,   DataType::kInt32,   DataType::kInt64};
      bool found = false;
      for (DataType t : types) {
        if (name == dataTypeName(t)) {
          o.type = t;
          found = true;
        }
      }
      if (!found) {
        usageError("unknown -d '" + name + "'");
      }
    } else if (arg == "-o") {
      const std::string name = value();
      const struct {
        const char* name;
        ReduceOp op;
      } ops[] = {{"sum", ReduceOp::kSum},
                 {"prod", ReduceOp::kProduct},
                 {"min", ReduceOp::kMin},
                 {"max", ReduceOp::kMax},
                 {"avg", ReduceOp::kAvg}};
      bool found = false;
      for (const auto& entry : ops) {
        if (name == entry.name) {
          o.op = entry.op;
          o.opName = entry.name;
          found = true;
        }
      }
      if (!found) {
        usageError("unknown -o '" + name + "'");
      }
    } else if (arg == "--transport") {
      const std::string name = value();
      if (name == "auto") {
        o.transport = TransportKind::kAuto;
      } else if (name == "tcp") {
        o.transport = TransportKind::kTcp;
      } else if (name == "shm") {
        o.transport = TransportKind::kShm;
      } else {
        usageError("unknown --transport '" + name + "'");
      }
    } else {
      usageError("unknown argument '" + arg + "'");
    }
  }
  if (o.factor <= 1.0 || o.iters < 1 || o.warmup < 0 || o.minBytes > o.maxBytes) {
    usageError("need -f > 1, -n >= 1, -w >= 0 and -b <= -e");
  }
  return o;
}

// The integer-valued input element i of `rank` for the check: small enough that every
// op and type is exact (products of up to 7 factors of at most 2 fit int8).
double inputValue(int rank, size_t i) {
  return static_cast<double>((static_cast<size_t>(rank) + i) % 2 + 1);
}

template <typename T>
void fill(std::vector<uint8_t>& bytes, size_t count, int rank) {
  T* data = reinterpret_cast<T*>(bytes.data());
  for (size_t i = 0; i < count; ++i) {
    data[i] = static_cast<T>(inputValue(rank, i));
  }
}

template <typename T>
T expectedReduction(ReduceOp op, int size, size_t i) {
  double acc = inputValue(0, i);
  for (int r = 1; r < size; ++r) {
    const double v = inputValue(r, i);
    acc = op == ReduceOp::kProduct ? acc * v
          : op == ReduceOp::kMin   ? std::min(acc, v)
          : op == ReduceOp::kMax   ? std::max(acc, v)
                                   : acc + v;
  }
  if (op == ReduceOp::kAvg) {
    return static_cast<T>(static_cast<T>(acc) / static_cast<T>(size));
  }
  return static_cast<T>(acc);
}

template <typename T>
int64_t countWrongTyped(const Options& o, const std::vector<uint8_t>& bytes, size_t count, int rank,
                        int size) {
  const T* data = reinterpret_cast<const T*>(bytes.data());
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    T expected;
    if (o.collective == Collective::kBroadcast) {
      expected = static_cast<T>(inputValue(o.root, i));
    } else if (o.collective == Collective::kReduce && rank != o.root) {
      expected = static_cast<T>(inputValue(rank, i));
    } else {
      expected = expectedReduction<T>(o.op, size, i);
    }
    wrong += data[i] != expected ? 1 : 0;
  }
  return wrong;
}

void fillInput(const Options& o, std::vector<uint8_t>& bytes, size_t count, int rank) {
  switch (o.type) {
    case DataType::kFloat64: return fill<double>(bytes, count, rank);
    case DataType::kInt8: return fill<int8_t>(bytes, count, rank);
    case DataType::kUInt8: return fill<uint8_t>(bytes, count, rank);
    case DataType::kInt32: return fill<int32_t>(bytes, count, rank);
    case DataType::kInt64: return fill<int64_t>(bytes, count, rank);
    default: return fill<float>(bytes, count, rank);
  }
}

int64_t countWrong(const Options& o, const std::vector<uint8_t>& bytes, size_t count, int rank, int size) {
  switch (o.type) {
    case DataType::kFloat64: return countWrongTyped<double>(o, bytes, count, rank, size);
    case DataType::kInt8: return countWrongTyped<int8_t>(o, bytes, count, rank, size);
    case DataType::kUInt8: return countWrongTyped<uint8_t>(o, bytes, count, rank, size);
    case DataType::kInt32: return countWrongTyped<int32_t>(o, bytes, count, rank, size);
    case DataType::kInt64: return countWrongTyped<int64_t>(o, bytes, count, rank, size);
    default: return countWrongTyped<float>(o, bytes, count, rank, size);
  }
}

void runOnce(const Options& o, Communicator& comm, void* buffer, size_t count) {
  switch (o.collective) {
    case Collective::kAllreduce: {
      AllreduceOptions options;
      options.algorithm = o.algorithm;
      options.op = o.op;
      return allreduce(comm, buffer, count, o.type, options);
    }
    case Collective::kBroadcast: {
      BroadcastOptions options;
      options.algorithm = o.algorithm;
      options.root = o.root;
      return broadcast(comm, buffer, count, o.type, options);
    }
    case Collective::kReduce: {
      ReduceOptions options;
      options.algorithm = o.algorithm;
      options.root = o.root;
      options.op = o.op;
      return reduce(comm, buffer, count, o.type, options);
    }
    case Collective::kBarrier:
      return barrier(comm);
  }
}

// Runs the benchmark as `rank`; returns the number of wrong elements over all ranks.
int64_t runRank(const Options& o, const std::shared_ptr<Store>& store, int rank, int size) {
  CommunicatorOptions commOptions;
  commOptions.transport = o.transport;
  auto comm = Communicator::create(std::make_shared<PrefixStore>("collective_bench", store), rank, size,
                                   commOptions);
  const size_t elem = elementSize(o.type);
  const bool reduces = o.collective == Collective::kAllreduce || o.collective == Collective::kReduce;
  if (rank == 0) {
    std::printf("# collective_bench %s: %d ranks, transport %s to rank %d, algo %s, %d iters, %d warm-up\n",
                o.collectiveName, size, comm->transportTo(size > 1 ? 1 : 0), size > 1 ? 1 : 0,
                algorithmName(o.algorithm), o.iters, o.warmup);
    std::printf("#%11s %12s %8s %6s %5s %10s %8s %8s %7s\n", "size", "count", "type", "redop", "root", "time",
                "algbw", "busbw", "#wrong");
    std::printf("#%11s %12s %8s %6s %5s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)",
                "(GB/s)", "(GB/s)", "");
  }
  std::vector<size_t> sizes;
  if (o.collective == Collective::kBarrier) {
    sizes.push_back(0);
  } else {
    for (double bytes = static_cast<double>(o.minBytes); bytes <= static_cast<double>(o.maxBytes) * 1.000001;
         bytes *= o.factor) {
      sizes.push_back(std::max(elem, static_cast<size_t>(bytes) / elem * elem));
    }
  }
  std::vector<uint8_t> buffer(o.collective == Collective::kBarrier ? 0 : sizes.back());
  int64_t totalWrong = 0;
  for (size_t bytes : sizes) {
    const size_t count = bytes / elem;
    int64_t wrong = 0;
    if (o.check && o.collective != Collective::kBarrier) {
      fillInput(o, buffer, count, rank);
      if (o.collective == Collective::kBroadcast && rank != o.root) {
        std::fill(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(bytes), uint8_t{0x7f});
      }
      runOnce(o, *comm, buffer.data(), count);
      wrong = countWrong(o, buffer, count, rank, size);
      allreduce(*comm, &wrong, 1, DataType::kInt64);
    }
    totalWrong += wrong;
    fillInput(o, buffer, count, rank);
    for (int i = 0; i < o.warmup; ++i) {
      runOnce(o, *comm, buffer.data(), count);
    }
    barrier(*comm);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) {
      runOnce(o, *comm, buffer.data(), count);
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
                o.iters;
    AllreduceOptions maxOptions;
    maxOptions.op = ReduceOp::kMax;
    allreduce(*comm, &us, 1, DataType::kFloat64, maxOptions);
    if (rank == 0) {
      const double algbw = static_cast<double>(bytes) / (us * 1e3);
      const double factor = o.collective == Collective::kAllreduce ? 2.0 * (size - 1) / size
                            : o.collective == Collective::kBarrier ? 0.0
                                                                   : 1.0;
      const bool rooted = o.collective == Collective::kBroadcast || o.collective == Collective::kReduce;
      std::printf("%12zu %12zu %8s %6s %5d %10.2f %8.2f %8.2f %7s\n", bytes, count, dataTypeName(o.type),
                  reduces ? o.opName : "none", rooted ? o.root : -1, us, algbw, algbw * factor,
                  o.check && o.collective != Collective::kBarrier ? std::to_string(wrong).c_str() : "N/A");
      std::fflush(stdout);
    }
  }
  return totalWrong;
}

// The process exit status of one rank: 0 when it ran and nothing was wrong.
int runRankStatus(const Options& o, const std::shared_ptr<Store>& store, int rank, int size) {
  try {
    return runRank(o, store, rank, size) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_bench rank %d: %s\n", rank, e.what());
    return 1;
  }
}

int runForked(const Options& o) {
  char dir[] = "/tmp/ringtree-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string path = std::string(dir) + "/store";
  std::fflush(stdout);
  std::vector<pid_t> children;
  for (int rank = 0; rank < o.nproc; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      break;
    }
    if (pid == 0) {
      int status = 1;
      try {
        auto store = std::make_shared<FileStore>(path, o.nproc);
        status = runRankStatus(o, store, rank, o.nproc);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "collective_bench rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      _exit(status);
    }
    children.push_back(pid);
  }
  int failures = o.nproc - static_cast<int>(children.size());
  for (pid_t pid : children) {
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
    }
  }
  unlink(path.c_str());
  rmdir(dir);
  return failures == 0 ? 0 : 1;
}

int envInt(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    usageError(std::string(name) + " is not set: pass --nproc N or run under ringtree-run --no-python");
  }
  return std::atoi(value);
}

int runLaunched(const Options& o) {
  const int rank = envInt("RANK");
  const int size = envInt("WORLD_SIZE");
  const char* addr = std::getenv("MASTER_ADDR");
  const char* agentStore = std::getenv("RINGTREE_USE_AGENT_STORE");
  TcpStoreOptions options;
  options.port = static_cast<uint16_t>(envInt("MASTER_PORT"));
  options.isServer = rank == 0 && (agentStore == nullptr || std::strcmp(agentStore, "1") != 0);
  options.numWorkers = size;
  options.waitForWorkers = false;
  auto store = std::make_shared<TcpStore>(addr != nullptr ? addr : "127.0.0.1", options);
  return runRankStatus(o, store, rank, size);
}

}  // namespace
}  // namespace ringtree

int main(int argc, char** argv) {
  try {
    const ringtree::Options options = ringtree::parseOptions(argc, argv);
    return options.nproc > 0 ? ringtree::runForked(options) : ringtree::runLaunched(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
