// The gather/scatter family (allgather, gather, scatter, reduce_scatter, alltoall): every
// algorithm, asked for and automatic, x world sizes 1..5 (and 8 for allgather) x tcp and
// shm x uneven counts with zeros x dtypes x in place and out of place x segments small
// enough for many steps, over the thread harness; then argument errors and mismatches.
// Collectives that move data are checked byte for byte against a
// pattern unique to (sender, receiver, byte); reduce_scatter against a local fold, in
// rank order, of small integers (exact in any order) with the same element kernels.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "algorithms/reduce_ops.h"
#include "harness/mismatch.h"
#include "harness/test_util.h"
#include "harness/thread_harness.h"
#include "harness/typed_values.h"

namespace ringtree {
namespace {

using Bytes = std::vector<uint8_t>;
using test::contains;
using test::expectMismatchOnBothRanks;

enum class Kind { kAllgather, kGather, kScatter, kReduceScatter, kAlltoall };

// Per-rank element counts of a case, as a function of the world size: uniform, or uneven
// with zeros. Every rank derives the same counts. kHuge: alltoall messages of about a
// megabyte (not in the grid).
enum class Counts { kZero, kOne, kOdd, kUneven, kLarge, kHuge };

struct Case {
  Kind kind;
  Algorithm algorithm;
  DataType type;
  ReduceOp op;
  Counts counts;
  int root;
  bool inPlace;
  size_t maxSegmentBytes;
};

const Counts kAllCounts[] = {Counts::kZero, Counts::kOne, Counts::kOdd, Counts::kUneven, Counts::kLarge};

// Rank r's block count (gather/scatter: every rank's is that of rank 0, the same for all).
size_t countOf(Counts counts, int r) {
  switch (counts) {
    case Counts::kZero: return 0;
    case Counts::kOne: return 1;
    case Counts::kOdd: return 7;
    case Counts::kUneven: return r % 3 == 1 ? 0 : static_cast<size_t>(3 + 17 * r);
    case Counts::kLarge: return r == 2 ? 0 : static_cast<size_t>(1500 + 301 * r);
    case Counts::kHuge: return 60000;
  }
  return 0;
}

// alltoall: how many elements rank `from` sends rank `to` (zeros included, not symmetric).
size_t pairCount(Counts counts, int from, int to) {
  if (counts == Counts::kUneven) return (from + 2 * to) % 4 == 0 ? 0 : static_cast<size_t>(1 + (from * 3 + to) % 5);
  if (counts == Counts::kLarge) return (from + to) % 3 == 0 ? 0 : static_cast<size_t>(1000 + 97 * from + 13 * to);
  if (counts == Counts::kHuge) return (from + to) % 3 == 0 ? 0 : static_cast<size_t>(60000 + 997 * from + 13 * to);
  return countOf(counts, 0);
}

std::vector<size_t> blockCounts(const Case& c, int n) {
  std::vector<size_t> counts(static_cast<size_t>(n));
  const bool perRank = c.kind == Kind::kAllgather || c.kind == Kind::kReduceScatter;
  for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = countOf(c.counts, perRank ? r : 0);
  return counts;
}

std::string describe(const Case& c) {
  const char* kinds[] = {"allgather", "gather", "scatter", "reduce_scatter", "alltoall"};
  const char* counts[] = {"zero", "one", "odd", "uneven", "large", "huge"};
  return std::string(kinds[static_cast<int>(c.kind)]) + "/" + algorithmName(c.algorithm) + "/" +
         dataTypeName(c.type) + "/" + reduceOpName(c.op) + "/counts=" + counts[static_cast<int>(c.counts)] +
         "/root=" + std::to_string(c.root) + (c.inPlace ? "/in_place" : "/out_of_place") +
         "/segment=" + std::to_string(c.maxSegmentBytes);
}

// The bytes rank `from` sends rank `to` (-1: every rank), distinct for every pair and
// position.
Bytes pattern(int from, int to, size_t bytes) {
  Bytes data(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    data[i] = static_cast<uint8_t>(from * 67 + (to + 1) * 29 + i * 13 + (i >> 8) * 7 + 1);
  }
  return data;
}

// What a receive buffer holds before the call: a value no pattern guarantees.
Bytes untouched(size_t bytes) { return Bytes(bytes, 0xee); }

std::vector<void*> pointers(std::vector<Bytes>& buffers) {
  std::vector<void*> result;
  for (auto& b : buffers) result.push_back(b.data());
  return result;
}

std::vector<const void*> constPointers(const std::vector<Bytes>& buffers) {
  std::vector<const void*> result;
  for (const auto& b : buffers) result.push_back(b.data());
  return result;
}

void runAllgather(Communicator& comm, const Case& c) {
  const int n = comm.size();
  const int rank = comm.rank();
  const size_t es = elementSize(c.type);
  const std::vector<size_t> counts = blockCounts(c, n);
  std::vector<Bytes> outputs;
  for (int r = 0; r < n; ++r) outputs.push_back(untouched(counts[r] * es));
  const Bytes input = pattern(rank, -1, counts[rank] * es);
  if (c.inPlace) outputs[rank] = input;
  AllgatherOptions o;
  o.algorithm = c.algorithm;
  o.maxSegmentBytes = c.maxSegmentBytes;
  allgather(comm, c.inPlace ? outputs[rank].data() : input.data(), pointers(outputs).data(), counts.data(), c.type, o);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(outputs[r], pattern(r, -1, counts[r] * es)) << describe(c) << ": block " << r << " on rank " << rank;
  }
  ASSERT_EQ(input, pattern(rank, -1, counts[rank] * es)) << describe(c) << ": input changed on rank " << rank;
}

void runGather(Communicator& comm, const Case& c) {
  const int n = comm.size();
  const int rank = comm.rank();
  const size_t bytes = countOf(c.counts, 0) * elementSize(c.type);
  const Bytes input = pattern(rank, c.root, bytes);
  std::vector<Bytes> outputs;
  if (rank == c.root) {
    for (int r = 0; r < n; ++r) outputs.push_back(untouched(bytes));
    if (c.inPlace) outputs[rank] = input;
  }
  GatherOptions o;
  o.algorithm = c.algorithm;
  o.root = c.root;
  o.maxSegmentBytes = c.maxSegmentBytes;
  const void* in = rank == c.root && c.inPlace ? outputs[rank].data() : input.data();
  gather(comm, in, rank == c.root ? pointers(outputs).data() : nullptr, countOf(c.counts, 0), c.type, o);
  for (int r = 0; r < static_cast<int>(outputs.size()); ++r) {
    ASSERT_EQ(outputs[r], pattern(r, c.root, bytes)) << describe(c) << ": block " << r << " on rank " << rank;
  }
  ASSERT_EQ(input, pattern(rank, c.root, bytes)) << describe(c) << ": input changed on rank " << rank;
}

void runScatter(Communicator& comm, const Case& c) {
  const int n = comm.size();
  const int rank = comm.rank();
  const size_t bytes = countOf(c.counts, 0) * elementSize(c.type);
  std::vector<Bytes> inputs;
  if (rank == c.root) {
    for (int r = 0; r < n; ++r) inputs.push_back(pattern(c.root, r, bytes));
  }
  Bytes output = untouched(bytes);
  ScatterOptions o;
  o.algorithm = c.algorithm;
  o.root = c.root;
  o.maxSegmentBytes = c.maxSegmentBytes;
  void* out = rank == c.root && c.inPlace ? inputs[rank].data() : output.data();
  scatter(comm, rank == c.root ? constPointers(inputs).data() : nullptr, out, countOf(c.counts, 0), c.type, o);
  ASSERT_EQ(rank == c.root && c.inPlace ? inputs[rank] : output, pattern(c.root, rank, bytes))
      << describe(c) << " on rank " << rank;
  for (int r = 0; r < static_cast<int>(inputs.size()); ++r) {
    ASSERT_EQ(inputs[r], pattern(c.root, r, bytes)) << describe(c) << ": input " << r << " changed on rank " << rank;
  }
}

void runAlltoall(Communicator& comm, const Case& c) {
  const int n = comm.size();
  const int rank = comm.rank();
  const size_t es = elementSize(c.type);
  std::vector<size_t> sendCounts, recvCounts;
  std::vector<Bytes> inputs, outputs;
  for (int p = 0; p < n; ++p) {
    sendCounts.push_back(pairCount(c.counts, rank, p));
    recvCounts.push_back(pairCount(c.counts, p, rank));
    inputs.push_back(pattern(rank, p, sendCounts.back() * es));
    outputs.push_back(untouched(recvCounts.back() * es));
  }
  std::vector<const void*> in = constPointers(inputs);
  if (c.inPlace) {
    outputs[rank] = inputs[rank];
    in[rank] = outputs[rank].data();
  }
  AlltoallOptions o;
  o.algorithm = c.algorithm;
  o.maxSegmentBytes = c.maxSegmentBytes;
  alltoall(comm, in.data(), sendCounts.data(), pointers(outputs).data(), recvCounts.data(), c.type, o);
  for (int p = 0; p < n; ++p) {
    ASSERT_EQ(outputs[p], pattern(p, rank, recvCounts[p] * es)) << describe(c) << ": from " << p << " on rank " << rank;
    ASSERT_EQ(inputs[p], pattern(rank, p, sendCounts[p] * es)) << describe(c) << ": input " << p << " changed";
  }
}

// Rank r's element i of its block for rank q, for op: small values whose sums and
// products stay exact.
double inputValue(ReduceOp op, int r, int q, size_t i) {
  const size_t k = i + static_cast<size_t>(q) * 5;
  switch (op) {
    case ReduceOp::kProduct: return static_cast<double>((static_cast<size_t>(r) + k) % 2 + 1);
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: return static_cast<double>((static_cast<size_t>(r) * 37 + k * 11) % 128);
    default: return static_cast<double>((static_cast<size_t>(r) * 7 + k * 3) % 5 + 1);
  }
}

Bytes reduceInput(const Case& c, int r, int q, size_t count) {
  const size_t es = elementSize(c.type);
  Bytes data(count * es);
  for (size_t i = 0; i < count; ++i) test::store(c.type, inputValue(c.op, r, q, i), data.data() + i * es);
  return data;
}

constexpr double kPremulFactor = 2.0;

// Block q of the reduction: every rank's contribution folded in rank order.
Bytes reducedBlock(const Case& c, int n, int q, size_t count) {
  const auto contribution = [&](int r) {
    Bytes data = reduceInput(c, r, q, count);
    if (c.op == ReduceOp::kPremulSum) algorithms::scale(data.data(), count, c.type, kPremulFactor);
    return data;
  };
  Bytes result = contribution(0);
  const ReduceFn fn = algorithms::reduceFunction(c.type, c.op);
  for (int r = 1; r < n; ++r) fn(result.data(), contribution(r).data(), count);
  if (c.op == ReduceOp::kAvg) algorithms::divide(result.data(), count, c.type, n);
  return result;
}

void runReduceScatter(Communicator& comm, const Case& c) {
  const int n = comm.size();
  const int rank = comm.rank();
  const size_t es = elementSize(c.type);
  const std::vector<size_t> counts = blockCounts(c, n);
  std::vector<Bytes> inputs;
  for (int q = 0; q < n; ++q) inputs.push_back(reduceInput(c, rank, q, counts[q]));
  const std::vector<Bytes> original = inputs;
  Bytes output = untouched(counts[rank] * es);
  ReduceScatterOptions o;
  o.algorithm = c.algorithm;
  o.op = c.op;
  o.premulFactor = kPremulFactor;
  o.maxSegmentBytes = c.maxSegmentBytes;
  reduceScatter(comm, constPointers(inputs).data(), c.inPlace ? inputs[rank].data() : output.data(), counts.data(),
                c.type, o);
  const Bytes& result = c.inPlace ? inputs[rank] : output;
  ASSERT_EQ(result, reducedBlock(c, n, rank, counts[rank])) << describe(c) << " on rank " << rank << " of " << n;
  for (int q = 0; q < n; ++q) {
    if (q != rank || !c.inPlace) {
      ASSERT_EQ(inputs[q], original[q]) << describe(c) << ": input " << q << " changed";
    }
  }
}

void runCase(Communicator& comm, const Case& c) {
  switch (c.kind) {
    case Kind::kAllgather: return runAllgather(comm, c);
    case Kind::kGather: return runGather(comm, c);
    case Kind::kScatter: return runScatter(comm, c);
    case Kind::kReduceScatter: return runReduceScatter(comm, c);
    case Kind::kAlltoall: return runAlltoall(comm, c);
  }
}

// A segment small enough that the large counts take many steps (or none).
size_t segmentFor(Counts counts) { return counts == Counts::kLarge ? 512 : 0; }

// Element sizes 1, 2, 4, 8, 8 and bool: the collectives that only move data see bytes.
const DataType kMoveTypes[] = {DataType::kInt8, DataType::kBFloat16, DataType::kFloat32, DataType::kInt64,
                               DataType::kComplex64, DataType::kBool};

std::vector<Case> casesFor(Kind kind, int n, TransportKind transport) {
  const bool shm = transport == TransportKind::kShm;
  std::vector<Case> cases;
  std::vector<Algorithm> algorithms;
  switch (kind) {
    case Kind::kAllgather: algorithms = {Algorithm::kAuto, Algorithm::kRing, Algorithm::kHalvingDoubling}; break;
    case Kind::kReduceScatter: algorithms = {Algorithm::kAuto, Algorithm::kRing, Algorithm::kPairwise}; break;
    case Kind::kAlltoall: algorithms = {Algorithm::kAuto, Algorithm::kPairwise}; break;
    case Kind::kGather:
    case Kind::kScatter: algorithms = {Algorithm::kAuto, Algorithm::kTree, Algorithm::kLinear}; break;
  }
  if (shm && kind != Kind::kGather && kind != Kind::kScatter) algorithms.push_back(Algorithm::kShmDirect);
  int variant = 0;  // alternates in place and out of place, and the roots
  if (kind == Kind::kReduceScatter) {
    const DataType types[] = {DataType::kFloat32, DataType::kInt32,     DataType::kBFloat16,  DataType::kFloat16,
                              DataType::kFloat64, DataType::kInt8,      DataType::kUInt8,     DataType::kInt16,
                              DataType::kInt64,   DataType::kBool,      DataType::kComplex64, DataType::kComplex128};
    const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg,  ReduceOp::kProduct, ReduceOp::kMin,      ReduceOp::kMax,
                            ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor,    ReduceOp::kPremulSum};
    for (DataType type : types) {
      // Every op each type supports; every count pattern on float32 and int32, the
      // uneven ones on the others (up to 5 ranks).
      const bool everyCount = type == DataType::kFloat32 || type == DataType::kInt32;
      for (ReduceOp op : ops) {
        if (!isSupported(type, op)) continue;
        for (Algorithm a : algorithms) {
          for (Counts counts : kAllCounts) {
            if (!everyCount && (n > 5 || (counts != Counts::kUneven && counts != Counts::kLarge))) continue;
            cases.push_back({kind, a, type, op, counts, -1, ++variant % 2 == 0, segmentFor(counts)});
          }
        }
      }
    }
    return cases;
  }
  for (DataType type : kMoveTypes) {
    for (Algorithm a : algorithms) {
      for (Counts counts : kAllCounts) {
        const bool rooted = kind == Kind::kGather || kind == Kind::kScatter;
        if (rooted && counts == Counts::kUneven) continue;  // one count for all
        for (int root = 0; root < (rooted ? n : 1); ++root) {
          if (rooted && n > 3 && (root + variant) % 2 == 1) {  // half of the roots, all over the cases
            ++variant;
            continue;
          }
          cases.push_back({kind, a, type, ReduceOp::kSum, counts, rooted ? root : -1, ++variant % 2 == 0,
                           segmentFor(counts)});
        }
      }
    }
  }
  return cases;
}

