#include "fake_gpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>

#include <ringtree/types.h>

#include "algorithms/reduce_ops.h"

namespace ringtree::test::fake_gpu {
namespace {

using cuda::NcclComm;
using cuda::NcclUniqueId;
using Clock = std::chrono::steady_clock;

constexpr size_t kAllocationAlignment = 256;
constexpr size_t kMaxAllocation = size_t{1} << 40;
constexpr unsigned char kFreshMemoryByte = 0xA5;
constexpr std::chrono::milliseconds kDefaultJoinTimeout(30000);
constexpr std::chrono::milliseconds kDefaultStallTimeout(30000);
constexpr int kSplitNoColor = -1;
// The reduction of a created PreMulSum op (not an NCCL value: ops keep it internally).
constexpr int kPreMulSum = -2;
constexpr char kIdMagic[16] = {'r', 'i', 'n', 'g', 't', 'r', 'e', 'e', '-', 'f', 'a', 'k', 'e', '-', 'i', 'd'};

// The calling thread's current device; a stream's worker takes its stream's device.
thread_local int currentDevice = 0;

// ---- Streams ---------------------------------------------------------------------------

// A FIFO of work and the counts that events and synchronisation compare: the work enqueued
// so far and the work that finished. Owned by its handle and by its worker, which runs the
// queue until the stream is destroyed and the queue is empty.
struct StreamCore {
  explicit StreamCore(int device) : device(device) {}

  // Appends task; returns at once.
  void push(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mutex);
    queue.push_back(std::move(task));
    ++enqueued;
    cv.notify_all();
  }
  // The mark of everything enqueued so far (what an event records).
  uint64_t mark() {
    std::lock_guard<std::mutex> lock(mutex);
    return enqueued;
  }
  bool reached(uint64_t target) {
    std::lock_guard<std::mutex> lock(mutex);
    return completed >= target;
  }
  void waitFor(uint64_t target) {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return completed >= target; });
  }
  void stop() {
    std::lock_guard<std::mutex> lock(mutex);
    stopping = true;
    cv.notify_all();
  }

  const int device;
  std::mutex mutex;
  std::condition_variable cv;  // any change below
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0;
  uint64_t completed = 0;
  bool stopping = false;
};

void runWorker(const std::shared_ptr<StreamCore>& core) {
  currentDevice = core->device;
  std::unique_lock<std::mutex> lock(core->mutex);
  for (;;) {
    core->cv.wait(lock, [&] { return !core->queue.empty() || core->stopping; });
    if (core->queue.empty()) return;
    std::function<void()> task = std::move(core->queue.front());
    core->queue.pop_front();
    lock.unlock();
    try {
      task();
    } catch (...) {
      // Work is checked when enqueued; a throw here has nowhere to go and must not stop the
      // stream.
    }
    task = nullptr;
    lock.lock();
    ++core->completed;
    core->cv.notify_all();
  }
}

std::shared_ptr<StreamCore> startStream(int device) {
  auto core = std::make_shared<StreamCore>(device);
  // Detached: the worker owns a reference and ends once the stream is destroyed and drained
  // (a destroyed stream's work still runs, as CUDA's does).
  std::thread(runWorker, core).detach();
  return core;
}

struct EventState {
  explicit EventState(int device) : device(device) {}
  const int device;
  // Guarded by the machine's mutex.
  std::shared_ptr<StreamCore> stream;  // null until recorded
  uint64_t target = 0;
};

struct Allocation {
  size_t bytes;
  int device;
};

// ---- NCCL state ------------------------------------------------------------------------

struct Clique;
struct Op;

// How a collective combines: an NCCL op (sum, prod, max, min, avg) or kPreMulSum, with the
// rank's scalar (its value, or the device address to read it from when the op runs).
struct Reduction {
  int base = cuda::kNcclSum;
  double scalar = 1.0;
  const void* scalarAt = nullptr;
};

struct CreatedOp {
  int type;
  double scalar;
  const void* scalarAt;
};

// One rank's communicator. Fields below the constants are guarded by the machine's mutex.
struct Comm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int nranks = 0;
  int initRank = 0;
  int device = 0;
  uint64_t serial = 0;

  bool aborted = false;
  int asyncError = 0;     // what the fake found (mismatch, peer gone, stall)
  int asyncOverride = 0;  // setAsyncErrorOn
  int hangs = 0;          // hangNextCollectiveOn
  int pending = 0;        // operations enqueued (or grouped) and not finished
  uint64_t nextCollective = 0;
  uint64_t nextSplit = 0;
  std::map<int, uint64_t> sent;      // by peer
  std::map<int, uint64_t> received;  // by peer
  std::map<int, CreatedOp> createdOps;
  int nextOp = kFirstCreatedRedOp;
};

enum class Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kSend, kRecv };

bool isPointToPoint(Kind kind) { return kind == Kind::kSend || kind == Kind::kRecv; }
bool isRooted(Kind kind) { return kind == Kind::kBroadcast || kind == Kind::kReduce; }

// One rank's enqueued operation.
struct Op {
  Kind kind;
  std::shared_ptr<Comm> comm;
  uint64_t index = 0;  // the collective's order on the communicator, or the send's/recv's
                       // order between the two ranks
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  int type = 0;
  Reduction reduction;
  int peer = 0;  // root of a rooted collective, peer of a send/recv
  bool hang = false;
  bool posted = false;  // a send/recv placed in its mailbox
  std::chrono::milliseconds stall{0};
};

// Where the ranks' operations of one collective meet.
struct Slot {
  explicit Slot(int nranks) : arrived(static_cast<size_t>(nranks), nullptr) {}
  std::vector<Op*> arrived;
  int count = 0;
  int left = 0;
  bool done = false;
  int failure = 0;  // what every party reports when not done
};

// Where a send meets its receive.
struct Mailbox {
  Op* send = nullptr;
  Op* recv = nullptr;
  int left = 0;
  bool done = false;
  int failure = 0;
};

struct SplitSlot {
  explicit SplitSlot(int nranks)
      : parents(static_cast<size_t>(nranks)), colors(static_cast<size_t>(nranks)), keys(static_cast<size_t>(nranks)),
        results(static_cast<size_t>(nranks)) {}
  std::vector<std::shared_ptr<Comm>> parents;
  std::vector<int> colors;
  std::vector<int> keys;
  std::vector<std::shared_ptr<Comm>> results;
  int count = 0;
  int left = 0;
  bool done = false;
  int failure = 0;
};

// The ranks of one communicator, together. Guarded by the machine's mutex.
struct Clique {
  explicit Clique(int nranks) : nranks(nranks), departed(static_cast<size_t>(nranks), false) {}
  bool anyDeparted() const { return std::find(departed.begin(), departed.end(), true) != departed.end(); }

  const int nranks;
  std::vector<bool> departed;  // aborted or destroyed, by rank
  std::map<uint64_t, Slot> slots;
  std::map<std::tuple<int, int, uint64_t>, Mailbox> mailboxes;  // (sender, receiver, index)
  std::map<uint64_t, SplitSlot> splits;
};

// A commInitRank rendezvous.
struct Join {
  explicit Join(int nranks)
      : nranks(nranks), joined(static_cast<size_t>(nranks), false), devices(static_cast<size_t>(nranks), -1),
        comms(static_cast<size_t>(nranks)) {}
  const int nranks;
  std::vector<bool> joined;
  std::vector<int> devices;
  std::vector<std::shared_ptr<Comm>> comms;
  int count = 0;
  bool done = false;
  int failure = 0;
};

// ---- The machine -----------------------------------------------------------------------

struct Machine {
  std::mutex mutex;
  std::condition_variable cv;  // NCCL state changed (under mutex)

  // Devices, streams, events, memory.
  int deviceCount = kDefaultDeviceCount;
  // Devices whose primary context a runtime call made (see InContext).
  std::set<int> contexts;
  std::map<int, std::shared_ptr<StreamCore>> nullStreams;
  std::unordered_map<void*, std::shared_ptr<StreamCore>> streams;
  std::vector<std::weak_ptr<StreamCore>> allStreams;  // destroyed ones too, while they run
  std::unordered_map<void*, std::shared_ptr<EventState>> events;
  std::map<uintptr_t, Allocation> allocations;
  size_t allocatedBytes = 0;

