#include "transport/shm/pair.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include <ringtree/before_waiting.h>
#include <ringtree/error.h>

#include "common/copy.h"
#include "common/cpu.h"

namespace ringtree::transport::shm {

namespace {

// Claims a sleeper's flag after a seq_cst fence (the waker's half of the eventcount in
// protocol.h): true when the peer was asleep and must be sent a wake-up byte.
bool claimSleeper(std::atomic<uint32_t>& flag) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return flag.load(std::memory_order_relaxed) != 0 && flag.exchange(0, std::memory_order_relaxed) != 0;
}

// Longest single sleep of sendNotice() waiting for ring space, so that a missed wake-up
// costs at most this much.
constexpr int kMaxNoticeSleepMs = 100;

}  // namespace

ShmPair::ShmPair(PairSetup setup, int peerRank, std::string peerDescription, const PairOptions& options)
    : Pair(peerRank, std::move(peerDescription)),
      socket_(std::move(setup.socket)),
      tx_(std::move(setup.tx)),
      rx_(std::move(setup.rx)),
      txControl_(reinterpret_cast<RingControl*>(tx_.data())),
      rxControl_(reinterpret_cast<RingControl*>(rx_.data())),
      txRing_(tx_.data() + kRingOffset),
      rxRing_(rx_.data() + kRingOffset),
      txRingBytes_(setup.txRingBytes),
      rxRingBytes_(setup.rxRingBytes),
      peerPid_(setup.peerPid),
      peerReadsDirect_(setup.peerReadsDirect),
      weReadDirect_(setup.weReadDirect),
      directCopyThreshold_(options.directCopyThreshold),
      lastHealthCheck_(net::Clock::now()) {}

ShmPair::~ShmPair() = default;

void ShmPair::rethrowIfFailed() const {
  if (failure_) std::rethrow_exception(failure_);
}

void ShmPair::postSend(const Envelope& envelope, const void* data, size_t bytes) {
  rethrowIfFailed();
  if (data == nullptr && bytes > 0) {
    throw InvalidArgument("postSend to " + peerDescription() + ": null buffer of " + std::to_string(bytes) +
                          " bytes");
  }
  SendOp op;
  op.envelope = envelope;
  op.data = static_cast<const uint8_t*>(data);
  op.bytes = bytes;
  op.written = 0;
  op.headerWritten = false;
  op.direct = peerReadsDirect_ && bytes > 0 && bytes >= directCopyThreshold_;
  op.number = sendsPosted_++;
  sends_.push_back(std::move(op));
}

void ShmPair::postRecv(const Envelope& expected, void* data, size_t bytes, const Accumulate& accumulate) {
  rethrowIfFailed();
  if (data == nullptr && bytes > 0) {
    throw InvalidArgument("postRecv from " + peerDescription() + ": null buffer of " + std::to_string(bytes) +
                          " bytes");
  }
  if (accumulate.fn != nullptr &&
      (accumulate.elementSize == 0 || accumulate.elementSize > kMaxElementBytes ||
       bytes % accumulate.elementSize != 0)) {
    throw InvalidArgument("postRecv from " + peerDescription() + ": " + std::to_string(bytes) +
                          " bytes are not whole elements of " + std::to_string(accumulate.elementSize) +
                          " bytes (at most " + std::to_string(kMaxElementBytes) + ")");
  }
  recvs_.push_back(RecvOp{expected, static_cast<uint8_t*>(data), bytes, accumulate});
}

bool ShmPair::progress() {
  rethrowIfFailed();
  try {
    if (owedWakeBytes_ > 0) drainWakeBytes();
    if (idle()) return true;
    checkPeerAliveNowAndThen();
    // Once the peer is gone its head and tail are final: if this pass, which loads them
    // after the hang-up was seen, moves nothing, nothing will ever move again.
    const bool peerWasClosed = peerClosed_;
    bool moved = progressSends();
    moved = progressRecvs() || moved;
    if (idle()) return true;
    if (peerWasClosed && !moved && !refused_) {
      if (recvs_.empty()) throwIfNoticeOrOtherCall(nullptr);  // why it left, when it said
      throwPeerGone();
    }
    return false;
  } catch (...) {
    failure_ = std::current_exception();
    throw;
  }
}

