// The CUDA backends (NCCL's and the host-staged one) driven through ProcessGroup with ranks
// as threads, over the in-process stand-ins for the CUDA runtime and NCCL
// (harness/fake_gpu.h): every operation against the CPU engine's result on the same
// inputs, every (dtype, op) of allreduce, the communicator's set-up from the store, stream
// ordering, asynchronous errors, timeouts and leaks. Which backend serves a group
// (backend_choice.h) is checked on its own.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/device_backend.h>
#include <ringtree/error.h>
#include <ringtree/process_group.h>

#include "backends/cuda/backend_choice.h"
#include "backends/cuda/nccl_backend.h"
#include "backends/cuda/staged_backend.h"
#include "harness/fake_gpu.h"
#include "harness/test_util.h"
#include "harness/thread_harness.h"
#include "harness/typed_values.h"

namespace ringtree {
namespace {

namespace fake = test::fake_gpu;
using test::messageOf;
using Bytes = std::vector<std::byte>;

std::unique_ptr<DeviceBackend> makeFakeNccl(const DeviceBackendContext& context) {
  return cuda::makeNcclBackend(context, fake::gpuApi(), fake::ncclApi());
}

std::unique_ptr<DeviceBackend> makeFakeStaged(const DeviceBackendContext& context) {
  return cuda::makeStagedBackend(context, fake::gpuApi());
}

enum class Kind { kNccl, kStaged };

const char* kindName(Kind kind) { return kind == Kind::kNccl ? "nccl" : "staged"; }

// Registers the backend under test for CUDA buffers, and puts the built-in one back.
class CudaBackendTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    fake::reset();
    registerDeviceBackend(DeviceType::kCuda, kindName(GetParam()),
                          GetParam() == Kind::kNccl ? &makeFakeNccl : &makeFakeStaged);
  }
  void TearDown() override { registerDeviceBackend(DeviceType::kCuda, "cuda", &cuda::makeDefaultCudaBackend); }

  // The device of `rank`'s buffers: one each for NCCL, one shared by all for staging.
  int deviceOf(int rank) const { return GetParam() == Kind::kNccl ? rank : 0; }
};

// Device memory of the fake holding `bytes`, freed at the end of the scope.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, const Bytes& bytes) : device_(device), bytes_(bytes.size()) {
    const RingtreeGpuApi& gpu = fake::gpuApi();
    gpu.setDevice(device);
    EXPECT_EQ(gpu.deviceMalloc(&data_, bytes.empty() ? 1 : bytes.size()), 0);
    if (!bytes.empty()) { EXPECT_EQ(gpu.memcpyAsync(data_, bytes.data(), bytes.size(), nullptr), 0); }
    EXPECT_EQ(gpu.streamSynchronize(nullptr), 0);
  }
  ~DeviceBuffer() {
    fake::gpuApi().setDevice(device_);  // as a CUDA program would: the free needs a context
    fake::gpuApi().deviceFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // The contents, read after what the device's null stream holds.
  Bytes read() const {
    const RingtreeGpuApi& gpu = fake::gpuApi();
    gpu.setDevice(device_);
    Bytes bytes(bytes_);
    if (!bytes.empty()) { EXPECT_EQ(gpu.memcpyAsync(bytes.data(), data_, bytes.size(), nullptr), 0); }
    EXPECT_EQ(gpu.streamSynchronize(nullptr), 0);
    return bytes;
  }
  void* data() const { return data_; }

 private:
  int device_;
  size_t bytes_;
  void* data_ = nullptr;
};

// One buffer of an operation: its type, element count, leading rows and first contents.
struct Spec {
  DataType type;
  size_t count;
  Bytes initial;
  size_t rows = 0;
};

// `count` elements of `type` from values(i).
Spec typed(DataType type, size_t count, const std::function<double(size_t)>& values, size_t rows = 0) {
  Spec spec{type, count, Bytes(count * elementSize(type)), rows};
  for (size_t i = 0; i < count; ++i) test::store(type, values(i), spec.initial.data() + i * elementSize(type));
  return spec;
}

// Output space: `count` elements of a recognisable filler.
Spec filler(DataType type, size_t count, size_t rows = 0) {
  return Spec{type, count, Bytes(count * elementSize(type), std::byte{0x5a}), rows};
}

using Operation = std::function<std::shared_ptr<Work>(ProcessGroup&, const std::vector<BufferView>&)>;