  // NCCL.
  std::unordered_map<void*, std::shared_ptr<Comm>> comms;
  std::map<std::string, std::shared_ptr<Join>> joins;
  uint64_t nextUniqueId = 1;
  uint64_t nextSerial = 1;

  // Knobs.
  int ncclVersion = kNcclVersionCode;
  bool optionalSymbols = true;
  std::chrono::milliseconds joinTimeout = kDefaultJoinTimeout;
  std::chrono::milliseconds stallTimeout = kDefaultStallTimeout;
  bool allowSharedDevice = false;
  int uniqueIdFailure = 0;
  std::map<int, int> initFailures;  // by rank, -1 any
  std::map<int, int> hangsByRank;
  std::map<int, int> sendFailures;  // by rank: what its next send returns
  std::map<int, int> asyncByRank;

  Counters counters;
};

// Never destroyed: workers of streams nobody destroyed may outlive main.
Machine& machine() {
  static Machine* const instance = new Machine;
  return *instance;
}

std::atomic<const char*> lastNcclError{""};

int ncclFailure(int result, const char* what) {
  lastNcclError.store(what);
  return result;
}

// Whether [pointer, pointer + bytes) lies inside one allocation (of device, unless -1).
bool insideAllocation(const Machine& m, const void* pointer, size_t bytes, int device) {
  if (pointer == nullptr) return false;
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  auto it = m.allocations.upper_bound(address);
  if (it == m.allocations.begin()) return false;
  --it;
  if (address - it->first >= it->second.bytes) return false;
  if (bytes > it->second.bytes - (address - it->first)) return false;
  return device < 0 || it->second.device == device;
}

// Whether a range that starts inside an allocation ends inside it (host ranges pass).
bool withinItsAllocation(const Machine& m, const void* pointer, size_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  auto it = m.allocations.upper_bound(address);
  if (it == m.allocations.begin()) return true;
  --it;
  const uintptr_t offset = address - it->first;
  if (offset >= it->second.bytes) return true;
  return bytes <= it->second.bytes - offset;
}

// The legacy stream of device.
std::shared_ptr<StreamCore> nullStream(Machine& m, int device) {
  auto& core = m.nullStreams[device];
  if (core == nullptr) core = startStream(device);
  return core;
}

bool validDevice(const Machine& m, int device) { return device >= 0 && device < m.deviceCount; }

int noDeviceError(const Machine& m) { return m.deviceCount == 0 ? kCudaErrorNoDevice : kCudaErrorInvalidDevice; }

// The stream of a handle (null: the current device's legacy stream), or null when unknown.
std::shared_ptr<StreamCore> findStream(Machine& m, void* stream) {
  if (stream == nullptr) return validDevice(m, currentDevice) ? nullStream(m, currentDevice) : nullptr;
  auto it = m.streams.find(stream);
  return it == m.streams.end() ? nullptr : it->second;
}

// ---- Element types -----------------------------------------------------------------------

float halfToFloat(uint16_t bits) {
  const bool negative = (bits & 0x8000u) != 0;
  const int exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ffu;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa == 0 ? INFINITY : NAN;
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400u), exponent - 25);
  }
  return negative ? -value : value;
}

float bfloat16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// Bytes of one element of an NCCL type; 0 for a value outside the enum.
size_t ncclElementSize(int type) {
  switch (type) {
    case cuda::kNcclInt8:
    case cuda::kNcclUint8:
      return 1;
    case cuda::kNcclFloat16:
    case cuda::kNcclBfloat16:
      return 2;
    case cuda::kNcclInt32:
    case cuda::kNcclUint32:
    case cuda::kNcclFloat32:
      return 4;
    case cuda::kNcclInt64:
    case cuda::kNcclUint64:
    case cuda::kNcclFloat64:
      return 8;
    default:
      return 0;
  }
}

// The ringtree type reductions of an NCCL type use; false for uint32, uint64 and unknown.
bool toDataType(int type, DataType* out) {
  switch (type) {
    case cuda::kNcclInt8: *out = DataType::kInt8; return true;
    case cuda::kNcclUint8: *out = DataType::kUInt8; return true;
    case cuda::kNcclInt32: *out = DataType::kInt32; return true;
    case cuda::kNcclInt64: *out = DataType::kInt64; return true;
    case cuda::kNcclFloat16: *out = DataType::kFloat16; return true;
    case cuda::kNcclFloat32: *out = DataType::kFloat32; return true;
    case cuda::kNcclFloat64: *out = DataType::kFloat64; return true;
    case cuda::kNcclBfloat16: *out = DataType::kBFloat16; return true;
    default: return false;
  }
}

bool isFloating(DataType type) {
  return type == DataType::kFloat16 || type == DataType::kBFloat16 || type == DataType::kFloat32 ||
         type == DataType::kFloat64;
}

// The value of one element of an NCCL type (a reducible one) at pointer.
double readScalar(const void* pointer, int type) {
  switch (type) {
    case cuda::kNcclInt8: { int8_t v; std::memcpy(&v, pointer, sizeof(v)); return v; }
    case cuda::kNcclUint8: { uint8_t v; std::memcpy(&v, pointer, sizeof(v)); return v; }
    case cuda::kNcclInt32: { int32_t v; std::memcpy(&v, pointer, sizeof(v)); return v; }
    case cuda::kNcclInt64: { int64_t v; std::memcpy(&v, pointer, sizeof(v)); return static_cast<double>(v); }
    case cuda::kNcclFloat16: { uint16_t v; std::memcpy(&v, pointer, sizeof(v)); return halfToFloat(v); }
    case cuda::kNcclBfloat16: { uint16_t v; std::memcpy(&v, pointer, sizeof(v)); return bfloat16ToFloat(v); }
    case cuda::kNcclFloat32: { float v; std::memcpy(&v, pointer, sizeof(v)); return v; }
    case cuda::kNcclFloat64: { double v; std::memcpy(&v, pointer, sizeof(v)); return v; }
    default: return 0.0;
  }
}

// 1/nranks as NCCL's avg holds it: rounded to float32 first, then to the element type.
double averageFactor(DataType type, int nranks) {
  const double exact = 1.0 / nranks;
  switch (type) {
    case DataType::kFloat64:
      return exact;
    case DataType::kFloat32:
      return static_cast<float>(exact);
    case DataType::kFloat16: {
      uint16_t one = 0x3c00;
      algorithms::scale(&one, 1, type, static_cast<float>(exact));
      return halfToFloat(one);
    }
    case DataType::kBFloat16: {
      uint16_t one = 0x3f80;
      algorithms::scale(&one, 1, type, static_cast<float>(exact));
      return bfloat16ToFloat(one);
    }
    default:
      return exact;
  }
}

ReduceOp ringtreeOp(int base) {
  switch (base) {
    case cuda::kNcclProd: return ReduceOp::kProduct;
    case cuda::kNcclMax: return ReduceOp::kMax;
    case cuda::kNcclMin: return ReduceOp::kMin;
    case cuda::kNcclAvg: return ReduceOp::kAvg;
    case kPreMulSum: return ReduceOp::kPremulSum;
    default: return ReduceOp::kSum;
  }
}

// ---- Collectives -------------------------------------------------------------------------

