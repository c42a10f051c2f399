#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <ringtree/communicator.h>
#include <ringtree/error.h>

#include <map>
#include <mutex>

#include "common/socket.h"
#include "diagnostics/flight_recorder.h"
#include "transport/mux/link.h"
#include "transport/pair.h"

namespace ringtree::arena {
class NodeArena;
}

namespace ringtree::diagnostics {
class StatusPublisher;
}

namespace ringtree::detail {

// What a wait throws at its deadline (CommunicatorImpl::waitIdle, the node-arena waits):
// a TimeoutError ("rank 0: timed out after 2000 ms waiting for rank 1 (host ..., pid
// ...)") that also carries its parts, so that the algorithm layer can name the call and
// add what the peers were doing.
class WaitTimeout : public TimeoutError {
 public:
  WaitTimeout(int rank, std::chrono::milliseconds waited, std::string waitingFor)
      : TimeoutError("rank " + std::to_string(rank) + ": timed out after " + std::to_string(waited.count()) +
                     " ms waiting for " + waitingFor),
        waited(waited),
        waitingFor(std::move(waitingFor)) {}

  std::chrono::milliseconds waited;
  std::string waitingFor;  // the peers' descriptions, ", "-separated
};

// What a wait throws when CommunicatorImpl::abort() interrupted it.
class WaitAborted : public Error {
 public:
  WaitAborted(int rank, std::string waitingFor)
      : Error("rank " + std::to_string(rank) + ": the communicator was aborted while waiting for " + waitingFor),
        waitingFor(std::move(waitingFor)) {}

  std::string waitingFor;
};

// What a long wait runs, on the waiting thread, to find out whether waiting on is
// pointless (the algorithm layer's check that the peers are in the same call): may throw
// to end the wait. A plain function and its argument, so that passing one costs the fast
// path nothing.
struct StallCheck {
  void (*check)(void* context) = nullptr;
  void* context = nullptr;
};

// Where the ranks of a communicator run, from the rendezvous records (see
// rendezvous::connectMesh): the same on every rank.
struct HostLayout {
  std::vector<int> hostOf;  // host index of each rank (hosts in the order of their lowest rank)
  int hosts = 1;
  // Several hosts with the same number (2 or more) of ranks on each: what the
  // hierarchical algorithms need. The fields below are meaningful only then.
  bool uniform = false;
  std::vector<int> localRanks;   // the ranks on this rank's host, ascending
  int localIndex = 0;            // this rank's position in localRanks
  std::vector<int> peersAcross;  // for each host, its rank at this rank's localIndex
  int acrossIndex = 0;           // this rank's host index (its position in peersAcross)
  std::vector<int> grid;         // grid[h * L + c]: the rank at local index c of host h (L = localRanks.size())

  // The rank at local index `local` of host `host` (uniform layouts only).
  int rankAt(int host, int local) const {
    return grid[static_cast<size_t>(host) * localRanks.size() + static_cast<size_t>(local)];
  }
  // The local index of `rank` on its host (uniform layouts only).
  int localIndexOf(int rank) const;

  // The layout of `rank` given every rank's host index.
  static HostLayout of(int rank, std::vector<int> hostOf);
};

// The connections a rendezvous made (one Link per peer, connected now or when first
// used), shared by every communicator over them: the one the rendezvous made, and those
// made over it (Communicator::createOver), each on channels of its own. Links close, and
// the connector that makes their connections stops, when the last communicator over them
// goes.
class Connections {
 public:
  Connections(int rank, std::vector<std::shared_ptr<transport::mux::Link>> links, std::vector<int> hostOf,
              std::shared_ptr<transport::mux::LinkConnector> connector)
      : rank_(rank), links_(std::move(links)), hostOf_(std::move(hostOf)), connector_(std::move(connector)) {}
  // The connector first: its threads stop before the links go.
  ~Connections() { connector_.reset(); }

  // This process's index among the connections' ranks (the rendezvous's rank).
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(links_.size()); }
  // The link to `index` (index != rank()).
  transport::mux::Link& link(int index) const { return *links_.at(static_cast<size_t>(index)); }
  // Every index's host (as HostLayout::hostOf).
  const std::vector<int>& hostOf() const { return hostOf_; }