void ShmPair::postTentativeRecv(const Envelope& expected, void* data, size_t bytes, const Accumulate& accumulate) {
  if (!recvs_.empty()) {
    throw InvalidArgument("postTentativeRecv from " + peerDescription() + " while another receive is posted");
  }
  postRecv(expected, data, bytes, accumulate);
  recvs_.back().tentative = true;
}

bool ShmPair::withdrawTentativeRecv() noexcept {
  if (recvs_.size() != 1 || !recvs_.front().tentative || haveHeader_) return false;
  recvs_.pop_front();
  refused_ = false;
  return true;
}

bool ShmPair::detachSends(net::Deadline deadline) {
  BeforeWaiting::notify();  // may wait for the peer to finish a pull
  const auto copyOf = [](const uint8_t* data, size_t bytes) {
    std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes]);
    std::memcpy(copy.get(), data, bytes);
    return copy;
  };
  for (DirectSend& send : directInFlight_) {
    if (send.copy != nullptr) continue;
    // Kept with the send from here on, whatever follows: a reader that took the message
    // after the address below was stored may be pulling from it.
    send.copy = copyOf(send.data, send.bytes);
    send.data = send.copy.get();
    DirectDescriptor& descriptor = txDescriptor(send.headerEnd);
    descriptor.address.store(reinterpret_cast<uintptr_t>(send.copy.get()), std::memory_order_relaxed);
    uint32_t state = kDirectPosted;
    if (!descriptor.state.compare_exchange_strong(state, kDirectMoved, std::memory_order_acq_rel)) {
      // The peer pulls from the caller's buffer (or the copy): that ends with a copy's time.
      try {
        while (reloadTail() < send.headerEnd) {
          checkPeerAlive();
          if (peerClosed_ || net::Clock::now() >= deadline) return false;
          std::this_thread::yield();
        }
      } catch (...) {
        return false;  // a peer that corrupted the tail: the pair fails on its next call
      }
    }
  }
  for (SendOp& op : sends_) {
    if (op.copy != nullptr || op.bytes == 0) continue;
    op.copy = copyOf(op.data, op.bytes);
    op.data = op.copy.get();
  }
  return true;
}

bool ShmPair::peerTookEverything() const noexcept {
  return sends_.empty() && directInFlight_.empty() &&
         txControl_->tail.load(std::memory_order_acquire) == writePosition_;
}

void ShmPair::detachRecvs() {
  for (RecvOp& op : recvs_) op.discard = true;
}

size_t ShmPair::pendingSends() const {
  if (directInFlight_.empty()) return sends_.size();
  return static_cast<size_t>(sendsPosted_ - directInFlight_.front().number);
}

bool ShmPair::peekIncoming(Envelope* envelope, size_t* bytes) {
  rethrowIfFailed();
  if (!recvs_.empty()) return false;
  try {
    if (owedWakeBytes_ > 0) drainWakeBytes();
    checkPeerAliveNowAndThen();
    // As in progress(): a header that is not there after the hang-up was seen never comes.
    const bool peerWasClosed = peerClosed_;
    const uint64_t end = alignToCacheLine(readPosition_) + sizeof(MessageHeader);
    if (cachedHead_ < end && reloadHead() < end) {
      if (peerWasClosed) {
        endedCleanly_ = cachedHead_ == readPosition_;
        throwPeerGone();
      }
      return false;
    }
    MessageHeader header;
    std::memcpy(&header, rxRing_ + (end - sizeof(MessageHeader)) % rxRingBytes_, sizeof(header));
    validateHeader(header);
    *envelope = header.envelope;
    *bytes = header.bytes;
    return true;
  } catch (...) {
    failure_ = std::current_exception();
    throw;
  }
}

