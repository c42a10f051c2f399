#include <ringtree/communicator.h>

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <ringtree/before_waiting.h>
#include <ringtree/error.h>

#include "common/cpu.h"
#include "common/env.h"
#include "common/logging.h"
#include "communicator_impl.h"
#include "diagnostics/peer_status.h"
#include "rendezvous/connect.h"
#include "rendezvous/group_arena.h"

namespace ringtree {

namespace detail {

namespace {

using Clock = net::Clock;

// waitIdle spins this long on progress() before it sleeps in poll(): long enough to
// catch a reply from a peer running on another core, short enough to give the core away
// soon when ranks outnumber cores.
constexpr auto kSpinTime = std::chrono::microseconds(50);
// Spin iterations that only pause the core before each further one also yields it.
constexpr int kPauseIterations = 16;
// Longest single poll() sleep, so that a missed wake-up costs at most this much.
constexpr int kMaxSleepMs = 100;


// Progresses every pair of busy and drops those that became idle.
void progressAll(std::vector<transport::Pair*>* busy) {
  busy->erase(std::remove_if(busy->begin(), busy->end(), [](transport::Pair* p) { return p->progress(); }),
              busy->end());
}

// Disarms the pairs armed so far, however the sleep ends.
class ArmedPairs {
 public:
  explicit ArmedPairs(const std::vector<transport::Pair*>& pairs) : pairs_(pairs) {}
  ~ArmedPairs() {
    for (size_t i = 0; i < armed_; ++i) pairs_[i]->disarmWait();
  }
  ArmedPairs(const ArmedPairs&) = delete;
  ArmedPairs& operator=(const ArmedPairs&) = delete;
  void arm(std::vector<pollfd>* fds) {
    fds->resize(pairs_.size());
    for (; armed_ < pairs_.size(); ++armed_) pairs_[armed_]->armWait(&(*fds)[armed_]);
  }

 private:
  const std::vector<transport::Pair*>& pairs_;
  size_t armed_ = 0;
};

// The peers' descriptions, ", "-separated.
std::string describePeers(const std::vector<transport::Pair*>& pairs) {
  std::string text;
  for (const transport::Pair* p : pairs) text += (text.empty() ? "" : ", ") + p->peerDescription();
  return text;
}

// A name usable in a file name: characters other than letters, digits, '-', '_' and '.'
// become '_'.
std::string fileNamePart(const std::string& name) {
  std::string part = name;
  for (char& c : part) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                       c == '_' || c == '.';
    if (!plain) c = '_';
  }
  return part;
}

}  // namespace

HostLayout HostLayout::of(int rank, std::vector<int> hostOf) {
  HostLayout layout;
  const int me = hostOf.at(static_cast<size_t>(rank));
  layout.hosts = *std::max_element(hostOf.begin(), hostOf.end()) + 1;
  std::vector<std::vector<int>> ranksOf(static_cast<size_t>(layout.hosts));
  for (size_t r = 0; r < hostOf.size(); ++r) ranksOf[static_cast<size_t>(hostOf[r])].push_back(static_cast<int>(r));
  const size_t local = ranksOf[static_cast<size_t>(me)].size();
  layout.uniform = layout.hosts >= 2 && local >= 2 &&
                   std::all_of(ranksOf.begin(), ranksOf.end(), [&](const auto& ranks) { return ranks.size() == local; });
  layout.localRanks = ranksOf[static_cast<size_t>(me)];
  layout.localIndex = static_cast<int>(std::find(layout.localRanks.begin(), layout.localRanks.end(), rank) -
                                       layout.localRanks.begin());
  if (layout.uniform) {
    for (const auto& ranks : ranksOf) {
      layout.peersAcross.push_back(ranks[static_cast<size_t>(layout.localIndex)]);
      layout.grid.insert(layout.grid.end(), ranks.begin(), ranks.end());
    }
    layout.acrossIndex = me;
  }
  layout.hostOf = std::move(hostOf);
  return layout;
}

int HostLayout::localIndexOf(int rank) const {
  const size_t local = localRanks.size();
  const size_t host = static_cast<size_t>(hostOf.at(static_cast<size_t>(rank)));
  const auto row = grid.begin() + static_cast<std::ptrdiff_t>(host * local);
  return static_cast<int>(std::find(row, row + static_cast<std::ptrdiff_t>(local), rank) - row);
}

CommunicatorImpl::CommunicatorImpl(int rank, int size, std::chrono::milliseconds timeout,
                                   std::vector<std::unique_ptr<transport::Pair>> pairs,
                                   std::shared_ptr<Connections> connections, std::vector<int> connectionOf,
                                   std::shared_ptr<arena::NodeArena> arena, size_t flightRecorderEntries,
                                   std::shared_ptr<Store> statusStore, std::vector<int> hostOf)
    : rank_(rank),
      size_(size),
      timeout_(timeout),
      connections_(std::move(connections)),
      connectionOf_(std::move(connectionOf)),
      pairs_(std::move(pairs)),
      arena_(std::move(arena)),
      hosts_(HostLayout::of(rank, hostOf.empty() ? std::vector<int>(static_cast<size_t>(size), 0) : std::move(hostOf))),
      recorder_(flightRecorderEntries),
      statusStore_(std::move(statusStore)) {
  env::readAlgorithm();  // RINGTREE_ALGO as of this communicator's creation (see env.h)
}

int CommunicatorImpl::abortDescriptor() {
  int fd = abortEvent_.load(std::memory_order_seq_cst);
  if (fd >= 0) return fd;
  fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) {
    RINGTREE_WARN("rank " << rank_ << ": cannot create the abort descriptor (" << net::errnoText(errno)
                          << "); waits sleep in slices of " << kMaxSleepMs << " ms instead");
    return -1;
  }
  abortEvent_.store(fd, std::memory_order_seq_cst);
  return fd;
}

