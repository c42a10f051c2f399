// Collective latency and bandwidth through the public C++ API, nccl-tests style: one row
// per size with time, algbw and busbw, and #wrong from a checked run. Rank 0 prints.
//
// Usage: collective_bench [allreduce|broadcast|reduce|barrier|allgather|gather|scatter|
//                          reduce_scatter|alltoall] [options]
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
//   -r RANK            root of broadcast, reduce, gather and scatter (default 0)
//   --algo NAME        an algorithm of <ringtree/options.h> (default auto)
//   --transport KIND   auto, tcp or shm (default auto)
//
// size: the bytes of one rank's buffer (allgather: its output; reduce_scatter, alltoall:
// its input; gather: the root's output; scatter: the root's input), cut into n blocks of
// size / n for the last five (sizes are rounded down to whole blocks).
// time: the per-rank average over the timed operations, maximum over the ranks (us).
// algbw = size / time; busbw = algbw * 2(n-1)/n for allreduce, (n-1)/n for allgather,
// reduce_scatter and alltoall, algbw for broadcast, reduce, gather and scatter
// (nccl-tests' definitions). allgather runs in place, the others out of place. Exit
// status 1 when an element is wrong or a rank fails.

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

enum class Collective {
  kAllreduce,
  kBroadcast,
  kReduce,
  kBarrier,
  kAllgather,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoall,
};

const struct {
  const char* name;
  Collective collective;
} kCollectives[] = {{"allreduce", Collective::kAllreduce}, {"broadcast", Collective::kBroadcast},
                    {"reduce", Collective::kReduce},       {"barrier", Collective::kBarrier},
                    {"allgather", Collective::kAllgather}, {"gather", Collective::kGather},
                    {"scatter", Collective::kScatter},     {"reduce_scatter", Collective::kReduceScatter},
                    {"alltoall", Collective::kAlltoall}};

