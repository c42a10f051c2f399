#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <ringtree/communicator.h>

#include "common/socket.h"
#include "transport/pair.h"

namespace ringtree::transport::shm {
class NodeArena;
}

namespace ringtree::detail {

// What algorithms see of a communicator: the pairs to each peer, a way to wait on
// several of them at once, and shared scratch space. Owned by Communicator.
class CommunicatorImpl {
 public:
  CommunicatorImpl(int rank, int size, std::chrono::milliseconds timeout,
                   std::vector<std::unique_ptr<transport::Pair>> pairs,
                   std::shared_ptr<transport::shm::NodeArena> arena);
  ~CommunicatorImpl();

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // The connection to peer (peer != rank()).
  transport::Pair& pair(int peer) { return *pairs_.at(static_cast<size_t>(peer)); }

  // Drives progress() on each pair until all are idle. Spins for a short while, then
  // sleeps in poll() on the pairs' wait descriptors (so oversubscribed ranks give the
  // core away). Throws TimeoutError at deadline naming the peers still busy, and
  // whatever a pair throws (NetworkError, EnvelopeMismatch).
  void waitIdle(const std::vector<transport::Pair*>& pairs, net::Deadline deadline);

  // The node-wide shared segment when every rank is on this host and shared memory is
  // enabled; nullptr otherwise.
  transport::shm::NodeArena* arena() { return arena_.get(); }

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

  // After a failed collective the connections are out of step: every later call throws
  // Error carrying this reason.
  void markBroken(const std::string& reason) {
    if (brokenReason_.empty()) {
      brokenReason_ = reason.empty() ? "an earlier collective failed" : reason;
    }
  }
  const std::string& brokenReason() const { return brokenReason_; }

 private:
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<transport::Pair>> pairs_;  // index = peer rank; null at rank_
  // shared_ptr: its deleter is bound where the arena is made, so this header and
  // communicator.cc need not see NodeArena's definition.
  std::shared_ptr<transport::shm::NodeArena> arena_;
  uint64_t sequence_ = 0;
  std::unique_ptr<char, FreeDeleter> scratch_;
  size_t scratchBytes_ = 0;
  std::string brokenReason_;
};

}  // namespace ringtree::detail
