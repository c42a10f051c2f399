#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "algorithms/call.h"

namespace ringtree::algorithms {

// Messages of one call to and from several peers, posted together and then waited for
// together so that they overlap (a root exchanging with every rank, a tree node with all
// its children). Messages to or from one peer still match the peer's in posting order.
// Every buffer must stay valid, and a send's bytes unchanged, until wait() returns.
// Single-threaded, like the Call it serves.
class Batch {
 public:
  explicit Batch(Call& call) : call_(call) {}

  void send(int peer, const void* data, size_t bytes) { pair(peer).postSend(call_.envelope, data, bytes); }
  void recv(int peer, void* data, size_t bytes, const transport::Accumulate& accumulate = {}) {
    pair(peer).postRecv(call_.envelope, data, bytes, accumulate);
  }

  // Blocks until every message posted so far is done; the batch is empty afterwards.
  // Throws what CommunicatorImpl::waitIdle throws (TimeoutError at the call's deadline,
  // NetworkError, EnvelopeMismatch).
  void wait() {
    call_.comm.waitIdle(pairs_, call_.deadline);
    pairs_.clear();
  }

 private:
  transport::Pair& pair(int peer) {
    transport::Pair& p = call_.comm.pair(peer);
    if (std::find(pairs_.begin(), pairs_.end(), &p) == pairs_.end()) pairs_.push_back(&p);
    return p;
  }

  Call& call_;
  std::vector<transport::Pair*> pairs_;
};

// Pairwise exchange with every peer: in step k (1 .. n - 1) this rank sends to rank + k
// the bytes sendTo(rank + k) gives and receives from rank - k into recvFrom(rank - k),
// both returning {pointer, bytes}. With allInFlight every step is posted at once and
// waited for together (lowest latency for small messages); otherwise one step at a time
// (one transfer each way at a time, which large messages move fastest with). Either way
// every pair carries the same messages in the same order, so ranks may choose apart.
template <typename SendTo, typename RecvFrom>
void pairwiseExchange(Call& call, bool allInFlight, SendTo&& sendTo, RecvFrom&& recvFrom) {
  const int n = call.size();
  const int rank = call.rank();
  Batch batch(call);
  for (int k = 1; k < n; ++k) {
    const int to = (rank + k) % n;
    const int from = (rank - k + n) % n;
    const auto out = sendTo(to);
    const auto in = recvFrom(from);
    batch.recv(from, in.first, in.second);
    batch.send(to, out.first, out.second);
    if (!allInFlight) batch.wait();
  }
  batch.wait();
}

}  // namespace ringtree::algorithms
