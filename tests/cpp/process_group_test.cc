// ProcessGroup, the one door to every operation: each collective, coalesced form and
// point-to-point call, sync and async, over real communicators; the argument checks and
// their texts; dispatch to a device backend registered for CUDA buffers; and the
// operation queue under it (submission order, waits that run queued operations, Work
// callbacks that use or destroy the group).

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/cuda.h>
#include <ringtree/device_backend.h>
#include <ringtree/error.h>
#include <ringtree/process_group.h>

#include "backends/cuda/backend_choice.h"
#include "backends/operation_queue.h"
#include "harness/test_util.h"
#include "harness/thread_harness.h"

namespace ringtree {
namespace {

using test::messageOf;

std::shared_ptr<ProcessGroup> makeGroup(int rank, int size, const std::shared_ptr<Store>& store,
                                        TransportKind transport = TransportKind::kAuto) {
  return ProcessGroup::create(store, rank, size, test::testOptions(transport));
}

// Rank r's value i of a call: distinct per rank and index, exact in int32 sums.
int32_t valueOf(int rank, size_t index) { return 1000 * (rank + 1) + static_cast<int32_t>(index); }

std::vector<int32_t> valuesOf(int rank, size_t count, size_t offset = 0) {
  std::vector<int32_t> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = valueOf(rank, offset + i);
  return values;
}

BufferView viewOf(std::vector<int32_t>& values) { return BufferView(values.data(), values.size()); }

std::vector<BufferView> viewsOf(std::vector<std::vector<int32_t>>& lists) {
  std::vector<BufferView> views;
  for (auto& list : lists) views.push_back(viewOf(list));
  return views;
}

// Every operation of the door, with exact results, at `size` ranks; async forms waited.
void runEveryOperation(int rank, int size, ProcessGroup& group, bool async) {
  const auto wait = [async](const std::shared_ptr<Work>& work) {
    if (async) {
      ASSERT_NE(work, nullptr);
      EXPECT_TRUE(work->wait());
    }
  };
  constexpr size_t kCount = 5;
  const int sumOfRanks = size * (size - 1) / 2;
  auto sumAt = [&](size_t i) {
    int32_t sum = 0;
    for (int r = 0; r < size; ++r) sum += valueOf(r, i);
    return sum;
  };

  {  // allreduce
    auto data = valuesOf(rank, kCount);
    if (async) wait(group.allreduceAsync(viewOf(data))); else group.allreduce(viewOf(data));
    for (size_t i = 0; i < kCount; ++i) EXPECT_EQ(data[i], sumAt(i)) << "allreduce " << i;
  }
  {  // allreduceCoalesced: a small and an empty buffer, and one above the packing limit
    std::vector<std::vector<int32_t>> tensors{valuesOf(rank, 3), {}, valuesOf(rank, 70000)};
    const auto views = viewsOf(tensors);
    if (async) wait(group.allreduceCoalescedAsync(views)); else group.allreduceCoalesced(views);
    EXPECT_EQ(tensors[0][2], sumAt(2));
    EXPECT_EQ(tensors[2][69999], sumAt(69999));
  }
  {  // broadcast from the last rank
    auto data = valuesOf(rank, kCount);
    BroadcastOptions options;
    options.root = size - 1;
    if (async) wait(group.broadcastAsync(viewOf(data), options)); else group.broadcast(viewOf(data), options);
    EXPECT_EQ(data, valuesOf(size - 1, kCount));
  }
  {  // reduce to rank 0
    auto data = valuesOf(rank, kCount);
    ReduceOptions options;
    options.op = ReduceOp::kMax;
    if (async) wait(group.reduceAsync(viewOf(data), options)); else group.reduce(viewOf(data), options);
    EXPECT_EQ(data, rank == 0 ? valuesOf(size - 1, kCount) : valuesOf(rank, kCount));
  }
  {  // allgather, uneven: rank r gives r + 1 elements
    auto mine = valuesOf(rank, static_cast<size_t>(rank + 1));
    std::vector<std::vector<int32_t>> outputs;
    for (int r = 0; r < size; ++r) outputs.emplace_back(static_cast<size_t>(r + 1));
    if (async) wait(group.allgatherAsync(viewsOf(outputs), viewOf(mine)));
    else group.allgather(viewsOf(outputs), viewOf(mine));
    for (int r = 0; r < size; ++r) EXPECT_EQ(outputs[r], valuesOf(r, static_cast<size_t>(r + 1)));
  }
  {  // allgatherSingle, in place
    std::vector<int32_t> output(kCount * static_cast<size_t>(size));
    std::copy_n(valuesOf(rank, kCount).begin(), kCount, output.begin() + static_cast<long>(kCount) * rank);
    const BufferView input(output.data() + kCount * static_cast<size_t>(rank), kCount);
    if (async) wait(group.allgatherSingleAsync(viewOf(output), input)); else group.allgatherSingle(viewOf(output), input);
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(std::vector<int32_t>(output.begin() + static_cast<long>(kCount) * r,
                                     output.begin() + static_cast<long>(kCount) * (r + 1)),
                valuesOf(r, kCount));
    }
  }
  {  // allgatherCoalesced and allgatherSingleCoalesced: two inputs of 2 and 3 elements
    std::vector<std::vector<int32_t>> inputs{valuesOf(rank, 2), valuesOf(rank, 3, 2)};
    std::vector<std::vector<std::vector<int32_t>>> outputs(static_cast<size_t>(size));
    std::vector<std::vector<BufferView>> outputViews;
    for (auto& list : outputs) {
      list = {std::vector<int32_t>(2), std::vector<int32_t>(3)};
      outputViews.push_back(viewsOf(list));
    }
    if (async) wait(group.allgatherCoalescedAsync(outputViews, viewsOf(inputs)));
    else group.allgatherCoalesced(outputViews, viewsOf(inputs));
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(outputs[r][0], valuesOf(r, 2));
      EXPECT_EQ(outputs[r][1], valuesOf(r, 3, 2));
    }
    std::vector<std::vector<int32_t>> wholes{std::vector<int32_t>(2 * size), std::vector<int32_t>(3 * size)};
    if (async) wait(group.allgatherSingleCoalescedAsync(viewsOf(wholes), viewsOf(inputs)));
    else group.allgatherSingleCoalesced(viewsOf(wholes), viewsOf(inputs));
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(wholes[0][2 * r + 1], valueOf(r, 1));
      EXPECT_EQ(wholes[1][3 * r + 2], valueOf(r, 4));
    }
  }
  {  // gather to and scatter from the last rank
    const int root = size - 1;
    auto mine = valuesOf(rank, kCount);
    std::vector<std::vector<int32_t>> gathered;
    if (rank == root) gathered.assign(static_cast<size_t>(size), std::vector<int32_t>(kCount));
    GatherOptions gatherOptions;
    gatherOptions.root = root;
    if (async) wait(group.gatherAsync(viewOf(mine), viewsOf(gathered), gatherOptions));
    else group.gather(viewOf(mine), viewsOf(gathered), gatherOptions);
    for (int r = 0; r < size && rank == root; ++r) EXPECT_EQ(gathered[r], valuesOf(r, kCount));

    std::vector<int32_t> scattered(kCount);
    ScatterOptions scatterOptions;
    scatterOptions.root = root;
    std::vector<std::vector<int32_t>> pieces;
    for (int r = 0; r < size && rank == root; ++r) pieces.push_back(valuesOf(r, kCount, 7));
    if (async) wait(group.scatterAsync(viewOf(scattered), viewsOf(pieces), scatterOptions));
    else group.scatter(viewOf(scattered), viewsOf(pieces), scatterOptions);
    EXPECT_EQ(scattered, valuesOf(rank, kCount, 7));
  }
  {  // reduceScatter (uneven) and reduceScatterSingle
    std::vector<std::vector<int32_t>> inputs;
    for (int r = 0; r < size; ++r) inputs.push_back(std::vector<int32_t>(static_cast<size_t>(r + 1), rank));
    std::vector<int32_t> output(static_cast<size_t>(rank + 1));
    if (async) wait(group.reduceScatterAsync(viewOf(output), viewsOf(inputs)));
    else group.reduceScatter(viewOf(output), viewsOf(inputs));
    EXPECT_EQ(output, std::vector<int32_t>(static_cast<size_t>(rank + 1), sumOfRanks));

    std::vector<int32_t> whole(kCount * static_cast<size_t>(size), rank + 1);
    std::vector<int32_t> part(kCount);
    if (async) wait(group.reduceScatterSingleAsync(viewOf(part), viewOf(whole)));
    else group.reduceScatterSingle(viewOf(part), viewOf(whole));
    EXPECT_EQ(part, std::vector<int32_t>(kCount, sumOfRanks + size));
  }
  {  // reduceScatterSingleCoalesced: a packed and an unpacked (large) buffer
    constexpr size_t kLarge = 70000;
    std::vector<std::vector<int32_t>> inputs{std::vector<int32_t>(2 * size, rank),
                                             std::vector<int32_t>(kLarge * size, 2 * rank)};
    std::vector<std::vector<int32_t>> outputs{std::vector<int32_t>(2), std::vector<int32_t>(kLarge)};
    if (async) wait(group.reduceScatterSingleCoalescedAsync(viewsOf(outputs), viewsOf(inputs)));
    else group.reduceScatterSingleCoalesced(viewsOf(outputs), viewsOf(inputs));
    EXPECT_EQ(outputs[0], std::vector<int32_t>(2, sumOfRanks));
    EXPECT_EQ(outputs[1], std::vector<int32_t>(kLarge, 2 * sumOfRanks));
  }
  {  // alltoall and alltoallSingle with split sizes (rank r sends q + 1 rows of 2 to rank q)
    std::vector<std::vector<int32_t>> inputs;
    std::vector<std::vector<int32_t>> outputs;
    for (int r = 0; r < size; ++r) {
      inputs.push_back(std::vector<int32_t>(static_cast<size_t>(r + 1), 100 * rank + r));
      outputs.emplace_back(static_cast<size_t>(rank + 1));
    }
    if (async) wait(group.alltoallAsync(viewsOf(outputs), viewsOf(inputs)));
    else group.alltoall(viewsOf(outputs), viewsOf(inputs));
    for (int r = 0; r < size; ++r) EXPECT_EQ(outputs[r], std::vector<int32_t>(static_cast<size_t>(rank + 1), 100 * r + rank));

    std::vector<int64_t> sendRows;
    std::vector<int64_t> recvRows;
    std::vector<int32_t> input;
    for (int r = 0; r < size; ++r) {
      sendRows.push_back(r + 1);
      recvRows.push_back(rank + 1);
      input.insert(input.end(), static_cast<size_t>(2 * (r + 1)), 100 * rank + r);
    }
    std::vector<int32_t> output(static_cast<size_t>(2 * (rank + 1) * size));
    const BufferView in(input.data(), input.size(), DataType::kInt32, {}, input.size() / 2);
    const BufferView out(output.data(), output.size(), DataType::kInt32, {}, output.size() / 2);
    if (async) wait(group.alltoallSingleAsync(out, in, recvRows, sendRows));
    else group.alltoallSingle(out, in, recvRows, sendRows);
    for (int r = 0; r < size; ++r) EXPECT_EQ(output[static_cast<size_t>(2 * (rank + 1) * r)], 100 * r + rank);
  }
  if (async) wait(group.barrierAsync()); else group.barrier();
  if (size > 1) {  // point-to-point around the ring, tag 3, then a receive from any source
    const int next = (rank + 1) % size;
    const int previous = (rank + size - 1) % size;
    auto sent = valuesOf(rank, kCount);
    std::vector<int32_t> received(kCount);
    if (async) {
      auto receive = group.irecv(viewOf(received), previous, 3);
      auto send = group.isend(viewOf(sent), next, 3);
      EXPECT_TRUE(send->wait());
      EXPECT_TRUE(receive->wait());
      EXPECT_EQ(receive->sourceRank(), previous);
    } else if (rank % 2 == 0) {
      group.send(viewOf(sent), next, 3);
      EXPECT_EQ(group.recv(viewOf(received), previous, 3), previous);
    } else {
      EXPECT_EQ(group.recv(viewOf(received), previous, 3), previous);
      group.send(viewOf(sent), next, 3);
    }
    EXPECT_EQ(received, valuesOf(previous, kCount));
    int32_t from = -1;
    if (rank == 0) {
      for (int r = 1; r < size; ++r) {
        const int source = group.recv(BufferView(&from, 1), ProcessGroup::kAnySource, 9);
        EXPECT_EQ(from, 10 * source);
      }
    } else {
      int32_t value = 10 * rank;
      group.send(BufferView(&value, 1), 0, 9);
    }
  }
}