bool ShmPair::takeIncoming(void* data, size_t bytes) {
  rethrowIfFailed();
  if (!recvs_.empty()) return false;
  try {
    // The header peekIncoming() validated: read again (the peer writes this memory), and
    // only an inline message of the size the caller expects is taken here.
    const uint64_t headerEnd = alignToCacheLine(readPosition_) + sizeof(MessageHeader);
    if (cachedHead_ < headerEnd) return false;
    MessageHeader header;
    std::memcpy(&header, rxRing_ + (headerEnd - sizeof(MessageHeader)) % rxRingBytes_, sizeof(header));
    if (header.marker != kHeaderMarker || header.kind != static_cast<uint32_t>(MessageKind::kInline) ||
        header.bytes != bytes) {
      return false;
    }
    const uint64_t end = headerEnd + bytes;
    if (cachedHead_ < end && reloadHead() < end) return false;  // still arriving
    if (bytes > 0) {
      auto* out = static_cast<uint8_t*>(data);
      const size_t offset = headerEnd % rxRingBytes_;
      const size_t first = std::min(bytes, rxRingBytes_ - offset);  // the rest wrapped round
      copyBytes(out, rxRing_ + offset, first);
      if (first < bytes) copyBytes(out + first, rxRing_, bytes - first);
    }
    readPosition_ = end;
    publishTail();
    return true;
  } catch (...) {
    failure_ = std::current_exception();
    throw;
  }
}

void ShmPair::checkIncoming(const Envelope* current) {
  rethrowIfFailed();
  if (!recvs_.empty()) return;
  try {
    if (owedWakeBytes_ > 0) drainWakeBytes();
    checkPeerAliveNowAndThen();
    throwIfNoticeOrOtherCall(current);
    // A peer that left before reading what this side wrote never will.
    if (peerClosed_ && (!sends_.empty() || !directInFlight_.empty() || reloadTail() < writePosition_)) {
      throwPeerGone();
    }
  } catch (...) {
    failure_ = std::current_exception();
    throw;
  }
}

void ShmPair::throwIfNoticeOrOtherCall(const Envelope* current) {
  const uint64_t end = alignToCacheLine(readPosition_) + sizeof(MessageHeader);
  if (cachedHead_ < end && reloadHead() < end) return;
  MessageHeader header;
  std::memcpy(&header, rxRing_ + (end - sizeof(MessageHeader)) % rxRingBytes_, sizeof(header));
  validateHeader(header);
  const bool otherCall =
      current != nullptr && header.envelope.sequence == current->sequence && header.envelope != *current;
  if (!isNotice(header.envelope) && !otherCall) return;
  throw EnvelopeMismatch(peerRank(), current != nullptr ? *current : Envelope{}, 0, header.envelope, header.bytes,
                         peerDescription() + " sent " + envelopeText(header.envelope, header.bytes) +
                             " where no message was expected");
}

