// The hierarchical collectives on one machine: ranks run as threads, and each communicator
// is told which simulated host its ranks run on (CommunicatorImpl::assumeHosts), so the
// algorithms run exactly as they would across hosts (tests/python/test_multihost.py runs
// them across real network namespaces). Exact results for every layout, root, count and
// reduction, the automatic choice, and refusals where the layout does not allow it.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/error.h>

#include "communicator_impl.h"
#include "harness/test_util.h"
#include "harness/thread_harness.h"

namespace ringtree {
namespace {

using test::contains;

// Host index of each rank: hosts x local ranks, ranks host-major, or interleaved (rank r on
// host r % hosts), as a launcher that deals ranks round-robin would place them.
std::vector<int> layout(int hosts, int local, bool interleaved) {
  std::vector<int> hostOf;
  for (int r = 0; r < hosts * local; ++r) hostOf.push_back(interleaved ? r % hosts : r / local);
  return hostOf;
}

struct Case {
  int hosts;
  int local;
  bool interleaved;
};

class HierarchicalGrid : public ::testing::TestWithParam<Case> {
 protected:
  int ranks() const { return GetParam().hosts * GetParam().local; }
  // Runs body on every rank of a job whose communicators take the parameter's layout.
  void runOnLayout(const std::function<void(int rank, Communicator& comm)>& body,
                   const CommunicatorOptions& options = test::testOptions()) const {
    const Case c = GetParam();
    const std::vector<int> hostOf = layout(c.hosts, c.local, c.interleaved);
    test::runCommunicators(ranks(), [&](int rank, Communicator& comm) {
      comm.impl().assumeHosts(hostOf);
      ASSERT_TRUE(comm.impl().hosts().uniform);
      body(rank, comm);
    }, options);
  }
};

TEST_P(HierarchicalGrid, ExactForEveryCountAndOp) {
  const int n = ranks();
  runOnLayout([&](int rank, Communicator& comm) {
    for (const size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}, size_t{(1 << 16) + 7}}) {
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProduct}) {
        std::vector<int64_t> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = static_cast<int64_t>((i % 7) + rank + 1);
        AllreduceOptions o;
        o.op = op;
        o.algorithm = Algorithm::kHierarchical;
        allreduce(comm, data.data(), count, DataType::kInt64, o);
        for (size_t i = 0; i < count; ++i) {
          int64_t want = op == ReduceOp::kProduct ? 1 : (op == ReduceOp::kMin ? INT64_MAX : (op == ReduceOp::kMax ? INT64_MIN : 0));
          for (int r = 0; r < n; ++r) {
            const int64_t v = static_cast<int64_t>((i % 7) + r + 1);
            if (op == ReduceOp::kSum) want += v;
            if (op == ReduceOp::kProduct) want *= v;
            if (op == ReduceOp::kMin) want = std::min(want, v);
            if (op == ReduceOp::kMax) want = std::max(want, v);
          }
          if (data[i] != want) {
            ADD_FAILURE() << "rank " << rank << " count " << count << " op " << static_cast<int>(op) << " element "
                          << i << ": " << data[i] << " != " << want;
            return;
          }
        }
      }
    }
    // Sliced into segments (the pipelined path), float32 with AVG.
    std::vector<float> values(4099, static_cast<float>(rank + 1));
    AllreduceOptions o;
    o.op = ReduceOp::kAvg;
    o.algorithm = Algorithm::kHierarchical;
    o.maxSegmentBytes = 256;
    allreduce(comm, values.data(), values.size(), DataType::kFloat32, o);
    const float mean = static_cast<float>(n + 1) / 2;
    for (const float v : values) ASSERT_EQ(v, mean);
  });
}

// Element i of rank r's data in the tests below.
int64_t valueOf(int rank, size_t i) { return static_cast<int64_t>((i % 11) + 2 * rank + 1); }

TEST_P(HierarchicalGrid, BroadcastFromEveryRoot) {
  const int n = ranks();
  runOnLayout([&](int rank, Communicator& comm) {
    // Small (trees), large (parts down chains), and large in small segments.
    for (const auto& [count, segment] : {std::pair<size_t, size_t>{0, 0}, {5, 0}, {1001, 0}, {(1 << 14) + 3, 0},
                                         {(1 << 14) + 3, 4096}}) {
      for (int root = 0; root < n; ++root) {
        std::vector<int64_t> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = valueOf(rank, i);
        BroadcastOptions o;
        o.root = root;
        o.algorithm = Algorithm::kHierarchical;
        o.maxSegmentBytes = segment;
        broadcast(comm, data.data(), count, DataType::kInt64, o);
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(data[i], valueOf(root, i)) << "rank " << rank << " root " << root << " count " << count << " i " << i;
        }
      }
    }
  });
}

