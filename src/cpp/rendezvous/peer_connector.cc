#include "rendezvous/peer_connector.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include <ringtree/error.h>

#include "common/logging.h"
#include "common/text.h"
#include "rendezvous/arena_setup.h"
#include "transport/tcp/device.h"

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
// How often the threads look at what they wait for (a stop, a declined dial's peer).
constexpr milliseconds kTick{100};
// Dialer threads: a dial that waits on an unreachable peer holds one of them.
constexpr int kDialers = 4;

}  // namespace

std::shared_ptr<PeerConnector> PeerConnector::start(Setup setup) {
  std::shared_ptr<PeerConnector> connector(new PeerConnector(std::move(setup)));
  for (int peer = 0; peer < connector->size_; ++peer) {
    if (peer == connector->rank_) continue;
    connector->links_[static_cast<size_t>(peer)] = std::make_shared<transport::mux::Link>(
        peer, connector->describe(peer, std::string(connector->expectedKind(peer)) == "shm"),
        connector->expectedKind(peer), std::weak_ptr<transport::mux::LinkConnector>(connector));
  }
  // The threads hold a plain pointer: the destructor joins them.
  PeerConnector* self = connector.get();
  connector->acceptor_ = std::thread([self] { self->acceptorLoop(); });
  for (int i = 0; i < kDialers; ++i) {
    connector->dialers_.emplace_back([self, i] { self->dialerLoop(/*watchAwaiting=*/i == 0); });
  }
  return connector;
}

PeerConnector::PeerConnector(Setup setup)
    : store_(std::move(setup.store)),
      rank_(setup.rank),
      size_(setup.size),
      options_(setup.options),
      earlierIncarnation_(setup.earlierIncarnation),
      nonce_(setup.nonce),
      tcp_(std::move(setup.tcp)),
      shm_(std::move(setup.shm)),
      early_(std::move(setup.early)),
      records_(std::move(setup.records)),
      recordBytes_(std::move(setup.recordBytes)),
      links_(static_cast<size_t>(size_)),
      states_(static_cast<size_t>(size_), State::kIdle),
      failures_(static_cast<size_t>(size_)),
      awaitUntil_(static_cast<size_t>(size_)),
      awaitSince_(static_cast<size_t>(size_)),
      stopEvent_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!stopEvent_.valid()) {
    throw NetworkError("rank " + std::to_string(rank_) + ": cannot create an eventfd for the connection threads: " +
                       net::errnoText(errno));
  }
}

PeerConnector::~PeerConnector() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    stop_.store(true, std::memory_order_release);
  }
  changed_.notify_all();
  const uint64_t one = 1;
  if (::write(stopEvent_.fd(), &one, sizeof(one)) < 0) {
    RINGTREE_WARN("rank " << rank_ << ": cannot wake the connection acceptor: " << net::errnoText(errno));
  }
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& dialer : dialers_) dialer.join();
}

// ---------------------------------------------------------------------------------------
// Records and routes

PeerRecord PeerConnector::record(int peer) const {
  const std::lock_guard<std::mutex> lock(recordsMutex_);
  return records_[static_cast<size_t>(peer)];
}

std::string PeerConnector::describe(int peer, bool shm) const { return describePeer(peer, record(peer), shm); }

std::string PeerConnector::interfaceText(int peer) const {
  const PeerRecord there = record(peer);
  if (sameHost(there.process, record(rank_).process)) return "rank " + std::to_string(peer) + " runs on this host";
  return "rank " + std::to_string(peer) + "'s address comes from " + there.tcpOrigin + ", rank " +
         std::to_string(rank_) + "'s from " + tcp_.origin + "; RINGTREE_SOCKET_IFNAME selects the interface";
}