using GridParam = std::tuple<Kind, TransportKind, int>;

class GatherScatterGrid : public ::testing::TestWithParam<GridParam> {};

TEST_P(GatherScatterGrid, EveryCaseIsExact) {
  const auto [kind, transport, n] = GetParam();
  const std::vector<Case> cases = casesFor(kind, n, transport);
  test::runCommunicators(n, [&](int, Communicator& comm) {
    for (const Case& c : cases) {
      test::runNamedCase([&] { return describe(c); }, [&] { runCase(comm, c); });
      if (::testing::Test::HasFatalFailure()) return;
    }
    barrier(comm);
  }, test::testOptions(transport));
}

std::string gridName(const ::testing::TestParamInfo<GridParam>& info) {
  const auto [kind, transport, n] = info.param;
  const char* kinds[] = {"allgather", "gather", "scatter", "reduce_scatter", "alltoall"};
  return std::string(kinds[static_cast<int>(kind)]) + "_" + transportKindName(transport) + "_" +
         std::to_string(n) + "ranks";
}

const auto kKinds = ::testing::Values(Kind::kAllgather, Kind::kGather, Kind::kScatter, Kind::kReduceScatter,
                                      Kind::kAlltoall);
const auto kTransports = ::testing::Values(TransportKind::kTcp, TransportKind::kShm);