class EveryOperation : public ::testing::TestWithParam<int> {};

TEST_P(EveryOperation, SyncAndAsyncGiveExactResults) {
  const int size = GetParam();
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(size, [&](int rank) {
    const auto group = makeGroup(rank, size, store);
    runEveryOperation(rank, size, *group, /*async=*/false);
    runEveryOperation(rank, size, *group, /*async=*/true);
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, EveryOperation, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

// --- The argument checks: one text per error, naming the operation and argument.

TEST(ProcessGroupArguments, AreRefusedBeforeAnythingRuns) {
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const auto group = makeGroup(rank, 2, store);
    std::vector<int32_t> ints(4);
    std::vector<float> floats(4);
    std::vector<std::vector<int32_t>> three(3, std::vector<int32_t>(4));
    const BufferView i32 = viewOf(ints);
    const BufferView f32(floats.data(), floats.size());

    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->allgather(viewsOf(three), i32); }),
              "all_gather: tensor_list must hold one tensor per rank of the group (2), got 3");
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->allgather({f32, i32}, i32); }),
              "all_gather: Invalid usage of tensors with different dtypes: tensor is int32 but tensor_list[0] is "
              "float32");
    std::vector<int32_t> small(3);
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->allgather({viewOf(small), viewOf(small)}, i32); }),
              std::string("all_gather: tensor has 4 elements but tensor_list[") + std::to_string(rank) +
                  "], this rank's output, has 3 elements");
    AllreduceOptions band;
    band.op = ReduceOp::kBand;
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->allreduce(f32, band); }),
              "all_reduce does not support ReduceOp.BAND on float32 buffers (bitwise ops need integer or bool "
              "buffers)");
    BroadcastOptions badRoot;
    badRoot.root = 2;
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->broadcast(i32, badRoot); }),
              "broadcast: root 2 is not a rank of this group of 2 ranks");
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->allreduce(BufferView(nullptr, 3, DataType::kInt32)); }),
              "all_reduce: tensor is null but should hold 3 elements");
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->allgatherSingle(i32, i32); }),
              "all_gather_single: output_tensor must hold world_size (2) times input_tensor's 4 elements, got 4 "
              "elements");
    std::vector<int32_t> whole(8);
    EXPECT_EQ(messageOf<InvalidArgument>([&] {
                group->allgatherSingle(viewOf(whole), BufferView(whole.data() + 1, 4));
              }),
              "all_gather_single: input_tensor overlaps output_tensor but is not this rank's part of it (in place, "
              "input_tensor must be the part that starts at element rank * input_tensor.numel())");
    GatherOptions gatherAtZero;
    const std::string gatherError = messageOf<InvalidArgument>([&] {
      group->gather(i32, rank == 0 ? std::vector<BufferView>{} : std::vector<BufferView>{i32, i32}, gatherAtZero);
    });
    EXPECT_EQ(gatherError, rank == 0 ? "Argument ``gather_list`` must be specified on destination rank."
                                     : "Argument ``gather_list`` must NOT be specified on non-destination ranks.");
    const BufferView rows(whole.data(), whole.size(), DataType::kInt32, {}, 4);
    std::vector<int32_t> other(8);
    const BufferView otherRows(other.data(), other.size(), DataType::kInt32, {}, 4);
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->alltoallSingle(otherRows, rows, {}, {3, 2}); }),
              "all_to_all_single: input_split_sizes add up to 5 but input's dim 0 is 4 (split sizes don't match the "
              "total dim 0 size)");
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->alltoallSingle(otherRows, rows, {}, {-1, 5}); }),
              "all_to_all_single: input_split_sizes must be non-negative, got -1 at index 0");
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->alltoallSingle(rows, rows, {}, {}); }),
              "all_to_all_single: input and output must not overlap");
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->isend(i32, rank); }),
              "rank " + std::to_string(rank) + ": isend: peer " + std::to_string(rank) +
                  " is this rank; point-to-point messages go to other ranks");
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->recv(i32, 1 - rank, -2); }),
              "recv from rank " + std::to_string(1 - rank) + ": tag -2 is negative");
    AllreduceOptions negative;
    negative.timeout = std::chrono::milliseconds(-1);
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->allreduceAsync(i32, negative); }),
              "all_reduce: timeout must be >= 0 ms, got -1 ms");
    // Nothing ran: the group still agrees with its peer.
    group->allreduce(i32);
    group->barrier();
  });
}

