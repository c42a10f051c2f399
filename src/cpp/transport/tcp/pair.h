#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <string>

#include "common/socket.h"
#include "transport/pair.h"
#include "transport/tcp/device.h"

namespace ringtree::transport::tcp {

// What precedes every message's payload on the wire, in host byte order (ringtree
// supports little-endian hosts only, so that is little-endian everywhere).
struct WireHeader {
  Envelope envelope;
  uint64_t bytes = 0;  // payload bytes that follow
};
static_assert(sizeof(WireHeader) == 56, "WireHeader is part of the wire format");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian");

// A Pair over one non-blocking TCP socket.
//
// Sends: posted messages are queued and written in posting order with sendmsg(), several
// small ones per call (gathered header + payload iovecs), large ones in as many pieces as
// the socket takes. A send is finished once the kernel has taken all of its bytes.
//
// Receives: headers and small payloads are read through a per-pair staging buffer
// (allocated once; a read may take the following messages' bytes, which wait there for
// their receive). Large payloads without Accumulate are read straight into the
// destination; payloads with Accumulate always go through the staging buffer, reduced
// into the destination a cache-sized chunk of whole elements at a time.
//
// After the first error (broken connection, envelope mismatch) the byte stream is
// unusable: every later call rethrows that error.
class TcpPair final : public Pair {
 public:
  // Throws NetworkError when the socket options cannot be set.
  TcpPair(net::Socket socket, int selfRank, int peerRank, std::string peerDescription,
          const PairOptions& options);
  ~TcpPair() override;

  const char* kind() const override { return "tcp"; }
  void postSend(const Envelope& envelope, const void* data, size_t bytes) override;
  void postRecv(const Envelope& expected, void* data, size_t bytes,
                const Accumulate& accumulate) override;
  bool progress() override;
  size_t pendingSends() const override { return sends_.size(); }
  size_t pendingRecvs() const override { return recvs_.size(); }
  // Reads whatever the socket holds into the staging buffer until a whole header is
  // there; the message then waits in staging (and the socket) for its receive.
  bool peekIncoming(Envelope* envelope, size_t* bytes) override;
  bool endedCleanly() const noexcept override { return endedCleanly_; }
  bool peerTookEverything() const noexcept override { return sends_.empty() && unacknowledgedBytes() == 0; }
  void postTentativeRecv(const Envelope& expected, void* data, size_t bytes, const Accumulate& accumulate) override;
  bool recvRefused() const noexcept override { return refused_; }
  bool withdrawTentativeRecv() noexcept override;
  bool detachSends(net::Deadline deadline) override;
  void detachRecvs() override;
  void checkIncoming(const Envelope* current) override;
  bool hungUp() noexcept override { return net::hungUp(socket_.fd()); }
  void armWait(pollfd* pfd) override;
  void armWaitForIncoming(pollfd* pfd) override;
  void disarmWait() override;
  // Writes the notice's header straight to the socket (net::sendAll), unless a send is
  // partly written: then the stream is not at a message boundary and nothing is sent.
  // Then shuts down the sending direction, which wakes a peer polling for POLLRDHUP.
  void sendNotice(const Envelope& notice, net::Deadline deadline) noexcept override;

  // Staging buffer capacity (also the largest chunk reduced at once).
  static constexpr size_t kStagingBytes = size_t{256} << 10;
  // Payload remainders at least this large (and without Accumulate) are read into the
  // destination directly; smaller ones through the staging buffer.
  static constexpr size_t kDirectReadBytes = size_t{64} << 10;

 private:
  struct SendOp {
    WireHeader header;
    const uint8_t* data;
    std::unique_ptr<uint8_t[]> copy;  // the payload, once detached (data points here)
  };
  struct RecvOp {
    Envelope expected;
    uint8_t* data;
    size_t bytes;
    Accumulate accumulate;
    bool discard = false;    // detached: the payload is read and dropped
    bool tentative = false;  // postTentativeRecv
  };

  // Each returns whether it moved any byte (or finished a message); throws on errors.
  bool progressSends();
  bool progressRecvs();
  // Reads into the staging buffer's free space. Returns false when nothing was available.
  bool fillStaging();
  // Reads into dst; returns the byte count, 0 when nothing was available.
  size_t readSome(void* dst, size_t size);
  size_t staged() const { return stagingEnd_ - stagingBegin_; }
  // Checks the header of the message that arrived for recvs_.front().
  void checkHeader(const WireHeader& header) const;
  // Bytes this side sent that the peer's kernel has not acknowledged yet (SIOCOUTQ).
  size_t unacknowledgedBytes() const noexcept;
  // PeerError for the send or receive in progress: the peer closed the connection
  // (error 0: end of stream), or another errno value.
  [[noreturn]] void throwClosed(int error, bool sending) const;
  [[noreturn]] void throwFailed(int error, bool sending) const;
  // "send of 4096 bytes of allreduce(seq=3, ...)" for the operation in progress.
  std::string currentSendText() const;
  std::string currentRecvText() const;
  void rethrowIfFailed() const;

  net::Socket socket_;
  int selfRank_;

  std::deque<SendOp> sends_;
  size_t sendOffset_ = 0;  // bytes of sends_.front() (header + payload) already written

  std::deque<RecvOp> recvs_;
  bool headerDone_ = false;  // recvs_.front()'s header has been read and checked
  bool refused_ = false;     // the tentative recvs_.front() refused the message in staging
  size_t delivered_ = 0;     // payload bytes of recvs_.front() stored or reduced
  std::unique_ptr<uint8_t[]> staging_;
  size_t stagingBegin_ = 0;
  size_t stagingEnd_ = 0;

  std::exception_ptr failure_;
  bool endOfStream_ = false;   // a read found the end of the peer's stream
  bool endedCleanly_ = false;  // ... between two messages, found by peekIncoming()
};

}  // namespace ringtree::transport::tcp