// Runs `operation` over host copies of `specs` (the CPU engine) and over device copies on
// `device` (the backend under test), then expects every buffer to hold the same bytes.
void expectSameAsCpu(ProcessGroup& group, int device, const std::vector<Spec>& specs, const Operation& operation,
                     const std::string& what) {
  std::vector<Bytes> host;
  std::vector<std::unique_ptr<DeviceBuffer>> onDevice;
  std::vector<BufferView> hostViews, deviceViews;
  for (const Spec& spec : specs) host.push_back(spec.initial);
  for (size_t i = 0; i < specs.size(); ++i) {
    onDevice.push_back(std::make_unique<DeviceBuffer>(device, specs[i].initial));
    hostViews.emplace_back(host[i].data(), specs[i].count, specs[i].type, Device{}, specs[i].rows);
    deviceViews.emplace_back(onDevice[i]->data(), specs[i].count, specs[i].type, Device{DeviceType::kCuda, device},
                             specs[i].rows);
  }
  if (const std::shared_ptr<Work> work = operation(group, hostViews)) work->wait();
  if (const std::shared_ptr<Work> work = operation(group, deviceViews)) work->wait();
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(onDevice[i]->read(), host[i]) << what << ": buffer " << i << " differs from the CPU engine's";
  }
}

// Blocks until `work` completed on the device (Work::wait() of a CUDA operation only
// orders the caller's stream after it), then rethrows its error.
void waitUntilCompleted(const std::shared_ptr<Work>& work) {
  ASSERT_TRUE(test::eventually([&] { return work->isCompleted(); }, std::chrono::seconds(30)));
  if (work->exception()) std::rethrow_exception(work->exception());
}

// Small values, distinct by rank and index; products of a few of them stay exact.
double valueAt(int rank, size_t i) { return static_cast<double>((rank + 1) * static_cast<int>(i % 3 + 1) % 5) - 1; }

TEST_P(CudaBackendTest, EveryAllreduceTypeAndOpGivesTheCpuEnginesResult) {
  for (const int size : {2, 4}) {
    const std::shared_ptr<Store> store = test::freshStore();
    test::runOnThreads(size, [&](int rank) {
      const auto group = ProcessGroup::create(store, rank, size, test::testOptions());
      for (int t = 0; t < kNumDataTypes; ++t) {
        for (int o = 0; o < kNumReduceOps; ++o) {
          const auto type = static_cast<DataType>(t);
          const auto op = static_cast<ReduceOp>(o);
          if (!isSupported(type, op)) continue;
          AllreduceOptions options;
          options.op = op;
          options.premulFactor = 2.0;
          const std::string what = std::string("allreduce ") + dataTypeName(type) + " " + reduceOpName(op) + " at " +
                                   std::to_string(size) + " ranks";
          // 7 elements: uneven ring chunks; the async form too for one op.
          expectSameAsCpu(*group, deviceOf(rank), {typed(type, 7, [&](size_t i) { return valueAt(rank, i); })},
                          [&](ProcessGroup& g, const std::vector<BufferView>& v) -> std::shared_ptr<Work> {
                            if (op == ReduceOp::kMax) return g.allreduceAsync(v[0], options);
                            g.allreduce(v[0], options);
                            return nullptr;
                          },
                          what);
        }
      }
      group->shutdown();
    });
  }
}

constexpr int kSize = 3;  // EveryOperationGivesTheCpuEnginesResult's ranks

