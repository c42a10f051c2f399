#include <algorithm>
#include <limits>
#include <utility>

#include <ringtree/error.h>
#include <ringtree/p2p.h>

#include "p2p/engine.h"
#include "p2p/wire.h"

// Where each incoming message goes: matching messages with receives, unexpected
// messages, notices, and the checks on what a peer sends.
namespace ringtree::detail {

namespace {

using p2p::MessageKind;

constexpr int kAnySource = PointToPoint::kAnySource;

}  // namespace

PointToPointEngine::ReceivePtr PointToPointEngine::takeMatchingReceive(int index, int tag) {
  auto& own = peers_[static_cast<size_t>(index)].receives;
  const auto hasTag = [tag](const ReceivePtr& r) { return r->tag == tag; };
  const auto fromPeer = std::find_if(own.begin(), own.end(), hasTag);
  const auto fromAny = std::find_if(anySourceReceives_.begin(), anySourceReceives_.end(), hasTag);
  const bool useAny =
      fromAny != anySourceReceives_.end() && (fromPeer == own.end() || (*fromAny)->order < (*fromPeer)->order);
  if (useAny) {
    ReceivePtr receive = std::move(*fromAny);
    anySourceReceives_.erase(fromAny);
    return receive;
  }
  if (fromPeer == own.end()) return nullptr;
  ReceivePtr receive = std::move(*fromPeer);
  own.erase(fromPeer);
  return receive;
}

bool PointToPointEngine::receivesMayWaitBehind(const Peer& peer) const {
  return !peer.receives.empty() || !anySourceReceives_.empty();
}

bool PointToPointEngine::takeUnexpected(const ReceivePtr& receive, Completions* done) {
  int bestPeer = -1;
  size_t bestIndex = 0;
  uint64_t bestArrival = std::numeric_limits<uint64_t>::max();
  for (int source = 0; source < size_; ++source) {
    if (receive->peer != kAnySource && receive->peer != source) continue;
    const auto& queue = peers_[static_cast<size_t>(source)].unexpected;
    for (size_t i = 0; i < queue.size(); ++i) {
      const Unexpected& message = queue[i];
      if (message.taker || message.envelope.tag != receive->tag) continue;
      if (message.arrival < bestArrival) {
        bestPeer = source;
        bestIndex = i;
        bestArrival = message.arrival;
      }
      break;  // later ones of this peer arrived after it
    }
  }
  if (bestPeer < 0) return false;
  serveFromUnexpected(bestPeer, bestIndex, receive, done);
  return true;
}

void PointToPointEngine::offerUnexpected(int index, size_t position, Completions* done) {
  const int tag = peers_[static_cast<size_t>(index)].unexpected[position].envelope.tag;
  if (ReceivePtr receive = takeMatchingReceive(index, tag)) serveFromUnexpected(index, position, receive, done);
}

void PointToPointEngine::serveFromUnexpected(int index, size_t position, const ReceivePtr& receive,
                                             Completions* done) {
  auto& queue = peers_[static_cast<size_t>(index)].unexpected;
  Unexpected& message = queue[position];
  if (message.envelope.dataType != static_cast<uint8_t>(receive->type) || message.envelope.count != receive->count) {
    const transport::Envelope envelope = message.envelope;
    if (message.complete) queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(position));
    reportMismatch(index, receive, envelope, done);  // drops it if it is still arriving
    return;
  }
  if (!message.complete) {
    // Waits for the rest of the message: due after the timeout from its posting (a receive
    // posted just now gets its deadline here, see postReceive).
    if (receive->deadline == net::kNoDeadline) receive->deadline = net::deadlineAfter(timeout_);
    nextDeadline_ = std::min(nextDeadline_, receive->deadline);
    message.taker = receive;
    return;
  }
  complete(receive->owner, nullptr, done, index);
  Completion& completion = done->back();
  completion.copyFrom = std::move(message.data);
  completion.copyTo = receive->data;
  completion.copyBytes = receive->bytes;
  queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(position));
}

void PointToPointEngine::reportMismatch(int index, const ReceivePtr& receive, const transport::Envelope& message,
                                        Completions* done) {
  const std::string reason = "point-to-point mismatch between rank " + std::to_string(rank_) + " and rank " +
                             std::to_string(index) + ": rank " + std::to_string(rank_) + "'s " + receive->opName +
                             " from " + p2p::peerText(receive->peer) + " with tag " + std::to_string(receive->tag) +
                             " expects " + p2p::typeAndCount(receive->type, receive->count) + " but rank " +
                             std::to_string(index) + " sent " + p2p::typeAndCount(message.dataType, message.count) +
                             " with that tag";
  complete(receive->owner, std::make_exception_ptr(CollectiveMismatchError(reason)), done);
  const transport::Envelope notice = p2p::mismatchNotice(message, receive->type, receive->count);
  failPeer(index, FailureKind::kMismatch, reason, &notice, done);
}