bool ShmPair::progressSends() {
  bool moved = false;
  if (!directInFlight_.empty()) {
    if (cachedTail_ < directInFlight_.front().headerEnd) reloadTail();
    while (!directInFlight_.empty() && cachedTail_ >= directInFlight_.front().headerEnd) {
      directInFlight_.pop_front();
      moved = true;
    }
  }
  while (!sends_.empty()) {
    SendOp& op = sends_.front();
    if (!op.headerWritten) {
      const uint64_t position = alignToCacheLine(writePosition_);
      const uint64_t end = position + sizeof(MessageHeader) + (op.direct ? sizeof(DirectDescriptor) : 0);
      if (end - cachedTail_ > txRingBytes_ && end - reloadTail() > txRingBytes_) break;
      MessageHeader header{};
      header.envelope = op.envelope;
      header.bytes = op.bytes;
      header.kind = static_cast<uint32_t>(op.direct ? MessageKind::kDirect : MessageKind::kInline);
      header.marker = kHeaderMarker;
      std::memcpy(txRing_ + position % txRingBytes_, &header, sizeof(header));
      writePosition_ = end;
      op.headerWritten = true;
      moved = true;
      if (op.direct) {
        // The descriptor's line follows the header's: both start on a line boundary of a
        // ring whose size is a whole number of lines, so neither wraps. Published with
        // the header (publishHead's release store).
        DirectDescriptor& descriptor = txDescriptor(end);
        descriptor.address.store(reinterpret_cast<uintptr_t>(op.data), std::memory_order_relaxed);
        descriptor.state.store(kDirectPosted, std::memory_order_relaxed);
        directInFlight_.push_back(DirectSend{end, op.number, op.data, op.bytes, std::move(op.copy)});
        sends_.pop_front();
        continue;
      }
    }
    moved = writePayload(op) || moved;
    if (op.written < op.bytes) break;
    sends_.pop_front();
  }
  publishHead();
  const uint64_t next = alignToCacheLine(writePosition_);
  if (moved && sends_.empty() && next + kPrefetchLines * kCacheLineBytes - cachedTail_ <= txRingBytes_) {
    // The next message's header and first payload lines, free as far as this side knows:
    // last read by the peer, a ring ago. Taken back now, the next send's stores (and the
    // head store behind them) do not wait for them.
    for (uint64_t line = 0; line < kPrefetchLines; ++line) {
      prefetchForWrite(txRing_ + (next + line * kCacheLineBytes) % txRingBytes_);
    }
  }
  return moved;
}

bool ShmPair::writePayload(SendOp& op) {
  bool wrote = false;
  while (op.written < op.bytes) {
    uint64_t space = txRingBytes_ - (writePosition_ - cachedTail_);
    if (space == 0) {
      space = txRingBytes_ - (writePosition_ - reloadTail());
      if (space == 0) break;
    }
    const size_t offset = writePosition_ % txRingBytes_;
    const size_t n = std::min({static_cast<size_t>(space), op.bytes - op.written, txRingBytes_ - offset,
                               kPublishBytes});
    copyBytes(txRing_ + offset, op.data + op.written, n);
    writePosition_ += n;
    op.written += n;
    wrote = true;
    if (writePosition_ - publishedHead_ >= kPublishBytes) publishHead();
  }
  return wrote;
}

bool ShmPair::progressRecvs() {
  bool moved = false;
  while (!recvs_.empty()) {
    RecvOp& op = recvs_.front();
    if (!haveHeader_) {
      const uint64_t position = alignToCacheLine(readPosition_);
      uint64_t end = position + sizeof(MessageHeader);
      if (cachedHead_ < end && reloadHead() < end) break;
      MessageHeader header;
      std::memcpy(&header, rxRing_ + position % rxRingBytes_, sizeof(header));
      if (op.tentative) {
        validateHeader(header);
        if (header.envelope != op.expected || header.bytes != op.bytes) {
          refused_ = true;  // the message stays at our tail for whoever takes it
          break;
        }
      }
      checkHeader(header, op);
      if (header.kind == static_cast<uint32_t>(MessageKind::kDirect)) {
        // The descriptor is published with the header (one head store covers both).
        end += sizeof(DirectDescriptor);
        if (cachedHead_ < end && reloadHead() < end) {
          throwProtocolError("published a direct-copy header without its descriptor");
        }
      }
      header_ = header;
      haveHeader_ = true;
      headerEnd_ = end;
      delivered_ = 0;
      carryBytes_ = 0;
      moved = true;
      // A kDirect header stays in the ring until its payload is read: moving the tail
      // past it is what finishes the peer's send.
      if (header_.kind == static_cast<uint32_t>(MessageKind::kInline)) readPosition_ = end;
    }
    if (header_.kind == static_cast<uint32_t>(MessageKind::kDirect)) {
      pullDirect(op);
      readPosition_ = headerEnd_;
    } else {
      moved = readInlinePayload(op) || moved;
      if (delivered_ < op.bytes) break;
    }
    haveHeader_ = false;
    recvs_.pop_front();
    moved = true;
  }
  publishTail();
  return moved;
}