// --- Device backends.

// A "cuda" backend for tests: runs every operation on the host memory the views point at
// through a CPU group of its own (the context's store), and counts what it was asked.
class HostBackedCudaBackend final : public DeviceBackend {
 public:
  explicit HostBackedCudaBackend(const DeviceBackendContext& context)
      : DeviceBackend(context.rank, context.size),
        inner_(ProcessGroup::create(context.store, context.rank, context.size, test::testOptions())) {}

  static std::atomic<int> made;
  static std::atomic<int> calls;
  static std::atomic<int> shutdowns;

  DeviceType deviceType() const override { return DeviceType::kCuda; }
  const char* name() const override { return "host-backed"; }

  std::shared_ptr<Work> allreduce(const BufferView& t, const AllreduceOptions& o, const Submission& s) override {
    ++calls;
    if (s.async) return inner_->allreduceAsync(host(t), o, s.keepAlive);
    inner_->allreduce(host(t), o);
    return nullptr;
  }
  std::shared_ptr<Work> allgather(const std::vector<BufferView>& l, const BufferView& t, const AllgatherOptions& o,
                                  const Submission& s) override {
    ++calls;
    if (s.async) return inner_->allgatherAsync(host(l), host(t), o, s.keepAlive);
    inner_->allgather(host(l), host(t), o);
    return nullptr;
  }
  void send(const BufferView& t, int dst, int tag) override {
    ++calls;
    inner_->send(host(t), dst, tag);
  }
  int recv(const BufferView& t, int src, int tag) override {
    ++calls;
    return inner_->recv(host(t), src, tag);
  }
  void shutdown() override {
    ++shutdowns;
    inner_->shutdown();
  }
  void abort() override { inner_->abort(); }

