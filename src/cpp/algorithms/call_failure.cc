#include "algorithms/call_failure.h"

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <ringtree/before_waiting.h>
#include <ringtree/error.h>

#include "common/logging.h"
#include "diagnostics/arena_status.h"
#include "diagnostics/flight_recorder.h"
#include "diagnostics/peer_status.h"

// How a call fails (failCall): the error it throws, the notices that tell the peers, the
// traces it leaves, and the long waits' check that the peers are in the same call.
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

// "allreduce(seq=7)": a call named briefly, where its full description was given before.
std::string shortName(const transport::Envelope& envelope) {
  return std::string(collectiveName(collectiveOf(envelope))) + "(seq=" + std::to_string(envelope.sequence) + ")";
}

using Failure = detail::CommunicatorImpl::Failure;

// What the other ranks were doing when `call` timed out: from the node arena when there
// is one, else from the statuses they published in the store. Empty, with *unavailable
// saying why, when neither can tell.
std::vector<diagnostics::PeerProgress> peerProgress(Call& call, std::string* unavailable,
                                                    std::chrono::milliseconds budget = kStatusReadBudget) {
  if (call.comm.arena() != nullptr) return diagnostics::readArenaPeers(*call.comm.arena(), &describe);
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
    diagnostics::announceFinished(call.comm.arena(), call.envelope.sequence, true, now);
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
  notice.noticeKind = transport::kAbandonNotice;
  notice.noticeFailure = noticeFailureOf(failure);
  notice.culprit = culprit >= 0 ? culprit : call.rank();
  const net::Deadline deadline = net::deadlineAfter(kNoticeTimeout);
  for (int peer = 0; peer < call.size(); ++peer) {
    if (peer != call.rank() && peer != skip) call.comm.pair(peer).sendNotice(notice, deadline);
  }
}

// Tells `peer` what this rank called (a mismatch notice), so that it fails with the same
// diagnosis. Best effort, bounded. Never throws.
void sendMismatchNotice(Call& call, int peer) noexcept {
  transport::Envelope notice = call.envelope;
  notice.noticeKind = transport::kMismatchNotice;
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

void checkPeersCalls(void* context) {
  Call& call = *static_cast<Call*>(context);
  std::string unavailable;
  const std::vector<diagnostics::PeerProgress> peers = peerProgress(call, &unavailable, kStallReadBudget);
  if (const diagnostics::PeerProgress* other = inAnotherCall(call, peers)) throw PeerInAnotherCall(*other);
}

void throwBroken(const detail::CommunicatorImpl& comm, const transport::Envelope& envelope) {
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

void failCall(Call& call, std::exception_ptr error) {
  // What follows may wait (notices to peers, the peers' status through the store).
  BeforeWaiting::notify();
  try {
    std::rethrow_exception(error);
  } catch (const transport::EnvelopeMismatch& mismatch) {
    if (transport::isAbandonNotice(mismatch.actual)) {
      // A peer gave up on a call: fail with its cause, naming the rank that caused it,
      // and pass the notice on (a peer that waits on this rank only learns it from here).
      const int reporter = mismatch.peerRank;
      const int culprit = mismatch.actual.culprit;
      const NoticeFailure kind = mismatch.actual.noticeFailure;
      transport::Envelope failed = mismatch.actual;  // the call that failed, as the notice describes it
      failed.noticeKind = 0;
      failed.noticeFailure = NoticeFailure::kError;
      failed.culprit = -1;
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
    const bool peerDetectedIt = mismatch.actual.noticeKind == transport::kMismatchNotice;
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
    // The call's own timeout, not the last wait's length (the call's earlier steps
    // count too, and a wake-up a few ms past the deadline is no part of it).
    const std::string timedOut = "rank " + std::to_string(call.rank()) + ": timed out after " +
                                 std::to_string(call.timeout.count()) + " ms in " + describe(call.envelope) +
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
    // The peers learn it now, as a rank that closes its connections (which this one does
    // next), and the pairs let go of this call's buffers while they are still valid (the
    // connections may outlive this communicator: other communicators use them).
    abandonPeers(call, -1, Failure::kNetwork, -1);
    recordFailure(call, message, Failure::kError, Trace::kNone);
    throw Error(message);
  } catch (const std::exception& e) {
    abandonPeers(call, -1, Failure::kError, -1);
    recordFailure(call, inCall(call, e.what()), Failure::kError, Trace::kNone);
    throw;
  }
}

}  // namespace ringtree::algorithms