TEST_P(CudaBackendTest, EveryOperationGivesTheCpuEnginesResult) {
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(kSize, [&](int rank) {
    const auto group = ProcessGroup::create(store, rank, kSize, test::testOptions());
    const int device = deviceOf(rank);
    const auto mine = [&](DataType type, size_t count, size_t rows = 0) {
      return typed(type, count, [&](size_t i) { return valueAt(rank, i) + 3; }, rows);
    };
    const auto f32 = DataType::kFloat32;
    const auto run = [&](const std::vector<Spec>& specs, const Operation& operation, const char* what) {
      expectSameAsCpu(*group, device, specs, operation, what);
    };
    using Views = const std::vector<BufferView>&;
    run({mine(DataType::kInt64, 5), mine(DataType::kInt64, 0), mine(DataType::kInt64, 9)},
        [](ProcessGroup& g, Views v) { return g.allreduceCoalescedAsync(v); }, "allreduceCoalesced");
    run({mine(DataType::kBFloat16, 6)}, [](ProcessGroup& g, Views v) {
          BroadcastOptions options;
          options.root = 2;
          g.broadcast(v[0], options);
          return nullptr;
        }, "broadcast");
    run({mine(DataType::kInt16, 6)}, [](ProcessGroup& g, Views v) {
          ReduceOptions options;
          options.root = 1;
          options.op = ReduceOp::kBxor;
          g.reduce(v[0], options);
          return nullptr;
        }, "reduce int16 BXOR");
    run({mine(f32, 6)}, [](ProcessGroup& g, Views v) {
          ReduceOptions options;
          options.root = 0;
          options.op = ReduceOp::kMin;
          return g.reduceAsync(v[0], options);
        }, "reduce float32 MIN");
    run({mine(f32, 4), filler(f32, 4), filler(f32, 4), filler(f32, 4)},
        [](ProcessGroup& g, Views v) { return g.allgatherAsync({v[1], v[2], v[3]}, v[0]); }, "allgather");
    // Parts of different sizes: rank r gives r + 1 elements, and gets r + 2 of a reduction.
    const auto part = static_cast<size_t>(rank + 1);
    run({mine(DataType::kInt32, part), filler(DataType::kInt32, 1), filler(DataType::kInt32, 2),
         filler(DataType::kInt32, 3)},
        [](ProcessGroup& g, Views v) {
          g.allgather({v[1], v[2], v[3]}, v[0]);
          return nullptr;
        }, "allgather, uneven");
    run({filler(f32, part + 1), mine(f32, 2), mine(f32, 3), mine(f32, 4)},
        [](ProcessGroup& g, Views v) {
          g.reduceScatter(v[0], {v[1], v[2], v[3]});
          return nullptr;
        }, "reduceScatter, uneven");
    run({filler(DataType::kInt16, part + 1), mine(DataType::kInt16, 2), mine(DataType::kInt16, 3),
         mine(DataType::kInt16, 4)},
        [](ProcessGroup& g, Views v) {
          ReduceScatterOptions options;
          options.op = ReduceOp::kBor;
          g.reduceScatter(v[0], {v[1], v[2], v[3]}, options);
          return nullptr;
        }, "reduceScatter int16 BOR, uneven");
    run({mine(DataType::kUInt8, 5), filler(DataType::kUInt8, 15)},
        [](ProcessGroup& g, Views v) {
          g.allgatherSingle(v[1], v[0]);
          return nullptr;
        }, "allgatherSingle");
    run({mine(f32, 2), mine(f32, 3), filler(f32, 2), filler(f32, 3), filler(f32, 2), filler(f32, 3), filler(f32, 2),
         filler(f32, 3)},
        [](ProcessGroup& g, Views v) {
          g.allgatherCoalesced({{v[2], v[3]}, {v[4], v[5]}, {v[6], v[7]}}, {v[0], v[1]});
          return nullptr;
        }, "allgatherCoalesced");
    run({mine(f32, 3), filler(f32, 3), filler(f32, 3), filler(f32, 3)},
        [rank](ProcessGroup& g, Views v) {
          GatherOptions options;
          options.root = 1;
          g.gather(v[0], rank == 1 ? std::vector<BufferView>{v[1], v[2], v[3]} : std::vector<BufferView>{}, options);
          return nullptr;
        }, "gather");
    run({filler(f32, 3), mine(f32, 3), mine(f32, 3), mine(f32, 3)},
        [rank](ProcessGroup& g, Views v) {
          ScatterOptions options;
          options.root = 2;
          return g.scatterAsync(v[0], rank == 2 ? std::vector<BufferView>{v[1], v[2], v[3]} : std::vector<BufferView>{},
                                options);
        }, "scatter");
    run({filler(DataType::kInt32, 4), mine(DataType::kInt32, 4), mine(DataType::kInt32, 4), mine(DataType::kInt32, 4)},
        [](ProcessGroup& g, Views v) {
          ReduceScatterOptions options;
          options.op = ReduceOp::kAvg;  // integer AVG: ringtree's ring and kernels
          g.reduceScatter(v[0], {v[1], v[2], v[3]}, options);
          return nullptr;
        }, "reduceScatter int32 AVG");
    run({filler(DataType::kFloat64, 4), mine(DataType::kFloat64, 12)},
        [](ProcessGroup& g, Views v) {
          ReduceScatterOptions options;
          options.op = ReduceOp::kPremulSum;
          options.premulFactor = 0.5;
          return g.reduceScatterSingleAsync(v[0], v[1], options);
        }, "reduceScatterSingle float64 PREMUL_SUM");
    run({filler(f32, 2), filler(f32, 3), mine(f32, 6), mine(f32, 9)},
        [](ProcessGroup& g, Views v) {
          g.reduceScatterSingleCoalesced({v[0], v[1]}, {v[2], v[3]});
          return nullptr;
        }, "reduceScatterSingleCoalesced");
    run({filler(f32, 2), filler(f32, 2), filler(f32, 2), mine(f32, 2), mine(f32, 2), mine(f32, 2)},
        [](ProcessGroup& g, Views v) { return g.alltoallAsync({v[0], v[1], v[2]}, {v[3], v[4], v[5]}); }, "alltoall");
    const auto rows = static_cast<size_t>(3 * (rank + 1));  // rank r gets r + 1 rows of 2 from each rank
    run({filler(DataType::kInt8, 2 * rows, rows), mine(DataType::kInt8, 12, 6)},
        [rank](ProcessGroup& g, Views v) {
          g.alltoallSingle(v[0], v[1], std::vector<int64_t>(3, rank + 1), {1, 2, 3});
          return nullptr;
        }, "alltoallSingle");
    run({mine(DataType::kComplex64, 4)},
        [rank](ProcessGroup& g, Views v) -> std::shared_ptr<Work> {
          if (rank == 0) g.send(v[0], 2, 7);
          if (rank == 2) { EXPECT_EQ(g.recv(v[0], 0, 7), 0); }
          if (rank == 1) return g.isend(v[0], 0, 3);
          if (rank == 0) return g.irecv(v[0], 1, 3);
          return nullptr;
        }, "send/recv");
    run({mine(f32, 5), filler(f32, 5), mine(f32, 3), filler(f32, 3)},
        [rank](ProcessGroup& g, Views v) {
          // Each rank sends to both neighbours first: one batch cannot deadlock.
          const int next = (rank + 1) % kSize;
          const int previous = (rank + kSize - 1) % kSize;
          for (const std::shared_ptr<Work>& work :
               g.batchIsendIrecv({{true, v[0], next, 1}, {true, v[2], previous, 2}, {false, v[1], previous, 1},
                                  {false, v[3], next, 2}})) {
            EXPECT_TRUE(work->wait());
          }
          return nullptr;
        }, "batchIsendIrecv");
    group->shutdown();
  });
}

