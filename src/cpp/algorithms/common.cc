#include "algorithms/common.h"

#include <ringtree/error.h>

#include "algorithms/shm_direct.h"
#include "common/logging.h"

namespace ringtree::algorithms {

namespace {

// Set in Envelope.reserved on the message a rank sends after it detected a mismatch:
// "this is what I called". The receiver reports it instead of answering it.
constexpr uint16_t kMismatchNotice = 1;

// How long a rank that detected a mismatch tries to deliver its notice.
constexpr std::chrono::milliseconds kNoticeTimeout(1000);

// A failure's text with the call it happened in: transports describe their operation in
// their own terms (bytes, raw envelope fields); this names the collective.
std::string inCall(const Call& call, const std::string& what) {
  const std::string description = describe(call.envelope);
  if (what.find(description) != std::string::npos) {
    return what;  // already says it (the arena algorithms do)
  }
  return what + " [in " + description + "]";
}

std::string timeoutText(std::chrono::milliseconds timeout) { return std::to_string(timeout.count()) + " ms"; }

}  // namespace

const char* collectiveName(Collective collective) {
  switch (collective) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduce: return "reduce";
    case Collective::kBarrier: return "barrier";
  }
  return "unknown collective";
}

uint32_t operationCode(Collective collective, Algorithm algorithm) {
  return static_cast<uint32_t>(collective) << 8 | static_cast<uint32_t>(algorithm);
}

std::string describe(const transport::Envelope& e) {
  const auto collective = static_cast<Collective>(e.operation >> 8);
  const auto algorithm = static_cast<Algorithm>(e.operation & 0xff);
  std::string text = collectiveName(collective);
  text += "(seq=" + std::to_string(e.sequence);
  if (collective != Collective::kBarrier) {
    text += ", algorithm=" + std::string(algorithmName(algorithm));
    text += ", dtype=" + std::string(e.dataType < kNumDataTypes ? dataTypeName(static_cast<DataType>(e.dataType)) : "?");
    text += ", count=" + std::to_string(e.count);
  }
  if (collective == Collective::kAllreduce || collective == Collective::kReduce) {
    text += ", op=" + std::string(e.reduceOp < kNumReduceOps ? reduceOpName(static_cast<ReduceOp>(e.reduceOp)) : "?");
  }
  if (collective == Collective::kBroadcast || collective == Collective::kReduce) {
    text += ", root=" + std::to_string(e.root);
  }
  return text + ")";
}

Range partition(size_t count, int parts, int index) {
  const size_t n = static_cast<size_t>(parts);
  const size_t i = static_cast<size_t>(index);
  const size_t base = count / n;
  const size_t extra = count % n;
  return Range{i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

Call beginCall(Communicator& communicator, Collective collective, Algorithm algorithm, DataType type, ReduceOp op,
               size_t count, int root, std::chrono::milliseconds timeout) {
  auto& comm = communicator.impl();
  if (!comm.brokenReason().empty()) {
    throw Error(std::string(collectiveName(collective)) + " on rank " + std::to_string(comm.rank()) +
                ": the communicator is unusable after an earlier failure: " + comm.brokenReason());
  }
  if (timeout.count() < 0) {
    throw InvalidArgument(std::string(collectiveName(collective)) + ": timeout must be >= 0 ms, got " +
                          timeoutText(timeout));
  }
  transport::Envelope envelope;
  envelope.sequence = comm.nextSequence();
  envelope.operation = operationCode(collective, algorithm);
  envelope.dataType = static_cast<uint8_t>(type);
  envelope.reduceOp = static_cast<uint8_t>(op);
  envelope.count = count;
  envelope.root = root;
  const auto effective = timeout.count() > 0 ? timeout : comm.timeout();
  RINGTREE_DEBUG("rank " << comm.rank() << " starts " << describe(envelope));
  Call call{comm, envelope, net::deadlineAfter(effective), elementSize(type)};
  announceCall(call);
  return call;
}

void failCall(Call& call, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const transport::EnvelopeMismatch& mismatch) {
    const bool peerDetectedIt = (mismatch.actual.reserved & kMismatchNotice) != 0;
    if (!peerDetectedIt) {
      // Tell the peer what this rank called, so that it fails with the same diagnosis
      // instead of waiting for its timeout. Best effort, bounded.
      transport::Envelope notice = call.envelope;
      notice.reserved = kMismatchNotice;
      call.comm.pair(mismatch.peerRank).sendNotice(notice, net::deadlineAfter(kNoticeTimeout));
    }
    std::string message = "collective mismatch between rank " + std::to_string(call.rank()) + " and rank " +
                           std::to_string(mismatch.peerRank) + ": rank " + std::to_string(call.rank()) + " called " +
                           describe(mismatch.expected) + " but rank " + std::to_string(mismatch.peerRank) +
                           (peerDetectedIt ? " reports it called " : " called ") + describe(mismatch.actual);
    if (!peerDetectedIt && mismatch.expected == mismatch.actual && mismatch.expectedBytes != mismatch.actualBytes) {
      message += " (message of " + std::to_string(mismatch.actualBytes) + " bytes where " +
                 std::to_string(mismatch.expectedBytes) + " were expected)";
    }
    call.comm.markBroken(message);
    throw CollectiveMismatchError(message);
  } catch (const NetworkError& e) {
    const std::string message = inCall(call, e.what());
    call.comm.markBroken(message);
    throw NetworkError(message);
  } catch (const TimeoutError& e) {
    const std::string message = inCall(call, e.what());
    call.comm.markBroken(message);
    throw TimeoutError(message);
  } catch (const std::exception& e) {
    call.comm.markBroken(inCall(call, e.what()));
    throw;
  }
}

void send(Call& call, int peer, const void* data, size_t bytes) {
  auto& pair = call.comm.pair(peer);
  pair.postSend(call.envelope, data, bytes);
  call.comm.waitIdle({&pair}, call.deadline);
}

void recv(Call& call, int peer, void* data, size_t bytes, const transport::Accumulate& accumulate) {
  auto& pair = call.comm.pair(peer);
  pair.postRecv(call.envelope, data, bytes, accumulate);
  call.comm.waitIdle({&pair}, call.deadline);
}

void sendRecv(Call& call, int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData,
              size_t recvBytes, const transport::Accumulate& accumulate) {
  auto& out = call.comm.pair(sendPeer);
  auto& in = call.comm.pair(recvPeer);
  in.postRecv(call.envelope, recvData, recvBytes, accumulate);
  out.postSend(call.envelope, sendData, sendBytes);
  if (&out == &in) {
    call.comm.waitIdle({&out}, call.deadline);
  } else {
    call.comm.waitIdle({&out, &in}, call.deadline);
  }
}

}  // namespace ringtree::algorithms