// The reduction of inputs[r] (count elements each) over the ranks r, as NCCL's op of
// ops[r] combines them.
std::vector<uint8_t> reduceAll(const std::vector<const uint8_t*>& inputs, const std::vector<Op*>& ops, size_t count) {
  const Op& first = *ops[0];
  DataType type = DataType::kFloat32;
  toDataType(first.type, &type);
  const int base = first.reduction.base;
  const int nranks = static_cast<int>(inputs.size());
  const size_t bytes = count * elementSize(type);
  const ReduceFn combine = algorithms::reduceFunction(type, ringtreeOp(base));
  const bool premultiply = base == kPreMulSum || (base == cuda::kNcclAvg && isFloating(type));
  const auto factor = [&](int rank) {
    const Op& op = *ops[static_cast<size_t>(rank)];
    if (base == cuda::kNcclAvg) return averageFactor(type, nranks);
    return op.reduction.scalarAt != nullptr ? readScalar(op.reduction.scalarAt, op.type) : op.reduction.scalar;
  };

  std::vector<uint8_t> total(inputs[0], inputs[0] + bytes);
  if (premultiply) algorithms::scale(total.data(), count, type, factor(0));
  std::vector<uint8_t> scaled(premultiply ? bytes : 0);
  for (int rank = 1; rank < nranks; ++rank) {
    const uint8_t* input = inputs[static_cast<size_t>(rank)];
    if (premultiply) {
      std::memcpy(scaled.data(), input, bytes);
      algorithms::scale(scaled.data(), count, type, factor(rank));
      input = scaled.data();
    }
    combine(total.data(), input, count);
  }
  if (base == cuda::kNcclAvg && !isFloating(type)) algorithms::divide(total.data(), count, type, nranks);
  return total;
}

// Moves the data of a collective all ranks arrived at (ops by rank); every input is read
// before any output is written. kNcclInvalidUsage when the ranks disagree.
int executeCollective(const std::vector<Op*>& ops) {
  const Op& first = *ops[0];
  for (const Op* op : ops) {
    if (op->kind != first.kind || op->count != first.count || op->type != first.type ||
        op->reduction.base != first.reduction.base || (isRooted(first.kind) && op->peer != first.peer)) {
      return ncclFailure(cuda::kNcclInvalidUsage, "the ranks called different collectives at the same point");
    }
  }
  const size_t nranks = ops.size();
  const size_t count = first.count;
  const size_t bytes = count * ncclElementSize(first.type);
  const auto input = [](const Op* op, size_t offset) { return static_cast<const uint8_t*>(op->send) + offset; };
  switch (first.kind) {
    case Kind::kAllReduce:
    case Kind::kReduce: {
      std::vector<const uint8_t*> inputs;
      for (const Op* op : ops) inputs.push_back(input(op, 0));
      const std::vector<uint8_t> total = reduceAll(inputs, ops, count);
      if (first.kind == Kind::kAllReduce) {
        for (Op* op : ops) std::memcpy(op->recv, total.data(), bytes);
      } else {
        std::memcpy(ops[static_cast<size_t>(first.peer)]->recv, total.data(), bytes);
      }
      break;
    }
    case Kind::kBroadcast: {
      const Op* root = ops[static_cast<size_t>(first.peer)];
      const std::vector<uint8_t> data(input(root, 0), input(root, 0) + bytes);
      for (Op* op : ops) std::memcpy(op->recv, data.data(), bytes);
      break;
    }
    case Kind::kAllGather: {
      std::vector<uint8_t> data(nranks * bytes);
      for (size_t rank = 0; rank < nranks; ++rank) std::memcpy(data.data() + rank * bytes, input(ops[rank], 0), bytes);
      for (Op* op : ops) std::memcpy(op->recv, data.data(), data.size());
      break;
    }
    case Kind::kReduceScatter: {
      std::vector<std::vector<uint8_t>> results;
      for (size_t part = 0; part < nranks; ++part) {
        std::vector<const uint8_t*> inputs;
        for (const Op* op : ops) inputs.push_back(input(op, part * bytes));
        results.push_back(reduceAll(inputs, ops, count));
      }
      for (size_t rank = 0; rank < nranks; ++rank) std::memcpy(ops[rank]->recv, results[rank].data(), bytes);
      break;
    }
    case Kind::kSend:
    case Kind::kRecv:
      break;
  }
  return 0;
}

// Records result as what the communicator reports, unless it was aborted or reports
// something already.
void reportAsync(Comm& comm, int result) {
  if (!comm.aborted && comm.asyncError == 0) comm.asyncError = result;
}

// Runs one collective on the stream's worker: meets the peers' operations of the same index.
void runCollective(Machine& m, std::unique_lock<std::mutex>& lock, Op& op) {
  Comm& comm = *op.comm;
  if (comm.aborted) return;
  Clique& clique = *comm.clique;
  auto it = clique.slots.try_emplace(op.index, comm.nranks).first;
  Slot& slot = it->second;
  if (slot.failure == 0 && clique.anyDeparted()) {
    slot.failure = ncclFailure(cuda::kNcclRemoteError, "a peer aborted or destroyed its communicator");
    m.cv.notify_all();
  }
  if (slot.failure == 0) {
    slot.arrived[static_cast<size_t>(comm.rank)] = &op;
    if (++slot.count == comm.nranks) {
      slot.failure = executeCollective(slot.arrived);
      slot.done = slot.failure == 0;
      m.cv.notify_all();
    } else {
      const bool settled = m.cv.wait_until(lock, Clock::now() + op.stall, [&] {
        return slot.done || slot.failure != 0 || comm.aborted || clique.anyDeparted();
      });
      if (!slot.done && slot.failure == 0) {
        slot.failure = settled ? ncclFailure(cuda::kNcclRemoteError, "a peer aborted or destroyed its communicator")
                               : ncclFailure(cuda::kNcclInternalError, "peers did not arrive within the stall timeout");
        m.cv.notify_all();
      }
    }
    slot.arrived[static_cast<size_t>(comm.rank)] = nullptr;
  }
  if (!slot.done) reportAsync(comm, slot.failure);
  if (++slot.left == comm.nranks) clique.slots.erase(it);
}

std::tuple<int, int, uint64_t> mailboxKey(const Op& op) {
  return op.kind == Kind::kSend ? std::make_tuple(op.comm->rank, op.peer, op.index)
                                : std::make_tuple(op.peer, op.comm->rank, op.index);
}

// Places a send or recv in its mailbox; the second of the pair moves the data.
void postPointToPoint(Machine& m, Op& op) {
  Comm& comm = *op.comm;
  if (comm.aborted) return;
  Mailbox& box = comm.clique->mailboxes[mailboxKey(op)];
  op.posted = true;
  if (box.failure != 0) return;
  (op.kind == Kind::kSend ? box.send : box.recv) = &op;
  if (box.send == nullptr || box.recv == nullptr) return;
  const size_t sent = box.send->count * ncclElementSize(box.send->type);
  const size_t expected = box.recv->count * ncclElementSize(box.recv->type);
  if (sent == expected) {
    if (sent != 0) std::memmove(box.recv->recv, box.send->send, sent);
    box.done = true;
  } else {
    box.failure = ncclFailure(cuda::kNcclInvalidUsage, "a send and its receive differ in size");
  }
  m.cv.notify_all();
}

// Waits until a posted send or recv met its other half (or cannot).
void finishPointToPoint(Machine& m, std::unique_lock<std::mutex>& lock, Op& op) {
  if (!op.posted) return;
  Comm& comm = *op.comm;
  Clique& clique = *comm.clique;
  auto it = clique.mailboxes.find(mailboxKey(op));
  Mailbox& box = it->second;
  const auto peerGone = [&] { return clique.departed[static_cast<size_t>(op.peer)]; };
  const bool settled = m.cv.wait_until(lock, Clock::now() + op.stall, [&] {
    return box.done || box.failure != 0 || comm.aborted || peerGone();
  });
  if (!box.done && box.failure == 0) {
    box.failure = settled ? ncclFailure(cuda::kNcclRemoteError, "a peer aborted or destroyed its communicator")
                          : ncclFailure(cuda::kNcclInternalError, "the peer did not arrive within the stall timeout");
    m.cv.notify_all();
  }
  if (!box.done) reportAsync(comm, box.failure);
  (op.kind == Kind::kSend ? box.send : box.recv) = nullptr;
  if (++box.left == 2) clique.mailboxes.erase(it);
}

