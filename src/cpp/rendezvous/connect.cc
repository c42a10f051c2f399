#include "rendezvous/connect.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <thread>

#include <ringtree/error.h>

#include "common/env.h"
#include "common/logging.h"
#include "common/socket.h"
#include "common/text.h"
#include "rendezvous/host_identity.h"
#include "transport/shm/unix_socket.h"

namespace ringtree::rendezvous {

namespace {

using Clock = net::Clock;
using std::chrono::milliseconds;
using transport::Pair;

constexpr size_t kNonceBytes = 16;
using Nonce = std::array<uint8_t, kNonceBytes>;

// The first message on every connection, from the connecting rank; the accepting rank
// answers with its own (same transport, ranks swapped). Host byte order.
constexpr uint32_t kHelloMagic = 0x31485452;  // "RTH1"
constexpr uint16_t kHelloVersion = 1;

enum class HelloTransport : uint8_t {
  kTcp = 1,
  kShm = 2,
  // Shared memory is required but the connector cannot reach the peer's listener: the
  // acceptor fails too instead of waiting for its timeout.
  kShmUnreachable = 3,
};

struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kHelloVersion;
  uint8_t transport = 0;  // HelloTransport
  uint8_t reserved = 0;
  int32_t senderRank = -1;
  int32_t receiverRank = -1;
  Nonce nonce{};
};
static_assert(sizeof(Hello) == 32, "Hello is part of the wire format");

// The node arena's hand-over (see connectFullMesh): rank r > 0 connects to rank 0's
// shm::Listener and sends an ArenaHello; rank 0 answers with an ArenaGrant carrying the
// segment's memfd (SCM_RIGHTS). Host byte order.
constexpr uint32_t kArenaHelloMagic = 0x314e5452;  // "RTN1"
constexpr uint32_t kArenaGrantMagic = 0x31475452;  // "RTG1"

struct ArenaHello {
  uint32_t magic = kArenaHelloMagic;
  int32_t rank = -1;
  Nonce nonce{};
};
static_assert(sizeof(ArenaHello) == 24, "ArenaHello is part of the wire format");

struct ArenaGrant {
  uint32_t magic = kArenaGrantMagic;
  int32_t size = 0;
  uint64_t slotBytes = 0;
};
static_assert(sizeof(ArenaGrant) == 16, "ArenaGrant is part of the wire format");

std::string arenaKey(int rank) { return "rt/comm/arena/" + std::to_string(rank); }

// How long an accepted connection may take to send its handshake before it is dropped
// (a peer sends it right after connecting; this only bounds stray connections).
constexpr milliseconds kHelloTimeout = std::chrono::seconds(10);
// Bounds of one TCP connect attempt and of the backoff between attempts.
constexpr milliseconds kConnectAttempt = std::chrono::seconds(5);
constexpr milliseconds kFirstBackoff{10};
constexpr milliseconds kMaxBackoff{1000};

// One rank's published record: who it is and how to reach it.
struct PeerRecord {
  HostIdentity host;
  int64_t pid = 0;
  int size = 0;
  TransportKind transport = TransportKind::kAuto;
  std::string tcpHost;
  uint16_t tcpPort = 0;
  std::string tcpOrigin;  // how the address was chosen, e.g. "interface 'eth0'"
  std::string shmName;    // empty: shared memory not offered
};

// Record encoding: "RTA1", then each field as a 4-byte length and its bytes (numbers as
// decimal text), in the order below. Values may hold any byte.
constexpr char kRecordMagic[] = "RTA1";
constexpr size_t kRecordFields = 9;

void appendField(Bytes* out, const std::string& value) {
  const auto length = static_cast<uint32_t>(value.size());
  const auto* p = reinterpret_cast<const uint8_t*>(&length);
  out->insert(out->end(), p, p + sizeof(length));
  out->insert(out->end(), value.begin(), value.end());
}

Bytes encodeRecord(const PeerRecord& r) {
  Bytes out(kRecordMagic, kRecordMagic + 4);
  for (const std::string& field :
       {r.host.hostname, r.host.bootId, std::to_string(r.pid), std::to_string(r.size),
        std::string(transportKindName(r.transport)), r.tcpHost, std::to_string(r.tcpPort), r.tcpOrigin,
        r.shmName}) {
    appendField(&out, field);
  }
  return out;
}

// Returns false for a malformed record.
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
  try {
    r->transport = parseTransportKind(fields[4]);
  } catch (const InvalidArgument&) {
    return false;
  }
  r->host = {fields[0], fields[1]};
  r->pid = pid;
  r->size = static_cast<int>(size);
  r->tcpHost = fields[5];
  r->tcpPort = static_cast<uint16_t>(port);
  r->tcpOrigin = fields[7];
  r->shmName = fields[8];
  return true;
}

