#pragma once

// TCPStore wire protocol, version 1. Shared by the client (tcp_store.cc), the server
// (tcp_store_server.cc) and the tests, which build well-formed and malformed frames with it.
//
// One TCP connection per client, strictly request/response: a client sends one request
// frame and reads its whole reply before sending the next one.
//
// Frame (requests and replies alike; every integer little-endian):
//   offset 0   u32    magic 0x31535452 (the bytes "RTS1")
//   offset 4   u8     code: an Op in a request, a Status in a reply
//   offset 5   u8[3]  reserved, must be zero
//   offset 8   u32    payload length: the number of bytes that follow
//
// Payload fields:
//   u8, u32, i64   fixed size
//   bytes          u32 length, then that many bytes (keys, values, token, messages)
//   keys           u32 count (<= kMaxKeysPerRequest), then count x bytes
//
// Requests: Op  payload                              -> payload of the kOk reply
//   kHello       u32 version, bytes token            -> u32 version
//   kSet         bytes key, bytes value              -> (empty)
//   kGet         i64 timeoutMs >= 0, keys            -> u32 count, count x bytes (key order)
//   kAdd         bytes key, i64 delta                -> i64 new value
//   kCompareSet  bytes key, bytes expected, desired  -> bytes value stored afterwards
//   kCheck       keys                                -> u8 (1: every key exists)
//   kWait        i64 timeoutMs >= 0, keys            -> (empty)
//   kDelete      bytes key                           -> u8 (1: the key existed)
//   kNumKeys     (empty)                             -> i64
//   kAppend      bytes key, bytes value              -> (empty)
//   kMultiSet    u32 count, count x (bytes key, bytes value) -> (empty)
// kGet and kWait are answered when every key exists at the same time, or with kTimeout
// at the deadline; timeoutMs 0 checks once. kGet serves both get() and multiGet().
//
// Replies other than kOk:
//   kTimeout          keys: those still missing at the deadline (kGet, kWait)
//   kInvalidArgument  bytes message (kAdd on a non-integer value, an overflowing add)
//   kError            bytes message (a reply that would not fit in a frame)
//   kAuthRefused      bytes message; the server closes the connection after it
//   kVersionMismatch  u32 the server's version; the server closes the connection after it
//
// Server-side validation: the header is checked before the payload is allocated (magic,
// reserved bytes, known op, length <= maxMessageBytes, and <= kMaxHelloPayload before the
// handshake); the payload is parsed with bounds checks (every length and count against
// the bytes remaining) and must be consumed exactly. Any violation -- also a request
// before kHello, a second kHello, or a request sent while the previous one is unanswered --
// closes that connection without a reply.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ringtree/store/store.h>

namespace ringtree::tcp_store_protocol {

constexpr uint32_t kMagic = 0x31535452;  // "RTS1" on the wire
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 12;
// Payload limit before the handshake succeeded: a HELLO is small, and an unauthenticated
// peer must not make the server allocate more.
constexpr uint32_t kMaxHelloPayload = 4096;
// Longest token a HELLO can carry.
constexpr size_t kMaxTokenBytes = kMaxHelloPayload - 8;
// Keys per request (kGet, kCheck, kWait, kMultiSet).
constexpr uint32_t kMaxKeysPerRequest = 1u << 20;

enum class Op : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kCompareSet = 5,
  kCheck = 6,
  kWait = 7,
  kDelete = 8,
  kNumKeys = 9,
  kAppend = 10,
  kMultiSet = 11,
};

constexpr bool isKnownOp(uint8_t code) {
  return code >= static_cast<uint8_t>(Op::kHello) && code <= static_cast<uint8_t>(Op::kMultiSet);
}

enum class Status : uint8_t {
  kOk = 0,
  kTimeout = 1,
  kInvalidArgument = 2,
  kError = 3,
  kAuthRefused = 4,
  kVersionMismatch = 5,
};

constexpr bool isKnownStatus(uint8_t code) { return code <= static_cast<uint8_t>(Status::kVersionMismatch); }

struct Header {
  uint8_t code = 0;
  uint32_t length = 0;
};

inline void storeU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

inline uint32_t loadU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