  // The rest is not exercised here.
  std::shared_ptr<Work> allreduceCoalesced(const std::vector<BufferView>&, const AllreduceOptions&,
                                           const Submission&) override { return unused(); }
  std::shared_ptr<Work> broadcast(const BufferView&, const BroadcastOptions&, const Submission&) override {
    return unused();
  }
  std::shared_ptr<Work> reduce(const BufferView&, const ReduceOptions&, const Submission&) override { return unused(); }
  std::shared_ptr<Work> allgatherCoalesced(const std::vector<std::vector<BufferView>>&,
                                           const std::vector<BufferView>&, const AllgatherOptions&,
                                           const Submission&) override { return unused(); }
  std::shared_ptr<Work> gather(const BufferView&, const std::vector<BufferView>&, const GatherOptions&,
                               const Submission&) override { return unused(); }
  std::shared_ptr<Work> scatter(const BufferView&, const std::vector<BufferView>&, const ScatterOptions&,
                                const Submission&) override { return unused(); }
  std::shared_ptr<Work> reduceScatter(const BufferView&, const std::vector<BufferView>&, const ReduceScatterOptions&,
                                      const Submission&) override { return unused(); }
  std::shared_ptr<Work> reduceScatterSingleCoalesced(const std::vector<BufferView>&, const std::vector<BufferView>&,
                                                     const ReduceScatterOptions&, const Submission&) override {
    return unused();
  }
  std::shared_ptr<Work> alltoall(const std::vector<BufferView>&, const std::vector<BufferView>&,
                                 const AlltoallOptions&, const Submission&) override { return unused(); }
  std::shared_ptr<Work> barrier(const BarrierOptions&, const Submission&) override { return unused(); }
  std::shared_ptr<Work> isend(const BufferView&, int, int, std::shared_ptr<void>) override { return unused(); }
  std::shared_ptr<Work> irecv(const BufferView&, int, int, std::shared_ptr<void>) override { return unused(); }

