#include "algorithms/common.h"

#include <cstdio>
#include <exception>
#include <utility>

#include <ringtree/error.h>

#include "algorithms/shm_direct.h"
#include "common/logging.h"
#include "common/validation.h"
#include "diagnostics/flight_recorder.h"
#include "diagnostics/peer_status.h"

namespace ringtree::algorithms {

namespace {

using transport::NoticeFailure;

// How long a rank whose call failed tries to deliver its notices (all of them together).
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


// How many of its latest calls a rank logs after a timeout or network error.
constexpr size_t kLoggedCalls = 10;

// How long a timed-out rank waits for the store to tell it what its peers were doing.
constexpr std::chrono::milliseconds kStatusReadBudget(1000);
// The same for a long wait's check that the peers are in the same call.
constexpr std::chrono::milliseconds kStallReadBudget(500);

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

// The collective and the algorithm of a call, from its envelope (see operationCode).
const char* collectiveOf(const transport::Envelope& envelope) {
  return collectiveName(static_cast<Collective>(envelope.operation >> 8));
}
const char* algorithmOf(const transport::Envelope& envelope) {
  return algorithmName(static_cast<Algorithm>(envelope.operation & 0xff));
}

// How the flight recorder reads the envelopes it records.
const diagnostics::CallFormat kCallFormat{&describe, &collectiveOf, &algorithmOf};

// "allreduce(seq=7)": a call named briefly, where its full description was given before.
std::string shortName(const transport::Envelope& envelope) {
  return std::string(collectiveOf(envelope)) + "(seq=" + std::to_string(envelope.sequence) + ")";
}

using Failure = detail::CommunicatorImpl::Failure;

// What the other ranks were doing when `call` timed out: from the node arena when there
// is one, else from the statuses they published in the store. Empty, with *unavailable
// saying why, when neither can tell.
std::vector<diagnostics::PeerProgress> peerProgress(Call& call, std::string* unavailable,
                                                    std::chrono::milliseconds budget = kStatusReadBudget) {
  if (call.comm.arena() != nullptr) return arenaPeerProgress(call);
  if (diagnostics::StatusPublisher* publisher = call.comm.statusPublisher()) {
    return publisher->readPeers(budget);
  }
  *unavailable = "what the other ranks were doing is unknown: this rank has no store connection to ask";
  return {};
}

// A peer that entered another call than `call` under the same sequence number (a
// mismatch that no message revealed: both ranks waited for each other), or null.
const diagnostics::PeerProgress* inAnotherCall(const Call& call, const std::vector<diagnostics::PeerProgress>& peers) {
  const std::string mine = describe(call.envelope);
  for (const diagnostics::PeerProgress& p : peers) {
    if (p.known && p.startedSequence == call.envelope.sequence && p.started != mine) return &p;
  }
  return nullptr;
}

// What a long wait's stall check throws: `peer` published that it is in another call
// under this call's sequence number (a mismatch that no message revealed, such as two
// ranks that each wait for the other as the root of a reduce).
class PeerInAnotherCall : public std::exception {
 public:
  explicit PeerInAnotherCall(diagnostics::PeerProgress peer) : peer(std::move(peer)) {}
  const char* what() const noexcept override { return "a peer is in another call"; }
  diagnostics::PeerProgress peer;
};

// The StallCheck of a call's waits (context: the Call): reads what the peers published
// (the node arena, else the store) and throws PeerInAnotherCall for a peer in another call
// with this call's sequence number.
void checkPeersCalls(void* context) {
  Call& call = *static_cast<Call*>(context);
  std::string unavailable;
  const std::vector<diagnostics::PeerProgress> peers = peerProgress(call, &unavailable, kStallReadBudget);
  if (const diagnostics::PeerProgress* other = inAnotherCall(call, peers)) throw PeerInAnotherCall(*other);
}

detail::CommunicatorImpl::StallCheck stallCheckOf(Call& call) { return {&checkPeersCalls, &call}; }

// A call on a communicator that an earlier failure broke: an error of that failure's
// class, repeating its text after the new call's description.
[[noreturn]] void throwBroken(const detail::CommunicatorImpl& comm, const transport::Envelope& envelope) {
  const std::string message = "rank " + std::to_string(comm.rank()) + ": " + describe(envelope) +
                              " cannot run, the communicator is unusable after an earlier failure: " +
                              comm.brokenReason();
  switch (comm.brokenFailure()) {
    case detail::CommunicatorImpl::Failure::kNetwork: throw NetworkError(message);
    case detail::CommunicatorImpl::Failure::kTimeout: throw TimeoutError(message);
    case detail::CommunicatorImpl::Failure::kMismatch: throw CollectiveMismatchError(message);
    case detail::CommunicatorImpl::Failure::kError: break;
  }
  throw Error(message);
}

// Which failures leave what trace besides the error.
enum class Trace {
  kNone,
  kDump,        // the flight record goes to RINGTREE_FLIGHT_RECORDER_DIR
  kDumpAndLog,  // also: the latest calls are logged
};

// Records the failure of `call` (flight recorder, node arena), leaves the communicator
// unusable with `message` as the reason, and leaves `trace`. Never throws.
void recordFailure(Call& call, const std::string& message, detail::CommunicatorImpl::Failure failure,
                   Trace trace) noexcept {
  try {
    const int64_t now = diagnostics::steadyNowNs();
    call.comm.flightRecorder().finished(CallState::kFailed, now, message);
    announceFinished(call, true, now);
    call.comm.markBroken(message, failure);
    if (trace == Trace::kDumpAndLog) {
      std::vector<FlightRecord> latest;
      const diagnostics::FlightRecorder& recorder = call.comm.flightRecorder();
      for (const diagnostics::RecordedCall& entry : recorder.snapshot(kLoggedCalls)) {
        latest.push_back(recorder.toRecord(entry));
      }
      RINGTREE_LOG(kError, message << "\nlatest calls of rank " << call.rank() << " (flight recorder, oldest first):\n"
                                   << diagnostics::flightRecordLines(latest));
    }
    if (trace != Trace::kNone) {
      const std::string path = call.comm.dumpFlightRecord("failure: " + message);
      if (!path.empty()) RINGTREE_INFO("rank " << call.rank() << " wrote its flight record to " << path);
    }
  } catch (const std::exception& e) {
    RINGTREE_WARN("rank " << call.rank() << ": cannot record the failure of " << describe(call.envelope) << ": "
                          << e.what());
  }
}

NoticeFailure noticeFailureOf(Failure failure) {
  switch (failure) {
    case Failure::kNetwork: return NoticeFailure::kNetwork;
    case Failure::kTimeout: return NoticeFailure::kTimeout;
    case Failure::kMismatch: return NoticeFailure::kMismatch;
    case Failure::kError: break;
  }
  return NoticeFailure::kError;
}

// Tells every peer but `skip` (one already told, or -1) that this rank gives up on
// `call`: an abandon notice naming `culprit` (-1: this rank) and the failure's class, so
// that a peer waiting on this rank fails at once with the original cause instead of
// waiting for its deadline, and passes it on. Best effort, all notices within one
// kNoticeTimeout. Never throws.
void abandonPeers(Call& call, int culprit, Failure failure, int skip) noexcept {
  if (call.comm.connectionsReleased()) return;
  transport::Envelope notice = call.envelope;
  notice.reserved = static_cast<uint16_t>(transport::kAbandonNotice | static_cast<uint16_t>(noticeFailureOf(failure))
                                                                           << 8);
  notice.extra = static_cast<uint32_t>(culprit >= 0 ? culprit : call.rank());
  const net::Deadline deadline = net::deadlineAfter(kNoticeTimeout);
  for (int peer = 0; peer < call.size(); ++peer) {
    if (peer != call.rank() && peer != skip) call.comm.pair(peer).sendNotice(notice, deadline);
  }
}

// Tells `peer` what this rank called (a mismatch notice), so that it fails with the same
// diagnosis. Best effort, bounded. Never throws.
void sendMismatchNotice(Call& call, int peer) noexcept {
  transport::Envelope notice = call.envelope;
  notice.reserved = transport::kMismatchNotice;
  call.comm.pair(peer).sendNotice(notice, net::deadlineAfter(kNoticeTimeout));
}

// "rank 3 (host 'h', pid 7, tcp ...)" for a rank named in a notice; this rank and ranks
// out of range by number only.
std::string rankDescription(Call& call, int rank) {
  if (rank < 0 || rank >= call.size() || rank == call.rank() || call.comm.connectionsReleased()) {
    return "rank " + std::to_string(rank);
  }
  return call.comm.pair(rank).peerDescription();
}

// The first peer that did not enter `call`, from what the peers published, or -1.
int firstAbsent(const Call& call, const std::vector<diagnostics::PeerProgress>& peers) {
  for (const diagnostics::PeerProgress& p : peers) {
    if (p.known && p.startedSequence < call.envelope.sequence) return p.rank;
  }
  return -1;
}

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
    // An alltoall's ranks share no element count (each knows its own row and column of
    // the count matrix): its envelope carries 0, and message sizes are checked instead.
    if (collective != Collective::kAlltoall) text += ", count=" + std::to_string(e.count);
  }
  if (e.extra != 0 && !transport::isNotice(e)) {
    char hash[16];
    std::snprintf(hash, sizeof(hash), "%08x", e.extra);
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
  Call call{comm, envelope, net::deadlineAfter(effective), elementSize(type)};
  // The start: the clock read deadlineAfter made (one read fewer on the fast path), unless
  // the deadline saturated.
  const int64_t start = call.deadline == net::kNoDeadline
                            ? diagnostics::steadyNowNs()
                            : std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  (call.deadline - effective).time_since_epoch())
                                  .count();
  comm.flightRecorder().started(envelope, &kCallFormat, start);
  announceCall(call, start);
  comm.startStatusPublishing();
  return call;
}

