// The in-process CUDA runtime table and NCCL of harness/fake_gpu.h: devices and memory,
// stream order and events, the kernels, communicators met by threads (every collective,
// in place, avg and PreMulSum), send/recv rings in a group, split, hangs released by
// abort, and the injected failures and counters tests of the NCCL backend rely on.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <ringtree/types.h>

#include "harness/fake_gpu.h"
#include "harness/test_util.h"

namespace ringtree::test::fake_gpu {
namespace {

using cuda::NcclApi;
using cuda::NcclComm;
using cuda::NcclUniqueId;
using namespace std::chrono_literals;

const RingtreeGpuApi& gpu() { return gpuApi(); }

void* deviceAlloc(size_t bytes) {
  void* pointer = nullptr;
  EXPECT_EQ(gpu().deviceMalloc(&pointer, bytes), kCudaSuccess);
  return pointer;
}

template <typename T>
void put(void* device, const std::vector<T>& values, void* stream) {
  ASSERT_EQ(gpu().memcpyAsync(device, values.data(), values.size() * sizeof(T), stream), kCudaSuccess);
  ASSERT_EQ(gpu().streamSynchronize(stream), kCudaSuccess);
}

template <typename T>
std::vector<T> get(const void* device, size_t count, void* stream) {
  std::vector<T> values(count);
  EXPECT_EQ(gpu().memcpyAsync(values.data(), device, count * sizeof(T), stream), kCudaSuccess);
  EXPECT_EQ(gpu().streamSynchronize(stream), kCudaSuccess);
  return values;
}

// Runs fn(rank) on a thread per rank and joins them.
void runRanks(int nranks, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) threads.emplace_back(fn, rank);
  for (auto& thread : threads) thread.join();
}

// A rank on device `rank` with a stream and its communicator.
struct Rank {
  NcclComm comm = nullptr;
  void* stream = nullptr;
};

Rank joinRank(const NcclApi& nccl, int nranks, const NcclUniqueId& id, int rank) {
  Rank joined;
  EXPECT_EQ(gpu().setDevice(rank), kCudaSuccess);
  EXPECT_EQ(gpu().streamCreate(&joined.stream), kCudaSuccess);
  EXPECT_EQ(nccl.commInitRank(&joined.comm, nranks, id, rank), cuda::kNcclSuccess);
  return joined;
}

void leaveRank(const NcclApi& nccl, Rank& joined) {
  EXPECT_EQ(nccl.commDestroy(joined.comm), cuda::kNcclSuccess);
  EXPECT_EQ(gpu().streamDestroy(joined.stream), kCudaSuccess);
}

// A stream held by a host function until open() is called.
class Gate {
 public:
  void holdStream(void* stream) {
    ASSERT_EQ(enqueueHostFunction(stream, [opened = opened_] { opened.wait(); }), kCudaSuccess);
  }
  void open() { promise_.set_value(); }

 private:
  std::promise<void> promise_;
  std::shared_future<void> opened_ = promise_.get_future().share();
};

class FakeGpu : public ::testing::Test {
 protected:
  void SetUp() override { reset(); }
  void TearDown() override { reset(); }
};

class FakeNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    reset();
    nccl = ncclApi();
    ASSERT_EQ(nccl->getUniqueId(&id), cuda::kNcclSuccess);
  }
  void TearDown() override { reset(); }

  std::shared_ptr<const NcclApi> nccl;
  NcclUniqueId id{};
};

// ---- CUDA ----------------------------------------------------------------------------

TEST_F(FakeGpu, DevicesAreCountedAndCurrentPerThread) {
  EXPECT_EQ(gpu().version, RINGTREE_GPU_API_VERSION);
  EXPECT_EQ(gpu().size, sizeof(RingtreeGpuApi));
  int value = 0;
  EXPECT_EQ(gpu().driverVersion(&value), kCudaSuccess);
  EXPECT_EQ(value, kCudaVersion);
  EXPECT_EQ(gpu().deviceCount(&value), kCudaSuccess);
  EXPECT_EQ(value, kDefaultDeviceCount);
  EXPECT_EQ(gpu().setDevice(kDefaultDeviceCount), kCudaErrorInvalidDevice);
  EXPECT_EQ(gpu().setDevice(3), kCudaSuccess);
  EXPECT_EQ(gpu().getDevice(&value), kCudaSuccess);
  EXPECT_EQ(value, 3);
  std::thread([] {
    int other = -1;
    EXPECT_EQ(gpu().getDevice(&other), kCudaSuccess);
    EXPECT_EQ(other, 0);
  }).join();
  EXPECT_STREQ(gpu().errorString(kCudaErrorInvalidValue), "invalid argument");

  setDeviceCount(0);
  EXPECT_EQ(gpu().deviceCount(&value), kCudaErrorNoDevice);
  EXPECT_EQ(value, 0);
  void* stream = nullptr;
  EXPECT_EQ(gpu().streamCreate(&stream), kCudaErrorNoDevice);
}