// Buffers with every of their ranks on the group's device; a receive from any source
// where the backend has one (staging: the CPU engine's).
// No thread ringtree drives (callers that never chose a device, the watchdog, a thread
// waiting for a Work, the CPU engine's thread finishing a staged receive) makes a context
// on GPU 0 when the group's GPUs are others: each would cost every rank hundreds of MiB.
// The rank threads never choose a device: their buffers are made on other threads.
TEST_P(CudaBackendTest, NoContextIsMadeOnADeviceTheGroupDoesNotUse) {
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const int device = GetParam() == Kind::kNccl ? rank + 1 : 1;
    std::optional<DeviceBuffer> buffer;
    std::thread([&] { buffer.emplace(device, Bytes(64)); }).join();
    const auto group = ProcessGroup::create(store, rank, 2, test::testOptions());
    const BufferView view(buffer->data(), 16, DataType::kFloat32, Device{DeviceType::kCuda, device});
    group->allreduce(view);
    const std::shared_ptr<Work> work = group->allreduceAsync(view);
    std::thread([&] { EXPECT_TRUE(work->wait()); }).join();
    waitUntilCompleted(work);
    waitUntilCompleted(rank == 1 ? group->isend(view, 0, 7) : group->irecv(view, 1, 7));
    group->shutdown();
    std::thread([&] { buffer.reset(); }).join();
  });
  EXPECT_TRUE(fake::contextActive(1));
  EXPECT_FALSE(fake::contextActive(0));
}

TEST_P(CudaBackendTest, RefusesWhatItCannotServe) {
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const auto group = ProcessGroup::create(store, rank, 2, test::testOptions());
    DeviceBuffer buffer(deviceOf(rank), Bytes(16));
    const BufferView view(buffer.data(), 4, DataType::kFloat32, Device{DeviceType::kCuda, deviceOf(rank)});
    group->allreduce(view);
    DeviceBuffer elsewhere(5, Bytes(16));
    EXPECT_TRUE(test::contains(messageOf<InvalidArgument>([&] {
      group->allreduce(BufferView(elsewhere.data(), 4, DataType::kFloat32, Device{DeviceType::kCuda, 5}));
    }), "one device per group and rank"));
    if (GetParam() == Kind::kNccl) {
      EXPECT_TRUE(test::contains(messageOf<InvalidArgument>([&] { group->recv(view, ProcessGroup::kAnySource); }),
                                 "NCCL has no wildcard receive"));
    } else {
      if (rank == 0) group->send(view, 1, 0);
      if (rank == 1) { EXPECT_EQ(group->recv(view, ProcessGroup::kAnySource), 0); }
    }
    group->shutdown();
  });
}

TEST_P(CudaBackendTest, ABatchIsCheckedWholeBeforeAnythingIsPosted) {
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const auto group = ProcessGroup::create(store, rank, 2, test::testOptions());
    DeviceBuffer buffer(deviceOf(rank), Bytes(16));
    const BufferView cuda(buffer.data(), 4, DataType::kFloat32, Device{DeviceType::kCuda, deviceOf(rank)});
    float host[4] = {};
    const int peer = 1 - rank;
    EXPECT_EQ(messageOf<InvalidArgument>([&] { group->batchIsendIrecv({}); }),
              "batch_isend_irecv needs at least one operation, got none");
    EXPECT_EQ(messageOf<InvalidArgument>([&] {
                group->batchIsendIrecv({{true, cuda, peer, 0}, {false, BufferView(host, 4), peer, 0}});
              }),
              "batch_isend_irecv: operations on different devices: op 0 is on cuda:" + std::to_string(deviceOf(rank)) +
                  " but op 1 is on cpu");
    EXPECT_TRUE(test::contains(
        messageOf<InvalidArgument>([&] { group->batchIsendIrecv({{false, cuda, ProcessGroup::kAnySource, 0}}); }),
        "op 0 receives from any source"));
    group->shutdown();
  });
}