void CommunicatorImpl::startStatusPublisher() {
  std::shared_ptr<Store> store = std::move(statusStore_);
  statusStore_.reset();
  try {
    publisher_ = std::make_unique<diagnostics::StatusPublisher>(std::move(store), rank_, size_, recorder_);
  } catch (const std::exception& e) {
    RINGTREE_WARN("rank " << rank_ << ": cannot start status publishing (timeouts will not say what the other ranks "
                          "were doing): " << e.what());
  }
}

CommunicatorImpl::~CommunicatorImpl() {
  if (publisher_) publisher_->stop();
  const int fd = abortEvent_.load();
  if (fd >= 0) ::close(fd);
}

void CommunicatorImpl::abort() {
  if (aborted_.exchange(true, std::memory_order_seq_cst)) return;
  const int fd = abortEvent_.load(std::memory_order_seq_cst);
  if (fd < 0) return;  // no wait has slept yet: the next one reads the flag first
  const uint64_t one = 1;
  // Cannot fail on a fresh eventfd (the counter is far from overflowing).
  [[maybe_unused]] const ssize_t written = ::write(fd, &one, sizeof(one));
}

void CommunicatorImpl::releaseConnections() {
  if (released_) return;
  released_ = true;
  statusStore_.reset();
  if (publisher_) publisher_->stop();
  pairs_.clear();
  arena_.reset();
}

void CommunicatorImpl::waitIdle(transport::Pair* const* pairs, size_t count, net::Deadline deadline,
                                StallCheck stallCheck) {
  std::vector<transport::Pair*> busy;  // allocates only for a pair still busy after one pass
  for (size_t i = 0; i < count; ++i) {
    if (pairs[i]->progress()) continue;
    if (busy.empty()) busy.reserve(count - i);
    busy.push_back(pairs[i]);
  }
  if (busy.empty()) return;
  const auto start = Clock::now();
  auto nextStallCheck = start + kStallCheckInterval;
  std::vector<pollfd> fds;
  for (;;) {
    const auto spinEnd = Clock::now() + kSpinTime;
    for (int i = 0;; ++i) {
      progressAll(&busy);
      if (busy.empty()) return;
      if (Clock::now() >= spinEnd) break;
      cpuRelax();
      if (i >= kPauseIterations) yieldCore();
    }
    BeforeWaiting::notify();
    const int abortFd = abortDescriptor();  // before the flag is read (see abortEvent_)
    if (aborted_.load(std::memory_order_seq_cst)) throw WaitAborted(rank_, describePeers(busy));
    if (Clock::now() >= deadline) {
      throw WaitTimeout(rank_, std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start),
                        describePeers(busy));
    }
    ArmedPairs armed(busy);
    armed.arm(&fds);
    fds.push_back(pollfd{abortFd, POLLIN, 0});  // -1: ignored by poll()
    // Something may have arrived between the last progress() and arming.
    bool anyBusy = false;
    for (size_t i = 0; i < busy.size(); ++i) {
      if (busy[i]->progress()) {
        fds[i].fd = -1;  // idle now: poll() ignores negative descriptors
      } else {
        anyBusy = true;
      }
    }
    if (!anyBusy) return;
    int timeoutMs = net::pollTimeoutMs(deadline);
    if (timeoutMs < 0 || timeoutMs > kMaxSleepMs) timeoutMs = kMaxSleepMs;
    if (::poll(fds.data(), fds.size(), timeoutMs) < 0 && errno != EINTR) {
      throw NetworkError("rank " + std::to_string(rank_) + ": poll failed: " + net::errnoText(errno));
    }
    // Sends that wait for a peer which reads nothing: it may have given up (a notice
    // followed by the end of its stream) or gone away.
    for (transport::Pair* p : busy) {
      if (p->pendingRecvs() == 0) p->checkIncoming(nullptr);
    }
    if (stallCheck.check != nullptr && Clock::now() >= nextStallCheck) {
      stallCheck.check(stallCheck.context);
      nextStallCheck = Clock::now() + kStallCheckInterval;
    }
  }
}

