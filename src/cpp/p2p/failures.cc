#include <algorithm>
#include <cstring>
#include <utility>

#include <ringtree/error.h>
#include <ringtree/p2p.h>

#include "common/copy.h"
#include "common/logging.h"
#include "p2p/engine.h"
#include "p2p/wire.h"

// Completing Works, the errors they carry, and giving up connections: failed peers,
// deadlines, shutdown.
namespace ringtree::detail {

namespace {

using p2p::MessageKind;

}  // namespace

void PointToPointEngine::complete(const Owner& owner, std::exception_ptr error, Completions* done, int sourceRank) {
  --pendingOperations_;
  if (owner.call != nullptr) owner.call->completed = true;
  if (owner.progress != nullptr) {
    owner.progress->completed = true;
    if (BlockingCall* driver = owner.progress->driver) {
      driver->completed = true;
      driver->waiter.nudge();  // out of its poll(): its wait is over
    }
  }
  Completion completion;
  completion.owner = owner;
  completion.error = std::move(error);
  completion.sourceRank = sourceRank;
  done->push_back(std::move(completion));
}

void PointToPointEngine::finishAll(Completions* done) {
  for (Completion& completion : *done) {
    if (completion.copyBytes > 0) ringtree::copyBytes(completion.copyTo, completion.copyFrom.get(), completion.copyBytes);
    completion.copyFrom.reset();
    if (completion.owner.call != nullptr) {
      // Its caller may return as soon as this has run.
      completion.owner.call->waiter.finish(std::move(completion.error), completion.sourceRank);
      continue;
    }
    Work& work = *completion.owner.work;
    if (completion.sourceRank >= 0) work.setSourceRank(completion.sourceRank);
    work.finish(completion.error);
  }
  done->clear();
}

std::exception_ptr PointToPointEngine::errorFor(FailureKind kind, const std::string& operation,
                                                const std::string& reason) const {
  const std::string message = "rank " + std::to_string(rank_) + ": " + operation + " failed: " + reason;
  switch (kind) {
    case FailureKind::kBroken:
    case FailureKind::kGivenUp: return std::make_exception_ptr(NetworkError(message));
    case FailureKind::kMismatch: return std::make_exception_ptr(CollectiveMismatchError(message));
    case FailureKind::kShutdown: break;
  }
  return std::make_exception_ptr(Error(message));
}

std::string PointToPointEngine::describe(const Receive& receive) const {
  return receive.opName + (" from " + p2p::peerText(receive.peer)) + " (tag " + std::to_string(receive.tag) + ", " +
         p2p::typeAndCount(receive.type, receive.count) + ")";
}

std::string PointToPointEngine::describe(int peer, const Send& send) const {
  return send.opName + (" to rank " + std::to_string(peer)) + " (tag " + std::to_string(send.tag) + ", " +
         p2p::typeAndCount(send.type, send.count) + ")";
}

bool PointToPointEngine::anyPeerLive() const {
  return std::any_of(peers_.begin(), peers_.end(), [](const Peer& p) { return p.pair != nullptr && !p.failed; });
}

void PointToPointEngine::failPeer(int index, FailureKind kind, const std::string& reason,
                                  const transport::Envelope* notice, Completions* done) {
  Peer& peer = peers_[static_cast<size_t>(index)];
  if (peer.failed) return;
  RINGTREE_DEBUG("rank " << rank_ << " gives up its point-to-point connection to rank " << index << ": " << reason);
  peer.failed = true;
  peer.failureKind = kind;
  peer.failureReason = reason;
  // Drops what the pair holds: it never touches those buffers again.
  if (notice != nullptr) peer.pair->sendNotice(*notice, net::deadlineAfter(kNoticeTimeout));
  for (const Send& send : peer.sends) complete(send.owner, errorFor(kind, describe(index, send), reason), done);
  peer.sends.clear();
  if (peer.transfer == Transfer::kIntoReceive) {
    complete(peer.transferReceive->owner, errorFor(kind, describe(*peer.transferReceive), reason), done);
  }
  peer.transferReceive.reset();
  if (peer.transfer == Transfer::kIntoUnexpected) {
    Unexpected& arriving = peer.unexpected.back();
    if (arriving.taker) complete(arriving.taker->owner, errorFor(kind, describe(*arriving.taker), reason), done);
    peer.unexpected.pop_back();  // messages that arrived completely stay receivable
  }
  peer.transfer = Transfer::kNone;
  peer.headLeftInPair = false;
  for (const ReceivePtr& receive : peer.receives) {
    complete(receive->owner, errorFor(kind, describe(*receive), reason), done);
  }
  peer.receives.clear();
  const bool othersLive = anyPeerLive();
  if (kind == FailureKind::kBroken || !othersLive) {
    const std::string why = othersLive ? reason : reason + " (and no other rank can send to this rank any more)";
    for (const ReceivePtr& receive : anySourceReceives_) {
      complete(receive->owner, errorFor(kind, describe(*receive), why), done);
    }
    anySourceReceives_.clear();
  }
}

void PointToPointEngine::failAllForShutdown(Completions* done) {
  const std::string reason = "the point-to-point engine was shut down";
  for (size_t index = 0; index < peers_.size(); ++index) {
    Peer& peer = peers_[index];
    for (const Send& send : peer.sends) {
      complete(send.owner, errorFor(FailureKind::kShutdown, describe(static_cast<int>(index), send), reason), done);
    }
    peer.sends.clear();
    if (peer.transferReceive) {
      complete(peer.transferReceive->owner, errorFor(FailureKind::kShutdown, describe(*peer.transferReceive), reason),
               done);
      peer.transferReceive.reset();
    }
    for (Unexpected& message : peer.unexpected) {
      if (message.taker) {
        complete(message.taker->owner, errorFor(FailureKind::kShutdown, describe(*message.taker), reason), done);
        message.taker.reset();
      }
    }
    for (const ReceivePtr& receive : peer.receives) {
      complete(receive->owner, errorFor(FailureKind::kShutdown, describe(*receive), reason), done);
    }
    peer.receives.clear();
    peer.transfer = Transfer::kNone;  // the pair is never progressed again
  }
  for (const ReceivePtr& receive : anySourceReceives_) {
    complete(receive->owner, errorFor(FailureKind::kShutdown, describe(*receive), reason), done);
  }
  anySourceReceives_.clear();
}

void PointToPointEngine::failDueOperations(Completions* done) {
  const auto now = net::Clock::now();
  if (now < nextDeadline_) return;
  const auto timedOut = [this](const std::string& operation) {
    return std::make_exception_ptr(TimeoutError("rank " + std::to_string(rank_) + ": " + operation +
                                                " timed out after " + std::to_string(timeout_.count()) + " ms"));
  };
  // Removes the due receives of a matching queue; returns the earliest deadline left.
  const auto expireQueue = [&](std::deque<ReceivePtr>* queue) {
    net::Deadline earliest = net::kNoDeadline;
    for (auto it = queue->begin(); it != queue->end();) {
      if ((*it)->deadline <= now) {
        complete((*it)->owner, timedOut(describe(**it)), done);
        it = queue->erase(it);
      } else {
        earliest = std::min(earliest, (*it)->deadline);
        ++it;
      }
    }
    return earliest;
  };
  net::Deadline next = net::kNoDeadline;
  for (size_t i = 0; i < peers_.size(); ++i) {
    const int index = static_cast<int>(i);
    Peer& peer = peers_[i];
    if (peer.pair == nullptr || peer.failed) continue;
    // A due send or arriving receive has its buffer in the pair: only giving up the
    // connection takes it back.
    std::string culprit;
    if (!peer.sends.empty() && peer.sends.front().deadline <= now) {
      culprit = describe(index, peer.sends.front());
      complete(peer.sends.front().owner, timedOut(culprit), done);
      peer.sends.pop_front();
    } else if (peer.transfer == Transfer::kIntoReceive && peer.transferReceive->deadline <= now) {
      culprit = describe(*peer.transferReceive);
      complete(peer.transferReceive->owner, timedOut(culprit), done);
      peer.transfer = Transfer::kNone;
      peer.transferReceive.reset();
    }
    if (!culprit.empty()) {
      const transport::Envelope abandon = p2p::notice(MessageKind::kAbandonNotice);
      failPeer(index, FailureKind::kGivenUp, "the connection to rank " + std::to_string(index) +
                                                 " was given up after the " + culprit + " timed out",
               &abandon, done);
      continue;
    }
    next = std::min(next, expireQueue(&peer.receives));
    if (!peer.sends.empty()) next = std::min(next, peer.sends.front().deadline);
    if (peer.transfer == Transfer::kIntoReceive) next = std::min(next, peer.transferReceive->deadline);
    if (peer.transfer == Transfer::kIntoUnexpected && peer.unexpected.back().taker &&
        peer.unexpected.back().taker->deadline <= now) {
      const ReceivePtr taker = std::move(peer.unexpected.back().taker);
      complete(taker->owner, timedOut(describe(*taker)), done);
      // Freed: the oldest queued receive that matches takes it (which may fail the peer).
      offerUnexpected(index, peer.unexpected.size() - 1, done);
    }
    if (!peer.failed && peer.transfer == Transfer::kIntoUnexpected && peer.unexpected.back().taker) {
      next = std::min(next, peer.unexpected.back().taker->deadline);
    }
  }
  next = std::min(next, expireQueue(&anySourceReceives_));
  nextDeadline_ = next;  // every operation still pending was counted
}

}  // namespace ringtree::detail