TEST_F(FakeGpu, MemoryIsTrackedAndFreeWaitsForTheDevice) {
  const Live before = live();
  ASSERT_EQ(gpu().setDevice(2), kCudaSuccess);
  auto* memory = static_cast<unsigned char*>(deviceAlloc(100));
  ASSERT_NE(memory, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(memory) % 256, 0u);
  EXPECT_EQ(memory[99], 0xA5);
  int device = 0;
  EXPECT_EQ(gpu().pointerDevice(memory + 50, &device), kCudaSuccess);
  EXPECT_EQ(device, 2);
  int onHost = 0;
  EXPECT_EQ(gpu().pointerDevice(&onHost, &device), kCudaSuccess);
  EXPECT_EQ(device, -1);
  EXPECT_EQ(live().allocations, before.allocations + 1);
  EXPECT_EQ(live().allocatedBytes, before.allocatedBytes + 100);

  // A copy past the allocation's end is refused.
  std::vector<unsigned char> host(200, 7);
  EXPECT_EQ(gpu().memcpyAsync(memory, host.data(), 101, nullptr), kCudaErrorInvalidValue);

  // deviceFree waits for the work the device's streams hold.
  void* stream = nullptr;
  ASSERT_EQ(gpu().streamCreate(&stream), kCudaSuccess);
  Gate gate;
  gate.holdStream(stream);
  ASSERT_EQ(gpu().memcpyAsync(memory, host.data(), 100, stream), kCudaSuccess);
  std::atomic<bool> freed{false};
  std::thread freeing([&] {
    EXPECT_EQ(gpu().deviceFree(memory), kCudaSuccess);
    freed = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(freed.load());
  gate.open();
  freeing.join();
  EXPECT_TRUE(freed.load());
  EXPECT_EQ(gpu().deviceFree(memory), kCudaErrorInvalidValue);
  EXPECT_EQ(gpu().deviceFree(nullptr), kCudaSuccess);
  EXPECT_EQ(gpu().streamDestroy(stream), kCudaSuccess);
  EXPECT_EQ(live().allocations, before.allocations);
  EXPECT_EQ(live().streams, before.streams);
  EXPECT_EQ(counters().allocations, 1);
  EXPECT_EQ(counters().frees, 1);
}

TEST_F(FakeGpu, StreamsRunInOrderAndEventsMarkTheirWork) {
  void* stream = nullptr;
  void* event = nullptr;
  ASSERT_EQ(gpu().streamCreate(&stream), kCudaSuccess);
  ASSERT_EQ(gpu().eventCreate(&event), kCudaSuccess);
  EXPECT_EQ(gpu().eventQuery(event), kCudaSuccess);  // never recorded

  Gate gate;
  gate.holdStream(stream);
  std::mutex mutex;
  std::vector<int> order;
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(enqueueHostFunction(stream,
                                  [&, i] {
                                    std::lock_guard<std::mutex> lock(mutex);
                                    order.push_back(i);
                                  }),
              kCudaSuccess);
  }
  // A chain of copies through device memory: each reads what the one before wrote.
  const std::vector<int> source = {1, 2, 3, 4};
  void* first = deviceAlloc(16);
  void* second = deviceAlloc(16);
  std::vector<int> result(4, 0);
  ASSERT_EQ(gpu().memcpyAsync(first, source.data(), 16, stream), kCudaSuccess);
  ASSERT_EQ(gpu().memcpyAsync(second, first, 16, stream), kCudaSuccess);
  ASSERT_EQ(gpu().memcpyAsync(result.data(), second, 16, stream), kCudaSuccess);
  ASSERT_EQ(gpu().eventRecord(event, stream), kCudaSuccess);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(gpu().eventQuery(event), kCudaErrorNotReady);

  gate.open();
  EXPECT_EQ(gpu().eventSynchronize(event), kCudaSuccess);
  EXPECT_EQ(gpu().eventQuery(event), kCudaSuccess);
  EXPECT_EQ(result, source);
  {
    std::lock_guard<std::mutex> lock(mutex);
    ASSERT_EQ(order.size(), 50u);
    for (int i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  }

  // The null stream is a FIFO of its own.
  std::vector<int> viaNull(4, 0);
  ASSERT_EQ(gpu().memcpyAsync(viaNull.data(), first, 16, nullptr), kCudaSuccess);
  ASSERT_EQ(gpu().streamSynchronize(nullptr), kCudaSuccess);
  EXPECT_EQ(viaNull, source);

  EXPECT_EQ(gpu().deviceFree(first), kCudaSuccess);
  EXPECT_EQ(gpu().deviceFree(second), kCudaSuccess);
  EXPECT_EQ(gpu().eventDestroy(event), kCudaSuccess);
  EXPECT_EQ(gpu().eventDestroy(event), kCudaErrorInvalidResourceHandle);
  EXPECT_EQ(gpu().streamDestroy(stream), kCudaSuccess);
  const Counters counted = counters();
  EXPECT_EQ(counted.streamsCreated, 1);
  EXPECT_EQ(counted.streamsDestroyed, 1);
  EXPECT_EQ(counted.eventsCreated, 1);
  EXPECT_EQ(counted.eventsDestroyed, 1);
}

TEST_F(FakeGpu, StreamWaitEventHoldsTheLaterWork) {
  void* held = nullptr;
  void* waiting = nullptr;
  void* event = nullptr;
  void* after = nullptr;
  ASSERT_EQ(gpu().streamCreate(&held), kCudaSuccess);
  ASSERT_EQ(gpu().streamCreate(&waiting), kCudaSuccess);
  ASSERT_EQ(gpu().eventCreate(&event), kCudaSuccess);
  ASSERT_EQ(gpu().eventCreate(&after), kCudaSuccess);

  Gate gate;
  gate.holdStream(held);
  ASSERT_EQ(gpu().eventRecord(event, held), kCudaSuccess);
  ASSERT_EQ(gpu().streamWaitEvent(waiting, event), kCudaSuccess);
  std::atomic<bool> ran{false};
  ASSERT_EQ(enqueueHostFunction(waiting, [&] { ran = true; }), kCudaSuccess);
  ASSERT_EQ(gpu().eventRecord(after, waiting), kCudaSuccess);
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(ran.load());
  EXPECT_EQ(gpu().eventQuery(after), kCudaErrorNotReady);

  gate.open();
  EXPECT_EQ(gpu().streamSynchronize(waiting), kCudaSuccess);
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(gpu().eventQuery(after), kCudaSuccess);

  // An event records streams of its own device only.
  ASSERT_EQ(gpu().setDevice(1), kCudaSuccess);
  void* elsewhere = nullptr;
  ASSERT_EQ(gpu().streamCreate(&elsewhere), kCudaSuccess);
  EXPECT_EQ(gpu().eventRecord(event, elsewhere), kCudaErrorInvalidResourceHandle);
  EXPECT_EQ(gpu().streamWaitEvent(elsewhere, after), kCudaSuccess);
  EXPECT_EQ(gpu().streamSynchronize(elsewhere), kCudaSuccess);

  for (void* e : {event, after}) EXPECT_EQ(gpu().eventDestroy(e), kCudaSuccess);
  for (void* s : {held, waiting, elsewhere}) EXPECT_EQ(gpu().streamDestroy(s), kCudaSuccess);
}

TEST_F(FakeGpu, KernelsRunTheCpuEngineOnTheStream) {
  void* stream = nullptr;
  ASSERT_EQ(gpu().streamCreate(&stream), kCudaSuccess);
  void* inout = deviceAlloc(4 * sizeof(float));
  void* in = deviceAlloc(4 * sizeof(float));
  put<float>(inout, {1, 2, 3, 4}, stream);
  put<float>(in, {10, 20, 30, 40}, stream);
  const int f32 = static_cast<int>(DataType::kFloat32);
  EXPECT_EQ(gpu().reduce(inout, in, 4, f32, static_cast<int>(ReduceOp::kSum), stream), kCudaSuccess);
  EXPECT_EQ(get<float>(inout, 4, stream), (std::vector<float>{11, 22, 33, 44}));
  EXPECT_EQ(gpu().reduce(inout, inout, 4, f32, static_cast<int>(ReduceOp::kMax), stream), kCudaSuccess);
  EXPECT_EQ(gpu().scale(inout, 4, f32, 2.0, stream), kCudaSuccess);
  EXPECT_EQ(get<float>(inout, 4, stream), (std::vector<float>{22, 44, 66, 88}));
  EXPECT_EQ(gpu().divide(inout, 4, f32, 4, stream), kCudaSuccess);
  EXPECT_EQ(get<float>(inout, 4, stream), (std::vector<float>{5.5f, 11, 16.5f, 22}));

  // Checked when enqueued.
  const int boolean = static_cast<int>(DataType::kBool);
  EXPECT_EQ(gpu().reduce(inout, in, 4, boolean, static_cast<int>(ReduceOp::kAvg), stream), kCudaErrorInvalidValue);
  EXPECT_EQ(gpu().scale(inout, 4, boolean, 2.0, stream), kCudaErrorInvalidValue);
  EXPECT_EQ(gpu().divide(inout, 4, f32, 0, stream), kCudaErrorInvalidValue);
  std::vector<float> host(4, 1.0f);
  EXPECT_EQ(gpu().reduce(inout, host.data(), 4, f32, 0, stream), kCudaErrorInvalidValue);
  EXPECT_EQ(gpu().reduce(inout, in, 5, f32, 0, stream), kCudaErrorInvalidValue);
  ASSERT_EQ(gpu().setDevice(1), kCudaSuccess);
  EXPECT_EQ(gpu().scale(inout, 4, f32, 2.0, stream), kCudaErrorInvalidResourceHandle);
  ASSERT_EQ(gpu().setDevice(0), kCudaSuccess);

  EXPECT_EQ(gpu().deviceFree(inout), kCudaSuccess);
  EXPECT_EQ(gpu().deviceFree(in), kCudaSuccess);
  EXPECT_EQ(gpu().streamDestroy(stream), kCudaSuccess);
}

// ---- NCCL ----------------------------------------------------------------------------

TEST_F(FakeNccl, TableReportsItsVersionAndOptionalEntries) {
  EXPECT_EQ(nccl->version, kNcclVersionCode);
  EXPECT_EQ(nccl->path, kNcclPath);
  int version = 0;
  EXPECT_EQ(nccl->getVersion(&version), cuda::kNcclSuccess);
  EXPECT_EQ(version, 22807);
  EXPECT_NE(nccl->getLastError, nullptr);
  EXPECT_NE(nccl->commSplit, nullptr);
  EXPECT_NE(nccl->redOpCreatePreMulSum, nullptr);
  EXPECT_NE(nccl->redOpDestroy, nullptr);
  EXPECT_STREQ(nccl->getErrorString(cuda::kNcclRemoteError), "remote process exited or there was a network error");

  setOptionalNcclSymbols(false);
  setNcclVersion(21004);
  const auto old = ncclApi();
  EXPECT_EQ(old->version, 21004);
  EXPECT_EQ(old->getLastError, nullptr);
  EXPECT_EQ(old->commSplit, nullptr);
  EXPECT_EQ(old->redOpCreatePreMulSum, nullptr);
  EXPECT_EQ(old->redOpDestroy, nullptr);
  EXPECT_NE(old->allReduce, nullptr);
  EXPECT_EQ(old->getVersion(&version), cuda::kNcclSuccess);
  EXPECT_EQ(version, 21004);

  NcclUniqueId other{};
  ASSERT_EQ(nccl->getUniqueId(&other), cuda::kNcclSuccess);
  EXPECT_NE(std::memcmp(id.internal, other.internal, sizeof(id.internal)), 0);
}

TEST_F(FakeNccl, TwoRanksAllReduceSumAndAvgOfFloats) {
  constexpr size_t kCount = 1000;
  runRanks(2, [&](int rank) {
    Rank self = joinRank(*nccl, 2, id, rank);
    std::vector<float> mine(kCount);
    for (size_t i = 0; i < kCount; ++i) mine[i] = static_cast<float>(rank + 1) * (static_cast<float>(i % 7) + 0.5f);
    void* send = deviceAlloc(kCount * sizeof(float));
    void* recv = deviceAlloc(kCount * sizeof(float));
    put(send, mine, self.stream);
    int device = -1;
    EXPECT_EQ(gpu().pointerDevice(send, &device), kCudaSuccess);
    EXPECT_EQ(device, rank);

    EXPECT_EQ(nccl->allReduce(send, recv, kCount, cuda::kNcclFloat32, cuda::kNcclSum, self.comm, self.stream),
              cuda::kNcclSuccess);
    EXPECT_EQ(nccl->allReduce(send, send, kCount, cuda::kNcclFloat32, cuda::kNcclAvg, self.comm, self.stream),
              cuda::kNcclSuccess);
    const auto sum = get<float>(recv, kCount, self.stream);
    const auto avg = get<float>(send, kCount, self.stream);
    for (size_t i = 0; i < kCount; ++i) {
      const float base = static_cast<float>(i % 7) + 0.5f;
      ASSERT_EQ(sum[i], 3 * base) << i;
      ASSERT_EQ(avg[i], 1.5f * base) << i;
    }
    int asyncError = -1;
    EXPECT_EQ(nccl->commGetAsyncError(self.comm, &asyncError), cuda::kNcclSuccess);
    EXPECT_EQ(asyncError, cuda::kNcclSuccess);
    EXPECT_EQ(gpu().deviceFree(send), kCudaSuccess);
    EXPECT_EQ(gpu().deviceFree(recv), kCudaSuccess);
    leaveRank(*nccl, self);
  });
  const Counters counted = counters();
  EXPECT_EQ(counted.commsInitialized, 2);
  EXPECT_EQ(counted.commsDestroyed, 2);
  EXPECT_EQ(counted.allReduce, 4);
  EXPECT_NE(counted.lastCollectiveStream, nullptr);
  EXPECT_EQ(counted.streamsCreated, counted.streamsDestroyed);
  EXPECT_EQ(live().communicators, 0);
}

TEST_F(FakeNccl, EveryCollectiveInPlaceWithAvgAndPreMulSum) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 4;
  runRanks(kRanks, [&](int rank) {
    Rank self = joinRank(*nccl, kRanks, id, rank);
    const auto fill = [&](int32_t value) { return std::vector<int32_t>(kCount, value); };
    void* buffer = deviceAlloc(kRanks * kCount * sizeof(int32_t));

    // broadcast from rank 1, in place.
    put(buffer, fill(100 + rank), self.stream);
    EXPECT_EQ(nccl->broadcast(buffer, buffer, kCount, cuda::kNcclInt32, 1, self.comm, self.stream), 0);
    EXPECT_EQ(get<int32_t>(buffer, kCount, self.stream), fill(101));

    // reduce (max) to rank 2; the others pass no recv buffer.
    put(buffer, fill(10 * rank - 7), self.stream);
    void* reduced = rank == 2 ? deviceAlloc(kCount * sizeof(int32_t)) : nullptr;
    EXPECT_EQ(nccl->reduce(buffer, reduced, kCount, cuda::kNcclInt32, cuda::kNcclMax, 2, self.comm, self.stream), 0);
    if (rank == 2) {
      EXPECT_EQ(get<int32_t>(reduced, kCount, self.stream), fill(13));
      EXPECT_EQ(gpu().deviceFree(reduced), kCudaSuccess);
    }

    // allGather in place: each rank's part already at its offset.
    auto* base = static_cast<int32_t*>(buffer);
    void* own = base + rank * kCount;
    put(own, fill(rank), self.stream);
    EXPECT_EQ(nccl->allGather(own, buffer, kCount, cuda::kNcclInt32, self.comm, self.stream), 0);
    std::vector<int32_t> gathered;
    for (int r = 0; r < kRanks; ++r) gathered.insert(gathered.end(), kCount, r);
    EXPECT_EQ(get<int32_t>(buffer, kRanks * kCount, self.stream), gathered);

    // reduceScatter in place: part r of the sum lands on rank r, at its offset.
    std::vector<int32_t> parts;
    for (int r = 0; r < kRanks; ++r) parts.insert(parts.end(), kCount, (rank + 1) * (r + 1));
    put(buffer, parts, self.stream);
    EXPECT_EQ(nccl->reduceScatter(buffer, own, kCount, cuda::kNcclInt32, cuda::kNcclSum, self.comm, self.stream), 0);
    EXPECT_EQ(get<int32_t>(own, kCount, self.stream), fill(6 * (rank + 1)));

    // avg of integers truncates toward zero: (1 + 2 + 4) / 3 and (-1 - 2 - 4) / 3.
    const int32_t value = 1 << rank;
    put(buffer, std::vector<int32_t>{value, -value, value, -value}, self.stream);
    EXPECT_EQ(nccl->allReduce(buffer, buffer, kCount, cuda::kNcclInt32, cuda::kNcclAvg, self.comm, self.stream), 0);
    EXPECT_EQ(get<int32_t>(buffer, kCount, self.stream), (std::vector<int32_t>{2, -2, 2, -2}));

    // PreMulSum: each rank's input times its own scalar (rank 0's read from device memory).
    float scalar = static_cast<float>(rank + 1);
    void* deviceScalar = deviceAlloc(sizeof(float));
    put(deviceScalar, std::vector<float>{scalar}, self.stream);
    int op = -1;
    EXPECT_EQ(nccl->redOpCreatePreMulSum(&op, rank == 0 ? deviceScalar : &scalar, cuda::kNcclFloat32,
                                         rank == 0 ? cuda::kNcclScalarDevice : cuda::kNcclScalarHostImmediate,
                                         self.comm),
              cuda::kNcclSuccess);
    EXPECT_EQ(op, kFirstCreatedRedOp);
    scalar = 1000.0f;  // read when created
    put(buffer, std::vector<float>(kCount, 0.5f), self.stream);
    EXPECT_EQ(nccl->allReduce(buffer, buffer, kCount, cuda::kNcclFloat32, op, self.comm, self.stream), 0);
    EXPECT_EQ(nccl->allReduce(buffer, buffer, kCount, cuda::kNcclInt32, op, self.comm, self.stream),
              cuda::kNcclInvalidArgument);
    EXPECT_EQ(nccl->redOpDestroy(op, self.comm), cuda::kNcclSuccess);
    EXPECT_EQ(get<float>(buffer, kCount, self.stream), std::vector<float>(kCount, 3.0f));
    EXPECT_EQ(nccl->redOpDestroy(op, self.comm), cuda::kNcclInvalidArgument);

    EXPECT_EQ(gpu().deviceFree(deviceScalar), kCudaSuccess);
    EXPECT_EQ(gpu().deviceFree(buffer), kCudaSuccess);
    leaveRank(*nccl, self);
  });
  const Counters counted = counters();
  EXPECT_EQ(counted.broadcast, 3);
  EXPECT_EQ(counted.reduce, 3);
  EXPECT_EQ(counted.allGather, 3);
  EXPECT_EQ(counted.reduceScatter, 3);
  EXPECT_EQ(counted.allReduce, 6);
  EXPECT_EQ(counted.redOpsCreated, 3);
  EXPECT_EQ(counted.redOpsDestroyed, 3);
}

TEST_F(FakeNccl, SendRecvRingInAGroupDoesNotDeadlock) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 64;
  runRanks(kRanks, [&](int rank) {
    Rank self = joinRank(*nccl, kRanks, id, rank);
    void* out = deviceAlloc(kCount * sizeof(int64_t));
    void* in = deviceAlloc(kCount * sizeof(int64_t));
    void* toSelf = deviceAlloc(sizeof(int64_t));
    put(out, std::vector<int64_t>(kCount, 1000 + rank), self.stream);
    const int next = (rank + 1) % kRanks;
    const int previous = (rank + kRanks - 1) % kRanks;
    EXPECT_EQ(nccl->groupStart(), cuda::kNcclSuccess);
    EXPECT_EQ(nccl->send(out, kCount, cuda::kNcclInt64, next, self.comm, self.stream), cuda::kNcclSuccess);
    EXPECT_EQ(nccl->recv(in, kCount, cuda::kNcclInt64, previous, self.comm, self.stream), cuda::kNcclSuccess);
    EXPECT_EQ(nccl->recv(toSelf, 1, cuda::kNcclInt64, rank, self.comm, self.stream), cuda::kNcclSuccess);
    EXPECT_EQ(nccl->send(out, 1, cuda::kNcclInt64, rank, self.comm, self.stream), cuda::kNcclSuccess);
    EXPECT_EQ(nccl->groupEnd(), cuda::kNcclSuccess);
    EXPECT_EQ(get<int64_t>(in, kCount, self.stream), std::vector<int64_t>(kCount, 1000 + previous));
    EXPECT_EQ(get<int64_t>(toSelf, 1, self.stream), std::vector<int64_t>(1, 1000 + rank));

    // Outside a group, a send waits for its receive on the stream only.
    if (rank == 0) {
      EXPECT_EQ(nccl->send(out, kCount, cuda::kNcclInt64, 1, self.comm, self.stream), 0);
    }
    if (rank == 1) {
      EXPECT_EQ(nccl->recv(in, kCount, cuda::kNcclInt64, 0, self.comm, self.stream), 0);
      EXPECT_EQ(get<int64_t>(in, kCount, self.stream), std::vector<int64_t>(kCount, 1000));
    }
    EXPECT_EQ(gpu().streamSynchronize(self.stream), kCudaSuccess);
    for (void* p : {out, in, toSelf}) EXPECT_EQ(gpu().deviceFree(p), kCudaSuccess);
    leaveRank(*nccl, self);
  });
  const Counters counted = counters();
  EXPECT_EQ(counted.send, 7);
  EXPECT_EQ(counted.recv, 7);
  EXPECT_EQ(counted.groupStart, 3);
  EXPECT_EQ(counted.groupEnd, 3);
  EXPECT_EQ(nccl->groupEnd(), cuda::kNcclInvalidUsage);
}