 private:
  static BufferView host(BufferView view) {
    view.device = Device{};
    return view;
  }
  static std::vector<BufferView> host(std::vector<BufferView> views) {
    for (BufferView& view : views) view.device = Device{};
    return views;
  }
  static std::shared_ptr<Work> unused() { throw Error("not exercised by this test"); }

  std::shared_ptr<ProcessGroup> inner_;
};

std::atomic<int> HostBackedCudaBackend::made{0};
std::atomic<int> HostBackedCudaBackend::calls{0};
std::atomic<int> HostBackedCudaBackend::shutdowns{0};

std::unique_ptr<DeviceBackend> makeHostBackedCuda(const DeviceBackendContext& context) {
  ++HostBackedCudaBackend::made;
  EXPECT_EQ(context.device, (Device{DeviceType::kCuda, 0}));
  return std::make_unique<HostBackedCudaBackend>(context);
}

TEST(DeviceBackends, CudaBuffersGoToTheRegisteredBackendMadeOnFirstUse) {
  constexpr Device kCuda0{DeviceType::kCuda, 0};
  const std::shared_ptr<Store> store = test::freshStore();
  ASSERT_TRUE(hasDeviceBackend(DeviceType::kCuda));  // the built-in NCCL backend
  registerDeviceBackend(DeviceType::kCuda, nullptr, nullptr);
  ASSERT_FALSE(hasDeviceBackend(DeviceType::kCuda));
  HostBackedCudaBackend::made = 0;  // counts of this run only (--gtest_repeat)
  HostBackedCudaBackend::calls = 0;
  HostBackedCudaBackend::shutdowns = 0;
  test::runOnThreads(2, [&](int rank) {
    const auto group = makeGroup(rank, 2, store);
    std::vector<int32_t> data = valuesOf(rank, 3);
    const BufferView cuda(data.data(), data.size(), DataType::kInt32, kCuda0);
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->allreduce(cuda); }),
              "all_reduce: the buffers are on cuda:0, and no backend for cuda buffers is available in this process "
              "(ringtree's cuda library is not loaded)");
  });
  registerDeviceBackend(DeviceType::kCuda, "host-backed", &makeHostBackedCuda);
  EXPECT_TRUE(hasDeviceBackend(DeviceType::kCuda));
  const std::shared_ptr<Store> secondStore = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const auto group = makeGroup(rank, 2, secondStore);
    std::vector<int32_t> data = valuesOf(rank, 3);
    const BufferView cuda(data.data(), data.size(), DataType::kInt32, kCuda0);
    group->allreduce(cuda);
    EXPECT_EQ(data[1], valueOf(0, 1) + valueOf(1, 1));
    EXPECT_TRUE(group->allreduceAsync(cuda)->wait());
    std::vector<int32_t> host(3);
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->allgather({cuda, BufferView(host.data(), 3)}, cuda); }),
              "all_gather: tensors on different devices: tensor is on cuda:0 but tensor_list[1] is on cpu");
    std::vector<int32_t> a(3), b(3);
    group->allgather({BufferView(a.data(), 3, DataType::kInt32, kCuda0), BufferView(b.data(), 3, DataType::kInt32, kCuda0)},
                     cuda);
    EXPECT_EQ(b, data);  // rank 1's allreduced data, gathered from every rank
    if (rank == 0) group->send(cuda, 1, 0); else EXPECT_EQ(group->recv(cuda, 0, 0), 0);
    group->allreduce(viewOf(host));  // CPU buffers still go to the CPU engine
    group->shutdown();
  });
  EXPECT_EQ(HostBackedCudaBackend::made.load(), 2);  // one per group of each rank
  EXPECT_EQ(HostBackedCudaBackend::calls.load(), 2 * 4);
  EXPECT_EQ(HostBackedCudaBackend::shutdowns.load(), 2);
  registerDeviceBackend(DeviceType::kCuda, nullptr, nullptr);
  EXPECT_FALSE(hasDeviceBackend(DeviceType::kCuda));
  EXPECT_THROW(registerDeviceBackend(DeviceType::kCpu, "cpu", &makeHostBackedCuda), InvalidArgument);

  // A group made without a store cannot set a device backend up.
  registerDeviceBackend(DeviceType::kCuda, "host-backed", &makeHostBackedCuda);
  ProcessGroup storeless(Communicator::create(test::freshStore(), 0, 1, test::testOptions()));
  int32_t one = 1;
  EXPECT_EQ(messageOf<InvalidArgument>([&] {
              storeless.allreduce(BufferView(&one, 1, DataType::kInt32, kCuda0));
            }),
            "all_reduce: the buffers are on cuda:0, but this ProcessGroup was made without a store, which its "
            "host-backed backend needs to set up");
  registerDeviceBackend(DeviceType::kCuda, "cuda", &cuda::makeDefaultCudaBackend);
}