void PointToPointEngine::handleNotice(int index, const transport::Envelope& notice, Completions* done) {
  Peer& peer = peers_[static_cast<size_t>(index)];
  const transport::Envelope abandon = p2p::notice(MessageKind::kAbandonNotice);
  const std::string self = "rank " + std::to_string(rank_);
  const std::string other = "rank " + std::to_string(index);
  switch (static_cast<MessageKind>(notice.noticeKind)) {
    case MessageKind::kMismatchNotice: {
      const std::string expected = p2p::typeAndCount(notice.dataType, notice.count);
      const auto sent = std::find_if(peer.sends.begin(), peer.sends.end(),
                                     [&](const Send& s) { return s.sequence == notice.sequence; });
      std::string reason = "point-to-point mismatch between " + self + " and " + other + ": ";
      if (sent != peer.sends.end()) {
        reason += self + " sent " + p2p::typeAndCount(sent->type, sent->count) + " with tag " +
                  std::to_string(sent->tag) + " but " + other + "'s receive for it expects " + expected;
        complete(sent->owner, std::make_exception_ptr(CollectiveMismatchError(reason)), done);
        peer.sends.erase(sent);
      } else {
        reason += other + "'s receive for " + self + "'s message number " + std::to_string(notice.sequence) +
                  " with tag " + std::to_string(notice.tag) + " (sent as " +
                  (notice.sentDataType < kNumDataTypes ? dataTypeName(static_cast<DataType>(notice.sentDataType))
                                                       : "?") +
                  ") expects " + expected;
      }
      failPeer(index, FailureKind::kMismatch, reason, &abandon, done);
      return;
    }
    case MessageKind::kAbandonNotice:
      failPeer(index, FailureKind::kGivenUp,
               other + " gave up its point-to-point connection with " + self + " after an operation failed there",
               &abandon, done);
      return;
    case MessageKind::kClosedNotice:
      failPeer(index, FailureKind::kGivenUp, other + " shut down its point-to-point engine", &abandon, done);
      return;
    case MessageKind::kData: break;
  }
  throw NetworkError(self + " received from " + peer.pair->peerDescription() + " a notice of unknown kind " +
                     std::to_string(notice.noticeKind));
}

bool PointToPointEngine::acceptIncoming(int index, const transport::Envelope& envelope, size_t bytes,
                                        Completions* done) {
  Peer& peer = peers_[static_cast<size_t>(index)];
  const auto protocolError = [&](const std::string& what) {
    return NetworkError("rank " + std::to_string(rank_) + " received from " + peer.pair->peerDescription() +
                        " a message that breaks the point-to-point protocol: " + what +
                        " (is its communicator shared with collectives?)");
  };
  if (envelope.operation != p2p::kMessageOperation) {
    throw protocolError("operation " + std::to_string(envelope.operation));
  }
  if (envelope.noticeKind != static_cast<uint8_t>(MessageKind::kData)) {
    handleNotice(index, envelope, done);
    return false;
  }
  size_t countBytes = 0;
  if (envelope.dataType >= kNumDataTypes ||
      __builtin_mul_overflow(envelope.count, elementSize(static_cast<DataType>(envelope.dataType)), &countBytes) ||
      countBytes != bytes || envelope.tag < 0) {
    throw protocolError(p2p::typeAndCount(envelope.dataType, envelope.count) + " in " + std::to_string(bytes) +
                        " bytes with tag " + std::to_string(envelope.tag));
  }
  if (envelope.sequence != peer.nextReceiveSequence) {
    throw protocolError("message number " + std::to_string(envelope.sequence) + " where " +
                        std::to_string(peer.nextReceiveSequence) + " was next");
  }
  if (ReceivePtr receive = takeMatchingReceive(index, envelope.tag)) {
    if (envelope.dataType != static_cast<uint8_t>(receive->type) || envelope.count != receive->count) {
      reportMismatch(index, receive, envelope, done);
      return false;
    }
    // The peer's transfer from here on, so that a pair that throws below fails it with the
    // peer (failPeer) rather than lose it. A message that has arrived whole is taken at
    // once; otherwise it lands as it comes.
    peer.transfer = Transfer::kIntoReceive;
    peer.transferReceive = std::move(receive);
    if (peer.pair->takeIncoming(peer.transferReceive->data, bytes)) {
      complete(peer.transferReceive->owner, nullptr, done, index);
      peer.transfer = Transfer::kNone;
      peer.transferReceive.reset();
    } else {
      peer.pair->postRecv(envelope, peer.transferReceive->data, bytes);
    }
  } else if (bytes <= kEagerBytes || receivesMayWaitBehind(peer)) {
    Unexpected message;
    message.envelope = envelope;
    message.arrival = nextArrival_++;
    message.data.reset(new uint8_t[bytes]);
    message.bytes = bytes;
    message.complete = peer.pair->takeIncoming(message.data.get(), bytes);
    if (!message.complete) {
      peer.pair->postRecv(envelope, message.data.get(), bytes);
      peer.transfer = Transfer::kIntoUnexpected;
    }
    peer.unexpected.push_back(std::move(message));
  } else {
    peer.headLeftInPair = true;
    return false;
  }
  ++peer.nextReceiveSequence;
  return true;
}

}  // namespace ringtree::detail