INSTANTIATE_TEST_SUITE_P(Sizes1To5, GatherScatterGrid, ::testing::Combine(kKinds, kTransports, ::testing::Range(1, 6)),
                         gridName);
INSTANTIATE_TEST_SUITE_P(EightRanks, GatherScatterGrid, ::testing::Combine(kKinds, kTransports, ::testing::Values(8)),
                         gridName);

// ---------------------------------------------------------------------------------------
// Errors.

// Runs fn, which must throw InvalidArgument whose message contains `part`.
template <typename Fn>
void expectInvalid(Fn&& fn, const std::string& part) {
  const std::string message = test::messageOf<InvalidArgument>(fn);
  EXPECT_TRUE(contains(message, part)) << "expected '" << part << "' in: " << message;
}

template <typename Options>
Options withAlgorithm(Algorithm algorithm) {
  Options options;
  options.algorithm = algorithm;
  return options;
}

TEST(GatherScatterFamily, InvalidArgumentsThrowBeforeAnyDataMoves) {
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    std::vector<int32_t> a(8, 1), b(8, 2);
    void* outputs[2] = {a.data(), b.data()};
    const void* inputs[2] = {a.data(), b.data()};
    void* withNull[2] = {a.data(), nullptr};
    const void* constWithNull[2] = {a.data(), nullptr};
    size_t counts[2] = {4, 4};
    size_t fewer[2] = {2, 2};
    const size_t huge = std::numeric_limits<size_t>::max() / 2;
    size_t hugeCounts[2] = {huge, huge};
    const DataType i32 = DataType::kInt32;

    expectInvalid([&] { allgather(comm, a.data(), nullptr, counts, i32); }, "allgather: outputs is null");
    expectInvalid([&] { allgather(comm, a.data(), outputs, nullptr, i32); }, "allgather: counts is null");
    expectInvalid([&] { allgather(comm, a.data(), withNull, counts, i32); },
                  "allgather: outputs[1] is null but should hold 4 elements");
    expectInvalid([&] { allgather(comm, nullptr, outputs, counts, i32); }, "allgather: input is null");
    expectInvalid([&] { allgather(comm, a.data(), outputs, hugeCounts, i32); },
                  "allgather: " + std::to_string(2 * huge) + " elements of int32 do not fit in the address space");
    size_t overflowingCounts[2] = {huge + 1, huge + 1};
    expectInvalid([&] { allgather(comm, a.data(), outputs, overflowingCounts, DataType::kInt8); },
                  "allgather: the sum of counts does not fit in size_t");
    const auto chain = withAlgorithm<AllgatherOptions>(Algorithm::kChain);
    expectInvalid([&] { allgather(comm, a.data(), outputs, counts, i32, chain); },
                  "algorithm 'chain' is not available for allgather; choose one of ring, halving_doubling, shm_direct, hierarchical");
    const auto shmDirect = withAlgorithm<AllgatherOptions>(Algorithm::kShmDirect);
    expectInvalid([&] { allgather(comm, a.data(), outputs, counts, i32, shmDirect); },
                  "allgather: shm_direct needs every rank on one host");

    GatherOptions badGatherRoot;
    badGatherRoot.root = 2;
    expectInvalid([&] { gather(comm, a.data(), outputs, 4, i32, badGatherRoot); },
                  "gather: root 2 is not a rank of this group of 2 ranks");
    GatherOptions gatherToMe;
    gatherToMe.root = rank;
    expectInvalid([&] { gather(comm, a.data(), nullptr, 4, i32, gatherToMe); }, "gather: outputs is null");
    expectInvalid([&] { gather(comm, nullptr, outputs, 4, i32, gatherToMe); }, "gather: input is null");
    expectInvalid([&] { gather(comm, a.data(), outputs, huge + 1, DataType::kInt8, gatherToMe); },
                  "gather: 2 blocks of " + std::to_string(huge + 1) + " elements do not fit in size_t");
    expectInvalid([&] { gather(comm, a.data(), outputs, huge, i32, gatherToMe); },
                  "gather: " + std::to_string(huge) + " elements of int32 do not fit in the address space");
    expectInvalid([&] { gather(comm, a.data(), outputs, 4, i32, withAlgorithm<GatherOptions>(Algorithm::kPairwise)); },
                  "algorithm 'pairwise' is not available for gather; choose one of tree, linear");

    ScatterOptions badScatterRoot;
    badScatterRoot.root = -1;
    expectInvalid([&] { scatter(comm, inputs, a.data(), 4, i32, badScatterRoot); },
                  "scatter: root -1 is not a rank of this group of 2 ranks");
    ScatterOptions scatterFromMe;
    scatterFromMe.root = rank;
    expectInvalid([&] { scatter(comm, constWithNull, a.data(), 4, i32, scatterFromMe); },
                  "scatter: inputs[1] is null but should hold 4 elements");
    expectInvalid([&] { scatter(comm, inputs, nullptr, 4, i32, scatterFromMe); }, "scatter: output is null");

    ReduceScatterOptions band;
    band.op = ReduceOp::kBand;
    expectInvalid([&] { reduceScatter(comm, inputs, a.data(), counts, DataType::kFloat32, band); }, "BAND");
    ReduceScatterOptions nanFactor;
    nanFactor.op = ReduceOp::kPremulSum;
    nanFactor.premulFactor = std::nan("");
    expectInvalid([&] { reduceScatter(comm, inputs, a.data(), counts, i32, nanFactor); }, "needs a finite factor");
    expectInvalid([&] { reduceScatter(comm, nullptr, a.data(), counts, i32); }, "reduce_scatter: inputs is null");
    expectInvalid([&] { reduceScatter(comm, inputs, nullptr, counts, i32); }, "reduce_scatter: output is null");
    expectInvalid([&] { reduceScatter(comm, constWithNull, a.data(), counts, i32); },
                  "reduce_scatter: inputs[1] is null");
    expectInvalid([&] { reduceScatter(comm, inputs, a.data(), hugeCounts, i32); },
                  "reduce_scatter: " + std::to_string(2 * huge) + " elements of int32 do not fit");

    expectInvalid([&] { alltoall(comm, inputs, counts, outputs, fewer, i32); },
                  "alltoall: rank " + std::to_string(rank) + " sends itself");
    expectInvalid([&] { alltoall(comm, nullptr, counts, outputs, counts, i32); }, "alltoall: inputs is null");
    expectInvalid([&] { alltoall(comm, inputs, counts, outputs, nullptr, i32); }, "alltoall: recvCounts is null");
    expectInvalid([&] { alltoall(comm, inputs, counts, withNull, counts, i32); }, "alltoall: outputs[1] is null");

    // Nothing was sent: the communicator still works.
    std::vector<int32_t> mine(2, rank + 10), first(2), second(2);
    void* gathered[2] = {first.data(), second.data()};
    size_t two[2] = {2, 2};
    allgather(comm, mine.data(), gathered, two, i32);
    EXPECT_EQ(first, std::vector<int32_t>(2, 10));
    EXPECT_EQ(second, std::vector<int32_t>(2, 11));
  }, test::testOptions(TransportKind::kTcp));
}