std::vector<FlightRecord> CommunicatorImpl::flightRecord() const {
  std::vector<FlightRecord> records;
  for (const diagnostics::RecordedCall& call : recorder_.snapshot()) records.push_back(recorder_.toRecord(call));
  return records;
}

std::string CommunicatorImpl::flightRecordJson(const std::string& reason) const {
  diagnostics::FlightRecordHeader header;
  header.group = identity_.groupName;
  header.world = identity_.world;
  header.rank = identity_.globalRank >= 0 ? identity_.globalRank : rank_;
  header.groupRank = rank_;
  header.groupSize = size_;
  header.reason = reason;
  header.capacity = recorder_.capacity();
  header.calls = recorder_.calls();
  return diagnostics::flightRecordJson(header, flightRecord());
}

std::string CommunicatorImpl::dumpFlightRecord(const std::string& reason) const {
  const std::string directory = env::flightRecorderDir();
  if (directory.empty()) return {};
  std::string name = "rank_" + std::to_string(identity_.globalRank >= 0 ? identity_.globalRank : rank_);
  if (!identity_.world) name += "." + fileNamePart(identity_.groupName);
  const std::filesystem::path path = std::filesystem::path(directory) / (name + ".json");
  // Written beside and renamed over the target, so that a reader never sees half a file.
  const std::filesystem::path partial = path.string() + ".partial." + std::to_string(::getpid());
  const std::string json = flightRecordJson(reason);
  const auto fail = [&](const std::filesystem::path& where, const std::string& why) {
    return Error("cannot write the flight record of rank " + std::to_string(rank_) + " to " + where.string() +
                 (why.empty() ? std::string() : ": " + why));
  };
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) throw fail(directory, error.message());
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << json;
    out.close();
    if (!out) throw fail(partial, net::errnoText(errno));
  }
  std::filesystem::rename(partial, path, error);
  if (error) {
    const std::string why = error.message();
    std::filesystem::remove(partial, error);
    throw fail(path, why);
  }
  return path.string();
}

}  // namespace detail

const char* transportKindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kAuto: return "auto";
    case TransportKind::kTcp: return "tcp";
    case TransportKind::kShm: return "shm";
  }
  return "?";
}

TransportKind parseTransportKind(const std::string& name) {
  for (const TransportKind kind : {TransportKind::kAuto, TransportKind::kTcp, TransportKind::kShm}) {
    if (name == transportKindName(kind)) return kind;
  }
  throw InvalidArgument("unknown transport '" + name + "'; expected 'auto', 'tcp' or 'shm'");
}