// Without ringtree's CUDA library (or a driver, or a device), the built-in backend's
// factory says what is missing, on every rank, when the first CUDA buffer arrives.
TEST(DeviceBackends, TheBuiltInCudaBackendSaysWhatIsMissing) {
  if (cudaStatus().available) GTEST_SKIP() << "this machine can run CUDA buffers";
  ASSERT_TRUE(hasDeviceBackend(DeviceType::kCuda));
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const auto group = makeGroup(rank, 2, store);
    int32_t value = 1;
    const std::string message = messageOf<Error>([&] {
      group->allreduce(BufferView(&value, 1, DataType::kInt32, Device{DeviceType::kCuda, 0}));
    });
    EXPECT_EQ(message, cudaStatus().reason);
    EXPECT_NE(message.find("CUDA"), std::string::npos) << message;
  });
}

// --- The operation queue under the CPU engine.

// Work::wait() without a timeout runs the queued operations up to its own on the waiting
// thread when the worker has not taken them; a bounded wait() never starts one. Either
// way they run once each, in submission order.
TEST(OperationQueue, WaitRunsQueuedOperationsOnTheWaitingThread) {
  const auto queue = detail::OperationQueue::create();
  std::vector<int> order;
  std::mutex orderMutex;
  std::atomic<int> ranHere{0};
  const std::thread::id self = std::this_thread::get_id();
  auto record = [&](int index) {
    std::lock_guard<std::mutex> lock(orderMutex);
    order.push_back(index);
    if (std::this_thread::get_id() == self) ++ranHere;
  };
  constexpr int kCalls = 200;
  for (int i = 0; i < kCalls; ++i) {
    const auto first = queue->submit("first", [&, i] { record(2 * i); }, nullptr);
    const auto second = queue->submit("second", [&, i] { record(2 * i + 1); }, nullptr);
    EXPECT_TRUE(second->wait());  // runs `first` too when still queued
    EXPECT_TRUE(first->isSuccess());
  }
  EXPECT_GT(ranHere.load(), 0) << "no wait() ran its operations on the waiting thread";
  std::vector<int> expected(2 * kCalls);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);

  std::atomic<int> boundedHere{0};
  for (int i = 0; i < 20; ++i) {
    const auto work = queue->submit("bounded", [&] {
      if (std::this_thread::get_id() == self) ++boundedHere;
    }, nullptr);
    EXPECT_TRUE(work->wait(std::chrono::milliseconds(20000)));
  }
  EXPECT_EQ(boundedHere.load(), 0) << "a bounded wait() started an operation";
  queue->shutdown();
  EXPECT_EQ(messageOf<Error>([&] { queue->submit("late", [] {}, nullptr); }),
            "late on a ProcessGroup that has been shut down");
}

