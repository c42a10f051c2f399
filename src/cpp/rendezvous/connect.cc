#include "rendezvous/connect.h"

#include <algorithm>
#include <cstdint>
#include <thread>

#include <ringtree/error.h>

#include "common/env.h"
#include "common/logging.h"
#include "common/socket.h"
#include "common/text.h"
#include "rendezvous/arena_setup.h"
#include "rendezvous/handshake.h"
#include "rendezvous/listener.h"
#include "rendezvous/peer_connector.h"
#include "rendezvous/peer_record.h"
#include "rendezvous/phase.h"

namespace ringtree::rendezvous {

namespace {

using Clock = net::Clock;
using std::chrono::milliseconds;

// The records phase and the links of one rank; one object per connectMesh call.
class MeshBuilder {
 public:
  MeshBuilder(std::shared_ptr<Store> store, int rank, int size, const ConnectOptions& options)
      : store_(std::move(store)),
        rank_(rank),
        size_(size),
        options_(options),
        phase_{rank, size, Clock::now(), net::deadlineAfter(options.timeout), options.timeout},
        records_(static_cast<size_t>(size)),
        recordBytes_(static_cast<size_t>(size)) {}

  Mesh run(bool wantArena) {
    publish();
    try {
      return connect(wantArena);
    } catch (const std::exception& e) {
      sayGaveUp(e.what());
      throw;
    }
  }

 private:
  Mesh connect(bool wantArena) {
    readRecords();
    Mesh mesh;
    mesh.hostOf = hostsOfRecords();
    std::vector<EarlyHello> early;
    if (wantArena && arenaPossible(records_)) {
      // Every route is shared memory: the vote is this rank's permission.
      mesh.arena = setUpNodeArena(ArenaSetup{*store_, phase_, records_, nonce_, *shm_, &early}, options_.arena);
      if (mesh.arena != nullptr) {
        RINGTREE_DEBUG("rank " << rank_ << " maps the node arena: " << size_ << " slots of "
                               << mesh.arena->slotBytes() << " bytes");
      }
    }
    PeerConnector::Setup setup;
    setup.store = store_;
    setup.rank = rank_;
    setup.size = size_;
    setup.options = options_;
    // Few ranks on this host: few rings, so their pages are faulted in when they are made.
    const auto onThisHost = std::count(mesh.hostOf.begin(), mesh.hostOf.end(), mesh.hostOf[static_cast<size_t>(rank_)]);
    setup.options.shm.prefault = onThisHost <= kPrefaultRingsUpTo;
    setup.records = records_;
    setup.recordBytes = recordBytes_;
    setup.earlierIncarnation = earlierIncarnation_;
    setup.nonce = nonce_;
    setup.tcp = std::move(tcp_);
    setup.shm = std::move(shm_);
    setup.early = std::move(early);
    const std::shared_ptr<PeerConnector> connector = PeerConnector::start(std::move(setup));
    const bool eager = options_.connect == ConnectMode::kEager ||
                       (options_.connect == ConnectMode::kAuto && size_ <= kEagerUpTo);
    if (eager) connector->connectEagerly(phase_);
    mesh.links = connector->links();
    mesh.connector = connector;
    return mesh;
  }

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
    Bytes held = store_->compareSet(addressKey(rank_), Bytes{}, mine);
    while (held != mine) {
      refuseIfRankHeld(held);
      held = store_->compareSet(addressKey(rank_), held, mine);  // another writer meanwhile: judge it too
    }
    nonce_ = agreeOnNonce(*store_);
  }

  // Whether the store holds a record this very process published under another rank's
  // key: an earlier group over the same keys (re-created with its ranks in another order).
  bool ownRecordUnderAnotherRank() const {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || !store_->check({addressKey(r)})) continue;
      PeerRecord other;
      if (decodeRecord(store_->get(addressKey(r)), &other) && sameProcess(other.process, record(rank_).process)) {
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

  void readRecords() {
    std::vector<std::string> keys;
    std::vector<int> ranks;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      keys.push_back(addressKey(r));
      ranks.push_back(r);
    }
    try {
      store_->wait(keys, phase_.remaining());
    } catch (const StoreError&) {
      std::vector<int> missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!store_->check({keys[i]})) missing.push_back(ranks[i]);
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
      const std::vector<Bytes> values = store_->multiGet(keys);
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
          throwIfGaveUp(ranks[i], record);
          stale.push_back(ranks[i]);
          staleText += (staleText.empty() ? "" : "; ") + describePeer(ranks[i], record, false);
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

  // Best effort, for a rank whose rendezvous fails: says why under "gaveup/<rank>", with
  // the identity of this process, so that peers still reading records fail at once
  // naming the cause (the record it published is then of a process that has exited, which
  // would otherwise read as a leftover of an earlier job, to be waited for).
  void sayGaveUp(const std::string& why) noexcept {
    try {
      const std::string text = encodeProcessIdentity(record(rank_).process) + "\n" + why;
      store_->set(gaveUpKey(rank_), Bytes(text.begin(), text.end()));
    } catch (...) {
    }
  }

  // Throws when `peer`, whose record is of a process that has exited, is that process's
  // rank of this rendezvous and said it gave up (sayGaveUp).
  void throwIfGaveUp(int peer, const PeerRecord& stale) const {
    const std::string key = gaveUpKey(peer);
    if (!store_->check({key})) return;
    const Bytes value = store_->get(key);
    const std::string text(value.begin(), value.end());
    const size_t newline = text.find('\n');
    ProcessIdentity who;
    if (newline == std::string::npos || !decodeProcessIdentity(text.substr(0, newline), &who) ||
        !sameProcess(who, stale.process)) {
      return;  // of another process: an earlier job's
    }
    throw NetworkError("rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
                       describePeer(peer, stale, false) + " gave up this rendezvous and exited: " +
                       text.substr(newline + 1));
  }

  static std::string gaveUpKey(int rank) { return "rt/comm/gaveup/" + std::to_string(rank); }

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

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  ConnectOptions options_;
  Phase phase_;
  std::vector<PeerRecord> records_;
  std::vector<Bytes> recordBytes_;  // records_ as read from the store (reloadRecord)
  // Whether the store holds records of an earlier group of this very process over the
  // same keys (see refuseIfRankHeld): its live peers' stale records are then waited for,
  // not refused.
  bool earlierIncarnation_ = false;
  TcpListener tcp_;
  std::unique_ptr<transport::shm::Listener> shm_;
  Nonce nonce_{};
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
  const std::string connect = env::connectMode();
  if (connect == "eager") {
    result.connect = ConnectMode::kEager;
  } else if (connect == "lazy") {
    result.connect = ConnectMode::kLazy;
  } else if (!connect.empty() && connect != "auto") {
    throw InvalidArgument("RINGTREE_CONNECT must be auto, eager or lazy (got '" + connect + "')");
  }
  result.timeout = options.timeout;
  return result;
}

Mesh connectMesh(const std::shared_ptr<Store>& store, int rank, int size, const ConnectOptions& options, bool arena) {
  if (size == 1) {
    Mesh mesh;
    mesh.links.resize(1);
    mesh.hostOf = {0};
    return mesh;
  }
  return MeshBuilder(store, rank, size, options).run(arena);
}

}  // namespace ringtree::rendezvous
