#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <ringtree/export.h>
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

struct CommunicatorOptions {
  // RINGTREE_TRANSPORT=auto|tcp|shm, when set, replaces this value.
  TransportKind transport = TransportKind::kAuto;
  // Network interface whose address TCP listeners bind and publish (RINGTREE_SOCKET_IFNAME
  // when empty; neither: the address that the host name resolves to, else all interfaces).
  std::string interface;
  // Deadline of the connection phase and default deadline of every operation.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
};

// rank + size + one connection per peer, made through a Store. The object every
// collective of <ringtree/collectives.h> runs on.
//
// Threading: a communicator runs one collective at a time; calls from several threads
// must be serialised by the caller (the Python layer's per-group worker does this).
class RINGTREE_API Communicator {
 public:
  // Collective over the `size` ranks: each calls it with its own rank and a store they
  // share (keys are written under "rt/comm/"; give each communicator its own
  // PrefixStore). Blocks until every connection is made; throws NetworkError naming the
  // peer and its address on failure, StoreError when a peer never published its address
  // within options.timeout, InvalidArgument for a bad rank/size.
  static std::shared_ptr<Communicator> create(std::shared_ptr<Store> store, int rank, int size,
                                              const CommunicatorOptions& options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  std::chrono::milliseconds timeout() const;
  // "self", "tcp" or "shm": how this rank reaches peer.
  const char* transportTo(int peer) const;

  // For ringtree's own algorithms (private API).
  detail::CommunicatorImpl& impl() { return *impl_; }

 private:
  explicit Communicator(std::unique_ptr<detail::CommunicatorImpl> impl);
  std::unique_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace ringtree