std::string addressKey(int rank) { return "rt/comm/addr/" + std::to_string(rank); }
const char kNonceKey[] = "rt/comm/nonce";

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

// A listening TCP socket on port 0 and the address that peers should connect to.
struct TcpListener {
  net::Socket socket;
  std::string host;
  uint16_t port = 0;
  std::string origin;
};

TcpListener listenForPeers(const std::string& interface) {
  TcpListener listener;
  if (!interface.empty()) {
    std::string error;
    const auto addresses = net::interfaceAddresses(interface, &error);
    if (addresses.empty()) throw NetworkError("cannot listen for peers: " + error);
    std::string lastError;
    for (const auto& address : addresses) {
      try {
        listener.socket = net::listenTcp(address, 0);
        listener.host = address;
        listener.origin = "interface '" + interface + "'";
        break;
      } catch (const NetworkError& e) {
        lastError = e.what();
      }
    }
    if (!listener.socket.valid()) {
      throw NetworkError("cannot listen for peers on interface '" + interface + "': " + lastError);
    }
  } else {
    const std::string hostname = localHostIdentity().hostname;
    std::string error;
    for (const auto& address : net::resolve(hostname, 0, &error)) {
      if (net::isLoopback(address)) continue;
      try {
        listener.socket = net::listenTcp(net::numericHost(address), 0);
        listener.host = net::numericHost(address);
        listener.origin = "host name '" + hostname + "'";
        break;
      } catch (const NetworkError& e) {
        RINGTREE_DEBUG("cannot listen on " << address.toString() << " (host name '" << hostname
                                           << "'): " << e.what());
      }
    }
    if (!listener.socket.valid()) {
      // The host name is unknown, loopback only (Debian's 127.0.1.1), or not ours.
      listener.socket = net::listenTcp("", 0);
      listener.host = net::firstExternalAddress();
      if (listener.host.empty()) listener.host = "127.0.0.1";
      listener.origin = "all interfaces (host name '" + hostname + "' does not resolve to a usable address)";
    }
  }
  listener.port = net::localPort(listener.socket.fd());
  return listener;
}

// Connects rank to all its peers; one object per connectFullMesh call.
class MeshBuilder {
 public:
  MeshBuilder(Store& store, int rank, int size, const ConnectOptions& options)
      : store_(store),
        rank_(rank),
        size_(size),
        options_(options),
        start_(Clock::now()),
        deadline_(net::deadlineAfter(options.timeout)),
        pairs_(static_cast<size_t>(size)),
        records_(static_cast<size_t>(size)) {}