TEST_F(FakeNccl, SplitFollowsColorAndKey) {
  constexpr int kRanks = 4;
  runRanks(kRanks, [&](int rank) {
    Rank self = joinRank(*nccl, kRanks, id, rank);
    const int color = rank == 3 ? -1 : rank % 2;
    NcclComm child = &self;
    ASSERT_EQ(nccl->commSplit(self.comm, color, -rank, &child, nullptr), cuda::kNcclSuccess);
    if (rank == 3) {
      EXPECT_EQ(child, nullptr);
    } else {
      ASSERT_NE(child, nullptr);
      // Color 0 holds parent ranks 0 and 2, ordered by key (-rank): 2 first.
      const int expectedRank = rank == 0 ? 1 : 0;
      const int expectedSize = rank == 1 ? 1 : 2;
      bool found = false;
      for (const CommInfo& info : communicators()) {
        if (info.handle != child) continue;
        found = true;
        EXPECT_EQ(info.rank, expectedRank);
        EXPECT_EQ(info.nranks, expectedSize);
        EXPECT_EQ(info.initRank, rank);
        EXPECT_EQ(info.device, rank);
      }
      EXPECT_TRUE(found);
      void* buffer = deviceAlloc(2 * sizeof(int32_t));
      auto* own = static_cast<int32_t*>(buffer) + expectedRank;
      put(own, std::vector<int32_t>{rank}, self.stream);
      EXPECT_EQ(nccl->allGather(own, buffer, 1, cuda::kNcclInt32, child, self.stream), cuda::kNcclSuccess);
      const auto members = get<int32_t>(buffer, static_cast<size_t>(expectedSize), self.stream);
      EXPECT_EQ(members, rank == 1 ? std::vector<int32_t>{1} : std::vector<int32_t>({2, 0}));
      EXPECT_EQ(gpu().deviceFree(buffer), kCudaSuccess);
      EXPECT_EQ(nccl->commDestroy(child), cuda::kNcclSuccess);
    }
    leaveRank(*nccl, self);
  });
  EXPECT_EQ(counters().commsSplit, 3);
  EXPECT_EQ(counters().commsDestroyed, 7);
  EXPECT_EQ(live().communicators, 0);
}