TEST_P(HierarchicalGrid, ReduceToEveryRoot) {
  const int n = ranks();
  runOnLayout([&](int rank, Communicator& comm) {
    for (const auto& [count, segment] : {std::pair<size_t, size_t>{0, 0}, {7, 0}, {(1 << 14) + 5, 0},
                                         {(1 << 14) + 5, 1000}}) {
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        for (int root = 0; root < n; ++root) {
          std::vector<int64_t> data(count);
          for (size_t i = 0; i < count; ++i) data[i] = valueOf(rank, i);
          ReduceOptions o;
          o.root = root;
          o.op = op;
          o.algorithm = Algorithm::kHierarchical;
          o.maxSegmentBytes = segment;
          reduce(comm, data.data(), count, DataType::kInt64, o);
          for (size_t i = 0; i < count; ++i) {
            int64_t want = valueOf(rank, i);  // other ranks' buffers stay as they were
            if (rank == root) {
              want = op == ReduceOp::kSum ? 0 : INT64_MIN;
              for (int r = 0; r < n; ++r) want = op == ReduceOp::kSum ? want + valueOf(r, i) : std::max(want, valueOf(r, i));
            }
            ASSERT_EQ(data[i], want) << "rank " << rank << " root " << root << " count " << count << " i " << i;
          }
        }
      }
    }
  });
}

// Blocks of different sizes, one of them empty: counts[r] = base + 3r, rank 1's 0.
std::vector<size_t> unevenCounts(int n, size_t base) {
  std::vector<size_t> counts(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = r == 1 ? 0 : base + 3 * static_cast<size_t>(r);
  return counts;
}

TEST_P(HierarchicalGrid, AllgatherOfUnevenBlocks) {
  const int n = ranks();
  runOnLayout([&](int rank, Communicator& comm) {
    for (const size_t base : {size_t{0}, size_t{4}, size_t{20000}}) {
      for (const bool inPlace : {false, true}) {
        const std::vector<size_t> counts = unevenCounts(n, base);
        std::vector<std::vector<int64_t>> outputs(static_cast<size_t>(n));
        std::vector<void*> pointers;
        for (int r = 0; r < n; ++r) {
          outputs[static_cast<size_t>(r)].assign(counts[static_cast<size_t>(r)], -1);
          pointers.push_back(outputs[static_cast<size_t>(r)].data());
        }
        std::vector<int64_t> input(counts[static_cast<size_t>(rank)]);
        for (size_t i = 0; i < input.size(); ++i) input[i] = valueOf(rank, i);
        if (inPlace) std::copy(input.begin(), input.end(), outputs[static_cast<size_t>(rank)].begin());
        AllgatherOptions o;
        o.algorithm = Algorithm::kHierarchical;
        allgather(comm, inPlace ? pointers[static_cast<size_t>(rank)] : input.data(), pointers.data(), counts.data(),
                  DataType::kInt64, o);
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) {
            ASSERT_EQ(outputs[static_cast<size_t>(r)][i], valueOf(r, i)) << "rank " << rank << " block " << r;
          }
        }
      }
    }
  });
}

TEST_P(HierarchicalGrid, ReduceScatterOfUnevenBlocks) {
  const int n = ranks();
  runOnLayout([&](int rank, Communicator& comm) {
    for (const size_t base : {size_t{0}, size_t{5}, size_t{20000}}) {
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kAvg}) {
        const std::vector<size_t> counts = unevenCounts(n, base);
        // Rank q's contribution to block r: valueOf(q, i + r).
        std::vector<std::vector<int64_t>> inputs(static_cast<size_t>(n));
        std::vector<const void*> pointers;
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) inputs[static_cast<size_t>(r)].push_back(valueOf(rank, i + r));
          pointers.push_back(inputs[static_cast<size_t>(r)].data());
        }
        std::vector<int64_t> output(counts[static_cast<size_t>(rank)], -1);
        ReduceScatterOptions o;
        o.op = op;
        o.algorithm = Algorithm::kHierarchical;
        reduceScatter(comm, pointers.data(), output.data(), counts.data(), DataType::kInt64, o);
        for (size_t i = 0; i < output.size(); ++i) {
          int64_t want = op == ReduceOp::kMin ? INT64_MAX : 0;
          for (int q = 0; q < n; ++q) {
            const int64_t v = valueOf(q, i + rank);
            want = op == ReduceOp::kMin ? std::min(want, v) : want + v;
          }
          if (op == ReduceOp::kAvg) want /= n;
          ASSERT_EQ(output[i], want) << "rank " << rank << " op " << static_cast<int>(op) << " i " << i;
        }
        // The inputs are left as they were.
        for (size_t i = 0; i < counts[0]; ++i) ASSERT_EQ(inputs[0][i], valueOf(rank, i));
      }
    }
  });
}