class Mismatch : public ::testing::TestWithParam<TransportKind> {};

TEST_P(Mismatch, AllgatherCountsDiffer) {
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kHalvingDoubling,
                              GetParam() == TransportKind::kShm ? Algorithm::kShmDirect : Algorithm::kRing}) {
    expectMismatchOnBothRanks(GetParam(), [&](int rank, Communicator& comm) {
      std::vector<float> a(8), b(8);
      void* outputs[2] = {a.data(), b.data()};
      size_t counts[2] = {4, rank == 0 ? size_t{4} : size_t{8}};
      AllgatherOptions o;
      o.algorithm = algorithm;
      allgather(comm, outputs[rank], outputs, counts, DataType::kFloat32, o);
    }, {"allgather(seq=1", "count=8", "count=12", std::string("algorithm=") + algorithmName(algorithm)});
  }
}

TEST_P(Mismatch, ReduceScatterOpsDiffer) {
  const Algorithm algorithm = GetParam() == TransportKind::kShm ? Algorithm::kShmDirect : Algorithm::kPairwise;
  expectMismatchOnBothRanks(GetParam(), [&](int rank, Communicator& comm) {
    std::vector<int32_t> a(4, 1), b(4, 1), out(4);
    const void* inputs[2] = {a.data(), b.data()};
    size_t counts[2] = {4, 4};
    ReduceScatterOptions o;
    o.algorithm = algorithm;
    o.op = rank == 0 ? ReduceOp::kSum : ReduceOp::kMax;
    reduceScatter(comm, inputs, out.data(), counts, DataType::kInt32, o);
  }, {"reduce_scatter(seq=1", "op=SUM", "op=MAX"});
}