TEST_F(FakeNccl, HangHoldsTheStreamUntilAbort) {
  constexpr size_t kCount = 8;
  std::atomic<bool> peerEnqueued{false};
  std::atomic<bool> aborting{false};
  hangNextCollective(0);
  runRanks(2, [&](int rank) {
    Rank self = joinRank(*nccl, 2, id, rank);
    void* buffer = deviceAlloc(kCount * sizeof(float));
    void* event = nullptr;
    ASSERT_EQ(gpu().eventCreate(&event), kCudaSuccess);
    put(buffer, std::vector<float>(kCount, 1.0f), self.stream);
    // Enqueueing returns at once, hung or not.
    EXPECT_EQ(nccl->allReduce(buffer, buffer, kCount, cuda::kNcclFloat32, cuda::kNcclSum, self.comm, self.stream),
              cuda::kNcclSuccess);
    EXPECT_EQ(gpu().eventRecord(event, self.stream), kCudaSuccess);
    if (rank == 0) {
      waitForFlag(peerEnqueued);
      std::this_thread::sleep_for(50ms);
      EXPECT_EQ(gpu().eventQuery(event), kCudaErrorNotReady);
      aborting = true;
      EXPECT_EQ(nccl->commAbort(self.comm), cuda::kNcclSuccess);
      EXPECT_EQ(gpu().eventSynchronize(event), kCudaSuccess);
      // The stream's later work runs; the hung collective moved nothing.
      EXPECT_EQ(get<float>(buffer, kCount, self.stream), std::vector<float>(kCount, 1.0f));
      int asyncError = 0;
      EXPECT_EQ(nccl->commGetAsyncError(self.comm, &asyncError), cuda::kNcclInvalidArgument);
    } else {
      peerEnqueued = true;
      EXPECT_EQ(gpu().eventSynchronize(event), kCudaSuccess);
      EXPECT_TRUE(aborting.load());
      int asyncError = 0;
      EXPECT_EQ(nccl->commGetAsyncError(self.comm, &asyncError), cuda::kNcclSuccess);
      EXPECT_EQ(asyncError, cuda::kNcclRemoteError);
      EXPECT_EQ(get<float>(buffer, kCount, self.stream), std::vector<float>(kCount, 1.0f));
      EXPECT_EQ(nccl->commDestroy(self.comm), cuda::kNcclSuccess);
    }
    EXPECT_EQ(gpu().eventDestroy(event), kCudaSuccess);
    EXPECT_EQ(gpu().streamDestroy(self.stream), kCudaSuccess);
    EXPECT_EQ(gpu().deviceFree(buffer), kCudaSuccess);
  });
  EXPECT_EQ(counters().commsAborted, 1);
  EXPECT_EQ(counters().commsDestroyed, 1);
  EXPECT_EQ(live().communicators, 0);
}