  // How many times this process has opened a communicator named `key` over these
  // connections, this one included: every member of a communicator opens and closes the
  // same ones, so a name used again gets a channel of its own on every member alike.
  int nextIncarnation(const std::string& key) {
    const std::lock_guard<std::mutex> lock(mutex_);
    return ++incarnations_[key];
  }

 private:
  const int rank_;
  const std::vector<std::shared_ptr<transport::mux::Link>> links_;  // null at rank_
  const std::vector<int> hostOf_;
  std::shared_ptr<transport::mux::LinkConnector> connector_;
  std::mutex mutex_;
  std::map<std::string, int> incarnations_;
};

// What algorithms see of a communicator: the pairs to each peer, a way to wait on
// several of them at once, shared scratch space, and the diagnostics (flight recorder,
// status publishing, abort). Owned by Communicator.
class CommunicatorImpl {
 public:
  // pairs: one per peer (null at rank), channels of `connections`' links, whose index of
  // each rank connectionOf gives. flightRecorderEntries: how many calls the flight recorder
  // keeps. statusStore: a store no one else uses (a clone) through which this rank
  // publishes its status (diagnostics::StatusPublisher) once it starts its first
  // collective; null: none is published. hostOf: every rank's host index (empty: all on
  // one host).
  CommunicatorImpl(int rank, int size, std::chrono::milliseconds timeout,
                   std::vector<std::unique_ptr<transport::Pair>> pairs, std::shared_ptr<Connections> connections,
                   std::vector<int> connectionOf, std::shared_ptr<arena::NodeArena> arena,
                   size_t flightRecorderEntries, std::shared_ptr<Store> statusStore, std::vector<int> hostOf = {});
  ~CommunicatorImpl();

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // The connection to peer (peer != rank()).
  transport::Pair& pair(int peer) { return *pairs_.at(static_cast<size_t>(peer)); }

  // The connections this communicator's pairs are channels of, and each rank's index
  // among them (for communicators made over this one).
  const std::shared_ptr<Connections>& connections() const { return connections_; }
  int connectionOf(int rank) const { return connectionOf_.at(static_cast<size_t>(rank)); }

  using StallCheck = detail::StallCheck;
  // A wait runs its StallCheck once it has lasted this long, then at most this often.
  static constexpr std::chrono::milliseconds kStallCheckInterval{1000};

  // Drives progress() on each pair until all are idle. Spins for a short while, then
  // sleeps in poll() on the pairs' wait descriptors and the abort descriptor (so
  // oversubscribed ranks give the core away); after each sleep, pairs with sends but no
  // receive posted are checked for a peer that went away or gave up
  // (Pair::checkIncoming), and stallCheck runs every kStallCheckInterval. Throws
  // WaitTimeout at deadline naming the peers still busy, WaitAborted once abort() was
  // called, and whatever a pair or stallCheck throws (NetworkError, EnvelopeMismatch).
  // A first pass over the pairs reads no clock and allocates nothing: a call whose
  // messages are already done (an inline send, a message that was waiting) returns there.
  void waitIdle(transport::Pair* const* pairs, size_t count, net::Deadline deadline, StallCheck stallCheck = {});
  void waitIdle(std::initializer_list<transport::Pair*> pairs, net::Deadline deadline, StallCheck stallCheck = {}) {
    waitIdle(pairs.begin(), pairs.size(), deadline, stallCheck);
  }
  void waitIdle(const std::vector<transport::Pair*>& pairs, net::Deadline deadline, StallCheck stallCheck = {}) {
    waitIdle(pairs.data(), pairs.size(), deadline, stallCheck);
  }

  // Any thread: makes waits throw WaitAborted (waitIdle wakes at once through the abort
  // descriptor; the node-arena waits check between sleeps of at most 50 ms) and
  // beginCall refuse new calls. Idempotent.
  void abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // After abort(), once no call runs: closes every connection, unmaps the node arena and
  // stops status publishing. pair() and arena() must not be used afterwards (beginCall
  // refuses calls on an aborted communicator). Idempotent.
  void releaseConnections();
  bool connectionsReleased() const { return released_; }

  diagnostics::FlightRecorder& flightRecorder() { return recorder_; }
  const diagnostics::FlightRecorder& flightRecorder() const { return recorder_; }