// Staged isend/irecv only post: a ring that receives before it sends completes (over
// NCCL such a ring needs batchIsendIrecv, as with torch's NCCL backend).
TEST(StagedBackend, ARingThatReceivesBeforeItSendsCompletes) {
  fake::reset();
  registerDeviceBackend(DeviceType::kCuda, "staged", &makeFakeStaged);
  constexpr int kRanks = 3;
  constexpr size_t kCount = 1 << 18;  // 1 MiB: past what a transport buffers before a receive
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(kRanks, [&](int rank) {
    const auto group = ProcessGroup::create(store, rank, kRanks, test::testOptions());
    std::vector<float> mine(kCount, static_cast<float>(rank));
    DeviceBuffer out(0, Bytes(reinterpret_cast<std::byte*>(mine.data()),
                              reinterpret_cast<std::byte*>(mine.data() + kCount)));
    DeviceBuffer in(0, Bytes(kCount * sizeof(float)));
    const Device device{DeviceType::kCuda, 0};
    const auto received = group->irecv(BufferView(in.data(), kCount, DataType::kFloat32, device),
                                       (rank + kRanks - 1) % kRanks, 0);
    const auto sent = group->isend(BufferView(out.data(), kCount, DataType::kFloat32, device), (rank + 1) % kRanks, 0);
    EXPECT_TRUE(sent->wait());
    EXPECT_TRUE(received->wait());
    EXPECT_EQ(received->sourceRank(), (rank + kRanks - 1) % kRanks);
    const Bytes result = in.read();
    float last = -1;
    std::memcpy(&last, result.data() + result.size() - sizeof(float), sizeof(float));
    EXPECT_EQ(last, static_cast<float>((rank + kRanks - 1) % kRanks));
    group->shutdown();
  });
  registerDeviceBackend(DeviceType::kCuda, "cuda", &cuda::makeDefaultCudaBackend);
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaBackendTest, ::testing::Values(Kind::kNccl, Kind::kStaged),
                         [](const ::testing::TestParamInfo<Kind>& info) { return std::string(kindName(info.param)); });

// --- NCCL's backend alone -----------------------------------------------------------------

class NcclBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::reset();
    registerDeviceBackend(DeviceType::kCuda, "nccl", &makeFakeNccl);
  }
  void TearDown() override { registerDeviceBackend(DeviceType::kCuda, "cuda", &cuda::makeDefaultCudaBackend); }

  static BufferView onDevice(const DeviceBuffer& buffer, size_t count, int device) {
    return BufferView(buffer.data(), count, DataType::kFloat32, Device{DeviceType::kCuda, device});
  }
};

TEST_F(NcclBackendTest, OneCommunicatorPerGroupFromTheIdInTheStoreAndNothingLeaks) {
  const fake::Live before = fake::live();
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(3, [&](int rank) {
    const auto group = ProcessGroup::create(store, rank, 3, test::testOptions());
    DeviceBuffer buffer(rank, Bytes(64));
    for (int i = 0; i < 3; ++i) group->allreduce(onDevice(buffer, 16, rank));
    group->shutdown();
  });
  EXPECT_EQ(fake::counters().commsInitialized, 3);
  EXPECT_EQ(fake::counters().allReduce, 9);
  EXPECT_EQ(fake::counters().commsDestroyed, 3);
  const fake::Live after = fake::live();
  EXPECT_EQ(after.streams, before.streams);
  EXPECT_EQ(after.events, before.events);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.communicators, before.communicators);
}

TEST_F(NcclBackendTest, SetUpFailuresNameTheCall) {
  fake::failCommInitRank(cuda::kNcclSystemError, 1);
  const std::shared_ptr<Store> store = test::freshStore();
  std::atomic<int> failed{0};
  fake::setJoinTimeout(std::chrono::milliseconds(500));
  test::runOnThreads(2, [&](int rank) {
    const auto group = ProcessGroup::create(store, rank, 2, test::testOptions());
    DeviceBuffer buffer(rank, Bytes(16));
    const std::string message = messageOf<Error>([&] { group->allreduce(onDevice(buffer, 4, rank)); });
    EXPECT_TRUE(test::contains(message, "ncclCommInitRank failed")) << message;
    EXPECT_TRUE(test::contains(message, "rank " + std::to_string(rank) + " of 2")) << message;
    ++failed;
  });
  EXPECT_EQ(failed.load(), 2);
  EXPECT_EQ(fake::live().communicators, 0);
}

