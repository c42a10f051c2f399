#include "rendezvous/connect.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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
#include "rendezvous/arena_setup.h"
#include "rendezvous/handshake.h"
#include "rendezvous/listener.h"
#include "rendezvous/peer_record.h"
#include "rendezvous/phase.h"

namespace ringtree::rendezvous {

namespace {

using Clock = net::Clock;
using std::chrono::milliseconds;
using transport::Pair;

// Bounds of one TCP connect attempt and of the backoff between attempts.
constexpr milliseconds kConnectAttempt = std::chrono::seconds(5);
constexpr milliseconds kFirstBackoff{10};
constexpr milliseconds kMaxBackoff{1000};
// How long a peer whose connection broke gets to show as exited in /proc.
constexpr milliseconds kExitSettle{250};
// How long a running peer of this host may refuse connections at its published address
// before its record counts as one of a connection phase that is over: within that time it
// may publish again (a group re-created in a live process over the same store keys).
constexpr milliseconds kListenerGrace{1000};

// Connects rank to all its peers; one object per connectFullMesh call.
class MeshBuilder {
 public:
  MeshBuilder(Store& store, int rank, int size, const ConnectOptions& options)
      : store_(store),
        rank_(rank),
        size_(size),
        options_(options),
        phase_{rank, size, Clock::now(), net::deadlineAfter(options.timeout), options.timeout},
        pairs_(static_cast<size_t>(size)),
        records_(static_cast<size_t>(size)),
        recordBytes_(static_cast<size_t>(size)) {}

  std::vector<std::unique_ptr<Pair>> run(std::shared_ptr<arena::NodeArena>* arena, std::vector<int>* hostOf) {
    publish();
    readRecords();
    // Every rank sees every record: incompatible options fail on both sides of the pair
    // at once instead of leaving the acceptor waiting for its timeout.
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) route(peer);
    }
    for (int peer = 0; peer < rank_; ++peer) connectToLower(peer);
    acceptFromHigher();
    if (arena != nullptr && arenaPossible(records_)) {
      // This rank's vote: the arena allowed, and every peer reached over shared memory.
      bool vote = options_.arena;
      for (int peer = 0; peer < size_; ++peer) {
        if (peer != rank_ && std::strcmp(pairs_[static_cast<size_t>(peer)]->kind(), "shm") != 0) vote = false;
      }
      *arena = setUpNodeArena(ArenaSetup{store_, phase_, records_, nonce_, *shm_}, vote);
      if (*arena != nullptr) {
        RINGTREE_DEBUG("rank " << rank_ << " maps the node arena: " << size_ << " slots of "
                               << (*arena)->slotBytes() << " bytes");
      }
    }
    if (hostOf != nullptr) *hostOf = hostsOfRecords();
    return std::move(pairs_);
  }

 private:
  enum class Route { kTcp, kShmPreferred, kShmRequired };

  void publish() {
    PeerRecord& self = records_[static_cast<size_t>(rank_)];
    self.process = localProcessIdentity();
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
    const Bytes mine = encodeRecord(self);
    Bytes held = store_.compareSet(addressKey(rank_), Bytes{}, mine);
    while (held != mine) {
      refuseIfRankHeld(held);
      held = store_.compareSet(addressKey(rank_), held, mine);  // another writer meanwhile: judge it too
    }
    nonce_ = agreeOnNonce(store_);
  }