  std::vector<std::unique_ptr<Pair>> run(std::shared_ptr<transport::shm::NodeArena>* arena) {
    publish();
    readRecords();
    // Every rank sees every record: incompatible options fail on both sides of the pair
    // at once instead of leaving the acceptor waiting for its timeout.
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) route(peer);
    }
    for (int peer = 0; peer < rank_; ++peer) connectToLower(peer);
    acceptFromHigher();
    if (arena != nullptr && arenaPossible() && voteForArena()) {
      *arena = rank_ == 0 ? grantArena() : receiveArena();
      RINGTREE_DEBUG("rank " << rank_ << " maps the node arena: " << size_ << " slots of "
                             << (*arena)->slotBytes() << " bytes");
    }
    return std::move(pairs_);
  }

 private:
  enum class Route { kTcp, kShmPreferred, kShmRequired };

  void publish() {
    PeerRecord& self = records_[static_cast<size_t>(rank_)];
    self.host = localHostIdentity();
    self.pid = ::getpid();
    self.size = size_;
    self.transport = options_.transport;
    tcp_ = listenForPeers(options_.interface);
    self.tcpHost = tcp_.host;
    self.tcpPort = tcp_.port;
    self.tcpOrigin = tcp_.origin;
    if (options_.transport != TransportKind::kTcp) {
      try {
        shm_ = std::make_unique<transport::shm::Listener>();
        self.shmName = shm_->name();
      } catch (const NetworkError& e) {
        if (options_.transport == TransportKind::kShm) {
          throw NetworkError("rank " + std::to_string(rank_) +
                             ": transport shm is required but no shared-memory listener can be opened: " +
                             e.what());
        }
        RINGTREE_INFO("rank " << rank_ << ": shared memory unavailable, using TCP only: " << e.what());
      }
    }
    RINGTREE_INFO("rank " << rank_ << " listens at " << net::formatHostPort(tcp_.host, tcp_.port)
                          << " (from " << tcp_.origin << ")");
    store_.set(addressKey(rank_), encodeRecord(self));
    const Nonce candidate = randomNonce();
    const Bytes nonce = store_.compareSet(kNonceKey, {}, Bytes(candidate.begin(), candidate.end()));
    if (nonce.size() != kNonceBytes) {
      throw StoreError("the communicator nonce under '" + std::string(kNonceKey) + "' has " +
                       std::to_string(nonce.size()) + " bytes instead of " + std::to_string(kNonceBytes) +
                       " (a key of another program in this store?)");
    }
    std::copy(nonce.begin(), nonce.end(), nonce_.begin());
  }

  void readRecords() {
    std::vector<std::string> keys;
    std::vector<int> ranks;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      keys.push_back(addressKey(r));
      ranks.push_back(r);
    }
    try {
      store_.wait(keys, remaining());
    } catch (const StoreError&) {
      std::vector<int> missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!store_.check({keys[i]})) missing.push_back(ranks[i]);
      }
      if (missing.empty()) throw;
      throw StoreError("rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
                       text::rankList(missing) + " did not publish an address (store keys 'rt/comm/addr/<rank>') within " +
                       std::to_string(elapsedMs()) +
                       " ms; did every rank start, with the same store and world size?");
    }
    const std::vector<Bytes> values = store_.multiGet(keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      PeerRecord& record = records_[static_cast<size_t>(ranks[i])];
      if (!decodeRecord(values[i], &record)) {
        throw StoreError("the address record of rank " + std::to_string(ranks[i]) + " under '" + keys[i] +
                         "' is malformed (a key of another program in this store?)");
      }
      if (record.size != size_) {
        throw InvalidArgument("rank " + std::to_string(rank_) + " was created with size " +
                              std::to_string(size_) + " but rank " + std::to_string(ranks[i]) +
                              " with size " + std::to_string(record.size));
      }
    }
  }

  const PeerRecord& record(int rank) const { return records_[static_cast<size_t>(rank)]; }

  // "rank 3 (host 'node1', pid 1234, tcp 10.0.0.2:41234)".
  std::string describe(int peer, bool shm) const {
    const PeerRecord& r = record(peer);
    return "rank " + std::to_string(peer) + " (host '" + r.host.hostname + "', pid " + std::to_string(r.pid) +
           ", " + (shm ? std::string("shm") : "tcp " + net::formatHostPort(r.tcpHost, r.tcpPort)) + ")";
  }

  // The interfaces in play, for connection errors.
  std::string interfaceText(int peer) const {
    return "rank " + std::to_string(peer) + "'s address comes from " + record(peer).tcpOrigin + ", rank " +
           std::to_string(rank_) + "'s from " + tcp_.origin + "; RINGTREE_SOCKET_IFNAME selects the interface";
  }

  milliseconds remaining() const {
    const int ms = net::pollTimeoutMs(deadline_);
    return ms < 0 ? options_.timeout : milliseconds(ms);
  }

  int64_t elapsedMs() const {
    return std::chrono::duration_cast<milliseconds>(Clock::now() - start_).count();
  }

  // Which transport the pair (rank_, peer) may use; the same answer on both sides, since
  // it depends only on the two records.
  Route route(int peer) const {
    const TransportKind mine = options_.transport;
    const TransportKind theirs = record(peer).transport;
    if ((mine == TransportKind::kTcp && theirs == TransportKind::kShm) ||
        (mine == TransportKind::kShm && theirs == TransportKind::kTcp)) {
      throw InvalidArgument("rank " + std::to_string(rank_) + " uses transport '" + transportKindName(mine) +
                            "' but rank " + std::to_string(peer) + " uses '" + transportKindName(theirs) +
                            "' (CommunicatorOptions::transport / RINGTREE_TRANSPORT must agree)");
    }
    if (mine == TransportKind::kTcp || theirs == TransportKind::kTcp) return Route::kTcp;
    const bool required = mine == TransportKind::kShm || theirs == TransportKind::kShm;
    const HostIdentity& here = record(rank_).host;
    const HostIdentity& there = record(peer).host;
    if (!sameHost(here, there)) {
      if (!required) return Route::kTcp;
      throw NetworkError("transport shm is required, but rank " + std::to_string(rank_) + " (host '" +
                         here.hostname + "', boot id " + here.bootId + ") and " + describe(peer, false) +
                         " (boot id " + there.bootId + ") are not on one host");
    }
    if (!shm_ || record(peer).shmName.empty()) return Route::kTcp;  // auto, and one side lacks shm
    return required ? Route::kShmRequired : Route::kShmPreferred;
  }

  Hello hello(int peer, HelloTransport transport) const {
    Hello h;
    h.transport = static_cast<uint8_t>(transport);
    h.senderRank = rank_;
    h.receiverRank = peer;
    h.nonce = nonce_;
    return h;
  }

  // Whether h is a valid handshake of this communicator from `sender` to this rank
  // (sender -1: any rank).
  bool validHello(const Hello& h, int sender) const {
    return h.magic == kHelloMagic && h.version == kHelloVersion && h.nonce == nonce_ &&
           h.receiverRank == rank_ && h.senderRank >= 0 && h.senderRank < size_ && h.senderRank != rank_ &&
           (sender < 0 || h.senderRank == sender) && h.transport >= static_cast<uint8_t>(HelloTransport::kTcp) &&
           h.transport <= static_cast<uint8_t>(HelloTransport::kShmUnreachable);
  }

  // Connects to peer's TCP listener, retrying with backoff until the deadline.
  net::Socket connectTcp(int peer) {
    const PeerRecord& r = record(peer);
    const std::string where = net::formatHostPort(r.tcpHost, r.tcpPort);
    std::string resolveError;
    const auto addresses = net::resolve(r.tcpHost, r.tcpPort, &resolveError);
    if (addresses.empty()) {
      throw NetworkError("rank " + std::to_string(rank_) + " cannot resolve the address " + where + " of " +
                         describe(peer, false) + ": " + resolveError + " (" + interfaceText(peer) + ")");
    }
    milliseconds backoff = kFirstBackoff;
    int lastError = 0;
    for (int attempt = 1;; ++attempt) {
      for (const auto& address : addresses) {
        net::Socket socket;
        const auto attemptDeadline = std::min(deadline_, Clock::now() + kConnectAttempt);
        lastError = net::connectTo(address, attemptDeadline, &socket);
        if (lastError == 0) return socket;
        RINGTREE_DEBUG("rank " << rank_ << ": connecting to " << describe(peer, false) << ", attempt " << attempt
                               << ": " << net::errnoText(lastError));
      }
      if (Clock::now() >= deadline_) {
        throw NetworkError("rank " + std::to_string(rank_) + " could not connect to " + describe(peer, false) +
                           " within " + std::to_string(elapsedMs()) + " ms (" +
                           std::to_string(attempt) + " attempts): " + net::errnoText(lastError) + " (" +
                           interfaceText(peer) + ")");
      }
      std::this_thread::sleep_for(std::min(backoff, remaining()));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }

  void connectToLower(int peer) {
    const Route r = route(peer);
    net::Socket shmSocket;
    std::string shmError;
    if (r != Route::kTcp) {
      shmSocket = transport::shm::connect(record(peer).shmName, deadline_, &shmError);
      if (shmSocket.valid()) {
        const Hello h = hello(peer, HelloTransport::kShm);
        const net::IoResult io = net::sendAll(shmSocket.fd(), &h, sizeof(h), deadline_);
        if (!io.ok()) {
          throw NetworkError("rank " + std::to_string(rank_) + ": shared-memory handshake with " +
                             describe(peer, true) + " failed: " + io.describe());
        }
      } else if (r == Route::kShmPreferred) {
        RINGTREE_INFO("rank " << rank_ << ": " << describe(peer, false)
                              << " looks local but its shared-memory listener is unreachable (" << shmError
                              << "); using TCP");
      }
    }
    const HelloTransport transport = shmSocket.valid()          ? HelloTransport::kShm
                                     : r == Route::kShmRequired ? HelloTransport::kShmUnreachable
                                                                : HelloTransport::kTcp;
    net::Socket tcpSocket = connectTcp(peer);
    const std::string where = net::formatHostPort(record(peer).tcpHost, record(peer).tcpPort);
    const Hello mine = hello(peer, transport);
    net::IoResult io = net::sendAll(tcpSocket.fd(), &mine, sizeof(mine), deadline_);
    if (!io.ok()) {
      throw NetworkError("rank " + std::to_string(rank_) + ": handshake with " + describe(peer, false) +
                         " failed: " + io.describe());
    }
    if (transport == HelloTransport::kShmUnreachable) {
      throw NetworkError("rank " + std::to_string(rank_) + " cannot reach " + describe(peer, true) +
                         " over shared memory (" + shmError + "), and transport shm is required");
    }
    Hello reply;
    io = net::recvAll(tcpSocket.fd(), &reply, sizeof(reply), deadline_);
    if (!io.ok()) {
      throw NetworkError("rank " + std::to_string(rank_) + ": " + describe(peer, false) +
                         " did not answer the handshake at " + where + ": " + io.describe() +
                         " (is a process of another job or communicator listening there?)");
    }
    if (!validHello(reply, peer) || reply.transport != mine.transport) {
      throw NetworkError("rank " + std::to_string(rank_) + ": the process at " + where + " is not " +
                         describe(peer, false) + " of this communicator (its handshake does not match)");
    }
    finishPair(peer, transport == HelloTransport::kShm, std::move(tcpSocket), std::move(shmSocket),
               /*initiator=*/true);
  }

  void finishPair(int peer, bool shm, net::Socket tcpSocket, net::Socket shmSocket, bool initiator) {
    if (shm) {
      pairs_[static_cast<size_t>(peer)] = transport::shm::createPair(
          std::move(shmSocket), initiator, rank_, peer, describe(peer, true), options_.shm, deadline_);
    } else {
      pairs_[static_cast<size_t>(peer)] =
          transport::tcp::createPair(std::move(tcpSocket), rank_, peer, describe(peer, false), options_.tcp);
    }
    RINGTREE_DEBUG("rank " << rank_ << " connected to " << describe(peer, shm));
  }

  // Whether the records alone allow a node arena: one host, shared memory offered and not
  // excluded by any rank. The same answer on every rank.
  bool arenaPossible() const {
    for (const PeerRecord& r : records_) {
      if (r.transport == TransportKind::kTcp || r.shmName.empty() || !sameHost(r.host, record(0).host)) {
        return false;
      }
    }
    return true;
  }

  // Whether every rank allows the arena and reaches every peer over shared memory.
  bool voteForArena() {
    bool vote = options_.arena;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_ && std::strcmp(pairs_[static_cast<size_t>(peer)]->kind(), "shm") != 0) vote = false;
    }
    store_.set(arenaKey(rank_), Bytes{static_cast<uint8_t>(vote ? 1 : 0)});
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back(arenaKey(r));
    try {
      store_.wait(keys, remaining());
    } catch (const StoreError& e) {
      throw StoreError("rank " + std::to_string(rank_) + ": not every rank said within " +
                       std::to_string(elapsedMs()) +
                       " ms whether it can use a node arena (store keys 'rt/comm/arena/<rank>'): " + e.what());
    }
    for (const Bytes& value : store_.multiGet(keys)) {
      if (value != Bytes{1}) return false;
    }
    return true;
  }

  // Rank 0: creates the arena and hands it to every other rank.
  std::shared_ptr<transport::shm::NodeArena> grantArena() {
    std::shared_ptr<transport::shm::NodeArena> arena;
    try {
      arena = transport::shm::NodeArena::create(size_);
    } catch (const NetworkError& e) {
      throw NetworkError("rank 0: cannot create the node arena for " + std::to_string(size_) + " ranks: " + e.what());
    }
    const ArenaGrant grant{kArenaGrantMagic, size_, arena->slotBytes()};
    std::vector<bool> granted(static_cast<size_t>(size_), false);
    for (int missing = size_ - 1; missing > 0;) {
      net::Socket socket;
      try {
        socket = shm_->accept(deadline_);
      } catch (const Error& e) {
        std::vector<int> ranks;
        for (int r = 1; r < size_; ++r) {
          if (!granted[static_cast<size_t>(r)]) ranks.push_back(r);
        }
        throw NetworkError("rank 0: " + text::rankList(ranks) + " did not ask for the node arena within " + std::to_string(elapsedMs()) +
                           " ms: " + e.what());
      }
      ArenaHello hello;
      const net::IoResult io =
          net::recvAll(socket.fd(), &hello, sizeof(hello), std::min(deadline_, Clock::now() + kHelloTimeout));
      if (!io.ok() || hello.magic != kArenaHelloMagic || hello.nonce != nonce_ || hello.rank <= 0 ||
          hello.rank >= size_ || granted[static_cast<size_t>(hello.rank)]) {
        RINGTREE_DEBUG("rank 0: rejecting a node arena request without a valid handshake");
        continue;
      }
      const net::IoResult sent =
          transport::shm::sendWithDescriptor(socket.fd(), &grant, sizeof(grant), arena->descriptor(), deadline_);
      if (!sent.ok()) {
        throw NetworkError("rank 0: handing the node arena to " + describe(hello.rank, true) +
                           " failed: " + sent.describe());
      }
      granted[static_cast<size_t>(hello.rank)] = true;
      --missing;
    }
    arena->closeDescriptor();
    return arena;
  }

  // Rank > 0: asks rank 0 for the arena and maps it.
  std::shared_ptr<transport::shm::NodeArena> receiveArena() {
    const std::string peer = describe(0, true);
    std::string error;
    net::Socket socket = transport::shm::connect(record(0).shmName, deadline_, &error);
    if (!socket.valid()) {
      throw NetworkError("rank " + std::to_string(rank_) + " cannot ask " + peer + " for the node arena: " + error);
    }
    ArenaHello hello;
    hello.rank = rank_;
    hello.nonce = nonce_;
    net::IoResult io = net::sendAll(socket.fd(), &hello, sizeof(hello), deadline_);
    ArenaGrant grant;
    transport::shm::Ancillary ancillary;
    if (io.ok()) io = transport::shm::recvWithDescriptor(socket.fd(), &grant, sizeof(grant), deadline_, &ancillary);
    if (!io.ok()) {
      throw NetworkError("rank " + std::to_string(rank_) + ": receiving the node arena from " + peer +
                         " failed: " + io.describe());
    }
    if (grant.magic != kArenaGrantMagic || grant.size != size_ || !ancillary.descriptor.valid() ||
        ancillary.extraDescriptors != 0) {
      throw NetworkError("rank " + std::to_string(rank_) + ": " + peer +
                         " answered the node arena request with something other than one arena of " +
                         std::to_string(size_) + " slots");
    }
    try {
      return transport::shm::NodeArena::attach(std::move(ancillary.descriptor), rank_, size_, grant.slotBytes);
    } catch (const Error& e) {
      throw NetworkError("rank " + std::to_string(rank_) + ": cannot map the node arena of " + peer + ": " + e.what());
    }
  }

  // A connection accepted on the TCP listener whose handshake is still arriving.
  struct Pending {
    net::Socket socket;
    Hello hello;
    size_t received = 0;
    Clock::time_point since;
  };

  void acceptFromHigher() {
    int missing = size_ - 1 - rank_;
    std::vector<Pending> pending;
    std::vector<pollfd> fds;
    while (missing > 0) {
      if (Clock::now() >= deadline_) throwAcceptTimeout();
      fds.assign(1, pollfd{tcp_.socket.fd(), POLLIN, 0});
      for (const Pending& p : pending) fds.push_back(pollfd{p.socket.fd(), POLLIN, 0});
      // Wake at least every second to drop connections that never send their handshake.
      int timeoutMs = net::pollTimeoutMs(deadline_);
      if (timeoutMs < 0 || timeoutMs > 1000) timeoutMs = 1000;
      const int rc = ::poll(fds.data(), fds.size(), timeoutMs);
      if (rc < 0) {
        if (errno == EINTR) continue;
        throw NetworkError("rank " + std::to_string(rank_) + ": poll failed while accepting peers: " +
                           net::errnoText(errno));
      }
      // Handshakes first (fds[1..] match pending as it was), then new connections.
      const auto now = Clock::now();
      for (size_t i = 0; i < pending.size(); ++i) {
        Pending& p = pending[i];
        if (fds[i + 1].revents == 0) {
          if (now - p.since > kHelloTimeout) {
            RINGTREE_DEBUG("rank " << rank_ << ": dropping connection from " << net::peerName(p.socket.fd())
                                   << ": no handshake");
            p.socket.reset();
          }
          continue;
        }
        if (!readHello(&p)) continue;
        if (p.received < sizeof(Hello)) continue;
        Pending done = std::move(p);
        if (acceptHello(std::move(done))) --missing;
      }
      pending.erase(std::remove_if(pending.begin(), pending.end(),
                                   [](const Pending& p) { return !p.socket.valid(); }),
                    pending.end());
      if (fds[0].revents != 0) acceptConnections(&pending);
    }
  }

  // Reads what has arrived of p's handshake. Returns false (and closes p) when the
  // connection failed.
  bool readHello(Pending* p) {
    for (;;) {
      const ssize_t n = ::recv(p->socket.fd(), reinterpret_cast<uint8_t*>(&p->hello) + p->received,
                               sizeof(Hello) - p->received, MSG_DONTWAIT);
      if (n > 0) {
        p->received += static_cast<size_t>(n);
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      RINGTREE_DEBUG("rank " << rank_ << ": connection from " << net::peerName(p->socket.fd())
                             << " closed before its handshake");
      p->socket.reset();
      return false;
    }
  }

  void acceptConnections(std::vector<Pending>* pending) {
    for (;;) {
      const int fd = ::accept4(tcp_.socket.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        throw NetworkError("rank " + std::to_string(rank_) + ": accept on " +
                           net::formatHostPort(tcp_.host, tcp_.port) + " failed: " + net::errnoText(errno));
      }
      pending->push_back(Pending{net::Socket(fd), Hello{}, 0, Clock::now()});
    }
  }

  // Handles a complete handshake. Returns whether it connected a peer; a stray or
  // duplicate connection is closed (and logged) instead.
  bool acceptHello(Pending p) {
    const Hello& h = p.hello;
    if (!validHello(h, -1) || h.senderRank < rank_ || pairs_[static_cast<size_t>(h.senderRank)] != nullptr) {
      RINGTREE_DEBUG("rank " << rank_ << ": rejecting connection from " << net::peerName(p.socket.fd())
                             << ": not a handshake of a higher rank of this communicator");
      return false;
    }
    const int peer = h.senderRank;
    const Route r = route(peer);
    const auto transport = static_cast<HelloTransport>(h.transport);
    if (transport == HelloTransport::kShmUnreachable) {
      throw NetworkError("rank " + std::to_string(rank_) + ": " + describe(peer, true) +
                         " cannot reach this rank over shared memory, and transport shm is required "
                         "(that rank's error names the cause)");
    }
    if ((transport == HelloTransport::kShm && r == Route::kTcp) ||
        (transport == HelloTransport::kTcp && r == Route::kShmRequired)) {
      throw NetworkError("rank " + std::to_string(rank_) + ": " + describe(peer, false) + " asks for transport " +
                         (transport == HelloTransport::kShm ? "shm" : "tcp") + ", which the two ranks' options exclude");
    }
    const Hello reply = hello(peer, transport);
    const net::IoResult io = net::sendAll(p.socket.fd(), &reply, sizeof(reply), deadline_);
    if (!io.ok()) {
      throw NetworkError("rank " + std::to_string(rank_) + ": handshake with " + describe(peer, false) +
                         " failed: " + io.describe());
    }
    net::Socket shmSocket;
    if (transport == HelloTransport::kShm) shmSocket = takeShmConnection(peer);
    finishPair(peer, transport == HelloTransport::kShm, std::move(p.socket), std::move(shmSocket),
               /*initiator=*/false);
    return true;
  }

  // The shared-memory connection of peer, which connected it before it sent its TCP
  // handshake. Others that arrive first are kept for their own handshakes.
  net::Socket takeShmConnection(int peer) {
    while (shmArrived_.count(peer) == 0) {
      net::Socket socket;
      try {
        socket = shm_->accept(deadline_);
      } catch (const Error& e) {
        throw NetworkError("rank " + std::to_string(rank_) + ": " + describe(peer, true) +
                           " announced a shared-memory connection that did not arrive: " + e.what());
      }
      Hello h;
      const net::IoResult io = net::recvAll(socket.fd(), &h, sizeof(h), std::min(deadline_, Clock::now() + kHelloTimeout));
      if (!io.ok() || !validHello(h, -1) || h.transport != static_cast<uint8_t>(HelloTransport::kShm) ||
          h.senderRank < rank_) {
        RINGTREE_DEBUG("rank " << rank_ << ": rejecting a shared-memory connection without a valid handshake");
        continue;
      }
      shmArrived_[h.senderRank] = std::move(socket);
    }
    net::Socket socket = std::move(shmArrived_[peer]);
    shmArrived_.erase(peer);
    return socket;
  }

  [[noreturn]] void throwAcceptTimeout() const {
    std::vector<int> missing;
    for (int r = rank_ + 1; r < size_; ++r) {
      if (pairs_[static_cast<size_t>(r)] == nullptr) missing.push_back(r);
    }
    throw NetworkError("rank " + std::to_string(rank_) + ": " + text::rankList(missing) + " did not connect within " + std::to_string(elapsedMs()) +
                       " ms to this rank's address " + net::formatHostPort(tcp_.host, tcp_.port) + " (from " +
                       tcp_.origin + "; RINGTREE_SOCKET_IFNAME selects the interface)");
  }

  Store& store_;
  int rank_;
  int size_;
  ConnectOptions options_;
  Clock::time_point start_;
  net::Deadline deadline_;
  std::vector<std::unique_ptr<Pair>> pairs_;
  std::vector<PeerRecord> records_;
  TcpListener tcp_;
  std::unique_ptr<transport::shm::Listener> shm_;
  Nonce nonce_{};
  std::map<int, net::Socket> shmArrived_;
};

}  // namespace