// A deferred submission wakes no worker that was active recently: a wait() that comes at
// once runs it on the waiting thread; one nobody waits for is taken by the worker within
// its timed wake-ups; a callback or a bounded wait() hands it to the worker at once.
TEST(OperationQueue, DeferredStartsAreLeftToAWaiterThenTakenByTheWorker) {
  using detail::OperationQueue;
  using Clock = std::chrono::steady_clock;
  const auto queue = OperationQueue::create();
  const std::thread::id self = std::this_thread::get_id();
  queue->submit("warm-up", [] {}, nullptr)->wait(std::chrono::milliseconds(20000));  // the worker is active now
  int ranHere = 0;
  constexpr int kCalls = 200;
  for (int i = 0; i < kCalls; ++i) {
    bool here = false;
    const auto work = queue->submit("deferred", [&] { here = std::this_thread::get_id() == self; }, nullptr,
                                    OperationQueue::Start::kDeferred);
    EXPECT_TRUE(work->wait());
    ranHere += here ? 1 : 0;
  }
  // The worker may take one when its timed wake-up falls between submit and wait.
  EXPECT_GT(ranHere, kCalls * 3 / 4) << "wait() did not run the deferred operations itself";

  // Nobody waits: the worker takes it (polled with isCompleted, which drives nothing).
  std::atomic<bool> onWorker{false};
  auto unattended = queue->submit("unattended", [&] { onWorker = std::this_thread::get_id() != self; }, nullptr,
                                  OperationQueue::Start::kDeferred);
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (!unattended->isCompleted() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(50));
  EXPECT_TRUE(unattended->isSuccess());
  EXPECT_TRUE(onWorker.load());

  // A callback and a bounded wait() leave it to the worker, which starts it at once.
  std::atomic<bool> called{false};
  auto withCallback = queue->submit("callback", [] {}, nullptr, OperationQueue::Start::kDeferred);
  withCallback->addCallback([&](Work&) { called = true; });
  while (!called.load() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(50));
  EXPECT_TRUE(called.load());
  std::atomic<bool> boundedOnWorker{false};
  auto bounded = queue->submit("bounded", [&] { boundedOnWorker = std::this_thread::get_id() != self; }, nullptr,
                               OperationQueue::Start::kDeferred);
  EXPECT_TRUE(bounded->wait(std::chrono::milliseconds(20000)));
  EXPECT_TRUE(boundedOnWorker.load());

  // Shutdown runs what is still deferred.
  std::atomic<bool> ranAtShutdown{false};
  auto last = queue->submit("last", [&] { ranAtShutdown = true; }, nullptr, OperationQueue::Start::kDeferred);
  queue->shutdown();
  EXPECT_TRUE(ranAtShutdown.load());
  EXPECT_TRUE(last->isSuccess());
}

// Synchronous calls from several threads, submissions and their waits mixed in: one
// operation at a time, every one runs once, and shutdown() returns only once none runs
// (calls that come later are refused). The inline path takes no lock, so this checks its
// compare-and-swaps against the queued path (and ThreadSanitizer runs it).
TEST(OperationQueue, InlineCallsSubmissionsAndShutdownRunOneAtATime) {
  const auto queue = detail::OperationQueue::create();
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> ran{0};
  int plainRan = 0;  // plain memory: ThreadSanitizer sees whether the queue orders the operations
  auto operation = [&] {
    if (running.fetch_add(1) != 0) ++overlaps;
    ++ran;
    ++plainRan;
    running.fetch_sub(1);
  };
  queue->runSync("alone", operation);  // nothing queued or running: on this thread
  EXPECT_EQ(queue->inlineCallCount(), 1u);
  constexpr int kThreads = 3;
  constexpr int kCalls = 3000;
  std::atomic<int> refused{0};
  std::atomic<int> syncDone{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> callers;
  for (int t = 0; t < kThreads; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < kCalls && !stop.load(); ++i) {
        try {
          queue->runSync("sync", operation);
          ++syncDone;
        } catch (const Error&) {
          ++refused;
          return;
        }
      }
    });
  }
  int submitted = 0;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 300; ++i) {
    works.push_back(queue->submit("async", operation, nullptr,
                                  i % 2 == 0 ? detail::OperationQueue::Start::kDeferred
                                             : detail::OperationQueue::Start::kAtOnce));
    ++submitted;
    if (i % 3 == 0) {
      EXPECT_TRUE(works.back()->wait());
    }
  }
  for (const auto& work : works) EXPECT_TRUE(work->wait());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (syncDone.load() < 100 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  stop = true;
  queue->shutdown();
  EXPECT_EQ(running.load(), 0) << "shutdown() returned while an operation ran";
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(overlaps.load(), 0) << "two operations ran at once";
  EXPECT_EQ(ran.load(), 1 + submitted + syncDone.load()) << "an operation ran twice or not at all";
  EXPECT_EQ(plainRan, ran.load());
  EXPECT_LE(queue->inlineCallCount(), 1u + static_cast<uint64_t>(syncDone.load()));
  EXPECT_EQ(messageOf<Error>([&] { queue->runSync("late", operation); }),
            "late on a ProcessGroup that has been shut down");
}