// The work of one stream unit (one call, or one group's calls on one stream).
void runOps(const std::vector<std::shared_ptr<Op>>& ops) {
  Machine& m = machine();
  std::unique_lock<std::mutex> lock(m.mutex);
  for (const auto& op : ops) {
    if (op->hang) m.cv.wait(lock, [&] { return op->comm->aborted; });
  }
  for (const auto& op : ops) {
    if (isPointToPoint(op->kind)) postPointToPoint(m, *op);
  }
  for (const auto& op : ops) {
    if (!isPointToPoint(op->kind)) runCollective(m, lock, *op);
  }
  for (const auto& op : ops) {
    if (isPointToPoint(op->kind)) finishPointToPoint(m, lock, *op);
  }
  for (const auto& op : ops) --op->comm->pending;
  m.cv.notify_all();
}

// The calling thread's open group: its depth, and the operations called in it.
struct Group {
  int depth = 0;
  std::vector<std::pair<std::shared_ptr<StreamCore>, std::shared_ptr<Op>>> ops;
};
thread_local Group group;

std::shared_ptr<Comm> findComm(Machine& m, NcclComm handle) {
  auto it = m.comms.find(handle);
  return it == m.comms.end() ? nullptr : it->second;
}

// Checks a collective, send or recv and enqueues it (or adds it to the open group).
int enqueue(Kind kind, const void* send, void* recv, size_t count, int type, int redOp, int peer, NcclComm handle,
            void* stream) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  const std::shared_ptr<Comm> comm = findComm(m, handle);
  if (comm == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "invalid communicator");
  const size_t elementBytes = ncclElementSize(type);
  if (elementBytes == 0) return ncclFailure(cuda::kNcclInvalidArgument, "invalid data type");
  if (count > kMaxAllocation / elementBytes) return ncclFailure(cuda::kNcclInvalidArgument, "count too large");

  Reduction reduction;
  const bool reduces = kind == Kind::kAllReduce || kind == Kind::kReduce || kind == Kind::kReduceScatter;
  if (reduces) {
    DataType dataType;
    if (!toDataType(type, &dataType)) {
      return ncclFailure(cuda::kNcclInvalidArgument, "reductions of unsigned 32/64-bit integers are not supported");
    }
    if (redOp >= cuda::kNcclSum && redOp <= cuda::kNcclAvg) {
      reduction.base = redOp;
    } else {
      auto it = comm->createdOps.find(redOp);
      if (it == comm->createdOps.end()) return ncclFailure(cuda::kNcclInvalidArgument, "invalid reduction op");
      if (it->second.type != type) {
        return ncclFailure(cuda::kNcclInvalidArgument, "reduction op created for another data type");
      }
      reduction.base = kPreMulSum;
      reduction.scalar = it->second.scalar;
      reduction.scalarAt = it->second.scalarAt;
    }
    if (!isSupported(dataType, ringtreeOp(reduction.base))) {
      return ncclFailure(cuda::kNcclInvalidArgument, "reduction op not supported on this data type");
    }
  }
  if (kind == Kind::kSend) {
    if (auto it = m.sendFailures.find(comm->initRank); it != m.sendFailures.end()) {
      const int result = it->second;
      m.sendFailures.erase(it);
      return ncclFailure(result, "injected send failure");
    }
  }
  if ((isRooted(kind) || isPointToPoint(kind)) && (peer < 0 || peer >= comm->nranks)) {
    return ncclFailure(cuda::kNcclInvalidArgument, isRooted(kind) ? "invalid root" : "invalid peer");
  }

  std::shared_ptr<StreamCore> core;
  if (stream == nullptr) {
    core = nullStream(m, comm->device);
  } else {
    auto it = m.streams.find(stream);
    if (it == m.streams.end()) return ncclFailure(cuda::kNcclUnhandledCudaError, "invalid CUDA stream");
    core = it->second;
    if (core->device != comm->device) {
      return ncclFailure(cuda::kNcclUnhandledCudaError, "the CUDA stream is not on the communicator's device");
    }
  }

  // The bytes each buffer must hold, and whether this rank uses it.
  const size_t bytes = count * elementBytes;
  const size_t nranks = static_cast<size_t>(comm->nranks);
  size_t sendBytes = bytes;
  size_t recvBytes = bytes;
  bool usesSend = kind != Kind::kRecv;
  bool usesRecv = kind != Kind::kSend;
  if (kind == Kind::kBroadcast) usesSend = comm->rank == peer;
  if (kind == Kind::kReduce) usesRecv = comm->rank == peer;
  if (kind == Kind::kAllGather) recvBytes = bytes * nranks;
  if (kind == Kind::kReduceScatter) sendBytes = bytes * nranks;
  if (bytes != 0) {
    if (usesSend && !insideAllocation(m, send, sendBytes, comm->device)) {
      return ncclFailure(cuda::kNcclInvalidArgument, "send buffer is not device memory of the communicator's device");
    }
    if (usesRecv && !insideAllocation(m, recv, recvBytes, comm->device)) {
      return ncclFailure(cuda::kNcclInvalidArgument, "recv buffer is not device memory of the communicator's device");
    }
  }

  Counters& counted = m.counters;
  switch (kind) {
    case Kind::kAllReduce: ++counted.allReduce; break;
    case Kind::kBroadcast: ++counted.broadcast; break;
    case Kind::kReduce: ++counted.reduce; break;
    case Kind::kAllGather: ++counted.allGather; break;
    case Kind::kReduceScatter: ++counted.reduceScatter; break;
    case Kind::kSend: ++counted.send; break;
    case Kind::kRecv: ++counted.recv; break;
  }
  counted.lastCollectiveStream = stream;
  if (count == 0 && !isPointToPoint(kind)) return cuda::kNcclSuccess;

  auto op = std::make_shared<Op>();
  op->kind = kind;
  op->comm = comm;
  op->send = usesSend ? send : nullptr;
  op->recv = usesRecv ? recv : nullptr;
  op->count = count;
  op->type = type;
  op->reduction = reduction;
  op->peer = peer;
  op->stall = m.stallTimeout;
  if (kind == Kind::kSend) {
    op->index = comm->sent[peer]++;
  } else if (kind == Kind::kRecv) {
    op->index = comm->received[peer]++;
  } else {
    op->index = comm->nextCollective++;
  }
  if (comm->hangs > 0) {
    --comm->hangs;
    op->hang = true;
  } else if (auto it = m.hangsByRank.find(comm->initRank); it != m.hangsByRank.end()) {
    if (--it->second == 0) m.hangsByRank.erase(it);
    op->hang = true;
  }
  ++comm->pending;
  if (group.depth > 0) {
    group.ops.emplace_back(core, std::move(op));
  } else {
    core->push([ops = std::vector<std::shared_ptr<Op>>{std::move(op)}] { runOps(ops); });
  }
  return cuda::kNcclSuccess;
}

// ---- The CUDA table --------------------------------------------------------------------

const char* cudaErrorString(int error) {
  switch (error) {
    case kCudaSuccess: return "no error";
    case kCudaErrorInvalidValue: return "invalid argument";
    case kCudaErrorMemoryAllocation: return "out of memory";
    case kCudaErrorNoDevice: return "no CUDA-capable device is detected";
    case kCudaErrorInvalidDevice: return "invalid device ordinal";
    case kCudaErrorInvalidResourceHandle: return "invalid resource handle";
    case kCudaErrorNotReady: return "device not ready";
    default: return "unrecognized error code";
  }
}

int cudaDriverVersion(int* version) {
  if (version == nullptr) return kCudaErrorInvalidValue;
  *version = kCudaVersion;
  return kCudaSuccess;
}

int cudaDeviceCount(int* count) {
  if (count == nullptr) return kCudaErrorInvalidValue;
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  *count = m.deviceCount;
  return m.deviceCount == 0 ? kCudaErrorNoDevice : kCudaSuccess;
}

int cudaSetDevice(int device) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (!validDevice(m, device)) return noDeviceError(m);
  currentDevice = device;
  m.contexts.insert(device);  // as CUDA 12 and later: setting a device makes its context
  return kCudaSuccess;
}