TEST_P(Mismatch, AlltoallSizesDiffer) {
  const Algorithm algorithm = GetParam() == TransportKind::kShm ? Algorithm::kShmDirect : Algorithm::kPairwise;
  expectMismatchOnBothRanks(GetParam(), [&](int rank, Communicator& comm) {
    std::vector<int64_t> a(8), b(8);
    const void* inputs[2] = {a.data(), b.data()};
    void* outputs[2] = {a.data(), b.data()};
    // Each rank sends the other 3 elements but expects 5 from it.
    size_t sendCounts[2] = {3, 3};
    size_t recvCounts[2] = {5, 5};
    sendCounts[rank] = recvCounts[rank] = 1;
    AlltoallOptions o;
    o.algorithm = algorithm;
    alltoall(comm, inputs, sendCounts, outputs, recvCounts, DataType::kInt64, o);
  }, {"alltoall(seq=1", "message of 24 bytes where 40 were expected"});
}

// Through the arena every rank sees both directions' sizes: a disagreement on one message
// fails both ranks in the call (over pairs only its receiver would see it).
TEST(Mismatch, AlltoallOneMessageSizeDiffersOverTheArena) {
  expectMismatchOnBothRanks(TransportKind::kShm, [&](int rank, Communicator& comm) {
    std::vector<int64_t> a(8), b(8);
    const void* inputs[2] = {a.data(), b.data()};
    void* outputs[2] = {a.data(), b.data()};
    // Rank 0 sends rank 1 two elements, but rank 1 expects four; the other way agrees.
    size_t sendCounts[2] = {1, 2};
    size_t recvCounts[2] = {1, 3};
    if (rank == 1) {
      sendCounts[0] = 3;
      recvCounts[0] = 4;
      sendCounts[1] = recvCounts[1] = 1;
    }
    AlltoallOptions o;
    o.algorithm = Algorithm::kShmDirect;
    alltoall(comm, inputs, sendCounts, outputs, recvCounts, DataType::kInt64, o);
  }, {"alltoall(seq=1, algorithm=shm_direct", "message of 16 bytes where 32 were expected"});
}