void ShmPair::validateHeader(const MessageHeader& header) const {
  const bool inlineKind = header.kind == static_cast<uint32_t>(MessageKind::kInline);
  const bool directKind = header.kind == static_cast<uint32_t>(MessageKind::kDirect);
  if (header.marker != kHeaderMarker || (!inlineKind && !directKind)) {
    std::ostringstream what;
    what << "corrupt message header at ring position " << alignToCacheLine(readPosition_) << " (marker 0x"
         << std::hex << header.marker << ", kind " << std::dec << header.kind << ")";
    throwProtocolError(what.str());
  }
  if (directKind && !weReadDirect_) {
    throwProtocolError("sent a direct-copy message although this process cannot read its memory");
  }
}

void ShmPair::checkHeader(const MessageHeader& header, const RecvOp& op) const {
  validateHeader(header);
  if (header.envelope != op.expected || header.bytes != op.bytes) {
    throw EnvelopeMismatch(peerRank(), op.expected, op.bytes, header.envelope, header.bytes,
                           peerDescription() + " sent a message of " + envelopeText(header.envelope, header.bytes) +
                               " where this rank expected " + envelopeText(op.expected, op.bytes));
  }
}

bool ShmPair::readInlinePayload(RecvOp& op) {
  bool consumedAny = false;
  while (delivered_ < op.bytes) {
    uint64_t available = cachedHead_ - readPosition_;
    if (available == 0) {
      available = reloadHead() - readPosition_;
      if (available == 0) break;
    }
    const size_t offset = readPosition_ % rxRingBytes_;
    const size_t contiguous = rxRingBytes_ - offset;
    const size_t n = std::min({static_cast<size_t>(available), op.bytes - delivered_, contiguous, kPublishBytes});
    const uint8_t* src = rxRing_ + offset;
    size_t consumed = n;
    if (op.discard) {
      // detached: consumed, not stored
    } else if (op.accumulate.fn == nullptr) {
      copyBytes(op.data + delivered_, src, n);
    } else {
      consumed = accumulateFromRing(op, src, n, n == contiguous);
      if (consumed == 0) {
        // Only part of the next element has arrived: wait unless more came meanwhile.
        if (reloadHead() - readPosition_ == available) break;
        continue;
      }
    }
    readPosition_ += consumed;
    delivered_ += consumed;
    consumedAny = true;
    if (readPosition_ - publishedTail_ >= kPublishBytes) publishTail();
  }
  return consumedAny;
}

size_t ShmPair::accumulateFromRing(RecvOp& op, const uint8_t* src, size_t n, bool atRingEnd) {
  const size_t elementSize = op.accumulate.elementSize;
  if (carryBytes_ > 0) {
    // Completing an element that the wrap-around split: its first carryBytes_ bytes were
    // the last bytes of the ring, and it belongs at delivered_ - carryBytes_.
    const size_t take = std::min(elementSize - carryBytes_, n);
    std::memcpy(carry_ + carryBytes_, src, take);
    carryBytes_ += take;
    if (carryBytes_ == elementSize) {
      op.accumulate.fn(op.data + delivered_ + take - elementSize, carry_, 1);
      carryBytes_ = 0;
    }
    return take;
  }
  const size_t whole = n - n % elementSize;
  if (whole > 0) {
    op.accumulate.fn(op.data + delivered_, src, whole / elementSize);
    return whole;
  }
  if (!atRingEnd) return 0;
  std::memcpy(carry_, src, n);
  carryBytes_ = n;
  return n;
}

DirectDescriptor& ShmPair::txDescriptor(uint64_t end) const {
  return *reinterpret_cast<DirectDescriptor*>(txRing_ + (end - sizeof(DirectDescriptor)) % txRingBytes_);
}