int cudaSetDeviceIfActive(int device) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (!validDevice(m, device)) return noDeviceError(m);
  if (m.contexts.count(device) != 0) currentDevice = device;
  return kCudaSuccess;
}

// A runtime call that needs a context makes the calling thread's current device's primary
// context, as the CUDA runtime does on a thread's first such call.
template <typename Signature, Signature Function>
struct InContext;
template <typename... Args, int (*Function)(Args...)>
struct InContext<int (*)(Args...), Function> {
  static int call(Args... args) {
    {
      Machine& m = machine();
      std::lock_guard<std::mutex> lock(m.mutex);
      if (validDevice(m, currentDevice)) m.contexts.insert(currentDevice);
    }
    return Function(args...);
  }
};
#define RINGTREE_IN_CONTEXT(function) &InContext<decltype(&function), &function>::call

int cudaGetDevice(int* device) {
  if (device == nullptr) return kCudaErrorInvalidValue;
  *device = currentDevice;
  return kCudaSuccess;
}

int cudaPointerDevice(const void* pointer, int* device) {
  if (device == nullptr) return kCudaErrorInvalidValue;
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  *device = -1;
  auto it = m.allocations.upper_bound(address);
  if (it != m.allocations.begin()) {
    --it;
    if (address - it->first < it->second.bytes) *device = it->second.device;
  }
  return kCudaSuccess;
}

int cudaStreamCreate(void** stream) {
  if (stream == nullptr) return kCudaErrorInvalidValue;
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (!validDevice(m, currentDevice)) return noDeviceError(m);
  auto core = startStream(currentDevice);
  m.allStreams.erase(std::remove_if(m.allStreams.begin(), m.allStreams.end(),
                                    [](const std::weak_ptr<StreamCore>& s) { return s.expired(); }),
                     m.allStreams.end());
  m.allStreams.push_back(core);
  *stream = core.get();
  m.streams.emplace(core.get(), std::move(core));
  ++m.counters.streamsCreated;
  return kCudaSuccess;
}

int cudaStreamDestroy(void* stream) {
  Machine& m = machine();
  std::shared_ptr<StreamCore> core;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    auto it = m.streams.find(stream);
    if (it == m.streams.end()) return kCudaErrorInvalidResourceHandle;
    core = std::move(it->second);
    m.streams.erase(it);
    ++m.counters.streamsDestroyed;
  }
  core->stop();
  return kCudaSuccess;
}

int cudaStreamWaitEvent(void* stream, void* event) {
  Machine& m = machine();
  std::shared_ptr<StreamCore> core;
  std::shared_ptr<StreamCore> awaited;
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    core = findStream(m, stream);
    auto it = m.events.find(event);
    if (core == nullptr || it == m.events.end()) return kCudaErrorInvalidResourceHandle;
    awaited = it->second->stream;
    target = it->second->target;
  }
  if (awaited != nullptr) core->push([awaited, target] { awaited->waitFor(target); });
  return kCudaSuccess;
}

int cudaStreamSynchronize(void* stream) {
  Machine& m = machine();
  std::shared_ptr<StreamCore> core;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    core = findStream(m, stream);
    if (core == nullptr) return kCudaErrorInvalidResourceHandle;
  }
  core->waitFor(core->mark());
  return kCudaSuccess;
}

int cudaEventCreate(void** event) {
  if (event == nullptr) return kCudaErrorInvalidValue;
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (!validDevice(m, currentDevice)) return noDeviceError(m);
  auto state = std::make_shared<EventState>(currentDevice);
  *event = state.get();
  m.events.emplace(state.get(), std::move(state));
  ++m.counters.eventsCreated;
  return kCudaSuccess;
}

int cudaEventDestroy(void* event) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (m.events.erase(event) == 0) return kCudaErrorInvalidResourceHandle;
  ++m.counters.eventsDestroyed;
  return kCudaSuccess;
}

int cudaEventRecord(void* event, void* stream) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  auto it = m.events.find(event);
  const std::shared_ptr<StreamCore> core = findStream(m, stream);
  if (it == m.events.end() || core == nullptr) return kCudaErrorInvalidResourceHandle;
  if (core->device != it->second->device) return kCudaErrorInvalidResourceHandle;
  it->second->stream = core;
  it->second->target = core->mark();
  return kCudaSuccess;
}

// The stream and mark an event waits for (stream null: never recorded).
int eventTarget(void* event, std::shared_ptr<StreamCore>* stream, uint64_t* target) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  auto it = m.events.find(event);
  if (it == m.events.end()) return kCudaErrorInvalidResourceHandle;
  *stream = it->second->stream;
  *target = it->second->target;
  return kCudaSuccess;
}

int cudaEventQuery(void* event) {
  std::shared_ptr<StreamCore> core;
  uint64_t target = 0;
  if (int error = eventTarget(event, &core, &target); error != kCudaSuccess) return error;
  return core == nullptr || core->reached(target) ? kCudaSuccess : kCudaErrorNotReady;
}

int cudaEventSynchronize(void* event) {
  std::shared_ptr<StreamCore> core;
  uint64_t target = 0;
  if (int error = eventTarget(event, &core, &target); error != kCudaSuccess) return error;
  if (core != nullptr) core->waitFor(target);
  return kCudaSuccess;
}

int cudaDeviceMalloc(void** pointer, size_t bytes) {
  if (pointer == nullptr) return kCudaErrorInvalidValue;
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (!validDevice(m, currentDevice)) return noDeviceError(m);
  if (bytes == 0) {
    *pointer = nullptr;
    return kCudaSuccess;
  }
  if (bytes > kMaxAllocation) return kCudaErrorMemoryAllocation;
  void* memory = ::operator new(bytes, std::align_val_t(kAllocationAlignment), std::nothrow);
  if (memory == nullptr) return kCudaErrorMemoryAllocation;
  std::memset(memory, kFreshMemoryByte, bytes);
  m.allocations.emplace(reinterpret_cast<uintptr_t>(memory), Allocation{bytes, currentDevice});
  m.allocatedBytes += bytes;
  ++m.counters.allocations;
  *pointer = memory;
  return kCudaSuccess;
}

int cudaDeviceFree(void* pointer) {
  if (pointer == nullptr) return kCudaSuccess;
  Machine& m = machine();
  std::vector<std::pair<std::shared_ptr<StreamCore>, uint64_t>> marks;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    auto it = m.allocations.find(reinterpret_cast<uintptr_t>(pointer));
    if (it == m.allocations.end()) return kCudaErrorInvalidValue;
    const int device = it->second.device;
    auto held = m.nullStreams.find(device);
    if (held != m.nullStreams.end()) marks.emplace_back(held->second, held->second->mark());
    for (const auto& weak : m.allStreams) {
      auto core = weak.lock();
      if (core != nullptr && core->device == device) {
        const uint64_t mark = core->mark();
        marks.emplace_back(std::move(core), mark);
      }
    }
  }
  for (auto& [core, mark] : marks) core->waitFor(mark);
  std::lock_guard<std::mutex> lock(m.mutex);
  auto it = m.allocations.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == m.allocations.end()) return kCudaErrorInvalidValue;
  m.allocatedBytes -= it->second.bytes;
  m.allocations.erase(it);
  ++m.counters.frees;
  ::operator delete(pointer, std::align_val_t(kAllocationAlignment));
  return kCudaSuccess;
}

int cudaMemcpyAsync(void* destination, const void* source, size_t bytes, void* stream) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  const std::shared_ptr<StreamCore> core = findStream(m, stream);
  if (core == nullptr) return kCudaErrorInvalidResourceHandle;
  if (bytes == 0) return kCudaSuccess;
  if (destination == nullptr || source == nullptr) return kCudaErrorInvalidValue;
  if (!withinItsAllocation(m, destination, bytes) || !withinItsAllocation(m, source, bytes)) {
    return kCudaErrorInvalidValue;
  }
  core->push([=] { std::memmove(destination, source, bytes); });
  return kCudaSuccess;
}

