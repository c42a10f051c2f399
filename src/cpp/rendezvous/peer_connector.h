#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/store/store.h>

#include "common/socket.h"
#include "rendezvous/connect.h"
#include "rendezvous/handshake.h"
#include "rendezvous/listener.h"
#include "rendezvous/peer_record.h"
#include "rendezvous/phase.h"
#include "transport/mux/link.h"
#include "transport/shm/device.h"

// The connections between the ranks of one rendezvous, made when they are first needed:
// one Link per peer, whose connection is dialed when a channel first posts something to
// the peer (transport::mux::LinkConnector), or accepted when the peer dials first.
namespace ringtree::rendezvous {

// Dials and accepts the connections of one rank (see connect.h's connectMesh for the
// protocol). Threads of its own: one accepts on both listeners and answers handshakes (it
// never waits on another rank's thread, so two ranks dialing each other cannot wait on
// each other; peer_acceptor.cc), and a few dial the peers that links ask for (a dial that
// waits on an unreachable peer holds one of them, not every other dial).
//
// Which connection a pair keeps when both ranks dial at once: the one the higher rank
// dialed. Per peer, a rank is idle, asked (a link wants the connection), dialing,
// awaiting (its dial was declined: the peer's comes; after a second without it, it dials
// again), attaching (building the pair), connected or failed. The acceptor takes a
// handshake when idle, asked or awaiting, or dialing the sender while the sender is the
// higher rank; otherwise it answers declined (dialing a lower sender: its own dial is
// the pair's), taken (connected or attaching: the sender is not the rank this
// rendezvous met) or gave up (failed). Every failure fails that peer's link (its
// channels throw a PeerError naming the peer and what went wrong) and is kept for
// connectEagerly().
//
// After the rendezvous a peer that refuses connections has closed (its communicator is
// gone): a dial fails at once saying so. During it (eager), a refusal by a live local
// process is retried for a second (it may publish a new record), then named as a
// lingering process of an earlier job.
class PeerConnector final : public transport::mux::LinkConnector,
                            public std::enable_shared_from_this<PeerConnector> {
 public:
  struct Setup {
    std::shared_ptr<Store> store;  // for a peer's record published again (a group re-created)
    int rank = 0;
    int size = 0;
    ConnectOptions options;
    std::vector<PeerRecord> records;
    std::vector<Bytes> recordBytes;  // records as read from the store
    bool earlierIncarnation = false;  // see connect.cc: stale records of a live peer are waited for
    Nonce nonce{};
    TcpListener tcp;
    std::unique_ptr<transport::shm::Listener> shm;  // null: shared memory not offered
    std::vector<EarlyHello> early;
  };

  // Makes the links (one per peer; null at rank) and starts the threads.
  static std::shared_ptr<PeerConnector> start(Setup setup);
  // Stops the threads: a dial in progress gives up at its next look (100 ms), or once a
  // connect attempt in progress ends (at most 5 s). Links that outlive it fail when they
  // ask for a connection.
  ~PeerConnector() override;

  const std::vector<std::shared_ptr<transport::mux::Link>>& links() const { return links_; }

  // Connects every pair now: dials every lower rank from the calling thread and waits
  // until every higher rank dialed this one (one that has not within a second, say one
  // that connects lazily, is dialed from here). Throws the first failure (NetworkError
  // naming the peer and its address, InvalidArgument for ranks with incompatible
  // transports) or, at deadline, NetworkError naming the ranks that did not connect.
  void connectEagerly(const Phase& phase);

  void requestConnection(int peer) noexcept override;
  bool peerGone(int peer) noexcept override;

 private:
  enum class Route { kTcp, kShmPreferred, kShmRequired };
  enum class State { kIdle, kAsked, kDialing, kAwaiting, kAttaching, kConnected, kFailed };

  // A connection accepted on a listener whose handshake is still arriving.
  struct Pending {
    net::Socket socket;
    Hello hello;
    size_t received = 0;
    bool sharedMemory = false;
    net::Clock::time_point since;
  };

  explicit PeerConnector(Setup setup);

  PeerRecord record(int peer) const;
  std::string describe(int peer, bool shm) const;
  std::string interfaceText(int peer) const;
  Route route(int peer) const;
  const char* expectedKind(int peer) const;
  Hello hello(int peer, HelloTransport transport) const { return makeHello(rank_, peer, transport, nonce_); }

  // Dialing (the dialer thread, or connectEagerly's thread).
  // watchAwaiting: this thread also looks after declined dials (checkAwaiting).
  void dialerLoop(bool watchAwaiting);
  // rendezvous: dialed during the rendezvous (eager), when records may still be replaced.
  void dialPeer(int peer, const Phase& phase, bool rendezvous);
  // The connection to peer, or null when the peer declined (its own dial wins).
  std::unique_ptr<transport::Pair> dial(int peer, const Phase& phase, bool rendezvous);
  net::Socket connectTcp(int peer, const Phase& phase, bool rendezvous);
  Hello awaitAnswer(int peer, int fd, const std::string& where, const Phase& phase);
  // Whether `reply` to the handshake `mine` accepts the connection (false: declined, the
  // peer's own connection is the pair's). Throws NetworkError for an answer of another
  // communicator, or a refusal (kTaken) while this rank has no connection to the peer.
  bool accepted(int peer, const Hello& reply, const Hello& mine, const std::string& where);
  void checkAwaiting();
  void throwIfPeerExited(int peer, const std::string& doing,
                         std::chrono::milliseconds settle = std::chrono::milliseconds(0)) const;
  bool refusedByLiveLocalPeer(int peer, int error) const;
  bool reloadRecord(int peer);
  [[noreturn]] void throwListenerClosed(int peer, int error) const;
  [[noreturn]] void throwPeerClosed(int peer) const;
  // Sleeps up to `duration`; false when the connector stops meanwhile.
  bool pause(std::chrono::milliseconds duration);

  // Accepting (the acceptor thread).
  void acceptorLoop();
  void acceptFrom(int listenerFd, bool sharedMemory, std::vector<Pending>* pending);
  bool readHello(Pending* p);
  void answer(Pending p);

  // Both threads.
  // Outcomes of a dial or an answer: each applies only while the peer's state is still
  // `from` (fail without one: in any state but connected), so that a late outcome never
  // overrides the one that took the pair meanwhile.
  void install(int peer, std::unique_ptr<transport::Pair> pair, State from);
  void fail(int peer, std::exception_ptr error, std::optional<State> from = std::nullopt);
  std::unique_ptr<transport::Pair> makePair(int peer, bool shm, net::Socket socket, bool initiator,
                                            net::Deadline deadline);
  [[noreturn]] void throwEagerTimeout(const Phase& phase) const;

  const std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const ConnectOptions options_;
  const bool earlierIncarnation_;
  const Nonce nonce_;
  const TcpListener tcp_;
  const std::unique_ptr<transport::shm::Listener> shm_;
  std::vector<EarlyHello> early_;  // the acceptor's, once it runs

  mutable std::mutex recordsMutex_;  // records_ and recordBytes_ (reloadRecord replaces one)
  std::vector<PeerRecord> records_;
  std::vector<Bytes> recordBytes_;

  std::vector<std::shared_ptr<transport::mux::Link>> links_;

  std::mutex mutex_;  // everything below
  std::condition_variable changed_;
  std::vector<State> states_;
  std::vector<std::exception_ptr> failures_;
  std::vector<net::Deadline> awaitUntil_;  // the first decline's deadline
  std::vector<net::Clock::time_point> awaitSince_;
  std::deque<int> asked_;
  bool stopping_ = false;
  std::atomic<bool> stop_{false};  // stopping_, read without the mutex

  net::Socket stopEvent_;  // eventfd: wakes the acceptor to stop
  std::thread acceptor_;
  std::vector<std::thread> dialers_;
};

}  // namespace ringtree::rendezvous