PeerConnector::Route PeerConnector::route(int peer) const {
  const PeerRecord there = record(peer);
  const PeerRecord here = record(rank_);
  const TransportKind mine = options_.transport;
  const TransportKind theirs = there.transport;
  if ((mine == TransportKind::kTcp && theirs == TransportKind::kShm) ||
      (mine == TransportKind::kShm && theirs == TransportKind::kTcp)) {
    throw InvalidArgument("rank " + std::to_string(rank_) + " uses transport '" + transportKindName(mine) +
                          "' but rank " + std::to_string(peer) + " uses '" + transportKindName(theirs) +
                          "' (CommunicatorOptions::transport / RINGTREE_TRANSPORT must agree)");
  }
  if (mine == TransportKind::kTcp || theirs == TransportKind::kTcp) return Route::kTcp;
  const bool required = mine == TransportKind::kShm || theirs == TransportKind::kShm;
  if (!sameHost(here.process, there.process)) {
    if (!required) return Route::kTcp;
    throw NetworkError("transport shm is required, but rank " + std::to_string(rank_) + " (host '" +
                       here.process.hostname + "', boot id " + here.process.bootId + ") and " +
                       describePeer(peer, there, false) + " (boot id " + there.process.bootId +
                       ") are not on one host");
  }
  if (!shm_ || there.shmName.empty()) return Route::kTcp;  // auto, and one side lacks shm
  return required ? Route::kShmRequired : Route::kShmPreferred;
}

const char* PeerConnector::expectedKind(int peer) const { return route(peer) == Route::kTcp ? "tcp" : "shm"; }

bool PeerConnector::peerGone(int peer) noexcept {
  try {
    return livenessOf(record(peer).process) == Liveness::kGone;
  } catch (...) {
    return false;
  }
}

void PeerConnector::throwIfPeerExited(int peer, const std::string& doing, milliseconds settle) const {
  const auto until = Clock::now() + settle;
  const ProcessIdentity there = record(peer).process;
  while (livenessOf(there) != Liveness::kGone) {
    if (Clock::now() >= until) return;
    std::this_thread::sleep_for(milliseconds(5));
  }
  throw NetworkError("rank " + std::to_string(rank_) + " " + doing + " " + describe(peer, false) +
                     ", but that process has exited since it published its address (crashed or killed "
                     "during the rendezvous?)");
}

bool PeerConnector::refusedByLiveLocalPeer(int peer, int error) const {
  const ProcessIdentity there = record(peer).process;
  return error == ECONNREFUSED && sameHost(there, record(rank_).process) && livenessOf(there) == Liveness::kRunning;
}

bool PeerConnector::reloadRecord(int peer) {
  const Bytes now = store_->get(addressKey(peer));
  PeerRecord fresh;
  {
    const std::lock_guard<std::mutex> lock(recordsMutex_);
    if (now == recordBytes_[static_cast<size_t>(peer)]) return false;
  }
  if (!decodeRecord(now, &fresh) || fresh.size != size_) {
    throw StoreError("the address record of rank " + std::to_string(peer) + " under '" + addressKey(peer) +
                     "' was replaced by one that is malformed or of another world size");
  }
  {
    const std::lock_guard<std::mutex> lock(recordsMutex_);
    records_[static_cast<size_t>(peer)] = fresh;
    recordBytes_[static_cast<size_t>(peer)] = now;
  }
  RINGTREE_DEBUG("rank " << rank_ << ": " << describe(peer, false) << " published again; connecting there");
  return true;
}

void PeerConnector::throwListenerClosed(int peer, int error) const {
  const PeerRecord there = record(peer);
  throwIfPeerExited(peer, "cannot connect (" + net::errnoText(error) + ") to", kExitSettle);
  throw NetworkError("rank " + std::to_string(rank_) + " cannot connect to rank " + std::to_string(peer) + " (" +
                     describeLiveRecord(there) + "): nothing listens at the address it " +
                     "published, though its process still runs, so its connection phase is over: the record is from " +
                     "an earlier job whose processes linger (a relaunch on the same MASTER_ADDR:MASTER_PORT or " +
                     "store?), or rank " + std::to_string(peer) + " gave up this rendezvous. Stop pid " +
                     std::to_string(there.process.pid) + " or give this job a store of its own");
}