// Ranks that agree on the total but not on how it is split between them: the counts'
// hash in the arena fingerprint tells the calls apart.
TEST(Mismatch, AllgatherCountsSplitDiffersOverTheArena) {
  expectMismatchOnBothRanks(TransportKind::kShm, [&](int rank, Communicator& comm) {
    std::vector<int32_t> a(8), b(8);
    void* outputs[2] = {a.data(), b.data()};
    size_t counts[2] = {3, 5};
    if (rank == 1) std::swap(counts[0], counts[1]);
    AllgatherOptions o;
    o.algorithm = Algorithm::kShmDirect;
    allgather(comm, outputs[rank], outputs, counts, DataType::kInt32, o);
  }, {"allgather(seq=1, algorithm=shm_direct", "counts hash="});
}

TEST(Mismatch, ReduceScatterCountsSplitDiffersOverTheArena) {
  expectMismatchOnBothRanks(TransportKind::kShm, [&](int rank, Communicator& comm) {
    std::vector<int32_t> a(8), b(8), out(8);
    const void* inputs[2] = {a.data(), b.data()};
    size_t counts[2] = {2, 6};
    if (rank == 1) std::swap(counts[0], counts[1]);
    ReduceScatterOptions o;
    o.algorithm = Algorithm::kShmDirect;
    reduceScatter(comm, inputs, out.data(), counts, DataType::kInt32, o);
  }, {"reduce_scatter(seq=1, algorithm=shm_direct", "counts hash="});
}