void endCall(Call& call) {
  const int64_t now = diagnostics::steadyNowNs();
  call.comm.flightRecorder().finished(CallState::kCompleted, now);
  announceFinished(call, false, now);
}

void failCall(Call& call, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const transport::EnvelopeMismatch& mismatch) {
    if (transport::isAbandonNotice(mismatch.actual)) {
      // A peer gave up on a call: fail with its cause, naming the rank that caused it,
      // and pass the notice on (a peer that waits on this rank only learns it from here).
      const int reporter = mismatch.peerRank;
      const int culprit = static_cast<int>(mismatch.actual.extra);
      const auto kind = static_cast<NoticeFailure>(mismatch.actual.reserved >> 8);
      transport::Envelope failed = mismatch.actual;
      failed.reserved = 0;
      failed.extra = 0;
      const char* what = kind == NoticeFailure::kNetwork    ? " died or closed its connections during "
                          : kind == NoticeFailure::kTimeout ? " did not arrive in time for "
                          : kind == NoticeFailure::kMismatch ? " called another collective than "
                                                             : " failed in ";
      std::string message = "rank " + std::to_string(call.rank()) + ": " + describe(call.envelope) + " failed: " +
                            rankDescription(call, culprit) + what + describe(failed) + ", reported by rank " +
                            std::to_string(reporter);
      Failure failure = Failure::kError;
      switch (kind) {
        case NoticeFailure::kNetwork: failure = Failure::kNetwork; break;
        case NoticeFailure::kTimeout: failure = Failure::kTimeout; break;
        case NoticeFailure::kMismatch: failure = Failure::kMismatch; break;
        case NoticeFailure::kError: break;
      }
      if (failure == Failure::kTimeout) {
        std::string unavailable;
        const std::vector<diagnostics::PeerProgress> peers = peerProgress(call, &unavailable);
        message += ". " + (peers.empty() ? unavailable
                                         : diagnostics::describeProgress(failed.sequence, shortName(failed), peers));
      }
      abandonPeers(call, culprit, failure, reporter);
      recordFailure(call, message, failure, failure == Failure::kMismatch ? Trace::kDump : Trace::kDumpAndLog);
      switch (failure) {
        case Failure::kNetwork: throw NetworkError(message);
        case Failure::kTimeout: throw TimeoutError(message);
        case Failure::kMismatch: throw CollectiveMismatchError(message);
        case Failure::kError: break;
      }
      throw Error(message);
    }
    const bool peerDetectedIt = (mismatch.actual.reserved & transport::kMismatchNotice) != 0;
    if (!peerDetectedIt) sendMismatchNotice(call, mismatch.peerRank);
    std::string message = "collective mismatch between rank " + std::to_string(call.rank()) + " and rank " +
                           std::to_string(mismatch.peerRank) + ": rank " + std::to_string(call.rank()) + " called " +
                           describe(mismatch.expected) + " but rank " + std::to_string(mismatch.peerRank) +
                           (peerDetectedIt ? " reports it called " : " called ") + describe(mismatch.actual);
    if (!peerDetectedIt && mismatch.expected == mismatch.actual && mismatch.expectedBytes != mismatch.actualBytes) {
      message += " (message of " + std::to_string(mismatch.actualBytes) + " bytes where " +
                 std::to_string(mismatch.expectedBytes) + " were expected)";
    }
    if (mismatch.actual.sequence < call.envelope.sequence) {
      // A message left over from an earlier call that returned here without reading it
      // (e.g. both ranks believed they were a broadcast's root): name this rank's side of
      // that call, from the flight recorder.
      for (const diagnostics::RecordedCall& earlier : call.comm.flightRecorder().snapshot()) {
        if (earlier.envelope.sequence == mismatch.actual.sequence) {
          message += "; at seq=" + std::to_string(earlier.envelope.sequence) + " rank " +
                     std::to_string(call.rank()) + " had called " + describe(earlier.envelope);
          break;
        }
      }
    }
    abandonPeers(call, mismatch.peerRank, Failure::kMismatch, mismatch.peerRank);
    recordFailure(call, message, Failure::kMismatch, Trace::kDump);
    throw CollectiveMismatchError(message);
  } catch (const PeerInAnotherCall& found) {
    const diagnostics::PeerProgress& other = found.peer;
    const std::string message = "collective mismatch between rank " + std::to_string(call.rank()) + " and rank " +
                                std::to_string(other.rank) + ": rank " + std::to_string(call.rank()) + " called " +
                                describe(call.envelope) + " but rank " + std::to_string(other.rank) + " called " +
                                other.started + " (from what rank " + std::to_string(other.rank) +
                                " published while this rank waited)";
    sendMismatchNotice(call, other.rank);
    abandonPeers(call, other.rank, Failure::kMismatch, other.rank);
    recordFailure(call, message, Failure::kMismatch, Trace::kDump);
    throw CollectiveMismatchError(message);
  } catch (const NetworkError& e) {
    const std::string message = inCall(call, e.what());
    const auto* peerError = dynamic_cast<const transport::PeerError*>(&e);
    abandonPeers(call, peerError != nullptr ? peerError->peerRank : -1, Failure::kNetwork, -1);
    recordFailure(call, message, Failure::kNetwork, Trace::kDumpAndLog);
    throw NetworkError(message);
  } catch (const detail::WaitTimeout& e) {
    const std::string timedOut = "rank " + std::to_string(call.rank()) + ": timed out after " +
                                 std::to_string(e.waited.count()) + " ms in " + describe(call.envelope) +
                                 " waiting for " + e.waitingFor;
    std::string unavailable;
    const std::vector<diagnostics::PeerProgress> peers = peerProgress(call, &unavailable);
    if (const diagnostics::PeerProgress* other = inAnotherCall(call, peers)) {
      const std::string message = "collective mismatch between rank " + std::to_string(call.rank()) + " and rank " +
                                  std::to_string(other->rank) + ": rank " + std::to_string(call.rank()) + " called " +
                                  describe(call.envelope) + " but rank " + std::to_string(other->rank) + " called " +
                                  other->started + " (found after " + timedOut + ")";
      sendMismatchNotice(call, other->rank);
      abandonPeers(call, other->rank, Failure::kMismatch, other->rank);
      recordFailure(call, message, Failure::kMismatch, Trace::kDump);
      throw CollectiveMismatchError(message);
    }
    const std::string message =
        timedOut + ". " +
        (peers.empty() ? unavailable
                       : diagnostics::describeProgress(call.envelope.sequence, shortName(call.envelope), peers));
    abandonPeers(call, firstAbsent(call, peers), Failure::kTimeout, -1);
    recordFailure(call, message, Failure::kTimeout, Trace::kDumpAndLog);
    throw TimeoutError(message);
  } catch (const TimeoutError& e) {
    const std::string message = inCall(call, e.what());
    abandonPeers(call, -1, Failure::kTimeout, -1);
    recordFailure(call, message, Failure::kTimeout, Trace::kDumpAndLog);
    throw TimeoutError(message);
  } catch (const detail::WaitAborted& e) {
    const std::string message = "rank " + std::to_string(call.rank()) + ": " + describe(call.envelope) +
                                " was aborted (abort() on its communicator or process group) while waiting for " +
                                e.waitingFor;
    recordFailure(call, message, Failure::kError, Trace::kNone);
    throw Error(message);
  } catch (const std::exception& e) {
    abandonPeers(call, -1, Failure::kError, -1);
    recordFailure(call, inCall(call, e.what()), Failure::kError, Trace::kNone);
    throw;
  }
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