void PeerConnector::throwPeerClosed(int peer) const {
  throw NetworkError("rank " + std::to_string(rank_) + " cannot connect to " + describe(peer, false) +
                     ": it no longer accepts connections (its communicator was destroyed or aborted, or its process "
                     "is exiting) and this rank had not needed it before");
}

bool PeerConnector::pause(milliseconds duration) {
  std::unique_lock<std::mutex> lock(mutex_);
  return !changed_.wait_for(lock, duration, [&] { return stopping_; });
}

// ---------------------------------------------------------------------------------------
// Dialing

void PeerConnector::requestConnection(int peer) noexcept {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    State& state = states_[static_cast<size_t>(peer)];
    if (state != State::kIdle) return;
    state = State::kAsked;
    asked_.push_back(peer);
  }
  changed_.notify_all();
}

void PeerConnector::dialerLoop(bool watchAwaiting) {
  for (;;) {
    int peer = -1;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait_for(lock, kTick, [&] { return stopping_ || !asked_.empty(); });
      if (stopping_) return;
      if (!asked_.empty()) {
        peer = asked_.front();
        asked_.pop_front();
      }
    }
    if (peer >= 0) {
      dialPeer(peer, Phase{rank_, size_, Clock::now(), net::deadlineAfter(options_.timeout), options_.timeout},
               /*rendezvous=*/false);
    }
    if (watchAwaiting) checkAwaiting();
  }
}

void PeerConnector::dialPeer(int peer, const Phase& phase, bool rendezvous) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    State& state = states_[static_cast<size_t>(peer)];
    if (state != State::kIdle && state != State::kAsked) return;
    state = State::kDialing;
  }
  std::unique_ptr<Pair> pair;
  try {
    pair = dial(peer, phase, rendezvous);
  } catch (...) {
    fail(peer, std::current_exception(), State::kDialing);  // unless the peer's own connection came meanwhile
    return;
  }
  if (pair != nullptr) {
    install(peer, std::move(pair), State::kDialing);
    return;
  }
  const std::lock_guard<std::mutex> lock(mutex_);
  State& state = states_[static_cast<size_t>(peer)];
  if (state == State::kDialing) {
    state = State::kAwaiting;
    // The first decline's deadline stands for every later dial (checkAwaiting dials again).
    net::Deadline& until = awaitUntil_[static_cast<size_t>(peer)];
    if (until == net::Deadline{}) until = phase.deadline;
    awaitSince_[static_cast<size_t>(peer)] = Clock::now();
  }
  RINGTREE_DEBUG("rank " << rank_ << ": rank " << peer << " declined this rank's connection; its own comes");
}

void PeerConnector::checkAwaiting() {
  std::vector<std::pair<int, net::Deadline>> awaiting;  // with the deadline of its wait
  std::vector<int> again;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto now = Clock::now();
    for (int peer = 0; peer < size_; ++peer) {
      if (states_[static_cast<size_t>(peer)] != State::kAwaiting) continue;
      awaiting.emplace_back(peer, awaitUntil_[static_cast<size_t>(peer)]);
      // Still not dialed by the peer that declined: dial it again, which finds out whether
      // it still dials this rank (declined again), gave up, or closed (refused).
      if (now - awaitSince_[static_cast<size_t>(peer)] >= kListenerGrace &&
          now < awaitUntil_[static_cast<size_t>(peer)]) {
        states_[static_cast<size_t>(peer)] = State::kAsked;
        asked_.push_back(peer);
        again.push_back(peer);
      }
    }
  }
  if (!again.empty()) changed_.notify_all();
  for (const auto& [peer, until] : awaiting) {
    if (std::find(again.begin(), again.end(), peer) != again.end()) continue;
    if (peerGone(peer)) {
      fail(peer,
           std::make_exception_ptr(transport::PeerError(peer, "rank " + std::to_string(rank_) +
                                                                  " waits for the connection of " +
                                                                  describe(peer, false) + ", which has exited")),
           State::kAwaiting);
    } else if (Clock::now() >= until) {
      fail(peer,
           std::make_exception_ptr(transport::PeerError(
               peer, "rank " + std::to_string(rank_) + ": " + describe(peer, false) +
                         " declined this rank's connection but did not connect itself within " +
                         std::to_string(options_.timeout.count()) + " ms")),
           State::kAwaiting);
    }
  }
}