// The stream a kernel launches on: on the current device, else an error.
int kernelStream(Machine& m, void* stream, std::shared_ptr<StreamCore>* core) {
  *core = findStream(m, stream);
  if (*core == nullptr || (*core)->device != currentDevice) return kCudaErrorInvalidResourceHandle;
  return kCudaSuccess;
}

bool validType(int dataType) { return dataType >= 0 && dataType < kNumDataTypes; }

int cudaReduce(void* inout, const void* in, size_t count, int dataType, int reduceOp, void* stream) {
  if (!validType(dataType) || reduceOp < 0 || reduceOp >= kNumReduceOps) return kCudaErrorInvalidValue;
  const auto type = static_cast<DataType>(dataType);
  const auto op = static_cast<ReduceOp>(reduceOp);
  if (!isSupported(type, op)) return kCudaErrorInvalidValue;
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  std::shared_ptr<StreamCore> core;
  if (int error = kernelStream(m, stream, &core); error != kCudaSuccess) return error;
  if (count == 0) return kCudaSuccess;
  const size_t bytes = count * elementSize(type);
  if (!insideAllocation(m, inout, bytes, -1) || !insideAllocation(m, in, bytes, -1)) return kCudaErrorInvalidValue;
  const ReduceFn combine = algorithms::reduceFunction(type, op);
  core->push([=] {
    const auto* first = static_cast<const uint8_t*>(in);
    const auto* target = static_cast<const uint8_t*>(inout);
    if (first < target + bytes && target < first + bytes) {
      // The kernels take operands that do not overlap.
      const std::vector<uint8_t> copy(first, first + bytes);
      combine(inout, copy.data(), count);
    } else {
      combine(inout, in, count);
    }
  });
  return kCudaSuccess;
}

int cudaScale(void* data, size_t count, int dataType, double factor, void* stream) {
  if (!validType(dataType)) return kCudaErrorInvalidValue;
  const auto type = static_cast<DataType>(dataType);
  if (type == DataType::kBool) return kCudaErrorInvalidValue;
  const bool floating = isFloating(type) || type == DataType::kComplex64 || type == DataType::kComplex128;
  if (!floating && !std::isfinite(factor)) return kCudaErrorInvalidValue;
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  std::shared_ptr<StreamCore> core;
  if (int error = kernelStream(m, stream, &core); error != kCudaSuccess) return error;
  if (count == 0) return kCudaSuccess;
  if (!insideAllocation(m, data, count * elementSize(type), -1)) return kCudaErrorInvalidValue;
  core->push([=] { algorithms::scale(data, count, type, factor); });
  return kCudaSuccess;
}

int cudaDivide(void* data, size_t count, int dataType, int64_t divisor, void* stream) {
  if (!validType(dataType) || divisor <= 0) return kCudaErrorInvalidValue;
  const auto type = static_cast<DataType>(dataType);
  if (type == DataType::kBool) return kCudaErrorInvalidValue;
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  std::shared_ptr<StreamCore> core;
  if (int error = kernelStream(m, stream, &core); error != kCudaSuccess) return error;
  if (count == 0) return kCudaSuccess;
  if (!insideAllocation(m, data, count * elementSize(type), -1)) return kCudaErrorInvalidValue;
  core->push([=] { algorithms::divide(data, count, type, divisor); });
  return kCudaSuccess;
}

RingtreeGpuApi makeGpuApi() {
  RingtreeGpuApi api{};
  api.version = RINGTREE_GPU_API_VERSION;
  api.size = sizeof(RingtreeGpuApi);
  api.runtimeVersion = kCudaVersion;
  api.errorString = cudaErrorString;
  api.driverVersion = cudaDriverVersion;
  api.deviceCount = cudaDeviceCount;
  api.setDevice = cudaSetDevice;
  api.getDevice = cudaGetDevice;
  api.pointerDevice = cudaPointerDevice;
  api.streamCreate = RINGTREE_IN_CONTEXT(cudaStreamCreate);
  api.streamDestroy = RINGTREE_IN_CONTEXT(cudaStreamDestroy);
  api.streamWaitEvent = RINGTREE_IN_CONTEXT(cudaStreamWaitEvent);
  api.streamSynchronize = RINGTREE_IN_CONTEXT(cudaStreamSynchronize);
  api.eventCreate = RINGTREE_IN_CONTEXT(cudaEventCreate);
  api.eventDestroy = RINGTREE_IN_CONTEXT(cudaEventDestroy);
  api.eventRecord = RINGTREE_IN_CONTEXT(cudaEventRecord);
  api.eventQuery = RINGTREE_IN_CONTEXT(cudaEventQuery);
  api.eventSynchronize = RINGTREE_IN_CONTEXT(cudaEventSynchronize);
  api.deviceMalloc = RINGTREE_IN_CONTEXT(cudaDeviceMalloc);
  api.deviceFree = RINGTREE_IN_CONTEXT(cudaDeviceFree);
  api.memcpyAsync = RINGTREE_IN_CONTEXT(cudaMemcpyAsync);
  api.reduce = RINGTREE_IN_CONTEXT(cudaReduce);
  api.scale = RINGTREE_IN_CONTEXT(cudaScale);
  api.divide = RINGTREE_IN_CONTEXT(cudaDivide);
  api.setDeviceIfActive = cudaSetDeviceIfActive;
  return api;
}

// ---- The NCCL table --------------------------------------------------------------------

int ncclGetVersion(int* version) {
  if (version == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "null version pointer");
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  *version = m.ncclVersion;
  return cuda::kNcclSuccess;
}