ConnectOptions connectOptionsFrom(const CommunicatorOptions& options) {
  if (options.timeout.count() < 0) {
    throw InvalidArgument("communicator timeout must not be negative (got " +
                          std::to_string(options.timeout.count()) + " ms)");
  }
  ConnectOptions result;
  result.transport = options.transport;
  const std::string transport = env::transport();
  if (!transport.empty()) {
    try {
      result.transport = parseTransportKind(transport);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("RINGTREE_TRANSPORT: ") + e.what());
    }
  }
  result.interface = options.interface.empty() ? env::socketIfname() : options.interface;
  const std::string arena = env::shmArena();
  if (!arena.empty() && arena != "0" && arena != "1") {
    throw InvalidArgument("RINGTREE_SHM_ARENA must be 0 or 1 (got '" + arena + "')");
  }
  result.arena = arena != "0";
  result.timeout = options.timeout;
  return result;
}

std::vector<std::unique_ptr<Pair>> connectFullMesh(Store& store, int rank, int size, const ConnectOptions& options,
                                                   std::shared_ptr<transport::shm::NodeArena>* arena) {
  if (size == 1) return std::vector<std::unique_ptr<Pair>>(1);
  return MeshBuilder(store, rank, size, options).run(arena);
}

}  // namespace ringtree::rendezvous
