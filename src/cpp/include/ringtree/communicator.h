#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ringtree/export.h>
#include <ringtree/flight_recorder.h>
#include <ringtree/store/store.h>

namespace ringtree {

namespace detail {
class CommunicatorImpl;
}

// How a communicator reaches its peers.
//  kAuto: shared memory to peers on the same host (same hostname and kernel boot id,
//         and able to reach our local socket), TCP to the others.
//  kTcp:  TCP to every peer.      kShm: shared memory to every peer (all must be local).
enum class TransportKind { kAuto, kTcp, kShm };

// "auto", "tcp" or "shm".
RINGTREE_API const char* transportKindName(TransportKind kind);
// The kind transportKindName() names. Throws InvalidArgument ("unknown transport 'x';
// expected 'auto', 'tcp' or 'shm'") for any other text.
RINGTREE_API TransportKind parseTransportKind(const std::string& name);

struct CommunicatorOptions {
  // RINGTREE_TRANSPORT=auto|tcp|shm, when set, replaces this value.
  TransportKind transport = TransportKind::kAuto;
  // Network interface whose address TCP listeners bind and publish (RINGTREE_SOCKET_IFNAME
  // when empty; neither: the address that the host name resolves to, else all interfaces).
  std::string interface;
  // Deadline of the connection phase and default deadline of every operation.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  // True for a communicator that will carry point-to-point messages only (a process
  // group's second one, see <ringtree/process_group.h>): it maps no node arena and opens no
  // store connection for status publishing, which only collectives use.
  bool pointToPointOnly = false;
};

// How diagnostics name a communicator (flight-recorder dumps, see
// <ringtree/flight_recorder.h>).
struct CommunicatorIdentity {
  std::string groupName;  // recorded in dumps; "" when the communicator has no name
  int globalRank = -1;    // this process's rank in the whole job; -1: the communicator's rank
  // Dumps go to rank_<globalRank>.json for the world, rank_<globalRank>.<groupName>.json
  // for other groups.
  bool world = true;
};

// rank + size + one connection per peer, made through a Store (create), or channels over
// another communicator's connections (createOver). The object every collective of
// <ringtree/collectives.h> runs on.
//
// Threading: a communicator runs one collective at a time; calls from several threads
// must be serialised by the caller (the Python layer's per-group worker does this).
// abort(), isAborted(), flightRecord(), flightRecordJson() and dumpFlightRecord() may be
// called from any thread at any time.
//
// Diagnostics: every collective call is recorded in the communicator's flight recorder
// (<ringtree/flight_recorder.h>). With size > 1 and no node arena, from its first
// collective on, a background thread publishes this rank's last started and finished
// call to the store (through a clone of it made by create(), under "rt/status/<rank>"),
// at most every 100 ms and only when they changed; when a call times out, its error says
// which ranks did not enter it and what each was last doing (read from the store, or
// from the node arena when there is one).
class RINGTREE_API Communicator {
 public:
  // Collective over the `size` ranks: each calls it with its own rank and a store they
  // share (keys are written under "rt/comm/" and "rt/status/"; give each communicator
  // its own PrefixStore). Blocks until every connection is made; throws NetworkError naming the
  // peer and its address on failure, StoreError when a peer never published its address
  // within options.timeout, InvalidArgument for a bad rank/size.
  static std::shared_ptr<Communicator> create(std::shared_ptr<Store> store, int rank, int size,
                                              const CommunicatorOptions& options = {});

  // A communicator of the ranks `ranks` of `base` (base ranks; ranks[i] becomes rank i),
  // over base's connections: no connection is opened. Its messages travel on a channel of
  // their own, matched apart from every other communicator's over those connections, so
  // that communicators over one set of connections may be used at the same time from
  // different threads. Every member calls it with the same ranks and `name`, which must
  // differ from that of every other live communicator over those connections with the
  // same members (the same name may be used again once the communicator is destroyed).
  // When every member runs on this host over shared memory (and options.pointToPointOnly
  // is false), the members set up a node arena of their own, a collective over them on
  // the new channel: it returns once every member has called it (bounded by
  // options.timeout). Otherwise nothing is exchanged and it returns at once. Only
  // options.timeout and options.pointToPointOnly are read (the connections are base's).
  // `store` (optional) is where it publishes its status for other ranks' timeout
  // messages (as create() does). Throws InvalidArgument for an empty list, a rank listed
  // twice or out of range, a list without this process's rank; Error when base was
  // aborted and released its connections; TimeoutError naming the members that did not
  // take part in the arena's setup in time.
  static std::shared_ptr<Communicator> createOver(const Communicator& base, const std::vector<int>& ranks,
                                                  const std::string& name, const CommunicatorOptions& options = {},
                                                  std::shared_ptr<Store> store = nullptr);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  std::chrono::milliseconds timeout() const;
  // "self", "tcp" or "shm": how this rank reaches peer. Throws Error after abort()
  // released the connections (see ProcessGroup::abort).
  const char* transportTo(int peer) const;

  // Makes the collective running on this communicator, if any, fail within about 100 ms
  // with Error ("... was aborted"), wherever it waits, and every later one fail at once.
  // Any thread; idempotent. Connections and shared memory are released when the
  // communicator is destroyed, or by ProcessGroup::abort() once nothing runs any more.
  void abort();
  bool isAborted() const;

  // The calls in this rank's flight recorder, oldest first.
  std::vector<FlightRecord> flightRecord() const;
  // The flight record as the JSON document of <ringtree/flight_recorder.h>, recording
  // `reason` as why it was written.
  std::string flightRecordJson(const std::string& reason = "") const;
  // When RINGTREE_FLIGHT_RECORDER_DIR is set: writes flightRecordJson(reason) into that
  // directory (created if needed; file name from the identity) and returns the file's
  // path; otherwise returns "". Throws Error naming the path when it cannot be written.
  std::string dumpFlightRecord(const std::string& reason) const;

  // Names this communicator in diagnostics. Call before its first collective (not
  // synchronised with one that runs).
  void setIdentity(const CommunicatorIdentity& identity);
  const CommunicatorIdentity& identity() const;

  // For ringtree's own algorithms (private API).
  detail::CommunicatorImpl& impl() { return *impl_; }
  const detail::CommunicatorImpl& impl() const { return *impl_; }

 private:
  explicit Communicator(std::unique_ptr<detail::CommunicatorImpl> impl);
  std::unique_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace ringtree