namespace {

// The communicator's state over its pairs. Status publishing serves the timeout text of
// communicators without a node arena (the arena carries the same information): its store
// connection (a clone of `store`, when given) is made now, while the store is known to
// answer (a clone made later could wait out the store's timeout for a server that is
// gone); its thread starts with the first collective.
std::unique_ptr<detail::CommunicatorImpl> makeImpl(int rank, int size, const CommunicatorOptions& options,
                                                   std::vector<std::unique_ptr<transport::Pair>> pairs,
                                                   std::shared_ptr<detail::Connections> connections,
                                                   std::vector<int> connectionOf,
                                                   std::shared_ptr<arena::NodeArena> arena, Store* store,
                                                   std::vector<int> hostOf) {
  std::shared_ptr<Store> statusStore;
  if (store != nullptr && size > 1 && arena == nullptr && !options.pointToPointOnly) {
    try {
      statusStore = store->clone();
    } catch (const std::exception& e) {
      RINGTREE_WARN("rank " << rank << ": cannot open a second store connection for status publishing (timeouts "
                            "will not say what the other ranks were doing): " << e.what());
    }
  }
  return std::make_unique<detail::CommunicatorImpl>(rank, size, options.timeout, std::move(pairs),
                                                    std::move(connections), std::move(connectionOf), std::move(arena),
                                                    env::flightRecorderEntries(), std::move(statusStore),
                                                    std::move(hostOf));
}

}  // namespace

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank, int size,
                                                   const CommunicatorOptions& options) {
  if (store == nullptr) throw InvalidArgument("Communicator::create: store is null");
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgument("Communicator::create: rank " + std::to_string(rank) + " is not in [0, size) for size " +
                          std::to_string(size));
  }
  const rendezvous::ConnectOptions connectOptions = rendezvous::connectOptionsFrom(options);
  rendezvous::Mesh mesh = rendezvous::connectMesh(store, rank, size, connectOptions, !options.pointToPointOnly);
  std::vector<std::unique_ptr<transport::Pair>> pairs(static_cast<size_t>(size));
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    transport::mux::Link& link = *mesh.links[static_cast<size_t>(peer)];
    pairs[static_cast<size_t>(peer)] = link.open(transport::mux::kBaseChannel, rank, peer, link.peerDescription());
  }
  std::vector<int> identity(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) identity[static_cast<size_t>(r)] = r;
  auto shared = std::make_shared<detail::Connections>(rank, std::move(mesh.links), mesh.hostOf,
                                                      std::move(mesh.connector));
  return std::shared_ptr<Communicator>(new Communicator(makeImpl(rank, size, options, std::move(pairs),
                                                                std::move(shared), std::move(identity),
                                                                std::move(mesh.arena), store.get(),
                                                                std::move(mesh.hostOf))));
}

namespace {

// "rank 1 (global rank 3, host 'h', pid 7, shm)": how a communicator over shared
// connections names the peer that its connection names "rank 3 (host 'h', pid 7, shm)".
std::string memberDescription(int rank, int index, const std::string& connectionDescription) {
  if (rank == index) return connectionDescription;
  const std::string prefix = "rank " + std::to_string(index) + " (";
  if (connectionDescription.compare(0, prefix.size(), prefix) == 0) {
    return "rank " + std::to_string(rank) + " (global rank " + std::to_string(index) + ", " +
           connectionDescription.substr(prefix.size());
  }
  return "rank " + std::to_string(rank) + " (" + connectionDescription + ")";
}

}  // namespace