const char* ncclGetErrorString(int result) {
  switch (result) {
    case cuda::kNcclSuccess: return "no error";
    case cuda::kNcclUnhandledCudaError: return "unhandled cuda error";
    case cuda::kNcclSystemError: return "unhandled system error";
    case cuda::kNcclInternalError: return "internal error";
    case cuda::kNcclInvalidArgument: return "invalid argument";
    case cuda::kNcclInvalidUsage: return "invalid usage";
    case cuda::kNcclRemoteError: return "remote process exited or there was a network error";
    case cuda::kNcclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(NcclComm) { return lastNcclError.load(); }

int ncclGetUniqueId(NcclUniqueId* id) {
  if (id == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "null unique id pointer");
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (m.uniqueIdFailure != 0) return ncclFailure(m.uniqueIdFailure, "getUniqueId failed (injected)");
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, kIdMagic, sizeof(kIdMagic));
  const uint64_t serial = m.nextUniqueId++;
  std::memcpy(id->internal + sizeof(kIdMagic), &serial, sizeof(serial));
  return cuda::kNcclSuccess;
}

std::shared_ptr<Comm> makeComm(Machine& m, const std::shared_ptr<Clique>& clique, int rank, int initRank, int device) {
  auto comm = std::make_shared<Comm>();
  comm->clique = clique;
  comm->rank = rank;
  comm->nranks = clique->nranks;
  comm->initRank = initRank;
  comm->device = device;
  comm->serial = m.nextSerial++;
  m.comms.emplace(comm.get(), comm);
  return comm;
}

int ncclCommInitRank(NcclComm* out, int nranks, NcclUniqueId id, int rank) {
  if (out == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "null communicator pointer");
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclFailure(cuda::kNcclInvalidArgument, "invalid rank or size");
  Machine& m = machine();
  std::unique_lock<std::mutex> lock(m.mutex);
  for (int key : {rank, -1}) {
    auto it = m.initFailures.find(key);
    if (it != m.initFailures.end()) return ncclFailure(it->second, "commInitRank failed (injected)");
  }
  if (!validDevice(m, currentDevice)) return ncclFailure(cuda::kNcclUnhandledCudaError, "no current CUDA device");
  const std::string key(id.internal, sizeof(id.internal));
  auto& slot = m.joins[key];
  if (slot == nullptr) slot = std::make_shared<Join>(nranks);
  const std::shared_ptr<Join> join = slot;
  if (join->nranks != nranks) {
    return ncclFailure(cuda::kNcclInvalidArgument, "ranks of one unique id disagree on the size");
  }
  const auto index = static_cast<size_t>(rank);
  if (join->joined[index]) return ncclFailure(cuda::kNcclInvalidUsage, "a rank joined the communicator twice");
  join->joined[index] = true;
  join->devices[index] = currentDevice;
  if (++join->count == nranks) {
    m.joins.erase(key);
    std::vector<int> devices = join->devices;
    std::sort(devices.begin(), devices.end());
    if (!m.allowSharedDevice && std::adjacent_find(devices.begin(), devices.end()) != devices.end()) {
      join->failure = ncclFailure(cuda::kNcclInvalidUsage, "two ranks of one communicator share a device");
    } else {
      auto clique = std::make_shared<Clique>(nranks);
      for (size_t r = 0; r < join->comms.size(); ++r) {
        join->comms[r] = makeComm(m, clique, static_cast<int>(r), static_cast<int>(r), join->devices[r]);
      }
      join->done = true;
    }
    m.cv.notify_all();
  } else if (!m.cv.wait_until(lock, Clock::now() + m.joinTimeout, [&] { return join->done || join->failure != 0; })) {
    join->joined[index] = false;
    if (--join->count == 0) {
      auto it = m.joins.find(key);
      if (it != m.joins.end() && it->second == join) m.joins.erase(it);
    }
    return ncclFailure(cuda::kNcclSystemError, "timed out waiting for the other ranks to join");
  }
  if (join->failure != 0) return join->failure;
  *out = join->comms[index].get();
  join->comms[index] = nullptr;
  ++m.counters.commsInitialized;
  return cuda::kNcclSuccess;
}

constexpr const char* kParentGone = "a rank of the parent aborted or destroyed its communicator";

int ncclCommSplit(NcclComm parentHandle, int color, int key, NcclComm* out, void*) {
  if (out == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "null communicator pointer");
  if (color < kSplitNoColor) return ncclFailure(cuda::kNcclInvalidArgument, "invalid color");
  Machine& m = machine();
  std::unique_lock<std::mutex> lock(m.mutex);
  const std::shared_ptr<Comm> parent = findComm(m, parentHandle);
  if (parent == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "invalid communicator");
  const std::shared_ptr<Clique> clique = parent->clique;
  auto it = clique->splits.try_emplace(parent->nextSplit++, parent->nranks).first;
  SplitSlot& split = it->second;
  const auto index = static_cast<size_t>(parent->rank);
  if (split.failure == 0 && clique->anyDeparted()) {
    split.failure = ncclFailure(cuda::kNcclRemoteError, kParentGone);
  }
  if (split.failure == 0) {
    split.parents[index] = parent;
    split.colors[index] = color;
    split.keys[index] = key;
    if (++split.count == parent->nranks) {
      std::map<int, std::vector<size_t>> members;  // parent ranks by color
      for (size_t r = 0; r < split.colors.size(); ++r) {
        if (split.colors[r] != kSplitNoColor) members[split.colors[r]].push_back(r);
      }
      for (auto& entry : members) {
        std::vector<size_t>& ranks = entry.second;
        std::sort(ranks.begin(), ranks.end(), [&](size_t a, size_t b) {
          return std::make_pair(split.keys[a], a) < std::make_pair(split.keys[b], b);
        });
        auto child = std::make_shared<Clique>(static_cast<int>(ranks.size()));
        for (size_t r = 0; r < ranks.size(); ++r) {
          const Comm& from = *split.parents[ranks[r]];
          split.results[ranks[r]] = makeComm(m, child, static_cast<int>(r), from.initRank, from.device);
        }
      }
      split.done = true;
      m.cv.notify_all();
    } else {
      const bool settled = m.cv.wait_until(lock, Clock::now() + m.joinTimeout, [&] {
        return split.done || split.failure != 0 || clique->anyDeparted();
      });
      if (!split.done && split.failure == 0) {
        split.failure = settled ? ncclFailure(cuda::kNcclRemoteError, kParentGone)
                                : ncclFailure(cuda::kNcclSystemError, "timed out waiting for the other ranks to split");
        m.cv.notify_all();
      }
    }
    split.parents[index] = nullptr;
  }
  const int failure = split.done ? 0 : split.failure;
  const std::shared_ptr<Comm> result = split.done ? split.results[index] : nullptr;
  split.results[index] = nullptr;
  if (++split.left == parent->nranks) clique->splits.erase(it);
  if (failure != 0) return failure;
  *out = result.get();
  if (result != nullptr) ++m.counters.commsSplit;
  return cuda::kNcclSuccess;
}

// Takes a communicator out of the live ones; its peers see it departed.
void retire(Machine& m, const std::shared_ptr<Comm>& comm) {
  m.comms.erase(comm.get());
  comm->clique->departed[static_cast<size_t>(comm->rank)] = true;
  m.cv.notify_all();
}

int ncclCommDestroy(NcclComm handle) {
  if (handle == nullptr) return cuda::kNcclSuccess;
  Machine& m = machine();
  std::unique_lock<std::mutex> lock(m.mutex);
  const std::shared_ptr<Comm> comm = findComm(m, handle);
  if (comm == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "invalid communicator");
  m.cv.wait(lock, [&] { return comm->pending == 0 || comm->aborted; });
  if (findComm(m, handle) != comm) return ncclFailure(cuda::kNcclInvalidArgument, "invalid communicator");
  retire(m, comm);
  ++m.counters.commsDestroyed;
  return cuda::kNcclSuccess;
}

int ncclCommAbort(NcclComm handle) {
  if (handle == nullptr) return cuda::kNcclSuccess;
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  const std::shared_ptr<Comm> comm = findComm(m, handle);
  if (comm == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "invalid communicator");
  comm->aborted = true;
  retire(m, comm);
  ++m.counters.commsAborted;
  return cuda::kNcclSuccess;
}

int ncclCommGetAsyncError(NcclComm handle, int* asyncError) {
  if (asyncError == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "null result pointer");
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  const std::shared_ptr<Comm> comm = findComm(m, handle);
  if (comm == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "invalid communicator");
  auto injected = m.asyncByRank.find(comm->initRank);
  if (comm->asyncOverride != 0) {
    *asyncError = comm->asyncOverride;
  } else if (injected != m.asyncByRank.end()) {
    *asyncError = injected->second;
  } else {
    *asyncError = comm->asyncError;
  }
  return cuda::kNcclSuccess;
}

int ncclAllReduce(const void* send, void* recv, size_t count, int type, int op, NcclComm comm, void* stream) {
  return enqueue(Kind::kAllReduce, send, recv, count, type, op, 0, comm, stream);
}

int ncclBroadcast(const void* send, void* recv, size_t count, int type, int root, NcclComm comm, void* stream) {
  return enqueue(Kind::kBroadcast, send, recv, count, type, cuda::kNcclSum, root, comm, stream);
}

int ncclReduce(const void* send, void* recv, size_t count, int type, int op, int root, NcclComm comm, void* stream) {
  return enqueue(Kind::kReduce, send, recv, count, type, op, root, comm, stream);
}

int ncclAllGather(const void* send, void* recv, size_t sendCount, int type, NcclComm comm, void* stream) {
  return enqueue(Kind::kAllGather, send, recv, sendCount, type, cuda::kNcclSum, 0, comm, stream);
}

int ncclReduceScatter(const void* send, void* recv, size_t recvCount, int type, int op, NcclComm comm, void* stream) {
  return enqueue(Kind::kReduceScatter, send, recv, recvCount, type, op, 0, comm, stream);
}

int ncclSend(const void* send, size_t count, int type, int peer, NcclComm comm, void* stream) {
  return enqueue(Kind::kSend, send, nullptr, count, type, cuda::kNcclSum, peer, comm, stream);
}

int ncclRecv(void* recv, size_t count, int type, int peer, NcclComm comm, void* stream) {
  return enqueue(Kind::kRecv, nullptr, recv, count, type, cuda::kNcclSum, peer, comm, stream);
}

int ncclGroupStart() {
  ++group.depth;
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  ++m.counters.groupStart;
  return cuda::kNcclSuccess;
}

int ncclGroupEnd() {
  if (group.depth == 0) return ncclFailure(cuda::kNcclInvalidUsage, "groupEnd without groupStart");
  {
    Machine& m = machine();
    std::lock_guard<std::mutex> lock(m.mutex);
    ++m.counters.groupEnd;
  }
  if (--group.depth > 0) return cuda::kNcclSuccess;
  {
    // Real NCCL frees an aborted communicator: ending a group that holds one reads freed
    // memory. Counted, so that tests catch it.
    Machine& m = machine();
    std::lock_guard<std::mutex> lock(m.mutex);
    for (const auto& entry : group.ops) {
      if (entry.second->comm->aborted) {
        ++m.counters.groupEndsOnAbortedComms;
        break;
      }
    }
  }
  // One unit per stream, in the order of the streams' first operations.
  std::vector<std::pair<std::shared_ptr<StreamCore>, std::vector<std::shared_ptr<Op>>>> units;
  for (auto& [core, op] : group.ops) {
    auto unit = std::find_if(units.begin(), units.end(), [&](const auto& u) { return u.first == core; });
    if (unit == units.end()) unit = units.emplace(units.end(), core, std::vector<std::shared_ptr<Op>>{});
    unit->second.push_back(std::move(op));
  }
  group.ops.clear();
  for (auto& [core, ops] : units) core->push([ops = std::move(ops)] { runOps(ops); });
  return cuda::kNcclSuccess;
}

int ncclRedOpCreatePreMulSum(int* op, void* scalar, int type, int residence, NcclComm handle) {
  if (op == nullptr || scalar == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "null op or scalar pointer");
  DataType dataType;
  if (!toDataType(type, &dataType)) return ncclFailure(cuda::kNcclInvalidArgument, "invalid data type for PreMulSum");
  if (residence != cuda::kNcclScalarDevice && residence != cuda::kNcclScalarHostImmediate) {
    return ncclFailure(cuda::kNcclInvalidArgument, "invalid scalar residence");
  }
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  const std::shared_ptr<Comm> comm = findComm(m, handle);
  if (comm == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "invalid communicator");
  CreatedOp created{type, 1.0, nullptr};
  if (residence == cuda::kNcclScalarHostImmediate) {
    created.scalar = readScalar(scalar, type);
  } else {
    if (!insideAllocation(m, scalar, ncclElementSize(type), comm->device)) {
      return ncclFailure(cuda::kNcclInvalidArgument, "device scalar is not device memory of the communicator's device");
    }
    created.scalarAt = scalar;
  }
  *op = comm->nextOp++;
  comm->createdOps.emplace(*op, created);
  ++m.counters.redOpsCreated;
  return cuda::kNcclSuccess;
}

int ncclRedOpDestroy(int op, NcclComm handle) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  const std::shared_ptr<Comm> comm = findComm(m, handle);
  if (comm == nullptr) return ncclFailure(cuda::kNcclInvalidArgument, "invalid communicator");
  if (comm->createdOps.erase(op) == 0) return ncclFailure(cuda::kNcclInvalidArgument, "op was not created here");
  ++m.counters.redOpsDestroyed;
  return cuda::kNcclSuccess;
}

}  // namespace