// The operation waits for the caller's stream; a synchronous call returns before it ran,
// and the caller's stream then waits for it.
TEST_F(NcclBackendTest, OperationsRunAfterTheCallersStreamAndBeforeWhatFollowsOnIt) {
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const RingtreeGpuApi& gpu = fake::gpuApi();
    const auto group = ProcessGroup::create(store, rank, 2, test::testOptions());
    DeviceBuffer buffer(rank, Bytes(4 * sizeof(float)));
    gpu.setDevice(rank);
    void* callerStream = nullptr;
    ASSERT_EQ(gpu.streamCreate(&callerStream), 0);
    setCurrentStream(Device{DeviceType::kCuda, rank}, callerStream);
    group->allreduce(onDevice(buffer, 4, rank));  // sets the communicator up
    std::atomic<bool> release{false};
    const float value = static_cast<float>(rank + 1);
    // The producer: holds the caller's stream, then writes the input.
    fake::enqueueHostFunction(callerStream, [&] {
      test::waitForFlag(release);
      float values[4] = {value, value, value, value};
      std::memcpy(buffer.data(), values, sizeof(values));
    });
    group->allreduce(onDevice(buffer, 4, rank));  // returns while the producer holds the stream
    EXPECT_NE(fake::counters().lastCollectiveStream, callerStream);
    float seen[4] = {};
    // The consumer, after the collective on the caller's stream.
    fake::enqueueHostFunction(callerStream, [&] { std::memcpy(seen, buffer.data(), sizeof(seen)); });
    release = true;
    ASSERT_EQ(gpu.streamSynchronize(callerStream), 0);
    EXPECT_EQ(seen[3], 3.0f);  // 1 + 2: the producers' values, reduced

    // Asynchronous: wait() orders the caller's stream after the operation, without
    // waiting on the host for it (the producer still holds the stream).
    release = false;
    fake::enqueueHostFunction(callerStream, [&] { test::waitForFlag(release); });
    const std::shared_ptr<Work> work = group->allreduceAsync(onDevice(buffer, 4, rank));
    EXPECT_TRUE(work->wait());
    EXPECT_FALSE(work->isCompleted());
    fake::enqueueHostFunction(callerStream, [&] { std::memcpy(seen, buffer.data(), sizeof(seen)); });
    release = true;
    ASSERT_EQ(gpu.streamSynchronize(callerStream), 0);
    EXPECT_EQ(seen[3], 6.0f);  // 3 + 3
    waitUntilCompleted(work);
    setCurrentStream(Device{DeviceType::kCuda, rank}, nullptr);
    group->shutdown();
    gpu.streamDestroy(callerStream);
  });
}

TEST_F(NcclBackendTest, AnAsynchronousNcclErrorFailsTheOperationAndEveryLaterOne) {
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const auto group = ProcessGroup::create(store, rank, 2, test::testOptions());
    DeviceBuffer buffer(rank, Bytes(16));
    group->allreduce(onDevice(buffer, 4, rank));
    if (rank == 1) fake::setAsyncError(1, cuda::kNcclRemoteError);
    if (rank == 1) {
      const auto start = std::chrono::steady_clock::now();
      // The watchdog may see the error before the call (which then throws) or after (its
      // Work fails).
      const std::string message =
          messageOf<Error>([&] { waitUntilCompleted(group->allreduceAsync(onDevice(buffer, 4, rank))); });
      EXPECT_LT(test::elapsedSince(start), test::kPrompt);
      EXPECT_TRUE(test::contains(message, "all_reduce on cuda:1")) << message;
      EXPECT_TRUE(test::contains(message, "rank 1 of 2")) << message;
      EXPECT_TRUE(test::contains(message, "asynchronous error")) << message;
      EXPECT_EQ(messageOf<Error>([&] { group->allreduce(onDevice(buffer, 4, rank)); }), message);
    }
    group->abort();
  });
  EXPECT_GE(fake::counters().commsAborted, 1);
}

TEST_F(NcclBackendTest, AnOperationPastTheTimeoutAbortsTheCommunicator) {
  constexpr auto kTimeout = std::chrono::milliseconds(1500);
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const auto group = ProcessGroup::create(store, rank, 2, test::testOptions(TransportKind::kAuto, kTimeout));
    DeviceBuffer buffer(rank, Bytes(16));
    group->allreduce(onDevice(buffer, 4, rank));
    fake::hangNextCollective(rank);
    const auto start = std::chrono::steady_clock::now();
    const std::shared_ptr<Work> work = group->allreduceAsync(onDevice(buffer, 4, rank));
    EXPECT_TRUE(work->wait());  // the caller's stream now waits for it; the host does not
    EXPECT_LT(test::elapsedSince(start), kTimeout);
    const std::string message = messageOf<TimeoutError>([&] { waitUntilCompleted(work); });
    EXPECT_GE(test::elapsedSince(start), kTimeout);
    EXPECT_LT(test::elapsedSince(start), kTimeout + test::kLateBy);
    EXPECT_TRUE(test::contains(message, "all_reduce on cuda:" + std::to_string(rank))) << message;
    EXPECT_TRUE(test::contains(message, "did not finish within its timeout of 1500 ms")) << message;
    EXPECT_THROW(group->allreduce(onDevice(buffer, 4, rank)), TimeoutError);
    group->shutdown();
  });
  EXPECT_EQ(fake::counters().commsAborted, 2);
}