std::shared_ptr<Communicator> Communicator::createOver(const Communicator& base, const std::vector<int>& ranks,
                                                       const std::string& name, const CommunicatorOptions& options,
                                                       std::shared_ptr<Store> store) {
  const detail::CommunicatorImpl& parent = base.impl();
  const std::string what = "Communicator::createOver('" + name + "')";
  if (ranks.empty()) throw InvalidArgument(what + ": the list of ranks is empty");
  if (options.timeout.count() < 0) {
    throw InvalidArgument(what + ": the timeout must not be negative (got " + std::to_string(options.timeout.count()) +
                          " ms)");
  }
  int rank = -1;
  std::vector<int> indices;
  std::vector<bool> seen(static_cast<size_t>(parent.size()), false);
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= parent.size()) {
      throw InvalidArgument(what + ": rank " + std::to_string(r) + " is not a rank of the base communicator (of size " +
                            std::to_string(parent.size()) + ")");
    }
    if (seen[static_cast<size_t>(r)]) throw InvalidArgument(what + ": rank " + std::to_string(r) + " is listed twice");
    seen[static_cast<size_t>(r)] = true;
    if (r == parent.rank()) rank = static_cast<int>(i);
    indices.push_back(parent.connectionOf(r));
  }
  if (rank < 0) {
    throw InvalidArgument(what + ": this process (rank " + std::to_string(parent.rank()) +
                          " of the base communicator) is not one of the ranks");
  }
  if (parent.connectionsReleased()) {
    throw Error(what + ": the base communicator was aborted and has released its connections");
  }
  const std::shared_ptr<detail::Connections>& connections = parent.connections();
  // The channel's name: the communicator's, its members (as connection indices), and how
  // many times this process opened that pair before, so that every member derives the
  // same id and a re-created communicator never meets the late messages of an earlier one.
  std::string key = name + "|";
  for (const int index : indices) key += std::to_string(index) + ",";
  key += "#" + std::to_string(connections->nextIncarnation(key));
  const transport::mux::ChannelId channel = transport::mux::channelIdOf(key);
  const int size = static_cast<int>(ranks.size());
  std::vector<std::unique_ptr<transport::Pair>> pairs(static_cast<size_t>(size));
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    transport::mux::Link& link = connections->link(indices[static_cast<size_t>(peer)]);
    pairs[static_cast<size_t>(peer)] =
        link.open(channel, rank, peer, memberDescription(peer, indices[static_cast<size_t>(peer)], link.peerDescription()));
  }
  // Hosts numbered in the order of their lowest rank in this communicator.
  std::vector<int> hostOf;
  std::vector<int> renumbered;
  for (const int index : indices) {
    const int host = connections->hostOf().at(static_cast<size_t>(index));
    const auto known = std::find(renumbered.begin(), renumbered.end(), host);
    hostOf.push_back(static_cast<int>(known - renumbered.begin()));
    if (known == renumbered.end()) renumbered.push_back(host);
  }
  // Members all on this host, over shared memory: a node arena of their own, as the
  // rendezvous gives the communicator it makes (offered over the new channel).
  std::shared_ptr<arena::NodeArena> arena;
  std::vector<transport::Pair*> raw;
  bool sharedMemory = renumbered.size() == 1;
  for (int peer = 0; peer < size; ++peer) {
    raw.push_back(pairs[static_cast<size_t>(peer)].get());
    // The planned kind: the same answer on every member, connected or not yet (lazy).
    if (peer != rank &&
        std::strcmp(connections->link(indices[static_cast<size_t>(peer)]).plannedKind(), "shm") != 0) {
      sharedMemory = false;
    }
  }
  if (size > 1 && sharedMemory && !options.pointToPointOnly) {
    const bool allowed = rendezvous::connectOptionsFrom(options).arena;
    arena = rendezvous::shareNodeArena(raw, rank, size, allowed, net::deadlineAfter(options.timeout));
  }
  return std::shared_ptr<Communicator>(new Communicator(makeImpl(rank, size, options, std::move(pairs), connections,
                                                                std::move(indices), std::move(arena), store.get(),
                                                                std::move(hostOf))));
}

Communicator::Communicator(std::unique_ptr<detail::CommunicatorImpl> impl) : impl_(std::move(impl)) {}

Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->rank(); }

int Communicator::size() const { return impl_->size(); }

std::chrono::milliseconds Communicator::timeout() const { return impl_->timeout(); }

const char* Communicator::transportTo(int peer) const {
  if (peer < 0 || peer >= impl_->size()) {
    throw InvalidArgument("transportTo: peer " + std::to_string(peer) + " is not in [0, " +
                          std::to_string(impl_->size()) + ")");
  }
  if (peer == impl_->rank()) return "self";
  if (impl_->connectionsReleased()) {
    throw Error("transportTo: rank " + std::to_string(impl_->rank()) +
                " has closed its connections (the communicator was aborted)");
  }
  return impl_->pair(peer).kind();
}

void Communicator::abort() { impl_->abort(); }

bool Communicator::isAborted() const { return impl_->aborted(); }

std::vector<FlightRecord> Communicator::flightRecord() const { return impl_->flightRecord(); }

std::string Communicator::flightRecordJson(const std::string& reason) const { return impl_->flightRecordJson(reason); }

std::string Communicator::dumpFlightRecord(const std::string& reason) const { return impl_->dumpFlightRecord(reason); }

void Communicator::setIdentity(const CommunicatorIdentity& identity) { impl_->setIdentity(identity); }

const CommunicatorIdentity& Communicator::identity() const { return impl_->identity(); }

}  // namespace ringtree