  // Whether the store holds a record this very process published under another rank's
  // key: an earlier group over the same keys (re-created with its ranks in another order).
  bool ownRecordUnderAnotherRank() const {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || !store_.check({addressKey(r)})) continue;
      PeerRecord other;
      if (decodeRecord(store_.get(addressKey(r)), &other) && sameProcess(other.process, record(rank_).process)) {
        return true;
      }
    }
    return false;
  }

  // This rank's key already held `held` when it came to publish. A record of a process
  // that has exited is a leftover to replace; one of this process is its own from an
  // earlier group over the same keys (torch names groups anew after
  // destroy_process_group): replaced, and the store counts as this job's
  // (earlierIncarnation_). One of another process that still runs means two live
  // processes claim this rank on one store: an earlier job that lingers, reached again by
  // a relaunch on the same store, or a rank given twice -- unless this process's own
  // record sits under another rank (an earlier group of these same processes, ranks
  // reordered). Waiting cannot resolve the conflict, so it throws StoreError at once. (A
  // record from another host cannot be checked and is replaced.)
  void refuseIfRankHeld(const Bytes& held) {
    PeerRecord previous;
    if (!decodeRecord(held, &previous)) {
      throw StoreError("rank " + std::to_string(rank_) + ": the store key '" + addressKey(rank_) +
                       "' holds something that is no address record (a key of another program in this store?)");
    }
    const ProcessIdentity& self = record(rank_).process;
    if (sameProcess(previous.process, self)) {
      earlierIncarnation_ = true;
      return;
    }
    if (livenessOf(previous.process) != Liveness::kRunning) return;
    if (ownRecordUnderAnotherRank()) {
      earlierIncarnation_ = true;
      return;
    }
    throw StoreError("rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": the store already holds " +
                     "the address of rank " + std::to_string(rank_) + " from another process that still runs (" +
                     describeLiveRecord(previous) + "): a job that still runs uses this store (a relaunch on the " +
                     "same MASTER_ADDR:MASTER_PORT, store or file:// path while processes of the earlier job " +
                     "linger?), or two processes were given rank " + std::to_string(rank_) + ". Stop pid " +
                     std::to_string(previous.process.pid) + " or give this job a store of its own");
  }

  // "host 'vm', pid 1234 ('python train.py', running for 35 s), tcp 10.0.0.2:41234": a
  // record of a process that runs on this host.
  static std::string describeLiveRecord(const PeerRecord& r) {
    return "host '" + r.process.hostname + "', " + describeLocalProcess(r.process.pid) + ", tcp " +
           net::formatHostPort(r.tcpHost, r.tcpPort);
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
      store_.wait(keys, phase_.remaining());
    } catch (const StoreError&) {
      std::vector<int> missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!store_.check({keys[i]})) missing.push_back(ranks[i]);
      }
      if (missing.empty()) throw;
      throw StoreError("rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
                       text::rankList(missing) + " did not publish an address (store keys 'rt/comm/addr/<rank>') within " +
                       std::to_string(phase_.elapsedMs()) +
                       " ms; did every rank start, with the same store and world size?");
    }
    // A record whose process has exited was left in a reused store by a job that did not
    // finish: it counts as not yet published, until that rank of this job overwrites it.
    // So does, once this rank's key held its own record of an earlier group over the same
    // keys (earlierIncarnation_), a record of another size from a live process of this
    // host: it is of that earlier group. (A record of this process under another rank is
    // not judged: ranks of one process on threads publish such records legitimately.)
    const ProcessIdentity& self = record(rank_).process;
    auto backoff = milliseconds(1);
    for (;;) {
      const std::vector<Bytes> values = store_.multiGet(keys);
      std::vector<int> stale;
      std::string staleText;
      for (size_t i = 0; i < keys.size(); ++i) {
        PeerRecord& record = records_[static_cast<size_t>(ranks[i])];
        recordBytes_[static_cast<size_t>(ranks[i])] = values[i];
        if (!decodeRecord(values[i], &record)) {
          throw StoreError("the address record of rank " + std::to_string(ranks[i]) + " under '" + keys[i] +
                           "' is malformed (a key of another program in this store?)");
        }
        const bool earlierGroup = earlierIncarnation_ && record.size != size_ && sameHost(record.process, self) &&
                                  livenessOf(record.process) == Liveness::kRunning;
        if (earlierGroup || livenessOf(record.process) == Liveness::kGone) {
          stale.push_back(ranks[i]);
          staleText += (staleText.empty() ? "" : "; ") + describe(ranks[i], false);
          continue;
        }
        if (record.size != size_) {
          throw InvalidArgument("rank " + std::to_string(rank_) + " was created with size " +
                                std::to_string(size_) + " but rank " + std::to_string(ranks[i]) +
                                " with size " + std::to_string(record.size));
        }
      }
      if (stale.empty()) return;
      if (Clock::now() >= phase_.deadline) {
        throw NetworkError("rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": the address records " +
                           "of " + text::rankList(stale) + " (store keys 'rt/comm/addr/<rank>') are from processes " +
                           "that have exited or from an earlier group over the same keys (" + staleText +
                           "): a job that did not finish, or an earlier group, left them in this store, " +
                           "and this job's " + text::rankList(stale) + " did not publish within " +
                           std::to_string(phase_.elapsedMs()) + " ms. Did every rank start? Give each job a store " +
                           "(or file:// path) of its own");
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, phase_.remaining()));
      backoff = std::min(backoff * 2, milliseconds(50));
    }
  }

  const PeerRecord& record(int rank) const { return records_[static_cast<size_t>(rank)]; }

  std::string describe(int peer, bool shm) const { return describePeer(peer, record(peer), shm); }

  // The interfaces in play, for connection errors: named only when the peer runs on
  // another host (on this one, every local address reaches its listener).
  std::string interfaceText(int peer) const {
    if (sameHost(record(peer).process, record(rank_).process)) {
      return "rank " + std::to_string(peer) + " runs on this host";
    }
    return "rank " + std::to_string(peer) + "'s address comes from " + record(peer).tcpOrigin + ", rank " +
           std::to_string(rank_) + "'s from " + tcp_.origin + "; RINGTREE_SOCKET_IFNAME selects the interface";
  }

  // Throws at once when peer's process has exited since it published its record (it was
  // running when readRecords() took it): waiting for it cannot succeed. settle: how long
  // to wait for the process to show as exited, after a sign that it is exiting (its
  // sockets close before /proc shows it gone).
  void throwIfPeerExited(int peer, const std::string& doing, milliseconds settle = milliseconds(0)) const {
    const auto until = Clock::now() + settle;
    while (livenessOf(record(peer).process) != Liveness::kGone) {
      if (Clock::now() >= until) return;
      std::this_thread::sleep_for(milliseconds(5));
    }
    throw NetworkError("rank " + std::to_string(rank_) + " " + doing + " " + describe(peer, false) +
                       ", but that process has exited since it published its address (crashed or killed "
                       "during the rendezvous?)");
  }

  // Whether peer's process runs on this host and refused the connection: it listens at
  // its published address from before publishing until its connection phase ends, so
  // either it has published again since this rank read its record (reloadRecord), or
  // that phase is over and the record cannot be of this communicator.
  bool refusedByLiveLocalPeer(int peer, int error) const {
    const ProcessIdentity& there = record(peer).process;
    return error == ECONNREFUSED && sameHost(there, record(rank_).process) && livenessOf(there) == Liveness::kRunning;
  }

  // Replaces peer's record with the one in the store when the peer has published again
  // since readRecords(); returns whether it did.
  bool reloadRecord(int peer) {
    const Bytes now = store_.get(addressKey(peer));
    if (now == recordBytes_[static_cast<size_t>(peer)]) return false;
    PeerRecord fresh;
    if (!decodeRecord(now, &fresh) || fresh.size != size_) {
      throw StoreError("the address record of rank " + std::to_string(peer) + " under '" + addressKey(peer) +
                       "' was replaced by one that is malformed or of another world size");
    }
    records_[static_cast<size_t>(peer)] = fresh;
    recordBytes_[static_cast<size_t>(peer)] = now;
    RINGTREE_DEBUG("rank " << rank_ << ": " << describe(peer, false) << " published again; connecting there");
    return true;
  }

  // Throws for a running peer of this host that has refused connections at its address
  // for kListenerGrace without publishing again (refusedByLiveLocalPeer).
  [[noreturn]] void throwListenerClosed(int peer, int error) const {
    const ProcessIdentity& there = record(peer).process;
    throwIfPeerExited(peer, "cannot connect (" + net::errnoText(error) + ") to", kExitSettle);
    throw NetworkError("rank " + std::to_string(rank_) + " cannot connect to rank " + std::to_string(peer) + " (" +
                       describeLiveRecord(record(peer)) + "): nothing listens at the address it published, though " +
                       "its process still runs, so its connection phase is over: the record is from an earlier job " +
                       "whose processes linger (a relaunch on the same MASTER_ADDR:MASTER_PORT or store?), or rank " +
                       std::to_string(peer) + " gave up this rendezvous. Stop pid " + std::to_string(there.pid) +
                       " or give this job a store of its own");
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
    const ProcessIdentity& here = record(rank_).process;
    const ProcessIdentity& there = record(peer).process;
    if (!sameHost(here, there)) {
      if (!required) return Route::kTcp;
      throw NetworkError("transport shm is required, but rank " + std::to_string(rank_) + " (host '" +
                         here.hostname + "', boot id " + here.bootId + ") and " + describe(peer, false) +
                         " (boot id " + there.bootId + ") are not on one host");
    }
    if (!shm_ || record(peer).shmName.empty()) return Route::kTcp;  // auto, and one side lacks shm
    return required ? Route::kShmRequired : Route::kShmPreferred;
  }

  Hello hello(int peer, HelloTransport transport) const { return makeHello(rank_, peer, transport, nonce_); }

  // Whether h is a valid handshake of this communicator from `sender` to this rank
  // (sender -1: any rank).
  bool validHello(const Hello& h, int sender) const { return rendezvous::validHello(h, nonce_, rank_, size_, sender); }

  // Connects to peer's TCP listener, retrying with backoff until the deadline. Returns an
  // invalid socket when the peer published a new record meanwhile (reloadRecord): the
  // caller starts over with it.
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
    Clock::time_point refusedSince{};
    for (int attempt = 1;; ++attempt) {
      for (const auto& address : addresses) {
        net::Socket socket;
        const auto attemptDeadline = std::min(phase_.deadline, Clock::now() + kConnectAttempt);
        lastError = net::connectTo(address, attemptDeadline, &socket);
        if (lastError == 0) return socket;
        RINGTREE_DEBUG("rank " << rank_ << ": connecting to " << describe(peer, false) << ", attempt " << attempt
                               << ": " << net::errnoText(lastError));
      }
      throwIfPeerExited(peer, "cannot connect (" + net::errnoText(lastError) + ") to");
      if (refusedByLiveLocalPeer(peer, lastError)) {
        if (reloadRecord(peer)) return net::Socket();
        // In a store of this job's earlier group the peer will publish again: it is waited
        // for (up to the deadline) however late it comes.
        if (!earlierIncarnation_) {
          if (refusedSince == Clock::time_point{}) {
            refusedSince = Clock::now();
          } else if (Clock::now() - refusedSince >= kListenerGrace) {
            throwListenerClosed(peer, lastError);
          }
        }
      }
      if (Clock::now() >= phase_.deadline) {
        throw NetworkError("rank " + std::to_string(rank_) + " could not connect to " + describe(peer, false) +
                           " within " + std::to_string(phase_.elapsedMs()) + " ms (" +
                           std::to_string(attempt) + " attempts): " + net::errnoText(lastError) + " (" +
                           interfaceText(peer) + ")");
      }
      std::this_thread::sleep_for(std::min(backoff, phase_.remaining()));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }

  void connectToLower(int peer) {
    while (!tryConnectToLower(peer)) {
    }
  }

  // One attempt at the pair (peer, this rank) with peer's current record; false when the
  // peer published a new record meanwhile (then nothing is left half-connected).
  bool tryConnectToLower(int peer) {
    const Route r = route(peer);
    const net::Deadline deadline = phase_.deadline;
    net::Socket shmSocket;
    std::string shmError;
    if (r != Route::kTcp) {
      shmSocket = transport::shm::connect(record(peer).shmName, deadline, &shmError);
      if (shmSocket.valid()) {
        const Hello h = hello(peer, HelloTransport::kShm);
        const net::IoResult io = net::sendAll(shmSocket.fd(), &h, sizeof(h), deadline);
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
    if (!tcpSocket.valid()) return false;
    const std::string where = net::formatHostPort(record(peer).tcpHost, record(peer).tcpPort);
    const Hello mine = hello(peer, transport);
    net::IoResult io = net::sendAll(tcpSocket.fd(), &mine, sizeof(mine), deadline);
    if (!io.ok()) {
      throw NetworkError("rank " + std::to_string(rank_) + ": handshake with " + describe(peer, false) +
                         " failed: " + io.describe());
    }
    if (transport == HelloTransport::kShmUnreachable) {
      throw NetworkError("rank " + std::to_string(rank_) + " cannot reach " + describe(peer, true) +
                         " over shared memory (" + shmError + "), and transport shm is required");
    }
    Hello reply;
    io = net::recvAll(tcpSocket.fd(), &reply, sizeof(reply), deadline);
    if (!io.ok()) {
      throwIfPeerExited(peer, "waits for the handshake's answer of", kExitSettle);
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
    return true;
  }

  void finishPair(int peer, bool shm, net::Socket tcpSocket, net::Socket shmSocket, bool initiator) {
    if (shm) {
      pairs_[static_cast<size_t>(peer)] = transport::shm::createPair(
          std::move(shmSocket), initiator, rank_, peer, describe(peer, true), options_.shm, phase_.deadline);
    } else {
      pairs_[static_cast<size_t>(peer)] =
          transport::tcp::createPair(std::move(tcpSocket), rank_, peer, describe(peer, false), options_.tcp);
    }
    RINGTREE_DEBUG("rank " << rank_ << " connected to " << describe(peer, shm));
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
      if (Clock::now() >= phase_.deadline) throwAcceptTimeout();
      for (int r = rank_ + 1; r < size_; ++r) {
        if (pairs_[static_cast<size_t>(r)] == nullptr) throwIfPeerExited(r, "waits for a connection from");
      }
      fds.assign(1, pollfd{tcp_.socket.fd(), POLLIN, 0});
      for (const Pending& p : pending) fds.push_back(pollfd{p.socket.fd(), POLLIN, 0});
      // Wake at least every second to drop connections that never send their handshake.
      int timeoutMs = net::pollTimeoutMs(phase_.deadline);
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
    const net::IoResult io = net::sendAll(p.socket.fd(), &reply, sizeof(reply), phase_.deadline);
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
        socket = shm_->accept(phase_.deadline);
      } catch (const Error& e) {
        throw NetworkError("rank " + std::to_string(rank_) + ": " + describe(peer, true) +
                           " announced a shared-memory connection that did not arrive: " + e.what());
      }
      Hello h;
      const net::IoResult io =
          net::recvAll(socket.fd(), &h, sizeof(h), std::min(phase_.deadline, Clock::now() + kHelloTimeout));
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

  // The host index of every rank: the index of the first rank with the same host.
  std::vector<int> hostsOfRecords() const {
    std::vector<int> hostOf(static_cast<size_t>(size_));
    std::vector<int> firstRankOfHost;
    for (int r = 0; r < size_; ++r) {
      const auto known = std::find_if(firstRankOfHost.begin(), firstRankOfHost.end(),
                                      [&](int first) { return sameHost(record(first).process, record(r).process); });
      hostOf[static_cast<size_t>(r)] = static_cast<int>(known - firstRankOfHost.begin());
      if (known == firstRankOfHost.end()) firstRankOfHost.push_back(r);
    }
    return hostOf;
  }

  [[noreturn]] void throwAcceptTimeout() const {
    std::vector<int> missing;
    for (int r = rank_ + 1; r < size_; ++r) {
      if (pairs_[static_cast<size_t>(r)] == nullptr) missing.push_back(r);
    }
    // The interface may be the cause only for ranks on other hosts.
    const bool elsewhere = std::any_of(missing.begin(), missing.end(),
                                       [&](int r) { return !sameHost(record(r).process, record(rank_).process); });
    throw NetworkError("rank " + std::to_string(rank_) + ": " + text::rankList(missing) + " did not connect within " +
                       std::to_string(phase_.elapsedMs()) + " ms to this rank's address " +
                       net::formatHostPort(tcp_.host, tcp_.port) + " (from " + tcp_.origin +
                       (elsewhere ? "; RINGTREE_SOCKET_IFNAME selects the interface)" : "; they run on this host)"));
  }

  Store& store_;
  int rank_;
  int size_;
  ConnectOptions options_;
  Phase phase_;
  std::vector<std::unique_ptr<Pair>> pairs_;
  std::vector<PeerRecord> records_;
  std::vector<Bytes> recordBytes_;  // records_ as read from the store (reloadRecord)
  // Whether the store holds records of an earlier group of this very process over the
  // same keys (see refuseIfRankHeld): its live peers' stale records are then waited for,
  // not refused.
  bool earlierIncarnation_ = false;
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
                                                   std::shared_ptr<arena::NodeArena>* arena, std::vector<int>* hostOf) {
  if (size == 1) {
    if (hostOf != nullptr) *hostOf = {0};
    return std::vector<std::unique_ptr<Pair>>(1);
  }
  return MeshBuilder(store, rank, size, options).run(arena, hostOf);
}

}  // namespace ringtree::rendezvous