// An inline call that is still running when something is queued, or when the queue is
// shut down, ends through the mutex and wakes the waiters: a worker asleep without a
// timeout (idle past kIdleLinger) takes the queued operation, and shutdown() returns once
// the inline call ended, not before.
TEST(OperationQueue, AnInlineCallEndingWakesTheWorkerAndShutdown) {
  using Clock = std::chrono::steady_clock;
  const auto queue = detail::OperationQueue::create();
  EXPECT_TRUE(queue->submit("worker", [] {}, nullptr)->wait(std::chrono::milliseconds(20000)));
  std::this_thread::sleep_for(detail::OperationQueue::kIdleLinger * 3);  // the worker sleeps untimed now
  int plain = 0;
  std::atomic<bool> inside{false};
  std::atomic<bool> release{false};
  auto blockingInline = [&] {
    auto operation = [&] {
      inside = true;
      while (!release.load()) std::this_thread::yield();
      ++plain;
    };
    queue->runSync("inline", operation);
  };
  std::thread first(blockingInline);
  while (!inside.load()) std::this_thread::yield();
  const auto queued = queue->submit("queued", [&] { ++plain; }, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(queued->isCompleted()) << "ran while the inline call ran";
  release = true;
  first.join();
  // Nobody waits for it here: the worker must have been woken by the inline call's end.
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (!queued->isCompleted() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(queued->isCompleted()) << "the worker was not woken when the inline call ended";
  EXPECT_EQ(plain, 2);

  inside = false;
  release = false;
  std::thread second(blockingInline);
  while (!inside.load()) std::this_thread::yield();
  std::atomic<bool> shutDown{false};
  std::thread closer([&] {
    queue->shutdown();
    shutDown = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(shutDown.load()) << "shutdown() returned while an inline call ran";
  release = true;
  second.join();
  closer.join();
  EXPECT_TRUE(shutDown.load());
  EXPECT_EQ(plain, 3);
  EXPECT_EQ(messageOf<Error>([&] { queue->runSync("late", blockingInline); }),
            "late on a ProcessGroup that has been shut down");
}

// A Work callback on the worker may make a synchronous call on the same queue (queued
// behind another operation: the wait runs the queue), and abort fails what is queued.
TEST(OperationQueue, CallbacksMayCallInAndAbortFailsQueuedOperations) {
  const auto queue = detail::OperationQueue::create();
  std::atomic<bool> firstStarted{false};
  std::atomic<bool> secondQueued{false};
  std::atomic<int> ran{0};
  auto first = queue->submit("first", [&] {  // on the worker: nobody waits for it
    firstStarted = true;
    while (!secondQueued.load()) std::this_thread::yield();  // the second is queued before this ends
    ++ran;
  }, nullptr);
  std::atomic<bool> callbackDone{false};
  first->addCallback([&](Work&) {
    auto call = [&] { ++ran; };
    queue->runSync("inline", call);
    callbackDone = true;
  });
  while (!firstStarted.load()) std::this_thread::yield();
  auto second = queue->submit("second", [&] { ++ran; }, nullptr);
  secondQueued = true;
  EXPECT_TRUE(second->wait());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!callbackDone.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(callbackDone.load()) << "the synchronous call in the callback never ran";
  EXPECT_EQ(ran.load(), 3);

  std::atomic<bool> release{false};
  std::atomic<bool> blockingStarted{false};
  auto blocking = queue->submit("blocking", [&] {
    blockingStarted = true;
    while (!release.load()) std::this_thread::yield();
  }, nullptr);
  while (!blockingStarted.load()) std::this_thread::yield();  // running: abort lets it finish
  auto queued = queue->submit("queued", [&] { ++ran; }, nullptr);
  bool interrupted = false;
  queue->abort(3, [&] {
    interrupted = true;
    release = true;
  });
  EXPECT_TRUE(interrupted);
  EXPECT_TRUE(blocking->isSuccess());
  EXPECT_EQ(messageOf<Error>([&] { queued->wait(); }),
            "queued on rank 3 was aborted before it started: its process group was aborted");
  EXPECT_EQ(ran.load(), 3);
  EXPECT_EQ(messageOf<Error>([&] { queue->submit("late", [] {}, nullptr); }),
            "late on a ProcessGroup that has been aborted");
}

// The last reference to a ProcessGroup dropped inside a Work callback on its worker:
// nothing waits for the group, which is destroyed there.
TEST(OperationQueue, CallbackMayDestroyTheGroup) {
  auto owner = std::make_shared<std::shared_ptr<ProcessGroup>>(makeGroup(0, 1, test::freshStore()));
  std::atomic<bool> destroyed{false};
  auto last = (*owner)->barrierAsync();
  last->addCallback([owner, &destroyed](Work&) {
    owner->reset();
    destroyed = true;
  });
  last.reset();
  owner.reset();  // the callback holds the only reference now
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!destroyed.load() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(destroyed.load());
}

}  // namespace
}  // namespace ringtree