net::Socket PeerConnector::connectTcp(int peer, const Phase& phase, bool rendezvous) {
  const PeerRecord r = record(peer);
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
      const auto attemptDeadline = std::min(phase.deadline, Clock::now() + kConnectAttempt);
      lastError = net::connectTo(address, attemptDeadline, &socket);
      if (lastError == 0) return socket;
      RINGTREE_DEBUG("rank " << rank_ << ": connecting to " << describe(peer, false) << ", attempt " << attempt << ": "
                             << net::errnoText(lastError));
    }
    throwIfPeerExited(peer, "cannot connect (" + net::errnoText(lastError) + ") to");
    // After the rendezvous every record is final (unless a peer's may be of an earlier
    // group of its process, which publishes again): a peer that refuses has closed.
    if (!rendezvous && !earlierIncarnation_ && lastError == ECONNREFUSED) throwPeerClosed(peer);
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
    if (Clock::now() >= phase.deadline) {
      throw NetworkError("rank " + std::to_string(rank_) + " could not connect to " + describe(peer, false) +
                         " within " + std::to_string(phase.elapsedMs()) + " ms (" + std::to_string(attempt) +
                         " attempts): " + net::errnoText(lastError) + " (" + interfaceText(peer) + ")");
    }
    if (!pause(std::min(backoff, phase.remaining()))) {
      throw NetworkError("rank " + std::to_string(rank_) + ": the connections were closed while connecting to " +
                         describe(peer, false));
    }
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

Hello PeerConnector::awaitAnswer(int peer, int fd, const std::string& where, const Phase& phase) {
  // Waits in slices, so that a stopping connector does not wait out the deadline.
  for (;;) {
    int timeoutMs = net::pollTimeoutMs(phase.deadline);
    if (timeoutMs < 0 || timeoutMs > static_cast<int>(kTick.count())) timeoutMs = static_cast<int>(kTick.count());
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, timeoutMs) != 0 || Clock::now() >= phase.deadline) break;
    if (stop_.load(std::memory_order_acquire)) {
      throw NetworkError("rank " + std::to_string(rank_) + ": the connections were closed while connecting to " +
                         describe(peer, false));
    }
  }
  Hello reply;
  const net::IoResult io = net::recvAll(fd, &reply, sizeof(reply), phase.deadline);
  if (!io.ok()) {
    throwIfPeerExited(peer, "waits for the handshake's answer of", kExitSettle);
    throw NetworkError("rank " + std::to_string(rank_) + ": " + describe(peer, false) +
                       " did not answer the handshake at " + where + ": " + io.describe() +
                       " (is a process of another job or communicator listening there?)");
  }
  return reply;
}