TEST_P(HierarchicalGrid, BarrierWaitsForEveryRank) {
  const int n = ranks();
  std::atomic<int> arrived{0};
  runOnLayout([&](int rank, Communicator& comm) {
    for (int round = 1; round <= 3; ++round) {
      // The last rank is late: nobody may leave before it arrived.
      if (rank == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      arrived.fetch_add(1);
      barrier(comm);
      ASSERT_GE(arrived.load(), round * n) << "rank " << rank << " left round " << round << " early";
      barrier(comm);  // nobody starts the next round before everyone checked
    }
    const std::string record = comm.flightRecordJson("test");
    EXPECT_TRUE(contains(record, R"("seq": 1, "collective": "barrier", "algorithm": "hierarchical")")) << record;
  }, test::testOptions(TransportKind::kTcp));  // with a node arena the barrier takes it
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalGrid,
                         ::testing::Values(Case{2, 2, false}, Case{2, 2, true}, Case{2, 3, false}, Case{3, 2, true},
                                           Case{4, 2, false}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::to_string(info.param.hosts) + "hosts_" + std::to_string(info.param.local) +
                                  "ranks" + (info.param.interleaved ? "_interleaved" : "");
                         });

TEST(Hierarchical, ChosenForLargeMessagesAcrossHostsAndNamedInTheFlightRecord) {
  test::runCommunicators(4, [&](int, Communicator& comm) {
    comm.impl().assumeHosts(layout(2, 2, false));
    std::vector<float> small(16, 1.0f);
    std::vector<float> large(1 << 16, 1.0f);  // 256 KiB: past the small-message bound
    allreduce(comm, small.data(), small.size(), DataType::kFloat32);
    allreduce(comm, large.data(), large.size(), DataType::kFloat32);
    EXPECT_EQ(small[0], 4.0f);
    EXPECT_EQ(large.back(), 4.0f);
    const std::string record = comm.flightRecordJson("test");
    EXPECT_TRUE(contains(record, "algorithm=halving_doubling, dtype=float32, count=16,")) << record;
    EXPECT_TRUE(contains(record, "algorithm=hierarchical, dtype=float32, count=65536,")) << record;
  }, test::testOptions(TransportKind::kTcp));  // across hosts there is no node arena
}

TEST(Hierarchical, TheOtherCollectivesTakeItAtEverySizeAcrossHosts) {
  test::runCommunicators(4, [&](int rank, Communicator& comm) {
    comm.impl().assumeHosts(layout(2, 2, true));
    std::vector<float> data(16, static_cast<float>(rank));
    broadcast(comm, data.data(), data.size(), DataType::kFloat32);
    reduce(comm, data.data(), data.size(), DataType::kFloat32);
    std::vector<float> gathered(64);
    std::vector<void*> outputs;
    std::vector<const void*> inputs;
    const std::vector<size_t> counts(4, 16);
    for (size_t r = 0; r < 4; ++r) {
      outputs.push_back(gathered.data() + 16 * r);
      inputs.push_back(gathered.data() + 16 * r);
    }
    allgather(comm, data.data(), outputs.data(), counts.data(), DataType::kFloat32);
    reduceScatter(comm, inputs.data(), data.data(), counts.data(), DataType::kFloat32);
    barrier(comm);
    const std::string record = comm.flightRecordJson("test");
    int sequence = 0;
    for (const char* call : {"broadcast", "reduce", "allgather", "reduce_scatter", "barrier"}) {
      const std::string entry = "\"seq\": " + std::to_string(++sequence) + ", \"collective\": \"" + call +
                                "\", \"algorithm\": \"hierarchical\"";
      EXPECT_TRUE(contains(record, entry)) << entry << ": " << record;
    }
  }, test::testOptions(TransportKind::kTcp));
}

TEST(Hierarchical, RefusedWhereTheLayoutDoesNotAllowIt) {
  // One host; uneven hosts (3 + 1 ranks); one rank per host.
  for (const std::vector<int>& hostOf :
       {std::vector<int>{0, 0, 0, 0}, std::vector<int>{0, 0, 0, 1}, std::vector<int>{0, 1, 2, 3}}) {
    test::runCommunicators(4, [&](int, Communicator& comm) {
      comm.impl().assumeHosts(hostOf);
      std::vector<float> data(8, 1.0f);
      AllreduceOptions o;
      o.algorithm = Algorithm::kHierarchical;
      try {
        allreduce(comm, data.data(), data.size(), DataType::kFloat32, o);
        ADD_FAILURE() << "hierarchical ran on a layout that does not allow it";
      } catch (const InvalidArgument& e) {
        EXPECT_TRUE(contains(e.what(), "hierarchical needs ranks on several hosts")) << e.what();
      }
      allreduce(comm, data.data(), data.size(), DataType::kFloat32);  // the automatic choice still works
      EXPECT_EQ(data[0], 4.0f);
    });
  }
  EXPECT_EQ(parseAlgorithm("hierarchical"), Algorithm::kHierarchical);
  BroadcastOptions b;
  b.algorithm = Algorithm::kHierarchical;
  AlltoallOptions a;
  a.algorithm = Algorithm::kHierarchical;
  test::runCommunicators(1, [&](int, Communicator& comm) {
    float x = 1;
    EXPECT_THROW(broadcast(comm, &x, 1, DataType::kFloat32, b), InvalidArgument);
    const void* in = &x;
    void* out = &x;
    const size_t one = 1;
    try {
      alltoall(comm, &in, &one, &out, &one, DataType::kFloat32, a);
      ADD_FAILURE() << "alltoall took an algorithm it does not implement";
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(contains(e.what(), "not available for alltoall")) << e.what();
    }
  });
}

}  // namespace
}  // namespace ringtree