TEST_F(FakeNccl, InjectedFailuresAndAsyncErrors) {
  failGetUniqueId(cuda::kNcclSystemError);
  NcclUniqueId unused{};
  EXPECT_EQ(nccl->getUniqueId(&unused), cuda::kNcclSystemError);
  EXPECT_STRNE(nccl->getLastError(nullptr), "");
  failGetUniqueId(0);
  EXPECT_EQ(nccl->getUniqueId(&unused), cuda::kNcclSuccess);

  // Rank 1 fails at once; rank 0 gives up after the join timeout.
  setJoinTimeout(200ms);
  failCommInitRank(cuda::kNcclInvalidUsage, 1);
  runRanks(2, [&](int rank) {
    EXPECT_EQ(gpu().setDevice(rank), kCudaSuccess);
    NcclComm comm = nullptr;
    EXPECT_EQ(nccl->commInitRank(&comm, 2, id, rank), rank == 1 ? cuda::kNcclInvalidUsage : cuda::kNcclSystemError);
  });
  failCommInitRank(0, 1);

  // Two ranks on one device are refused, unless allowed.
  NcclUniqueId shared{};
  ASSERT_EQ(nccl->getUniqueId(&shared), cuda::kNcclSuccess);
  runRanks(2, [&](int rank) {
    NcclComm comm = nullptr;
    EXPECT_EQ(nccl->commInitRank(&comm, 2, shared, rank), cuda::kNcclInvalidUsage);
  });
  setAllowSharedDevice(true);
  ASSERT_EQ(nccl->getUniqueId(&shared), cuda::kNcclSuccess);
  std::vector<NcclComm> comms(2);
  runRanks(2, [&](int rank) {
    EXPECT_EQ(nccl->commInitRank(&comms[static_cast<size_t>(rank)], 2, shared, rank), cuda::kNcclSuccess);
  });

  int asyncError = -1;
  setAsyncError(1, cuda::kNcclRemoteError);
  EXPECT_EQ(nccl->commGetAsyncError(comms[0], &asyncError), cuda::kNcclSuccess);
  EXPECT_EQ(asyncError, cuda::kNcclSuccess);
  EXPECT_EQ(nccl->commGetAsyncError(comms[1], &asyncError), cuda::kNcclSuccess);
  EXPECT_EQ(asyncError, cuda::kNcclRemoteError);
  setAsyncErrorOn(comms[1], cuda::kNcclInternalError);
  EXPECT_EQ(nccl->commGetAsyncError(comms[1], &asyncError), cuda::kNcclSuccess);
  EXPECT_EQ(asyncError, cuda::kNcclInternalError);
  setAsyncErrorOn(comms[1], 0);
  setAsyncError(1, 0);
  EXPECT_EQ(nccl->commGetAsyncError(comms[1], &asyncError), cuda::kNcclSuccess);
  EXPECT_EQ(asyncError, cuda::kNcclSuccess);
  for (NcclComm comm : comms) EXPECT_EQ(nccl->commDestroy(comm), cuda::kNcclSuccess);
  EXPECT_EQ(counters().commsInitialized, 2);
}