std::unique_ptr<Pair> PeerConnector::dial(int peer, const Phase& phase, bool rendezvous) {
  for (;;) {
    const Route r = route(peer);
    const PeerRecord there = record(peer);
    std::string shmError;
    if (r != Route::kTcp) {
      net::Socket shmSocket = transport::shm::connect(there.shmName, phase.deadline, &shmError);
      if (shmSocket.valid()) {
        const Hello mine = hello(peer, HelloTransport::kShm);
        const net::IoResult io = net::sendAll(shmSocket.fd(), &mine, sizeof(mine), phase.deadline);
        if (!io.ok()) {
          throw NetworkError("rank " + std::to_string(rank_) + ": shared-memory handshake with " +
                             describe(peer, true) + " failed: " + io.describe());
        }
        const Hello reply = awaitAnswer(peer, shmSocket.fd(), "its shared-memory listener", phase);
        if (!accepted(peer, reply, mine, "the shared-memory listener of " + describe(peer, true))) return nullptr;
        return makePair(peer, true, std::move(shmSocket), /*initiator=*/true, phase.deadline);
      }
      if (r == Route::kShmPreferred) {
        RINGTREE_INFO("rank " << rank_ << ": " << describe(peer, false)
                              << " looks local but its shared-memory listener is unreachable (" << shmError
                              << "); using TCP");
      }
    }
    const HelloTransport transport = r == Route::kShmRequired ? HelloTransport::kShmUnreachable : HelloTransport::kTcp;
    net::Socket tcpSocket = connectTcp(peer, phase, rendezvous);
    if (!tcpSocket.valid()) continue;  // the peer published a new record: dial that
    const std::string where = net::formatHostPort(there.tcpHost, there.tcpPort);
    const Hello mine = hello(peer, transport);
    const net::IoResult io = net::sendAll(tcpSocket.fd(), &mine, sizeof(mine), phase.deadline);
    if (!io.ok()) {
      throw NetworkError("rank " + std::to_string(rank_) + ": handshake with " + describe(peer, false) +
                         " failed: " + io.describe());
    }
    if (transport == HelloTransport::kShmUnreachable) {
      throw NetworkError("rank " + std::to_string(rank_) + " cannot reach " + describe(peer, true) +
                         " over shared memory (" + shmError + "), and transport shm is required");
    }
    const Hello reply = awaitAnswer(peer, tcpSocket.fd(), where, phase);
    if (!accepted(peer, reply, mine, where)) return nullptr;
    return makePair(peer, false, std::move(tcpSocket), /*initiator=*/true, phase.deadline);
  }
}

bool PeerConnector::accepted(int peer, const Hello& reply, const Hello& mine, const std::string& where) {
  const auto transport = static_cast<HelloTransport>(reply.transport);
  if (!validHello(reply, nonce_, rank_, size_, peer, /*answer=*/true) ||
      (reply.transport != mine.transport && transport != HelloTransport::kDeclined &&
       transport != HelloTransport::kTaken && transport != HelloTransport::kGaveUp)) {
    throw NetworkError("rank " + std::to_string(rank_) + ": the process at " + where + " is not " +
                       describe(peer, false) + " of this communicator (its handshake does not match)");
  }
  if (transport == HelloTransport::kGaveUp) {
    throw NetworkError("rank " + std::to_string(rank_) + ": " + describe(peer, false) + " gave up its connection to " +
                       "this rank before this rank needed it (its own error names why)");
  }
  if (transport != HelloTransport::kTaken) return transport != HelloTransport::kDeclined;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    // This rank's acceptor took the peer's own connection meanwhile: that one is the pair's.
    if (states_[static_cast<size_t>(peer)] != State::kDialing) return false;
  }
  const PeerRecord there = record(peer);
  throw NetworkError("rank " + std::to_string(rank_) + " cannot connect to rank " + std::to_string(peer) + " (" +
                     describeLiveRecord(there) + "): it has a connection to a rank " + std::to_string(rank_) + " already, so its record is " +
                     "from a rendezvous that ended before this one: an earlier job whose processes linger (a relaunch " +
                     "on the same MASTER_ADDR:MASTER_PORT or store?). Stop pid " + std::to_string(there.process.pid) +
                     " or give this job a store of its own");
}

std::unique_ptr<Pair> PeerConnector::makePair(int peer, bool shm, net::Socket socket, bool initiator,
                                              net::Deadline deadline) {
  std::unique_ptr<Pair> pair;
  if (shm) {
    pair = transport::shm::createPair(std::move(socket), initiator, rank_, peer, describe(peer, true), options_.shm,
                                      deadline);
  } else {
    pair = transport::tcp::createPair(std::move(socket), rank_, peer, describe(peer, false), options_.tcp);
  }
  RINGTREE_DEBUG("rank " << rank_ << " connected to " << describe(peer, shm));
  return pair;
}

