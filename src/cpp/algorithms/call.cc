#include "algorithms/call.h"

#include <cstdio>
#include <utility>

#include <ringtree/error.h>

#include "algorithms/call_failure.h"
#include "common/logging.h"
#include "common/validation.h"
#include "diagnostics/arena_status.h"
#include "diagnostics/flight_recorder.h"

namespace ringtree::algorithms {

namespace {


// Names the collectives' messages in the transports' errors (transport::envelopeText);
// "" for envelopes that are not a collective's (point-to-point's, say).
std::string describeCollectiveMessage(const transport::Envelope& envelope) {
  const uint32_t code = envelope.operation >> 8;
  if (code < static_cast<uint32_t>(Collective::kAllreduce) || code > static_cast<uint32_t>(Collective::kLast)) {
    return {};
  }
  return describe(envelope);
}
const bool kCollectiveMessagesNamed = (transport::setEnvelopeDescriber(&describeCollectiveMessage), true);

const char* collectiveNameOf(const transport::Envelope& envelope) { return collectiveName(collectiveOf(envelope)); }
const char* algorithmNameOf(const transport::Envelope& envelope) { return algorithmName(algorithmOf(envelope)); }

// How the flight recorder reads the envelopes it records.
const diagnostics::CallFormat kCallFormat{&describe, &collectiveNameOf, &algorithmNameOf};

}  // namespace

const char* collectiveName(Collective collective) {
  switch (collective) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduce: return "reduce";
    case Collective::kBarrier: return "barrier";
    case Collective::kAllgather: return "allgather";
    case Collective::kGather: return "gather";
    case Collective::kScatter: return "scatter";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAlltoall: return "alltoall";
  }
  return "unknown collective";
}

uint16_t operationCode(Collective collective, Algorithm algorithm) {
  return static_cast<uint16_t>(static_cast<uint16_t>(collective) << 8 | static_cast<uint16_t>(algorithm));
}

std::string describe(const transport::Envelope& e) {
  const Collective collective = collectiveOf(e);
  std::string text = collectiveName(collective);
  text += "(seq=" + std::to_string(e.sequence);
  if (collective != Collective::kBarrier) {
    text += ", algorithm=" + std::string(algorithmName(algorithmOf(e)));
    text += ", dtype=" + std::string(e.dataType < kNumDataTypes ? dataTypeName(static_cast<DataType>(e.dataType)) : "?");
    // An alltoall's ranks share no element count (each knows its own row and column of
    // the count matrix): its envelope carries 0, and message sizes are checked instead.
    if (collective != Collective::kAlltoall) text += ", count=" + std::to_string(e.count);
  }
  if (e.countsHash != 0) {
    char hash[16];
    std::snprintf(hash, sizeof(hash), "%08x", e.countsHash);
    text += ", counts hash=" + std::string(hash);
  }
  if (collective == Collective::kAllreduce || collective == Collective::kReduce ||
      collective == Collective::kReduceScatter) {
    text += ", op=" + std::string(e.reduceOp < kNumReduceOps ? reduceOpName(static_cast<ReduceOp>(e.reduceOp)) : "?");
  }
  if (collective == Collective::kBroadcast || collective == Collective::kReduce ||
      collective == Collective::kGather || collective == Collective::kScatter) {
    text += ", root=" + std::to_string(e.root);
  }
  return text + ")";
}

Call beginCall(Communicator& communicator, Collective collective, Algorithm algorithm, DataType type, ReduceOp op,
               size_t count, int root, std::chrono::milliseconds timeout) {
  auto& comm = communicator.impl();
  if (comm.aborted()) {
    throw Error(std::string(collectiveName(collective)) + " on rank " + std::to_string(comm.rank()) +
                ": the communicator was aborted");
  }
  validation::checkTimeout(collectiveName(collective), timeout);
  transport::Envelope envelope;
  envelope.sequence = comm.nextSequence();
  envelope.operation = operationCode(collective, algorithm);
  envelope.dataType = static_cast<uint8_t>(type);
  envelope.reduceOp = static_cast<uint8_t>(op);
  envelope.count = count;
  envelope.root = root;
  if (!comm.brokenReason().empty()) throwBroken(comm, envelope);
  const auto effective = timeout.count() > 0 ? timeout : comm.timeout();
  RINGTREE_DEBUG("rank " << comm.rank() << " starts " << describe(envelope));
  Call call{comm, envelope, net::deadlineAfter(effective), effective, elementSize(type)};
  // The start: the clock read deadlineAfter made (one read fewer on the fast path), unless
  // the deadline saturated.
  const int64_t start = call.deadline == net::kNoDeadline
                            ? diagnostics::steadyNowNs()
                            : std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  (call.deadline - effective).time_since_epoch())
                                  .count();
  comm.flightRecorder().started(envelope, &kCallFormat, start);
  diagnostics::announceCall(comm.arena(), envelope, start);
  comm.startStatusPublishing();
  return call;
}

void endCall(Call& call) {
  const int64_t now = diagnostics::steadyNowNs();
  call.comm.flightRecorder().finished(CallState::kCompleted, now);
  diagnostics::announceFinished(call.comm.arena(), call.envelope.sequence, false, now);
}

void send(Call& call, int peer, const void* data, size_t bytes) {
  auto& pair = call.comm.pair(peer);
  pair.postSend(call.envelope, data, bytes);
  call.comm.waitIdle({&pair}, call.deadline, stallCheckOf(call));
  // Nothing is read from this peer in this step: make sure it has not gone away or
  // given up (a send finishes once the kernel or the ring has taken it).
  if (pair.pendingRecvs() == 0) pair.checkIncoming(&call.envelope);
}

void recv(Call& call, int peer, void* data, size_t bytes, const transport::Accumulate& accumulate) {
  auto& pair = call.comm.pair(peer);
  pair.postRecv(call.envelope, data, bytes, accumulate);
  call.comm.waitIdle({&pair}, call.deadline, stallCheckOf(call));
}

void sendRecv(Call& call, int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData,
              size_t recvBytes, const transport::Accumulate& accumulate) {
  auto& out = call.comm.pair(sendPeer);
  auto& in = call.comm.pair(recvPeer);
  in.postRecv(call.envelope, recvData, recvBytes, accumulate);
  out.postSend(call.envelope, sendData, sendBytes);
  if (&out == &in) {
    call.comm.waitIdle({&out}, call.deadline, stallCheckOf(call));
  } else {
    call.comm.waitIdle({&out, &in}, call.deadline, stallCheckOf(call));
    if (out.pendingRecvs() == 0) out.checkIncoming(&call.envelope);  // as in send()
  }
}

}  // namespace ringtree::algorithms
