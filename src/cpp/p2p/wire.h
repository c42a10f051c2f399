#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <ringtree/types.h>

#include "transport/pair.h"

// How point-to-point messages use the transport Envelope (the wire format), and the
// texts that name them in errors.
//
// A message:   operation = kMessageOperation, noticeKind = kData,
//              sequence  = its number among the messages from this sender to this
//                          receiver (1, 2, ...; the receiver checks that none is skipped),
//              tag, dataType and count = the send's.
// A notice (0 payload bytes; the sender gave up the connection right after it):
//   kMismatchNotice: the receive that took message `sequence` (with `tag`) expects
//                    dataType x count; sentDataType holds the data type that was sent.
//   kAbandonNotice:  the sender gave up the connection after an operation with this rank
//                    timed out there, or after it received a notice.
//   kClosedNotice:   the sender's engine was shut down (it sends nothing more); unlike a
//                    connection that breaks, this does not fail receives from any source.
namespace ringtree::p2p {

// Distinct from every collective's code (collective << 8 | algorithm, at most 0x09ff),
// so that a communicator shared with collectives shows up as a protocol error, not as
// data.
constexpr uint16_t kMessageOperation = 0x7032;

// Envelope::noticeKind of point-to-point messages.
enum class MessageKind : uint8_t { kData = 0, kMismatchNotice = 1, kAbandonNotice = 2, kClosedNotice = 3 };

inline transport::Envelope dataEnvelope(uint64_t sequence, int tag, DataType type, size_t count) {
  transport::Envelope envelope;
  envelope.sequence = sequence;
  envelope.operation = kMessageOperation;
  envelope.dataType = static_cast<uint8_t>(type);
  envelope.noticeKind = static_cast<uint8_t>(MessageKind::kData);
  envelope.count = count;
  envelope.tag = tag;
  return envelope;
}

inline transport::Envelope mismatchNotice(const transport::Envelope& message, DataType expectedType,
                                          size_t expectedCount) {
  transport::Envelope notice = message;
  notice.noticeKind = static_cast<uint8_t>(MessageKind::kMismatchNotice);
  notice.sentDataType = message.dataType;
  notice.dataType = static_cast<uint8_t>(expectedType);
  notice.count = expectedCount;
  return notice;
}

// kAbandonNotice or kClosedNotice.
inline transport::Envelope notice(MessageKind kind) {
  transport::Envelope notice;
  notice.operation = kMessageOperation;
  notice.noticeKind = static_cast<uint8_t>(kind);
  return notice;
}

// "float32 x 4"; a data type outside the enum (from a peer) shows as its number.
inline std::string typeAndCount(uint8_t type, uint64_t count) {
  const std::string name = type < kNumDataTypes ? dataTypeName(static_cast<DataType>(type))
                                                : "data type " + std::to_string(type);
  return name + " x " + std::to_string(count);
}
inline std::string typeAndCount(DataType type, size_t count) {
  return typeAndCount(static_cast<uint8_t>(type), count);
}

// "rank 3", or "any source" for a receive from any rank (peer -1).
inline std::string peerText(int peer) { return peer < 0 ? "any source" : "rank " + std::to_string(peer); }

}  // namespace ringtree::p2p