// ---------------------------------------------------------------------------------------
// Outcomes

void PeerConnector::install(int peer, std::unique_ptr<Pair> pair, State from) {
  const bool attached = links_[static_cast<size_t>(peer)]->attach(std::move(pair));
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    State& state = states_[static_cast<size_t>(peer)];
    // Not attached: the link failed meanwhile (its connector was asked no more).
    if (state == from) state = attached ? State::kConnected : State::kFailed;
  }
  changed_.notify_all();
}

void PeerConnector::fail(int peer, std::exception_ptr error, std::optional<State> from) {
  // A connection that cannot be made is the peer's doing as far as the calls that need it
  // can tell: they name it as the rank that caused their failure (PeerError).
  try {
    std::rethrow_exception(error);
  } catch (const transport::PeerError&) {
  } catch (const NetworkError& e) {
    error = std::make_exception_ptr(transport::PeerError(peer, e.what()));
  } catch (...) {
  }
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    State& state = states_[static_cast<size_t>(peer)];
    if (state == State::kConnected || state == State::kFailed || (from && state != *from)) return;
    state = State::kFailed;
    failures_[static_cast<size_t>(peer)] = error;
  }
  changed_.notify_all();
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    RINGTREE_DEBUG("rank " << rank_ << ": no connection to rank " << peer << ": " << e.what());
  } catch (...) {
  }
  links_[static_cast<size_t>(peer)]->connectFailed(std::move(error));
}

// ---------------------------------------------------------------------------------------
// Eager connection

void PeerConnector::connectEagerly(const Phase& phase) {
  for (int peer = 0; peer < rank_; ++peer) {
    dialPeer(peer, phase, /*rendezvous=*/true);
    const std::lock_guard<std::mutex> lock(mutex_);
    if (failures_[static_cast<size_t>(peer)] != nullptr) std::rethrow_exception(failures_[static_cast<size_t>(peer)]);
  }
  // A higher rank that has not dialed within kListenerGrace is dialed from here: it may
  // connect lazily (another RINGTREE_CONNECT), or be slow; if it dials meanwhile, the
  // pair keeps one connection as always.
  const auto dialHigherAt = Clock::now() + kListenerGrace;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    std::vector<int> missing;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      if (failures_[static_cast<size_t>(peer)] != nullptr) std::rethrow_exception(failures_[static_cast<size_t>(peer)]);
      if (states_[static_cast<size_t>(peer)] != State::kConnected) missing.push_back(peer);
    }
    if (missing.empty()) return;
    if (Clock::now() >= phase.deadline) throwEagerTimeout(phase);
    lock.unlock();
    for (const int peer : missing) {
      throwIfPeerExited(peer, "waits for a connection from");
      if (peer > rank_ && Clock::now() >= dialHigherAt) requestConnection(peer);
    }
    lock.lock();
    changed_.wait_for(lock, kTick);
  }
}

void PeerConnector::throwEagerTimeout(const Phase& phase) const {
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && states_[static_cast<size_t>(r)] != State::kConnected) missing.push_back(r);
  }
  const PeerRecord self = record(rank_);
  // The interface may be the cause only for ranks on other hosts.
  const bool elsewhere = std::any_of(missing.begin(), missing.end(),
                                     [&](int r) { return !sameHost(record(r).process, self.process); });
  throw NetworkError("rank " + std::to_string(rank_) + ": " + text::rankList(missing) + " did not connect within " +
                     std::to_string(phase.elapsedMs()) + " ms to this rank's address " +
                     net::formatHostPort(tcp_.host, tcp_.port) + " (from " + tcp_.origin +
                     (elsewhere ? "; RINGTREE_SOCKET_IFNAME selects the interface)" : "; they run on this host)"));
}

}  // namespace ringtree::rendezvous
