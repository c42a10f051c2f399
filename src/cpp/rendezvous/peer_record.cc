#include "rendezvous/peer_record.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <ringtree/error.h>

#include "common/socket.h"
#include "common/text.h"

namespace ringtree::rendezvous {

namespace {

constexpr char kRecordMagic[] = "RTA2";
constexpr size_t kRecordFields = 11;
constexpr char kNonceKey[] = "rt/comm/nonce";

void appendField(Bytes* out, const std::string& value) {
  const auto length = static_cast<uint32_t>(value.size());
  const auto* p = reinterpret_cast<const uint8_t*>(&length);
  out->insert(out->end(), p, p + sizeof(length));
  out->insert(out->end(), value.begin(), value.end());
}

Nonce randomNonce() {
  Nonce nonce{};
  size_t filled = 0;
  while (filled < nonce.size()) {
    const ssize_t n = ::getrandom(nonce.data() + filled, nonce.size() - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw NetworkError("getrandom failed: " + net::errnoText(errno));
    }
    filled += static_cast<size_t>(n);
  }
  return nonce;
}

}  // namespace

std::string addressKey(int rank) { return "rt/comm/addr/" + std::to_string(rank); }

Bytes encodeRecord(const PeerRecord& r) {
  Bytes out(kRecordMagic, kRecordMagic + 4);
  for (const std::string& field :
       {r.process.hostname, r.process.bootId, std::to_string(r.process.pid), std::to_string(r.size),
        std::string(transportKindName(r.transport)), r.tcpHost, std::to_string(r.tcpPort), r.tcpOrigin,
        r.shmName, std::to_string(r.process.pidNamespace), std::to_string(r.process.startTicks)}) {
    appendField(&out, field);
  }
  return out;
}

bool decodeRecord(const Bytes& in, PeerRecord* r) {
  if (in.size() < 4 || std::memcmp(in.data(), kRecordMagic, 4) != 0) return false;
  std::vector<std::string> fields;
  size_t at = 4;
  while (at < in.size()) {
    uint32_t length = 0;
    if (in.size() - at < sizeof(length)) return false;
    std::memcpy(&length, in.data() + at, sizeof(length));
    at += sizeof(length);
    if (in.size() - at < length) return false;
    fields.emplace_back(reinterpret_cast<const char*>(in.data() + at), length);
    at += length;
  }
  if (fields.size() != kRecordFields) return false;
  int64_t pid = 0;
  int64_t size = 0;
  int64_t port = 0;
  if (!text::parseInteger(fields[2], 0, INT64_MAX, &pid) || !text::parseInteger(fields[3], 1, INT32_MAX, &size) ||
      !text::parseInteger(fields[6], 1, 65535, &port)) {
    return false;
  }
  int64_t pidNamespace = 0;
  int64_t startTicks = 0;
  if (!text::parseInteger(fields[9], 0, INT64_MAX, &pidNamespace) ||
      !text::parseInteger(fields[10], 0, INT64_MAX, &startTicks)) {
    return false;
  }
  try {
    r->transport = parseTransportKind(fields[4]);
  } catch (const InvalidArgument&) {
    return false;
  }
  r->process = ProcessIdentity{};
  r->process.hostname = fields[0];
  r->process.bootId = fields[1];
  r->process.pid = pid;
  r->size = static_cast<int>(size);
  r->tcpHost = fields[5];
  r->tcpPort = static_cast<uint16_t>(port);
  r->tcpOrigin = fields[7];
  r->shmName = fields[8];
  r->process.pidNamespace = static_cast<uint64_t>(pidNamespace);
  r->process.startTicks = static_cast<uint64_t>(startTicks);
  return true;
}

std::string describeLiveRecord(const PeerRecord& r) {
  return "host '" + r.process.hostname + "', " + describeLocalProcess(r.process.pid) + ", tcp " +
         net::formatHostPort(r.tcpHost, r.tcpPort);
}

std::string describePeer(int rank, const PeerRecord& r, bool shm) {
  return "rank " + std::to_string(rank) + " (" + describeProcess(r.process) + ", " +
         (shm ? std::string("shm") : "tcp " + net::formatHostPort(r.tcpHost, r.tcpPort)) + ")";
}

Nonce agreeOnNonce(Store& store) {
  const Nonce candidate = randomNonce();
  const Bytes stored = store.compareSet(kNonceKey, {}, Bytes(candidate.begin(), candidate.end()));
  if (stored.size() != kNonceBytes) {
    throw StoreError("the communicator nonce under '" + std::string(kNonceKey) + "' has " +
                     std::to_string(stored.size()) + " bytes instead of " + std::to_string(kNonceBytes) +
                     " (a key of another program in this store?)");
  }
  Nonce nonce{};
  std::copy(stored.begin(), stored.end(), nonce.begin());
  return nonce;
}

}  // namespace ringtree::rendezvous