// The collectives over per-rank blocks (collectives.h), whose buffers hold n blocks.
bool isBlockwise(Collective c) {
  return c == Collective::kAllgather || c == Collective::kGather || c == Collective::kScatter ||
         c == Collective::kReduceScatter || c == Collective::kAlltoall;
}

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
    const auto named = std::find_if(std::begin(kCollectives), std::end(kCollectives),
                                    [&](const auto& entry) { return arg == entry.name; });
    if (named != std::end(kCollectives)) {
      o.collective = named->collective;
      o.collectiveName = named->name;
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

// Element i of the block rank `from` gives rank `to` in the collectives that only move
// data: below 100, exact in every type.
double blockValue(int from, int to, size_t i) {
  return static_cast<double>((static_cast<size_t>(from) * 7 + static_cast<size_t>(to) * 3 + i) % 100);
}

// One size's buffers on one rank, carved from storage allocated once for the largest
// size. `data` is the buffer of allreduce, broadcast and reduce (in place) and the input
// of the blockwise collectives, `result` their output; a blockwise buffer holds n blocks
// of `block` elements (scatter's and reduce_scatter's output: one).
struct Message {
  size_t count = 0;
  size_t block = 0;
  uint8_t* data = nullptr;
  uint8_t* result = nullptr;
  std::vector<size_t> counts;       // block, for every rank
  std::vector<const void*> inputs;  // the blocks of data
  std::vector<void*> outputs;       // the blocks of data (allgather: in place) or of result
};

Message layOut(const Options& o, std::vector<uint8_t>& data, std::vector<uint8_t>& result, size_t count, int size) {
  Message m;
  m.count = count;
  m.data = data.data();
  m.result = result.data();
  if (!isBlockwise(o.collective)) return m;
  const size_t es = elementSize(o.type);
  m.block = count / static_cast<size_t>(size);
  uint8_t* outputBase = o.collective == Collective::kAllgather ? m.data : m.result;
  for (int r = 0; r < size; ++r) {
    const size_t offset = static_cast<size_t>(r) * m.block * es;
    m.counts.push_back(m.block);
    m.inputs.push_back(m.data + offset);
    m.outputs.push_back(outputBase + offset);
  }
  return m;
}

template <typename T>
void fill(const Options& o, const Message& m, int rank) {
  T* data = reinterpret_cast<T*>(m.data);
  for (size_t i = 0; i < m.count; ++i) {
    const size_t blockIndex = m.block > 0 ? i / m.block : 0;
    const size_t inBlock = m.block > 0 ? i % m.block : i;
    const int to = static_cast<int>(blockIndex);
    switch (o.collective) {
      case Collective::kAllgather:
        data[i] = to == rank ? static_cast<T>(blockValue(rank, 0, inBlock)) : static_cast<T>(127);
        break;
      case Collective::kGather: data[i] = static_cast<T>(blockValue(rank, o.root, inBlock)); break;
      case Collective::kScatter:
      case Collective::kAlltoall: data[i] = static_cast<T>(blockValue(rank, to, inBlock)); break;
      default: data[i] = static_cast<T>(inputValue(rank, i)); break;
    }
  }
  if (isBlockwise(o.collective) && o.collective != Collective::kAllgather) {
    std::fill(m.result, m.result + m.count * sizeof(T), uint8_t{0x7f});
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

// The elements a blockwise collective left wrong on this rank.
template <typename T>
int64_t countWrongBlocks(const Options& o, const Message& m, int rank, int size) {
  const T* data = reinterpret_cast<const T*>(m.data);
  const T* result = reinterpret_cast<const T*>(m.result);
  int64_t wrong = 0;
  for (size_t i = 0; i < m.count; ++i) {
    const int from = static_cast<int>(i / m.block);
    const size_t inBlock = i % m.block;
    switch (o.collective) {
      case Collective::kAllgather: wrong += data[i] != static_cast<T>(blockValue(from, 0, inBlock)); break;
      case Collective::kGather:
        if (rank == o.root) wrong += result[i] != static_cast<T>(blockValue(from, o.root, inBlock));
        break;
      case Collective::kAlltoall: wrong += result[i] != static_cast<T>(blockValue(from, rank, inBlock)); break;
      case Collective::kScatter:
        if (i < m.block) wrong += result[i] != static_cast<T>(blockValue(o.root, rank, i));
        break;
      case Collective::kReduceScatter:
        if (i < m.block) {
          wrong += result[i] != expectedReduction<T>(o.op, size, static_cast<size_t>(rank) * m.block + i);
        }
        break;
      default: break;
    }
  }
  return wrong;
}

template <typename T>
int64_t countWrongTyped(const Options& o, const Message& m, int rank, int size) {
  if (isBlockwise(o.collective)) return countWrongBlocks<T>(o, m, rank, size);
  const T* data = reinterpret_cast<const T*>(m.data);
  int64_t wrong = 0;
  for (size_t i = 0; i < m.count; ++i) {
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

void fillInput(const Options& o, const Message& m, int rank) {
  switch (o.type) {
    case DataType::kFloat64: return fill<double>(o, m, rank);
    case DataType::kInt8: return fill<int8_t>(o, m, rank);
    case DataType::kUInt8: return fill<uint8_t>(o, m, rank);
    case DataType::kInt32: return fill<int32_t>(o, m, rank);
    case DataType::kInt64: return fill<int64_t>(o, m, rank);
    default: return fill<float>(o, m, rank);
  }
}

int64_t countWrong(const Options& o, const Message& m, int rank, int size) {
  switch (o.type) {
    case DataType::kFloat64: return countWrongTyped<double>(o, m, rank, size);
    case DataType::kInt8: return countWrongTyped<int8_t>(o, m, rank, size);
    case DataType::kUInt8: return countWrongTyped<uint8_t>(o, m, rank, size);
    case DataType::kInt32: return countWrongTyped<int32_t>(o, m, rank, size);
    case DataType::kInt64: return countWrongTyped<int64_t>(o, m, rank, size);
    default: return countWrongTyped<float>(o, m, rank, size);
  }
}

template <typename CollectiveOptionsType>
CollectiveOptionsType optionsFor(const Options& o) {
  CollectiveOptionsType options;
  options.algorithm = o.algorithm;
  return options;
}

void runOnce(const Options& o, Communicator& comm, const Message& m) {
  void* buffer = m.data;
  const size_t count = m.count;
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
    case Collective::kAllgather:
      return allgather(comm, m.outputs[static_cast<size_t>(comm.rank())], m.outputs.data(), m.counts.data(), o.type,
                       optionsFor<AllgatherOptions>(o));
    case Collective::kGather: {
      auto options = optionsFor<GatherOptions>(o);
      options.root = o.root;
      return gather(comm, m.data, m.outputs.data(), m.block, o.type, options);
    }
    case Collective::kScatter: {
      auto options = optionsFor<ScatterOptions>(o);
      options.root = o.root;
      return scatter(comm, m.inputs.data(), m.result, m.block, o.type, options);
    }
    case Collective::kReduceScatter: {
      auto options = optionsFor<ReduceScatterOptions>(o);
      options.op = o.op;
      return reduceScatter(comm, m.inputs.data(), m.result, m.counts.data(), o.type, options);
    }
    case Collective::kAlltoall:
      return alltoall(comm, m.inputs.data(), m.counts.data(), m.outputs.data(), m.counts.data(), o.type,
                      optionsFor<AlltoallOptions>(o));
  }
}

// Runs the benchmark as `rank`; returns the number of wrong elements over all ranks.
int64_t runRank(const Options& o, const std::shared_ptr<Store>& store, int rank, int size) {
  CommunicatorOptions commOptions;
  commOptions.transport = o.transport;
  auto comm = Communicator::create(std::make_shared<PrefixStore>("collective_bench", store), rank, size,
                                   commOptions);
  const size_t elem = elementSize(o.type);
  const bool reduces = o.collective == Collective::kAllreduce || o.collective == Collective::kReduce ||
                       o.collective == Collective::kReduceScatter;
  // Sizes are whole elements, and whole blocks of the blockwise collectives.
  const size_t unit = elem * (isBlockwise(o.collective) ? static_cast<size_t>(size) : 1);
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
      sizes.push_back(std::max(unit, static_cast<size_t>(bytes) / unit * unit));
    }
  }
  std::vector<uint8_t> data(o.collective == Collective::kBarrier ? 0 : sizes.back());
  std::vector<uint8_t> result(isBlockwise(o.collective) ? sizes.back() : 0);
  int64_t totalWrong = 0;
  for (size_t bytes : sizes) {
    const size_t count = bytes / elem;
    const Message message = layOut(o, data, result, count, size);
    int64_t wrong = 0;
    if (o.check && o.collective != Collective::kBarrier) {
      fillInput(o, message, rank);
      if (o.collective == Collective::kBroadcast && rank != o.root) {
        std::fill(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(bytes), uint8_t{0x7f});
      }
      runOnce(o, *comm, message);
      wrong = countWrong(o, message, rank, size);
      allreduce(*comm, &wrong, 1, DataType::kInt64);
    }
    totalWrong += wrong;
    fillInput(o, message, rank);
    for (int i = 0; i < o.warmup; ++i) {
      runOnce(o, *comm, message);
    }
    barrier(*comm);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) {
      runOnce(o, *comm, message);
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
                o.iters;
    AllreduceOptions maxOptions;
    maxOptions.op = ReduceOp::kMax;
    allreduce(*comm, &us, 1, DataType::kFloat64, maxOptions);
    if (rank == 0) {
      const double algbw = static_cast<double>(bytes) / (us * 1e3);
      const bool spread = o.collective == Collective::kAllgather || o.collective == Collective::kReduceScatter ||
                          o.collective == Collective::kAlltoall;
      const double factor = o.collective == Collective::kAllreduce ? 2.0 * (size - 1) / size
                            : spread                               ? static_cast<double>(size - 1) / size
                            : o.collective == Collective::kBarrier ? 0.0
                                                                   : 1.0;
      const bool rooted = o.collective == Collective::kBroadcast || o.collective == Collective::kReduce ||
                          o.collective == Collective::kGather || o.collective == Collective::kScatter;
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
