#include "transport/tcp/pair.h"

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <ringtree/error.h>

#include "common/copy.h"

namespace ringtree::transport::tcp {

namespace {

// iovecs handed to one sendmsg(): header and payload of up to half as many messages.
constexpr int kMaxIovecs = 64;

bool isClosedError(int error) { return error == EPIPE || error == ECONNRESET || error == ENOTCONN; }

void setBufferSize(int fd, int option, int bytes, const char* name) {
  if (::setsockopt(fd, SOL_SOCKET, option, &bytes, sizeof(bytes)) != 0) {
    throw NetworkError(std::string("cannot set ") + name + ": " + net::errnoText(errno));
  }
}

}  // namespace

TcpPair::TcpPair(net::Socket socket, int selfRank, int peerRank, std::string peerDescription,
                 const PairOptions& options)
    : Pair(peerRank, std::move(peerDescription)),
      socket_(std::move(socket)),
      selfRank_(selfRank),
      staging_(new uint8_t[kStagingBytes]) {
  try {
    net::setNonBlocking(socket_.fd());
    net::setNoDelay(socket_.fd());
    if (options.socketBufferBytes > 0) {
      setBufferSize(socket_.fd(), SO_SNDBUF, options.socketBufferBytes, "SO_SNDBUF");
      setBufferSize(socket_.fd(), SO_RCVBUF, options.socketBufferBytes, "SO_RCVBUF");
    }
  } catch (const NetworkError& e) {
    throw NetworkError("connection to " + Pair::peerDescription() + ": " + e.what());
  }
}

TcpPair::~TcpPair() = default;

void TcpPair::rethrowIfFailed() const {
  if (failure_) std::rethrow_exception(failure_);
}

void TcpPair::postSend(const Envelope& envelope, const void* data, size_t bytes) {
  rethrowIfFailed();
  if (data == nullptr && bytes > 0) {
    throw InvalidArgument("postSend to " + peerDescription() + ": null buffer of " +
                          std::to_string(bytes) + " bytes");
  }
  SendOp op;
  op.header.envelope = envelope;
  op.header.bytes = bytes;
  op.data = static_cast<const uint8_t*>(data);
  sends_.push_back(std::move(op));
}

void TcpPair::postRecv(const Envelope& expected, void* data, size_t bytes, const Accumulate& accumulate) {
  rethrowIfFailed();
  if (data == nullptr && bytes > 0) {
    throw InvalidArgument("postRecv from " + peerDescription() + ": null buffer of " +
                          std::to_string(bytes) + " bytes");
  }
  if (accumulate.fn != nullptr &&
      (accumulate.elementSize == 0 || accumulate.elementSize > kStagingBytes / 2 ||
       bytes % accumulate.elementSize != 0)) {
    throw InvalidArgument("postRecv from " + peerDescription() + ": " + std::to_string(bytes) +
                          " bytes is not a whole number of " + std::to_string(accumulate.elementSize) +
                          "-byte elements");
  }
  recvs_.push_back(RecvOp{expected, static_cast<uint8_t*>(data), bytes, accumulate});
}

void TcpPair::postTentativeRecv(const Envelope& expected, void* data, size_t bytes, const Accumulate& accumulate) {
  if (!recvs_.empty()) {
    throw InvalidArgument("postTentativeRecv from " + peerDescription() + " while another receive is posted");
  }
  postRecv(expected, data, bytes, accumulate);
  recvs_.back().tentative = true;
}

bool TcpPair::withdrawTentativeRecv() noexcept {
  if (recvs_.size() != 1 || !recvs_.front().tentative || headerDone_) return false;
  recvs_.pop_front();
  refused_ = false;
  return true;
}

bool TcpPair::detachSends(net::Deadline /*deadline*/) {
  for (SendOp& op : sends_) {
    if (op.copy != nullptr || op.header.bytes == 0) continue;
    op.copy.reset(new uint8_t[op.header.bytes]);
    std::memcpy(op.copy.get(), op.data, op.header.bytes);
    op.data = op.copy.get();
  }
  return true;
}

void TcpPair::detachRecvs() {
  for (RecvOp& op : recvs_) op.discard = true;
}

bool TcpPair::progress() {
  rethrowIfFailed();
  try {
    // Alternate directions until neither moves: a full-duplex exchange larger than the
    // socket buffers needs both (the peer's sends wait for our reads and vice versa).
    bool moved = true;
    while (moved) {
      moved = false;
      if (!sends_.empty()) moved |= progressSends();
      if (!recvs_.empty()) moved |= progressRecvs();
    }
  } catch (...) {
    failure_ = std::current_exception();
    throw;
  }
  return sends_.empty() && recvs_.empty();
}

bool TcpPair::progressSends() {
  bool moved = false;
  while (!sends_.empty()) {
    iovec iov[kMaxIovecs];
    int count = 0;
    size_t total = 0;
    size_t skip = sendOffset_;
    for (const SendOp& op : sends_) {
      if (count + 2 > kMaxIovecs) break;
      const size_t headerBytes = sizeof(WireHeader);
      if (skip < headerBytes) {
        iov[count++] = {const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(&op.header)) + skip,
                        headerBytes - skip};
        total += headerBytes - skip;
        skip = 0;
      } else {
        skip -= headerBytes;
      }
      const size_t payload = op.header.bytes;
      if (skip < payload) {
        iov[count++] = {const_cast<uint8_t*>(op.data) + skip, payload - skip};
        total += payload - skip;
      }
      skip = 0;
    }
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = ::sendmsg(socket_.fd(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
      const int error = errno;
      if (isClosedError(error)) throwClosed(error, /*sending=*/true);
      throwFailed(error, /*sending=*/true);
    }
    moved = true;
    size_t left = static_cast<size_t>(n);
    while (!sends_.empty()) {
      const size_t remaining = sizeof(WireHeader) + sends_.front().header.bytes - sendOffset_;
      if (left < remaining) {
        sendOffset_ += left;
        break;
      }
      left -= remaining;
      sends_.pop_front();
      sendOffset_ = 0;
    }
    if (static_cast<size_t>(n) < total) return moved;  // the socket buffer is full
  }
  return moved;
}

size_t TcpPair::readSome(void* dst, size_t size) {
  for (;;) {
    const ssize_t n = ::recv(socket_.fd(), dst, size, MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) {
      endOfStream_ = true;
      throwClosed(0, /*sending=*/false);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    const int error = errno;
    if (isClosedError(error)) throwClosed(error, /*sending=*/false);
    throwFailed(error, /*sending=*/false);
  }
}

bool TcpPair::fillStaging() {
  if (stagingBegin_ == stagingEnd_) {
    stagingBegin_ = stagingEnd_ = 0;
  } else if (stagingEnd_ > kStagingBytes / 2) {
    // Only a partial header, element or small payload is left: cheap to move to the front.
    std::memmove(staging_.get(), staging_.get() + stagingBegin_, staged());
    stagingEnd_ = staged();
    stagingBegin_ = 0;
  }
  const size_t n = readSome(staging_.get() + stagingEnd_, kStagingBytes - stagingEnd_);
  stagingEnd_ += n;
  return n > 0;
}

void TcpPair::checkHeader(const WireHeader& header) const {
  const RecvOp& op = recvs_.front();
  if (header.envelope == op.expected && header.bytes == op.bytes) return;
  throw EnvelopeMismatch(peerRank(), op.expected, op.bytes, header.envelope, header.bytes,
                         "rank " + std::to_string(selfRank_) + " received from " + peerDescription() +
                             " a message that does not match the posted receive: expected " +
                             envelopeText(op.expected, op.bytes) + ", received " +
                             envelopeText(header.envelope, header.bytes));
}

bool TcpPair::progressRecvs() {
  bool moved = false;
  while (!recvs_.empty()) {
    RecvOp& op = recvs_.front();
    if (!headerDone_) {
      if (staged() < sizeof(WireHeader)) {
        if (!fillStaging()) return moved;
        moved = true;
        continue;
      }
      WireHeader header;
      std::memcpy(&header, staging_.get() + stagingBegin_, sizeof(header));
      if (op.tentative && (header.envelope != op.expected || header.bytes != op.bytes)) {
        refused_ = true;  // the message stays in staging for whoever takes it
        return moved;
      }
      stagingBegin_ += sizeof(header);
      checkHeader(header);
      headerDone_ = true;
      delivered_ = 0;
    }
    while (delivered_ < op.bytes) {
      const size_t want = op.bytes - delivered_;
      if (op.discard) {
        const size_t take = std::min(staged(), want);
        stagingBegin_ += take;
        delivered_ += take;
        if (take > 0) continue;
      } else if (op.accumulate.fn == nullptr) {
        if (staged() > 0) {
          const size_t take = std::min(staged(), want);
          copyBytes(op.data + delivered_, staging_.get() + stagingBegin_, take);
          stagingBegin_ += take;
          delivered_ += take;
          continue;
        }
        if (want >= kDirectReadBytes) {
          const size_t n = readSome(op.data + delivered_, want);
          if (n == 0) return moved;
          delivered_ += n;
          moved = true;
          continue;
        }
      } else {
        const size_t element = op.accumulate.elementSize;
        const size_t whole = std::min(staged(), want) / element * element;
        if (whole > 0) {
          op.accumulate.fn(op.data + delivered_, staging_.get() + stagingBegin_, whole / element);
          stagingBegin_ += whole;
          delivered_ += whole;
          continue;
        }
      }
      if (!fillStaging()) return moved;
      moved = true;
    }
    recvs_.pop_front();
    headerDone_ = false;
    moved = true;
  }
  return moved;
}

bool TcpPair::peekIncoming(Envelope* envelope, size_t* bytes) {
  rethrowIfFailed();
  if (!recvs_.empty()) return false;
  try {
    while (staged() < sizeof(WireHeader)) {
      if (!fillStaging()) return false;
    }
  } catch (...) {
    failure_ = std::current_exception();
    endedCleanly_ = endOfStream_ && staged() == 0;
    throw;
  }
  WireHeader header;
  std::memcpy(&header, staging_.get() + stagingBegin_, sizeof(header));
  *envelope = header.envelope;
  *bytes = header.bytes;
  return true;
}

void TcpPair::checkIncoming(const Envelope* current) {
  rethrowIfFailed();
  if (!recvs_.empty()) return;
  try {
    if (staged() < sizeof(WireHeader)) {
      // fillStaging() would take the end of the stream for an error; here it is one only
      // when the peer left before its kernel took what this side sent (a peer that read
      // everything and closed its communicator is not a failure yet).
      if (stagingBegin_ == stagingEnd_) stagingBegin_ = stagingEnd_ = 0;
      for (;;) {
        const ssize_t n = ::recv(socket_.fd(), staging_.get() + stagingEnd_, kStagingBytes - stagingEnd_,
                                 MSG_DONTWAIT);
        if (n > 0) {
          stagingEnd_ += static_cast<size_t>(n);
          break;
        }
        if (n == 0) {
          if (unacknowledgedBytes() > 0) throwClosed(0, /*sending=*/true);
          break;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        const int error = errno;
        if (isClosedError(error)) throwClosed(error, /*sending=*/true);
        throwFailed(error, /*sending=*/false);
      }
    }
    if (staged() < sizeof(WireHeader)) return;
    WireHeader header;
    std::memcpy(&header, staging_.get() + stagingBegin_, sizeof(header));
    const bool otherCall = current != nullptr && header.envelope.sequence == current->sequence &&
                           header.envelope != *current;
    if (!isNotice(header.envelope) && !otherCall) return;
    const Envelope expected = current != nullptr ? *current : Envelope{};
    throw EnvelopeMismatch(peerRank(), expected, 0, header.envelope, header.bytes,
                           "rank " + std::to_string(selfRank_) + " received from " + peerDescription() + " " +
                               envelopeText(header.envelope, header.bytes) + " where it expected no message");
  } catch (...) {
    failure_ = std::current_exception();
    throw;
  }
}

size_t TcpPair::unacknowledgedBytes() const noexcept {
  int queued = 0;
  if (::ioctl(socket_.fd(), SIOCOUTQ, &queued) != 0) return 0;
  return queued > 0 ? static_cast<size_t>(queued) : 0;
}

void TcpPair::armWait(pollfd* pfd) {
  pfd->fd = socket_.fd();
  // POLLIN only with a receive posted: bytes that arrive early for a later receive must
  // not wake a waiter that cannot consume them. POLLRDHUP reports a peer that went away
  // while only sends are pending (errors and hang-ups are always reported).
  pfd->events = static_cast<short>(POLLRDHUP | (recvs_.empty() ? 0 : POLLIN) | (sends_.empty() ? 0 : POLLOUT));
  pfd->revents = 0;
}

void TcpPair::armWaitForIncoming(pollfd* pfd) {
  armWait(pfd);
  pfd->events = static_cast<short>(pfd->events | POLLIN);
}

void TcpPair::disarmWait() {}

void TcpPair::sendNotice(const Envelope& notice, net::Deadline deadline) noexcept {
  if (sendOffset_ == 0) {
    WireHeader header;
    header.envelope = notice;
    header.bytes = 0;
    // Best effort: a failure only means the peer does not learn why this rank gave up.
    net::sendAll(socket_.fd(), &header, sizeof(header), deadline);
  }
  ::shutdown(socket_.fd(), SHUT_WR);
  sends_.clear();
  recvs_.clear();
  if (failure_) return;
  try {
    throw NetworkError("rank " + std::to_string(selfRank_) + ": the connection to " + peerDescription() +
                       " was abandoned after a failed call");
  } catch (...) {
    failure_ = std::current_exception();  // that NetworkError, or bad_alloc building it
  }
}

std::string TcpPair::currentSendText() const {
  if (sends_.empty()) return "send";
  const SendOp& op = sends_.front();
  const size_t done = sendOffset_ > sizeof(WireHeader) ? sendOffset_ - sizeof(WireHeader) : 0;
  return "send of " + envelopeText(op.header.envelope, op.header.bytes) + " (" + std::to_string(done) +
         " bytes sent, " + std::to_string(sends_.size() - 1) + " more queued)";
}

std::string TcpPair::currentRecvText() const {
  if (recvs_.empty()) return "the wait for the next message";
  const RecvOp& op = recvs_.front();
  return "receive of " + envelopeText(op.expected, op.bytes) + " (" +
         (headerDone_ ? std::to_string(delivered_) + " bytes received" : std::string("header not yet received")) +
         ", " + std::to_string(recvs_.size() - 1) + " more queued)";
}

void TcpPair::throwClosed(int error, bool sending) const {
  throw PeerError(peerRank(), "rank " + std::to_string(selfRank_) + ": connection to " + peerDescription() +
                     " closed during " + (sending ? currentSendText() : currentRecvText()) +
                     (error == 0 ? std::string(": end of stream") : ": " + net::errnoText(error)) +
                     " (the peer process exited, crashed or closed its communicator)");
}

void TcpPair::throwFailed(int error, bool sending) const {
  throw PeerError(peerRank(), "rank " + std::to_string(selfRank_) + ": " + (sending ? currentSendText() : currentRecvText()) +
                     (sending ? " to " : " from ") + peerDescription() + " failed: " + net::errnoText(error));
}

std::unique_ptr<Pair> createPair(net::Socket socket, int selfRank, int peerRank,
                                 const std::string& peerDescription, const PairOptions& options) {
  return std::make_unique<TcpPair>(std::move(socket), selfRank, peerRank, peerDescription, options);
}

}  // namespace ringtree::transport::tcp