// ---- The public functions --------------------------------------------------------------

const RingtreeGpuApi& gpuApi() {
  static const RingtreeGpuApi api = makeGpuApi();
  return api;
}

std::shared_ptr<const cuda::NcclApi> ncclApi() {
  Machine& m = machine();
  auto api = std::make_shared<cuda::NcclApi>();
  bool optional;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    api->version = m.ncclVersion;
    optional = m.optionalSymbols;
  }
  api->path = kNcclPath;
  api->getVersion = ncclGetVersion;
  api->getErrorString = ncclGetErrorString;
  api->getUniqueId = ncclGetUniqueId;
  api->commInitRank = ncclCommInitRank;
  api->commDestroy = ncclCommDestroy;
  api->commAbort = ncclCommAbort;
  api->commGetAsyncError = ncclCommGetAsyncError;
  api->allReduce = ncclAllReduce;
  api->broadcast = ncclBroadcast;
  api->reduce = ncclReduce;
  api->allGather = ncclAllGather;
  api->reduceScatter = ncclReduceScatter;
  api->send = ncclSend;
  api->recv = ncclRecv;
  api->groupStart = ncclGroupStart;
  api->groupEnd = ncclGroupEnd;
  if (optional) {
    api->getLastError = ncclGetLastError;
    api->commSplit = ncclCommSplit;
    api->redOpCreatePreMulSum = ncclRedOpCreatePreMulSum;
    api->redOpDestroy = ncclRedOpDestroy;
  }
  return api;
}

void reset() {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  m.deviceCount = kDefaultDeviceCount;
  m.ncclVersion = kNcclVersionCode;
  m.optionalSymbols = true;
  m.joinTimeout = kDefaultJoinTimeout;
  m.stallTimeout = kDefaultStallTimeout;
  m.allowSharedDevice = false;
  m.uniqueIdFailure = 0;
  m.initFailures.clear();
  m.hangsByRank.clear();
  m.sendFailures.clear();
  m.asyncByRank.clear();
  for (auto& [handle, comm] : m.comms) {
    comm->hangs = 0;
    comm->asyncOverride = 0;
  }
  m.counters = Counters{};
  m.contexts.clear();
  lastNcclError.store("");
  currentDevice = 0;
}

void setDeviceCount(int count) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  m.deviceCount = std::max(count, 0);
}

int enqueueHostFunction(void* stream, std::function<void()> fn) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  const std::shared_ptr<StreamCore> core = findStream(m, stream);
  if (core == nullptr) return kCudaErrorInvalidResourceHandle;
  core->push(std::move(fn));
  return kCudaSuccess;
}

void setNcclVersion(int code) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  m.ncclVersion = code;
}

void setOptionalNcclSymbols(bool present) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  m.optionalSymbols = present;
}

void setJoinTimeout(std::chrono::milliseconds timeout) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  m.joinTimeout = timeout;
}

void setStallTimeout(std::chrono::milliseconds timeout) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  m.stallTimeout = timeout;
}

void setAllowSharedDevice(bool allow) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  m.allowSharedDevice = allow;
}

void failGetUniqueId(int result) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  m.uniqueIdFailure = result;
}

void failCommInitRank(int result, int rank) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (result == 0) {
    m.initFailures.erase(rank);
  } else {
    m.initFailures[rank] = result;
  }
}

void failNextSend(int rank, int result) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  m.sendFailures[rank] = result;
}

void hangNextCollective(int rank) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  ++m.hangsByRank[rank];
}

void hangNextCollectiveOn(cuda::NcclComm handle) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (auto comm = findComm(m, handle)) ++comm->hangs;
}

void setAsyncError(int rank, int result) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (result == 0) {
    m.asyncByRank.erase(rank);
  } else {
    m.asyncByRank[rank] = result;
  }
}

void setAsyncErrorOn(cuda::NcclComm handle, int result) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (auto comm = findComm(m, handle)) comm->asyncOverride = result;
}

bool contextActive(int device) {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  return m.contexts.count(device) != 0;
}

Counters counters() {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  return m.counters;
}

Live live() {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  Live result;
  result.streams = static_cast<int>(m.streams.size());
  result.events = static_cast<int>(m.events.size());
  result.allocations = static_cast<int>(m.allocations.size());
  result.allocatedBytes = m.allocatedBytes;
  result.communicators = static_cast<int>(m.comms.size());
  return result;
}

std::vector<CommInfo> communicators() {
  Machine& m = machine();
  std::lock_guard<std::mutex> lock(m.mutex);
  std::vector<std::pair<uint64_t, CommInfo>> found;
  for (const auto& [handle, comm] : m.comms) {
    found.emplace_back(comm->serial, CommInfo{handle, comm->rank, comm->nranks, comm->initRank, comm->device});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CommInfo> result;
  for (auto& entry : found) result.push_back(entry.second);
  return result;
}

}  // namespace ringtree::test::fake_gpu
