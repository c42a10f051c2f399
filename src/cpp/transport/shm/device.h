#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/socket.h"
#include "transport/pair.h"

// Shared-memory transport between processes on one host.
//
// Peers meet over an AF_UNIX stream socket in the abstract namespace (no file is
// created; the name carries a random job nonce). The socket is both the probe that the
// peer really shares this host's kernel and network namespace, and the channel over
// which the memory is handed over: segments are memfd_create() files passed with
// SCM_RIGHTS, so they never appear in /dev/shm, are reachable only by processes that
// were given the descriptor, and disappear when the last process holding them exits,
// kill -9 included. The socket stays open for the pair's lifetime: it carries wake-up
// bytes for a sleeping peer and reports the peer's death (POLLHUP) at once.
namespace ringtree::transport::shm {

struct PairOptions {
  // Bytes of each direction's ring buffer (messages up to this size, and chunks of larger
  // ones, are staged through it). Allocated once.
  size_t ringBytes = size_t{1} << 20;
  // Whether both rings' pages are faulted in when the pair is made (MAP_POPULATE on both
  // sides): the first pass of small messages over a lazily faulted ring takes two page
  // faults every 32 messages (~0.15 us a message at 2 ranks). Otherwise a page takes
  // memory when first written: a pair that carries little costs almost nothing.
  bool prefault = false;
  // Messages at least this large are moved with one process_vm_readv copy straight from
  // the sender's buffer (when the kernel allows it between the two processes; probed at
  // connection time), instead of through the ring.
  size_t directCopyThreshold = size_t{256} << 10;
};

// A listening abstract-namespace socket with a fresh random name.
class Listener {
 public:
  // Throws NetworkError when no socket can be created.
  Listener();
  ~Listener();
  const std::string& name() const { return name_; }
  // The listening socket (non-blocking), for a caller that polls it and accepts itself.
  int fd() const { return socket_.fd(); }
  // Accepts one connection, waiting until deadline; throws NetworkError/TimeoutError.
  net::Socket accept(net::Deadline deadline);

 private:
  std::string name_;
  net::Socket socket_;
};

// Connects to a Listener's name. Returns an invalid Socket (and sets *error) when the
// name cannot be reached: the peer is then not on this host (or not in our network
// namespace) and the caller should use TCP.
net::Socket connect(const std::string& name, net::Deadline deadline, std::string* error);

// Builds the pair over a connected socket (from connect() on one side, Listener::accept
// on the other; `initiator` is true on the connect side). Both sides call it; it
// exchanges memfds, maps the rings and checks the peer's credentials (same uid).
// Throws NetworkError naming the peer on failure.
std::unique_ptr<Pair> createPair(net::Socket socket, bool initiator, int selfRank, int peerRank,
                                 const std::string& peerDescription, const PairOptions& options,
                                 net::Deadline deadline);

}  // namespace ringtree::transport::shm
