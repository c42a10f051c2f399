#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include <ringtree/communicator.h>
#include <ringtree/options.h>
#include <ringtree/types.h>

#include "common/socket.h"
#include "communicator_impl.h"
#include "transport/pair.h"

// The life cycle of one collective call, which every algorithm runs inside (runCall:
// sequence number, envelope, deadline, flight recorder, failure handling), and the
// blocking send/receive steps algorithms build on.
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
  std::chrono::milliseconds timeout;  // how long after its start the deadline comes
  size_t elementSize;

  int rank() const { return comm.rank(); }
  int size() const { return comm.size(); }
};

// Envelope.operation = collective << 8 | algorithm: ranks that chose different
// algorithms for the same call are caught as a mismatch too.
uint16_t operationCode(Collective collective, Algorithm algorithm);
// The collective and the algorithm an envelope's operation code names.
inline Collective collectiveOf(const transport::Envelope& envelope) {
  return static_cast<Collective>(envelope.operation >> 8);
}
inline Algorithm algorithmOf(const transport::Envelope& envelope) {
  return static_cast<Algorithm>(envelope.operation & 0xff);
}

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

// Blocking steps. Each waits (spinning, then sleeping) until its messages are done.
void send(Call& call, int peer, const void* data, size_t bytes);
void recv(Call& call, int peer, void* data, size_t bytes, const transport::Accumulate& accumulate = {});
// Sends to one peer and receives from another (or the same) at the same time.
void sendRecv(Call& call, int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData,
              size_t recvBytes, const transport::Accumulate& accumulate = {});

// Implementation detail of runCall, out of line: beginCall opens the call's flight-recorder
// entry (and publishes its fingerprint in the node arena), endCall closes it, failCall
// (call_failure.cc) closes it as failed, tells the peers, and throws the error the call
// fails with (see <ringtree/flight_recorder.h> for the traces a failure leaves).
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