// Messages of about a megabyte (complex128) through the arena, in several steps of the
// default size (the grid's small segments cover many small steps). Uneven sizes with
// empty messages, in place and not.
TEST(GatherScatterFamily, LargeAlltoallOverTheArenaIsExact) {
  for (int n : {2, 3}) {
    test::runCommunicators(n, [&](int, Communicator& comm) {
      for (bool inPlace : {false, true}) {
        const Case c{Kind::kAlltoall, Algorithm::kShmDirect, DataType::kComplex128, ReduceOp::kSum, Counts::kHuge,
                     -1, inPlace, 0};
        runAlltoall(comm, c);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }, test::testOptions(TransportKind::kShm));
  }
}

// Only a rank that receives can see a mismatch within the call: the root of a gather
// fails in it, the other rank (which only sends) when it next receives from the root,
// which told it.
TEST_P(Mismatch, GatherCountsDifferFailTheRootAndThenTheSender) {
  std::vector<std::string> messages(2);
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    std::vector<int16_t> a(8), b(8);
    void* outputs[2] = {a.data(), b.data()};
    GatherOptions o;
    o.algorithm = Algorithm::kLinear;
    try {
      gather(comm, a.data(), outputs, rank == 0 ? 4 : 8, DataType::kInt16, o);
      EXPECT_EQ(rank, 1) << "the root did not detect the mismatch";
      o.root = 1;
      gather(comm, a.data(), outputs, 4, DataType::kInt16, o);
      ADD_FAILURE() << "rank 1 was not told of the mismatch";
    } catch (const CollectiveMismatchError& e) {
      messages[static_cast<size_t>(rank)] = e.what();
    }
  }, test::testOptions(GetParam(), std::chrono::seconds(10)));
  EXPECT_TRUE(contains(messages[0], "rank 0 called gather(seq=1, algorithm=linear, dtype=int16, count=8, root=0)"))
      << messages[0];
  EXPECT_TRUE(contains(messages[0], "rank 1 called gather(seq=1, algorithm=linear, dtype=int16, count=16, root=0)"))
      << messages[0];
  EXPECT_TRUE(contains(messages[1], "rank 0 reports it called gather(seq=1")) << messages[1];
  EXPECT_TRUE(contains(messages[1], "count=8")) << messages[1];
}

