// The hierarchical allreduce on one machine: ranks run as threads, and each communicator
// is told which simulated host its ranks run on (CommunicatorImpl::assumeHosts), so the
// algorithm runs exactly as it would across hosts (tests/python/test_multihost.py runs it
// across real network namespaces). Exact results for every layout, count and reduction,
// the automatic choice, and refusals where the layout does not allow it.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
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

class HierarchicalGrid : public ::testing::TestWithParam<Case> {};

TEST_P(HierarchicalGrid, ExactForEveryCountAndOp) {
  const Case c = GetParam();
  const int n = c.hosts * c.local;
  const std::vector<int> hostOf = layout(c.hosts, c.local, c.interleaved);
  test::runCommunicators(n, [&](int rank, Communicator& comm) {
    comm.impl().assumeHosts(hostOf);
    ASSERT_TRUE(comm.impl().hosts().uniform);
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
  test::runCommunicators(1, [&](int, Communicator& comm) {
    float x = 1;
    EXPECT_THROW(broadcast(comm, &x, 1, DataType::kFloat32, b), InvalidArgument);
  });
}

}  // namespace
}  // namespace ringtree