// A call's own timeout wins over the group's.
TEST_F(NcclBackendTest, ACallsOwnTimeoutIsHonoured) {
  constexpr auto kTimeout = std::chrono::milliseconds(500);
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const auto group = ProcessGroup::create(store, rank, 2, test::testOptions());
    DeviceBuffer buffer(rank, Bytes(16));
    group->allreduce(onDevice(buffer, 4, rank));
    fake::hangNextCollective(rank);
    AllreduceOptions options;
    options.timeout = kTimeout;
    const auto start = std::chrono::steady_clock::now();
    const std::shared_ptr<Work> work = group->allreduceAsync(onDevice(buffer, 4, rank), options);
    const std::string message = messageOf<TimeoutError>([&] { waitUntilCompleted(work); });
    EXPECT_GE(test::elapsedSince(start), kTimeout);
    EXPECT_LT(test::elapsedSince(start), kTimeout + test::kLateBy);
    EXPECT_TRUE(test::contains(message, "did not finish within its timeout of 500 ms")) << message;
    group->shutdown();
  });
}

TEST_F(NcclBackendTest, PremulSumUsesNcclsOpWhereItHasOneAndRingtreesKernelsElsewhere) {
  for (const bool optional : {true, false}) {
    fake::reset();
    fake::setOptionalNcclSymbols(optional);
    const std::shared_ptr<Store> store = test::freshStore();
    test::runOnThreads(2, [&](int rank) {
      const auto group = ProcessGroup::create(store, rank, 2, test::testOptions());
      const float mine[2] = {1.0f + static_cast<float>(rank), 3.0f};
      DeviceBuffer buffer(rank, Bytes(reinterpret_cast<const std::byte*>(mine), reinterpret_cast<const std::byte*>(mine) + 8));
      AllreduceOptions options;
      options.op = ReduceOp::kPremulSum;
      options.premulFactor = 0.5;
      group->allreduce(onDevice(buffer, 2, rank), options);
      const Bytes result = buffer.read();
      float values[2];
      std::memcpy(values, result.data(), sizeof(values));
      EXPECT_EQ(values[0], 1.5f);  // (1 + 2) / 2
      EXPECT_EQ(values[1], 3.0f);
      group->shutdown();
    });
    EXPECT_EQ(fake::counters().redOpsCreated, optional ? 2 : 0) << "optional symbols " << optional;
    EXPECT_EQ(fake::counters().send > 0, !optional) << "optional symbols " << optional;
  }
}

// An NCCL call that fails inside a group ends the group before the failure aborts the
// communicator (NCCL frees an aborted communicator, which the open group holds).
TEST_F(NcclBackendTest, AFailureInsideAGroupEndsTheGroupBeforeTheAbort) {
  fake::setStallTimeout(std::chrono::milliseconds(300));
  fake::failNextSend(0, cuda::kNcclSystemError);
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const auto group = ProcessGroup::create(store, rank, 2, test::testOptions());
    DeviceBuffer in(rank, Bytes(16));
    DeviceBuffer out(rank, Bytes(16));
    const int peer = 1 - rank;
    const std::vector<PointToPointOp> ops = {{false, onDevice(out, 4, rank), peer, 0},
                                             {true, onDevice(in, 4, rank), peer, 0}};
    if (rank == 0) {
      const std::string message = messageOf<Error>([&] { group->batchIsendIrecv(ops); });
      EXPECT_TRUE(test::contains(message, "ncclSend failed")) << message;
    } else {
      try {  // its peer never sends: it fails too, how does not matter here
        for (const auto& work : group->batchIsendIrecv(ops)) waitUntilCompleted(work);
      } catch (const std::exception&) {
      }
    }
    group->abort();
  });
  EXPECT_GE(fake::counters().commsAborted, 1);
  EXPECT_EQ(fake::counters().groupEndsOnAbortedComms, 0);
}

// As NoContextIsMadeOnADeviceTheGroupDoesNotUse, when a group is aborted with operations still on its stream, from threads that
// never chose a device.
TEST_F(NcclBackendTest, AbortingWithOperationsPendingMakesNoContextOnDevice0) {
  fake::hangNextCollective(0);
  fake::hangNextCollective(1);
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    const int device = rank + 1;
    std::optional<DeviceBuffer> buffer;
    std::thread([&] { buffer.emplace(device, Bytes(64)); }).join();
    const auto group = ProcessGroup::create(store, rank, 2, test::testOptions());
    group->allreduce(onDevice(*buffer, 16, device));  // enqueued; its stream then hangs
    std::shared_ptr<Work> work = group->allreduceAsync(onDevice(*buffer, 16, device));
    std::thread([&] { group->abort(); }).join();
    std::thread([&] { work.reset(); }).join();  // the last holder of its event
    std::thread([&] { buffer.reset(); }).join();
  });
  EXPECT_FALSE(fake::contextActive(0));
}