DirectDescriptor& ShmPair::rxDescriptor(uint64_t end) const {
  // The reader's one write into the peer's ring is the descriptor's state (protocol.h).
  return *reinterpret_cast<DirectDescriptor*>(const_cast<uint8_t*>(rxRing_) +
                                              (end - sizeof(DirectDescriptor)) % rxRingBytes_);
}

void ShmPair::pullDirect(RecvOp& op) {
  if (op.discard) return;  // detached: nothing to copy; moving the tail finishes the send
  BeforeWaiting::notify();  // a copy of at least the direct-copy threshold: long enough to count as a wait
  DirectDescriptor& descriptor = rxDescriptor(headerEnd_);
  uint32_t state = kDirectPosted;
  if (!descriptor.state.compare_exchange_strong(state, kDirectTaken, std::memory_order_acq_rel) &&
      state != kDirectMoved) {
    throwProtocolError("left a direct-copy descriptor in state " + std::to_string(state));
  }
  const uint64_t address = descriptor.address.load(std::memory_order_acquire);
  const auto* peerBuffer = reinterpret_cast<const void*>(static_cast<uintptr_t>(address));
  if (op.accumulate.fn == nullptr && !isShortCopyDistance(op.data, peerBuffer)) {
    readPeerMemory(op.data, address, op.bytes, op);
    return;
  }
  if (!bounce_) bounce_ = std::make_unique<uint8_t[]>(kBounceBytes + kPageBytes);  // zeroed: faulted in once
  const uintptr_t bounceStart = reinterpret_cast<uintptr_t>(bounce_.get());
  const size_t elementSize = op.accumulate.fn == nullptr ? 1 : op.accumulate.elementSize;
  const size_t chunk = kBounceBytes - kBounceBytes % elementSize;
  for (size_t offset = 0; offset < op.bytes; offset += chunk) {
    const size_t n = std::min(chunk, op.bytes - offset);
    const uint64_t source = address + offset;
    // The chunk at the source's page offset, so that the kernel copies at distance 0,
    // unless its elements are misaligned there (the reduction reads whole elements).
    const bool aligned = source % elementSize == 0;
    uint8_t* landing = bounce_.get() + (aligned ? (source - bounceStart) % kPageBytes : 0);
    readPeerMemory(landing, source, n, op);
    if (op.accumulate.fn == nullptr) {
      copyBytes(op.data + offset, landing, n);
    } else {
      op.accumulate.fn(op.data + offset, landing, n / elementSize);
    }
  }
}

void ShmPair::readPeerMemory(uint8_t* dst, uint64_t address, size_t bytes, const RecvOp& op) {
  size_t done = 0;
  while (done < bytes) {
    iovec local{dst + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(address + done)), bytes - done};
    const ssize_t rc = ::process_vm_readv(peerPid_, &local, 1, &remote, 1, 0);
    if (rc > 0) {
      done += static_cast<size_t>(rc);
      continue;
    }
    if (rc < 0 && errno == EINTR) continue;
    const int error = rc < 0 ? errno : EFAULT;
    std::ostringstream what;
    if (error == ESRCH) {
      what << peerDescription() << ": process " << peerPid_ << " exited during the receive of "
           << envelopeText(op.expected, op.bytes);
    } else {
      what << peerDescription() << ": cannot read its send buffer (pid " << peerPid_ << ", address 0x" << std::hex
           << address + done << std::dec << ", " << bytes - done << " bytes) for the receive of "
           << envelopeText(op.expected, op.bytes) << ": " << net::errnoText(error);
    }
    throw NetworkError(what.str());
  }
}

uint64_t ShmPair::reloadTail() {
  const uint64_t tail = txControl_->tail.load(std::memory_order_acquire);
  if (tail < cachedTail_ || tail > publishedHead_) {
    throwProtocolError("moved the tail of this rank's ring to " + std::to_string(tail) + " (valid: " +
                       std::to_string(cachedTail_) + " to " + std::to_string(publishedHead_) + ")");
  }
  cachedTail_ = tail;
  return tail;
}