  // Starts status publishing if it is due and not started yet (beginCall calls it: a
  // communicator that never runs a collective, like a point-to-point engine's, costs no
  // thread). Never throws: when the thread cannot start, a warning is logged and nothing
  // is published.
  void startStatusPublishing() {
    if (statusStore_ != nullptr) startStatusPublisher();
  }
  // Null when this rank publishes no status (size 1, a node arena, no collective yet, or
  // no store clone).
  diagnostics::StatusPublisher* statusPublisher() { return publisher_.get(); }

  // See Communicator::flightRecord(), flightRecordJson() and dumpFlightRecord().
  std::vector<FlightRecord> flightRecord() const;
  std::string flightRecordJson(const std::string& reason) const;
  std::string dumpFlightRecord(const std::string& reason) const;

  const CommunicatorIdentity& identity() const { return identity_; }
  void setIdentity(const CommunicatorIdentity& identity) { identity_ = identity; }

  // The node-wide shared segment when every rank is on this host and shared memory is
  // enabled; nullptr otherwise.
  arena::NodeArena* arena() { return arena_.get(); }

  // Which host each rank runs on.
  const HostLayout& hosts() const { return hosts_; }
  // For tests of the algorithms on one machine: makes this rank's algorithms treat the
  // ranks as running on the hosts `hostOf` names (the transports stay what they are).
  // Every rank must assume the same map, before its first collective.
  void assumeHosts(std::vector<int> hostOf) { hosts_ = HostLayout::of(rank_, std::move(hostOf)); }

  // Sequence number of the next collective call (the same on every rank when they call
  // the same collectives in the same order).
  uint64_t nextSequence() { return ++sequence_; }

  // Scratch memory for the algorithms: at least `bytes`, 64-byte aligned, reused across
  // calls and grown (never shrunk) when a call needs more. Its pages are touched when it
  // grows so that later calls do not pay page faults. The pointer stays valid until the
  // next scratch() call.
  void* scratch(size_t bytes) {
    if (bytes > scratchBytes_) {
      const size_t rounded = (bytes + 4095) & ~size_t{4095};
      void* memory = std::aligned_alloc(64, rounded);
      if (memory == nullptr) {
        throw std::bad_alloc();
      }
      std::memset(memory, 0, rounded);
      scratch_.reset(static_cast<char*>(memory));
      scratchBytes_ = rounded;
    }
    return scratch_.get();
  }

  // What kind of failure broke the communicator: later calls throw the same class.
  enum class Failure { kError, kNetwork, kTimeout, kMismatch };

  // After a failed collective the connections are out of step: every later call throws
  // an error of the class `failure` names, carrying this reason.
  void markBroken(const std::string& reason, Failure failure) {
    if (brokenReason_.empty()) {
      brokenReason_ = reason.empty() ? "an earlier collective failed" : reason;
      brokenFailure_ = failure;
    }
  }
  const std::string& brokenReason() const { return brokenReason_; }
  Failure brokenFailure() const { return brokenFailure_; }

 private:
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };

  void startStatusPublisher();

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<Connections> connections_;
  std::vector<int> connectionOf_;
  std::vector<std::unique_ptr<transport::Pair>> pairs_;  // index = peer rank; null at rank_
  // shared_ptr: its deleter is bound where the arena is made, so this header and
  // communicator.cc need not see NodeArena's definition.
  std::shared_ptr<arena::NodeArena> arena_;
  HostLayout hosts_;
  uint64_t sequence_ = 0;
  std::unique_ptr<char, FreeDeleter> scratch_;
  size_t scratchBytes_ = 0;
  std::string brokenReason_;
  Failure brokenFailure_ = Failure::kError;

  diagnostics::FlightRecorder recorder_;
  std::shared_ptr<Store> statusStore_;  // the clone, until status publishing starts
  std::unique_ptr<diagnostics::StatusPublisher> publisher_;  // reads recorder_: declared after it
  CommunicatorIdentity identity_;
  std::atomic<bool> aborted_{false};
  // eventfd, readable once abort() was called: made by the first wait that sleeps
  // (communicators that never sleep in waitIdle, such as point-to-point ones, have none).
  // The waiter stores it before it reads aborted_, abort() stores aborted_ before it reads
  // it (all seq_cst): one of them sees the other.
  std::atomic<int> abortEvent_{-1};
  // Makes abortEvent_ when there is none; -1 when the kernel refuses (waits then sleep in
  // short slices).
  int abortDescriptor();
  bool released_ = false;
};

}  // namespace ringtree::detail
