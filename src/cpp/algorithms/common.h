#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <ringtree/communicator.h>
#include <ringtree/options.h>
#include <ringtree/types.h>

#include "common/socket.h"
#include "communicator_impl.h"
#include "transport/pair.h"

// What every collective algorithm shares: the call context (sequence number, envelope,
// deadline), blocking send/receive steps over pairs, and balanced element ranges.
namespace ringtree::algorithms {

enum class Collective : uint8_t {
  kAllreduce = 1,
  kBroadcast = 2,
  kReduce = 3,
  kBarrier = 4,
  kAllgather = 5,
  kGather = 6,
  kScatter = 7,
  kReduceScatter = 8,
  kAlltoall = 9,
  kLast = kAlltoall,
};

const char* collectiveName(Collective collective);

// One collective call in progress on one rank.
struct Call {
  detail::CommunicatorImpl& comm;
  transport::Envelope envelope;  // what every message of this call carries
  net::Deadline deadline;
  size_t elementSize;

  int rank() const { return comm.rank(); }
  int size() const { return comm.size(); }
};

// Envelope.operation = collective << 8 | algorithm: ranks that chose different
// algorithms for the same call are caught as a mismatch too.
uint32_t operationCode(Collective collective, Algorithm algorithm);

// "allreduce(seq=3, algorithm=ring, dtype=float32, count=1024, op=SUM)".
std::string describe(const transport::Envelope& envelope);

// Starts a call and runs body(call). Checks that the communicator is usable (not broken,
// not aborted), takes the next sequence number, computes the deadline (options timeout,
// else the communicator's) and records the call in the flight recorder. Translates a wire
// mismatch into CollectiveMismatchError naming both ranks and both calls (after telling
// the peer what this rank called), a timeout into TimeoutError naming the call, the ranks
// waited for and what the others were doing, an abort into Error; marks the communicator
// broken on any failure.
template <typename Body>
void runCall(Communicator& communicator, Collective collective, Algorithm algorithm, DataType type,
             ReduceOp op, size_t count, int root, std::chrono::milliseconds timeout, Body&& body);

// A range of elements [offset, offset + count).
struct Range {
  size_t offset = 0;
  size_t count = 0;
};

// Part `index` of `count` elements cut into `parts` nearly equal, contiguous parts (the
// first count % parts parts have one element more).
Range partition(size_t count, int parts, int index);

// Blocking steps. Each waits (spinning, then sleeping) until its messages are done.
void send(Call& call, int peer, const void* data, size_t bytes);
void recv(Call& call, int peer, void* data, size_t bytes, const transport::Accumulate& accumulate = {});
// Sends to one peer and receives from another (or the same) at the same time.
void sendRecv(Call& call, int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData,
              size_t recvBytes, const transport::Accumulate& accumulate = {});

// Implementation detail of runCall, out of line: beginCall opens the call's flight-recorder
// entry (and publishes its fingerprint in the node arena), endCall closes it, failCall
// closes it as failed (and leaves the failure's traces: see <ringtree/flight_recorder.h>).
Call beginCall(Communicator& communicator, Collective collective, Algorithm algorithm, DataType type, ReduceOp op,
               size_t count, int root, std::chrono::milliseconds timeout);
void endCall(Call& call);
[[noreturn]] void failCall(Call& call, std::exception_ptr error);

template <typename Body>
void runCall(Communicator& communicator, Collective collective, Algorithm algorithm, DataType type,
             ReduceOp op, size_t count, int root, std::chrono::milliseconds timeout, Body&& body) {
  Call call = beginCall(communicator, collective, algorithm, type, op, count, root, timeout);
  try {
    body(call);
  } catch (...) {
    failCall(call, std::current_exception());
  }
  endCall(call);
}

}  // namespace ringtree::algorithms
