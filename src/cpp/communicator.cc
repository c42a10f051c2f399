#include <ringtree/communicator.h>

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include <ringtree/error.h>

#include "common/cpu.h"
#include "communicator_impl.h"
#include "rendezvous/connect.h"

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

}  // namespace

CommunicatorImpl::CommunicatorImpl(int rank, int size, std::chrono::milliseconds timeout,
                                   std::vector<std::unique_ptr<transport::Pair>> pairs,
                                   std::shared_ptr<transport::shm::NodeArena> arena)
    : rank_(rank), size_(size), timeout_(timeout), pairs_(std::move(pairs)), arena_(std::move(arena)) {}

CommunicatorImpl::~CommunicatorImpl() = default;

void CommunicatorImpl::waitIdle(const std::vector<transport::Pair*>& pairs, net::Deadline deadline) {
  const auto start = Clock::now();
  std::vector<transport::Pair*> busy(pairs);
  std::vector<pollfd> fds;
  for (;;) {
    const auto spinEnd = Clock::now() + kSpinTime;
    for (int i = 0;; ++i) {
      progressAll(&busy);
      if (busy.empty()) return;
      if (Clock::now() >= spinEnd) break;
      cpuRelax();
      if (i >= kPauseIterations) sched_yield();
    }
    if (Clock::now() >= deadline) {
      std::string peers;
      for (const transport::Pair* p : busy) peers += (peers.empty() ? "" : ", ") + p->peerDescription();
      throw TimeoutError(
          "rank " + std::to_string(rank_) + ": timed out after " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()) +
          " ms waiting for " + peers);
    }
    ArmedPairs armed(busy);
    armed.arm(&fds);
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
  }
}

}  // namespace detail

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank, int size,
                                                   const CommunicatorOptions& options) {
  if (store == nullptr) throw InvalidArgument("Communicator::create: store is null");
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgument("Communicator::create: rank " + std::to_string(rank) + " is not in [0, size) for size " +
                          std::to_string(size));
  }
  const rendezvous::ConnectOptions connectOptions = rendezvous::connectOptionsFrom(options);
  std::shared_ptr<transport::shm::NodeArena> arena;
  auto pairs = rendezvous::connectFullMesh(*store, rank, size, connectOptions, &arena);
  auto impl =
      std::make_unique<detail::CommunicatorImpl>(rank, size, options.timeout, std::move(pairs), std::move(arena));
  return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
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
  return impl_->pair(peer).kind();
}

}  // namespace ringtree