TEST_F(FakeNccl, DisagreeingRanksReportInvalidUsage) {
  runRanks(2, [&](int rank) {
    Rank self = joinRank(*nccl, 2, id, rank);
    void* buffer = deviceAlloc(8 * sizeof(float));
    put(buffer, std::vector<float>(8, 2.0f), self.stream);
    const size_t count = rank == 0 ? 4 : 8;
    EXPECT_EQ(nccl->allReduce(buffer, buffer, count, cuda::kNcclFloat32, cuda::kNcclSum, self.comm, self.stream), 0);
    EXPECT_EQ(gpu().streamSynchronize(self.stream), kCudaSuccess);
    int asyncError = 0;
    EXPECT_EQ(nccl->commGetAsyncError(self.comm, &asyncError), cuda::kNcclSuccess);
    EXPECT_EQ(asyncError, cuda::kNcclInvalidUsage);
    EXPECT_EQ(get<float>(buffer, 8, self.stream), std::vector<float>(8, 2.0f));
    EXPECT_EQ(gpu().deviceFree(buffer), kCudaSuccess);
    leaveRank(*nccl, self);
  });
}

TEST_F(FakeNccl, CallsAreCheckedWhenMade) {
  Rank self = joinRank(*nccl, 1, id, 0);
  void* buffer = deviceAlloc(16);
  std::vector<float> host(4, 1.0f);
  const auto allReduce = [&](const void* send, void* recv, size_t count, int type, int op, void* stream) {
    return nccl->allReduce(send, recv, count, type, op, self.comm, stream);
  };
  EXPECT_EQ(allReduce(host.data(), host.data(), 4, cuda::kNcclFloat32, 0, self.stream), cuda::kNcclInvalidArgument);
  EXPECT_EQ(allReduce(buffer, buffer, 5, cuda::kNcclFloat32, 0, self.stream), cuda::kNcclInvalidArgument);
  EXPECT_EQ(allReduce(buffer, buffer, 4, cuda::kNcclUint32, 0, self.stream), cuda::kNcclInvalidArgument);
  EXPECT_EQ(allReduce(buffer, buffer, 4, 42, 0, self.stream), cuda::kNcclInvalidArgument);
  EXPECT_EQ(allReduce(buffer, buffer, 4, cuda::kNcclFloat32, 17, self.stream), cuda::kNcclInvalidArgument);
  EXPECT_EQ(nccl->allReduce(buffer, buffer, 4, cuda::kNcclFloat32, 0, nullptr, self.stream),
            cuda::kNcclInvalidArgument);
  EXPECT_EQ(nccl->broadcast(buffer, buffer, 4, cuda::kNcclUint32, 1, self.comm, self.stream),
            cuda::kNcclInvalidArgument);
  // uint32 moves data; one rank's collectives complete alone.
  EXPECT_EQ(nccl->broadcast(buffer, buffer, 4, cuda::kNcclUint32, 0, self.comm, self.stream), cuda::kNcclSuccess);
  EXPECT_EQ(nccl->allReduce(buffer, buffer, 0, cuda::kNcclFloat32, 0, self.comm, nullptr), cuda::kNcclSuccess);
  EXPECT_EQ(counters().lastCollectiveStream, nullptr);
  void* unknownStream = &host;
  EXPECT_EQ(allReduce(buffer, buffer, 4, cuda::kNcclFloat32, 0, unknownStream), cuda::kNcclUnhandledCudaError);
  ASSERT_EQ(gpu().setDevice(1), kCudaSuccess);
  void* elsewhere = nullptr;
  ASSERT_EQ(gpu().streamCreate(&elsewhere), kCudaSuccess);
  EXPECT_EQ(allReduce(buffer, buffer, 4, cuda::kNcclFloat32, 0, elsewhere), cuda::kNcclUnhandledCudaError);
  EXPECT_EQ(gpu().streamDestroy(elsewhere), kCudaSuccess);
  ASSERT_EQ(gpu().setDevice(0), kCudaSuccess);
  EXPECT_EQ(allReduce(buffer, buffer, 4, cuda::kNcclFloat32, cuda::kNcclProd, self.stream), cuda::kNcclSuccess);
  EXPECT_EQ(counters().lastCollectiveStream, self.stream);
  EXPECT_EQ(counters().allReduce, 2);
  EXPECT_EQ(gpu().streamSynchronize(self.stream), kCudaSuccess);
  EXPECT_EQ(gpu().deviceFree(buffer), kCudaSuccess);
  EXPECT_EQ(nccl->commAbort(nullptr), cuda::kNcclSuccess);
  EXPECT_EQ(nccl->commDestroy(nullptr), cuda::kNcclSuccess);
  leaveRank(*nccl, self);
  EXPECT_EQ(nccl->commDestroy(self.comm), cuda::kNcclInvalidArgument);
}

}  // namespace
}  // namespace ringtree::test::fake_gpu