INSTANTIATE_TEST_SUITE_P(Transports, Mismatch, ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         [](const ::testing::TestParamInfo<TransportKind>& info) {
                           return std::string(transportKindName(info.param));
                         });

// The call's deadline holds for the family as for every collective, and the error names
// the rank that never arrived and the call.
TEST(GatherScatterFamily, TimeoutNamesTheRankThatDidNotArrive) {
  test::runCommunicators(3, [&](int rank, Communicator& comm) {
    if (rank == 2) {
      // Never enters the gather but stays connected past the root's deadline.
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      return;
    }
    std::vector<int32_t> a(4, rank), b(4), c(4);
    void* outputs[3] = {a.data(), b.data(), c.data()};
    GatherOptions o;
    o.algorithm = Algorithm::kLinear;
    o.timeout = std::chrono::milliseconds(300);
    if (rank == 1) {
      gather(comm, a.data(), nullptr, 4, DataType::kInt32, o);  // only sends: done at once
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    const std::string message =
        test::messageOf<TimeoutError>([&] { gather(comm, a.data(), outputs, 4, DataType::kInt32, o); });
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(290));
    EXPECT_TRUE(contains(message, "rank 2 (")) << message;
    EXPECT_FALSE(contains(message, "rank 1 (")) << message;
    EXPECT_TRUE(contains(message, "gather(seq=1, algorithm=linear, dtype=int32, count=12, root=0)")) << message;
  }, test::testOptions(TransportKind::kTcp));
}

}  // namespace
}  // namespace ringtree