uint64_t ShmPair::reloadHead() {
  const uint64_t head = rxControl_->head.load(std::memory_order_acquire);
  if (head < cachedHead_ || head - publishedTail_ > rxRingBytes_) {
    throwProtocolError("moved the head of its ring to " + std::to_string(head) + " (valid: " +
                       std::to_string(cachedHead_) + " to " + std::to_string(publishedTail_ + rxRingBytes_) + ")");
  }
  if (head != cachedHead_) {
    // The lines just published are about to be read (a header, then its payload): fetch
    // the first few at once rather than one miss after the other.
    uint64_t line = std::max(alignToCacheLine(readPosition_), cachedHead_ / kCacheLineBytes * kCacheLineBytes);
    const uint64_t last = std::min(head, line + kPrefetchLines * kCacheLineBytes);
    for (; line < last; line += kCacheLineBytes) __builtin_prefetch(rxRing_ + line % rxRingBytes_);
  }
  cachedHead_ = head;
  return head;
}

void ShmPair::publishHead() {
  if (writePosition_ == publishedHead_) return;
  publishedHead_ = writePosition_;
  txControl_->head.store(publishedHead_, std::memory_order_release);
  if (claimSleeper(txControl_->readerSleeping)) wakePeer();
}

void ShmPair::publishTail() {
  if (readPosition_ == publishedTail_) return;
  publishedTail_ = readPosition_;
  rxControl_->tail.store(publishedTail_, std::memory_order_release);
  if (claimSleeper(rxControl_->writerSleeping)) wakePeer();
}

