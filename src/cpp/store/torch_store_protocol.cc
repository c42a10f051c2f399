#include "store/torch_store_protocol.h"

namespace ringtree::torch_store_protocol {

namespace {

// Reads fields off the front of a buffer. Every read returns false when the bytes are not
// all there yet; a length or count over the limits sets malformed (and returns false).
class FieldReader {
 public:
  FieldReader(const uint8_t* data, size_t size, const Limits& limits) : data_(data), size_(size), limits_(limits) {}

  bool u8(uint8_t* v) {
    if (size_ - pos_ < 1) return false;
    *v = data_[pos_++];
    return true;
  }
  bool u64(uint64_t* v) {
    if (size_ - pos_ < 8) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(data_[pos_ + i]) << (8 * i);
    pos_ += 8;
    *v = u;
    return true;
  }
  bool u32(uint32_t* v) {
    if (size_ - pos_ < 4) return false;
    uint32_t u = 0;
    for (int i = 0; i < 4; ++i) u |= static_cast<uint32_t>(data_[pos_ + i]) << (8 * i);
    pos_ += 4;
    *v = u;
    return true;
  }
  bool value(Bytes* out) {
    const uint8_t* p = nullptr;
    uint64_t n = 0;
    if (!span(&p, &n)) return false;
    out->assign(p, p + n);
    return true;
  }
  bool key(std::string* out) {
    const uint8_t* p = nullptr;
    uint64_t n = 0;
    if (!span(&p, &n)) return false;
    if (n > 0 && p[0] == '/') {
      ++p;
      --n;
    }
    out->assign(reinterpret_cast<const char*>(p), n);
    return true;
  }
  bool count(uint64_t* n) {
    if (!u64(n)) return false;
    if (*n > limits_.maxKeys) {
      error = "a list of " + std::to_string(*n) + " keys exceeds the limit of " + std::to_string(limits_.maxKeys);
      return false;
    }
    return true;
  }
  bool keys(std::vector<std::string>* out) {
    uint64_t n = 0;
    if (!count(&n)) return false;
    // Each key takes at least its 8-byte length: a count the bytes cannot hold yet is
    // incomplete, and nothing is reserved for it before they are there.
    if (n > (size_ - pos_) / 8) return false;
    out->resize(n);
    for (auto& k : *out) {
      if (!key(&k)) return false;
    }
    return true;
  }

  size_t position() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  std::string error;  // non-empty: the command is malformed

 private:
  bool span(const uint8_t** p, uint64_t* n) {
    uint64_t length = 0;
    const size_t start = pos_;
    if (!u64(&length)) return false;
    if (length > limits_.maxFieldBytes) {
      error = "a field of " + std::to_string(length) + " bytes exceeds the limit of " +
              std::to_string(limits_.maxFieldBytes) + " bytes";
      return false;
    }
    if (size_ - pos_ < length) {
      pos_ = start;
      return false;
    }
    *p = data_ + pos_;
    *n = length;
    pos_ += length;
    return true;
  }

  const uint8_t* data_;
  size_t size_;
  Limits limits_;
  size_t pos_ = 0;
};

bool readFields(FieldReader& r, Command* c) {
  switch (c->query) {
    case Query::kValidate:
    case Query::kPing: {
      uint32_t v = 0;
      if (!r.u32(&v)) return false;
      c->number = v;
      return true;
    }
    case Query::kSet:
    case Query::kAppend:
      c->keys.resize(1);
      c->values.resize(1);
      return r.key(&c->keys[0]) && r.value(&c->values[0]);
    case Query::kCompareSet:
      c->keys.resize(1);
      c->values.resize(2);
      return r.key(&c->keys[0]) && r.value(&c->values[0]) && r.value(&c->values[1]);
    case Query::kGet:
    case Query::kDeleteKey:
      c->keys.resize(1);
      return r.key(&c->keys[0]);
    case Query::kAdd: {
      c->keys.resize(1);
      uint64_t delta = 0;
      if (!(r.key(&c->keys[0]) && r.u64(&delta))) return false;
      c->number = static_cast<int64_t>(delta);
      return true;
    }
    case Query::kCheck:
    case Query::kWait:
    case Query::kMultiGet:
      return r.keys(&c->keys);
    case Query::kMultiSet: {
      uint64_t n = 0;
      if (!r.count(&n)) return false;
      // Each pair takes at least its two 8-byte lengths.
      if (n > r.remaining() / 16) return false;
      c->keys.clear();
      c->values.clear();
      for (uint64_t i = 0; i < n; ++i) {
        c->keys.emplace_back();
        c->values.emplace_back();
        if (!(r.key(&c->keys.back()) && r.value(&c->values.back()))) return false;
      }
      return true;
    }
    case Query::kGetNumKeys:
    case Query::kCancelWait:
      return true;
  }
  return false;
}

}  // namespace

ParseResult parseCommand(const uint8_t* data, size_t size, const Limits& limits, Command* command,
                         size_t* consumed, std::string* error) {
  if (size == 0) return ParseResult::kIncomplete;
  if (data[0] > static_cast<uint8_t>(Query::kPing)) {
    *error = std::string("unsupported query ") + queryName(data[0]) + " (" + std::to_string(data[0]) + ")";
    return ParseResult::kMalformed;
  }
  FieldReader r(data + 1, size - 1, limits);
  *command = Command();
  command->query = static_cast<Query>(data[0]);
  if (!readFields(r, command)) {
    if (r.error.empty()) return ParseResult::kIncomplete;
    *error = std::string(queryName(data[0])) + ": " + r.error;
    return ParseResult::kMalformed;
  }
  *consumed = 1 + r.position();
  return ParseResult::kComplete;
}

void appendU8(Bytes& out, uint8_t v) { out.push_back(v); }

void appendU32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void appendI64(Bytes& out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(u >> (8 * i)));
}

void appendValue(Bytes& out, const Bytes& value) {
  appendI64(out, static_cast<int64_t>(value.size()));
  out.insert(out.end(), value.begin(), value.end());
}

const char* queryName(uint8_t code) {
  switch (static_cast<Query>(code)) {
    case Query::kValidate: return "VALIDATE";
    case Query::kSet: return "SET";
    case Query::kCompareSet: return "COMPARE_SET";
    case Query::kGet: return "GET";
    case Query::kAdd: return "ADD";
    case Query::kCheck: return "CHECK";
    case Query::kWait: return "WAIT";
    case Query::kGetNumKeys: return "GETNUMKEYS";
    case Query::kDeleteKey: return "DELETE_KEY";
    case Query::kAppend: return "APPEND";
    case Query::kMultiGet: return "MULTI_GET";
    case Query::kMultiSet: return "MULTI_SET";
    case Query::kCancelWait: return "CANCEL_WAIT";
    case Query::kPing: return "PING";
  }
  return "unknown query";
}

}  // namespace ringtree::torch_store_protocol