// Parses a header. False when the magic or the reserved bytes are wrong; the caller
// checks the code and the length against its own limits.
inline bool decodeHeader(const uint8_t* p, Header* header) {
  if (loadU32(p) != kMagic || p[5] != 0 || p[6] != 0 || p[7] != 0) return false;
  header->code = p[4];
  header->length = loadU32(p + 8);
  return true;
}

// Builds a frame: fields are appended after room for the header, and frame() fills the
// header in. Not thread-safe.
class Writer {
 public:
  Writer() : buffer_(kHeaderSize, 0) {}

  Writer& u8(uint8_t v) {
    buffer_.push_back(v);
    return *this;
  }
  Writer& u32(uint32_t v) {
    const size_t at = buffer_.size();
    buffer_.resize(at + 4);
    storeU32(buffer_.data() + at, v);
    return *this;
  }
  Writer& i64(int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) buffer_.push_back(static_cast<uint8_t>(u >> (8 * i)));
    return *this;
  }
  // Callers keep size below 4 GiB (requests are bounded by maxMessageBytes first).
  Writer& bytes(const void* data, size_t size) {
    u32(static_cast<uint32_t>(size));
    const auto* p = static_cast<const uint8_t*>(data);
    buffer_.insert(buffer_.end(), p, p + size);
    return *this;
  }
  Writer& bytes(const Bytes& b) { return bytes(b.data(), b.size()); }
  Writer& str(const std::string& s) { return bytes(s.data(), s.size()); }
  Writer& keys(const std::vector<std::string>& keys) {
    u32(static_cast<uint32_t>(keys.size()));
    for (const auto& key : keys) str(key);
    return *this;
  }

  // Payload bytes written so far.
  size_t payloadSize() const { return buffer_.size() - kHeaderSize; }

  // Fills in the header with code and the payload length and returns the whole frame.
  // The payload must be below 4 GiB (check payloadSize() first).
  Bytes frame(uint8_t code) && {
    storeU32(buffer_.data(), kMagic);
    buffer_[4] = code;
    storeU32(buffer_.data() + 8, static_cast<uint32_t>(payloadSize()));
    return std::move(buffer_);
  }

 private:
  Bytes buffer_;
};

// Bounds-checked payload parser: every read returns false (and reads nothing) when the
// payload is too short, and no length is trusted before it is checked against the bytes
// remaining, so a malformed payload never causes a large allocation.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  explicit Reader(const Bytes& b) : Reader(b.data(), b.size()) {}

  bool u8(uint8_t* v) {
    if (remaining() < 1) return false;
    *v = data_[pos_++];
    return true;
  }
  bool u32(uint32_t* v) {
    if (remaining() < 4) return false;
    *v = loadU32(data_ + pos_);
    pos_ += 4;
    return true;
  }
  bool i64(int64_t* v) {
    if (remaining() < 8) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(data_[pos_ + i]) << (8 * i);
    pos_ += 8;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool bytes(Bytes* out) {
    const uint8_t* p = nullptr;
    uint32_t n = 0;
    if (!span(&p, &n)) return false;
    out->assign(p, p + n);
    return true;
  }
  bool str(std::string* out) {
    const uint8_t* p = nullptr;
    uint32_t n = 0;
    if (!span(&p, &n)) return false;
    out->assign(reinterpret_cast<const char*>(p), n);
    return true;
  }
  bool keys(std::vector<std::string>* out) {
    uint32_t count = 0;
    if (!u32(&count)) return false;
    // Each key takes at least its 4-byte length, so count is bounded by what is left.
    if (count > kMaxKeysPerRequest || count > remaining() / 4) return false;
    out->clear();
    out->reserve(count);
    for (uint32_t i = 0; i < count; ++i) {
      out->emplace_back();
      if (!str(&out->back())) return false;
    }
    return true;
  }
  // True when every byte has been consumed.
  bool done() const { return pos_ == size_; }
  size_t remaining() const { return size_ - pos_; }

 private:
  bool span(const uint8_t** p, uint32_t* n) {
    uint32_t length = 0;
    if (remaining() < 4) return false;
    length = loadU32(data_ + pos_);
    if (length > remaining() - 4) return false;
    pos_ += 4;
    *p = data_ + pos_;
    *n = length;
    pos_ += length;
    return true;
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace ringtree::tcp_store_protocol