void ShmPair::wakePeer() {
  const char byte = 0;
  for (;;) {
    if (::send(socket_.fd(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return;
    if (errno == EINTR) continue;
    // A full socket buffer already holds wake-ups; anything else means the peer is gone.
    if (errno != EAGAIN && errno != EWOULDBLOCK) peerClosed_ = true;
    return;
  }
}

void ShmPair::drainWakeBytes() {
  char buffer[64];
  for (;;) {
    const ssize_t rc = ::recv(socket_.fd(), buffer, sizeof(buffer), MSG_DONTWAIT);
    if (rc > 0) {
      owedWakeBytes_ -= std::min(owedWakeBytes_, static_cast<size_t>(rc));
      if (static_cast<size_t>(rc) < sizeof(buffer)) return;
      continue;
    }
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
      peerClosed_ = true;
      owedWakeBytes_ = 0;
    }
    return;
  }
}

void ShmPair::checkPeerAlive() {
  if (net::hungUp(socket_.fd())) peerClosed_ = true;
}

void ShmPair::checkPeerAliveNowAndThen() {
  if (++callsSinceClock_ < kClockCheckCalls) return;
  callsSinceClock_ = 0;
  const auto now = net::Clock::now();
  if (now - lastHealthCheck_ >= kHealthCheckInterval) {
    lastHealthCheck_ = now;
    checkPeerAlive();
  }
}

void ShmPair::armWait(pollfd* pfd) { arm(pfd, /*incoming=*/false); }

void ShmPair::armWaitForIncoming(pollfd* pfd) { arm(pfd, /*incoming=*/true); }

void ShmPair::arm(pollfd* pfd, bool incoming) {
  pfd->fd = socket_.fd();
  pfd->events = POLLIN;
  pfd->revents = 0;
  armedRead_ = incoming || !recvs_.empty();
  armedWrite_ = !sends_.empty() || !directInFlight_.empty();
  if (armedRead_) rxControl_->readerSleeping.store(1, std::memory_order_relaxed);
  if (armedWrite_) txControl_->writerSleeping.store(1, std::memory_order_relaxed);
  // The sleeper's half of the eventcount: the caller's next progress() loads the
  // counters only after this fence.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ShmPair::disarmWait() {
  // A flag the peer already cleared means it sent (or is about to send) a wake-up byte.
  if (armedRead_ && rxControl_->readerSleeping.exchange(0, std::memory_order_relaxed) == 0) ++owedWakeBytes_;
  if (armedWrite_ && txControl_->writerSleeping.exchange(0, std::memory_order_relaxed) == 0) ++owedWakeBytes_;
  armedRead_ = false;
  armedWrite_ = false;
  drainWakeBytes();
}

bool ShmPair::waitForSpace(uint64_t end, net::Deadline deadline) {
  BeforeWaiting::notify();
  for (;;) {
    if (end - reloadTail() <= txRingBytes_) return true;
    if (peerClosed_ || net::Clock::now() >= deadline) return false;
    txControl_->writerSleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (end - reloadTail() > txRingBytes_) {
      int timeoutMs = net::pollTimeoutMs(deadline);
      if (timeoutMs < 0 || timeoutMs > kMaxNoticeSleepMs) timeoutMs = kMaxNoticeSleepMs;
      pollfd pfd{socket_.fd(), POLLIN, 0};
      ::poll(&pfd, 1, timeoutMs);
    }
    // A flag the peer already cleared means it sent (or is about to send) a wake-up byte.
    if (txControl_->writerSleeping.exchange(0, std::memory_order_relaxed) == 0) ++owedWakeBytes_;
    drainWakeBytes();
  }
}

void ShmPair::sendNotice(const Envelope& notice, net::Deadline deadline) noexcept {
  try {
    if (sends_.empty() || !sends_.front().headerWritten) {
      const uint64_t position = alignToCacheLine(writePosition_);
      const uint64_t end = position + sizeof(MessageHeader);
      if (waitForSpace(end, deadline)) {
        MessageHeader header{};
        header.envelope = notice;
        header.bytes = 0;
        header.kind = static_cast<uint32_t>(MessageKind::kInline);
        header.marker = kHeaderMarker;
        std::memcpy(txRing_ + position % txRingBytes_, &header, sizeof(header));
        writePosition_ = end;
        publishHead();
      }
    }
  } catch (...) {
    // Best effort: a failure only means the peer does not learn why this rank gave up.
  }
  ::shutdown(socket_.fd(), SHUT_WR);
  sends_.clear();
  directInFlight_.clear();
  recvs_.clear();
  haveHeader_ = false;
  if (failure_) return;
  try {
    throw NetworkError(peerDescription() + ": the shared-memory connection was abandoned after a failed call");
  } catch (...) {
    failure_ = std::current_exception();  // that NetworkError, or bad_alloc building it
  }
}

std::string ShmPair::pendingText() const {
  std::ostringstream out;
  if (!recvs_.empty()) {
    out << "the receive of " << envelopeText(recvs_.front().expected, recvs_.front().bytes);
    if (haveHeader_) out << " (" << delivered_ << " bytes arrived)";
    if (recvs_.size() > 1) out << " and " << recvs_.size() - 1 << " later receives";
  }
  const size_t sends = sends_.size() + directInFlight_.size();
  if (sends > 0) {
    if (!recvs_.empty()) out << ", ";
    out << sends << (sends == 1 ? " send" : " sends");
    if (!sends_.empty()) out << " (the next: " << envelopeText(sends_.front().envelope, sends_.front().bytes) << ")";
  }
  if (recvs_.empty() && sends == 0) out << "no operation";
  return out.str();
}

void ShmPair::throwProtocolError(const std::string& what) const {
  throw PeerError(peerRank(), peerDescription() + " broke the shared-memory protocol: " + what + "; pending: " +
                     pendingText());
}

void ShmPair::throwPeerGone() const {
  throw PeerError(peerRank(), peerDescription() + " closed the shared-memory connection (its process exited or its pair " +
                     "was destroyed); pending: " + pendingText());
}

}  // namespace ringtree::transport::shm