// NCCL's one-rank path leaves some tails unscaled: one rank scales with ringtree's kernel.
TEST_F(NcclBackendTest, PremulSumOnOneRankIsRingtreesScale) {
  fake::reset();
  fake::setOptionalNcclSymbols(true);
  const auto group = ProcessGroup::create(test::freshStore(), 0, 1, test::testOptions());
  const double mine[3] = {1.0, -3.0, 0.25};
  DeviceBuffer buffer(0, Bytes(reinterpret_cast<const std::byte*>(mine), reinterpret_cast<const std::byte*>(mine) + 24));
  const BufferView view(buffer.data(), 3, DataType::kFloat64, Device{DeviceType::kCuda, 0});
  AllreduceOptions options;
  options.op = ReduceOp::kPremulSum;
  options.premulFactor = 2.0;
  group->allreduce(view, options);
  ReduceOptions rooted;
  rooted.op = ReduceOp::kPremulSum;
  rooted.premulFactor = 2.0;
  group->reduce(view, rooted);
  const Bytes result = buffer.read();
  double values[3];
  std::memcpy(values, result.data(), sizeof(values));
  EXPECT_EQ(values[0], 4.0);
  EXPECT_EQ(values[1], -12.0);
  EXPECT_EQ(values[2], 1.0);
  EXPECT_EQ(fake::counters().redOpsCreated, 0);
  group->shutdown();
}

// A synchronous barrier returns once every rank reached it.
TEST_F(NcclBackendTest, BarrierWaitsForEveryRank) {
  const std::shared_ptr<Store> store = test::freshStore();
  test::runOnThreads(2, [&](int rank) {
    DeviceBackendContext context;
    context.store = store;
    context.rank = rank;
    context.size = 2;
    context.timeout = std::chrono::seconds(20);
    context.device = Device{DeviceType::kCuda, rank};
    fake::gpuApi().setDevice(rank);
    const std::unique_ptr<DeviceBackend> backend = makeFakeNccl(context);
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
    const auto start = std::chrono::steady_clock::now();
    backend->barrier({}, {});
    if (rank == 0) { EXPECT_GE(test::elapsedSince(start), std::chrono::milliseconds(300)); }
    EXPECT_TRUE(backend->barrier({}, {true, nullptr})->wait());
    backend->shutdown();
  });
}

// --- Which backend serves a group -----------------------------------------------------------

TEST(CudaBackendChoice, NcclUnlessRanksShareAGpuOrOneLacksIt) {
  std::string why;
  EXPECT_EQ(cuda::chooseCudaBackend({{"m/0", true, ""}, {"m/1", true, ""}}, "", &why), "nccl");
  EXPECT_EQ(cuda::chooseCudaBackend({{"m/0", true, ""}, {"m/0", true, ""}}, "auto", &why), "staged");
  EXPECT_EQ(why, "ranks 0 and 1 share one GPU, which NCCL refuses");
  EXPECT_EQ(cuda::chooseCudaBackend({{"m/0", true, ""}, {"n/0", false, ""}}, "", &why), "staged");
  EXPECT_EQ(why, "rank 1 has no usable NCCL");
  EXPECT_EQ(cuda::chooseCudaBackend({{"m/0", true, ""}, {"m/1", true, ""}}, "staged", &why), "staged");
  EXPECT_EQ(why, "RINGTREE_CUDA_BACKEND=staged");
  EXPECT_EQ(messageOf<Error>([&] { cuda::chooseCudaBackend({{"m/0", true, ""}, {"m/0", true, ""}}, "nccl", &why); }),
            "RINGTREE_CUDA_BACKEND=nccl, but NCCL cannot serve this group: ranks 0 and 1 share one GPU, which NCCL "
            "refuses");
  EXPECT_EQ(messageOf<InvalidArgument>([&] { cuda::chooseCudaBackend({}, "gloo", &why); }),
            "RINGTREE_CUDA_BACKEND must be auto, nccl or staged, got 'gloo'");
}

TEST(CudaBackendChoice, OneGpuHasOneNameWhateverDevicesAProcessSees) {
  EXPECT_EQ(cuda::gpuIdentity(0, "3,5"), cuda::gpuIdentity(1, "5,3"));
  EXPECT_EQ(cuda::gpuIdentity(2, ""), cuda::gpuIdentity(0, "2"));
  EXPECT_NE(cuda::gpuIdentity(0, ""), cuda::gpuIdentity(1, ""));
  EXPECT_EQ(cuda::gpuIdentity(0, "GPU-1234"), cuda::gpuIdentity(1, "GPU-0,GPU-1234"));
}

}  // namespace
}  // namespace ringtree
