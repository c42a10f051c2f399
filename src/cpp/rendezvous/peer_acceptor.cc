#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>

#include <ringtree/error.h>

#include "common/logging.h"
#include "rendezvous/arena_setup.h"
#include "rendezvous/peer_connector.h"

// The acceptor thread of PeerConnector: both listeners, handshakes as they arrive, and the
// answer that decides which connection a pair keeps.
namespace ringtree::rendezvous {

using Clock = net::Clock;

void PeerConnector::acceptorLoop() {
  for (EarlyHello& e : early_) {
    answer(Pending{std::move(e.socket), e.hello, sizeof(Hello), e.sharedMemory, Clock::now()});
  }
  early_.clear();
  std::vector<Pending> pending;
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back(pollfd{stopEvent_.fd(), POLLIN, 0});
    fds.push_back(pollfd{tcp_.socket.fd(), POLLIN, 0});
    fds.push_back(pollfd{shm_ ? shm_->fd() : -1, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back(pollfd{p.socket.fd(), POLLIN, 0});
    // Wake at least every second to drop connections that never send their handshake.
    const int rc = ::poll(fds.data(), fds.size(), 1000);
    if (rc < 0 && errno != EINTR) {
      RINGTREE_WARN("rank " << rank_ << ": the connection acceptor's poll failed: " << net::errnoText(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (stop_.load(std::memory_order_acquire)) return;
    if (rc <= 0) fds.assign(fds.size(), pollfd{-1, 0, 0});
    const auto now = Clock::now();
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (fds[i + 3].revents == 0) {
        if (now - p.since > kHelloTimeout) {
          RINGTREE_DEBUG("rank " << rank_ << ": dropping connection from " << net::peerName(p.socket.fd())
                                 << ": no handshake");
          p.socket.reset();
        }
        continue;
      }
      if (!readHello(&p) || p.received < sizeof(Hello)) continue;
      answer(std::move(p));
      p.socket.reset();
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(), [](const Pending& p) { return !p.socket.valid(); }),
                  pending.end());
    if (fds[1].revents != 0) acceptFrom(tcp_.socket.fd(), false, &pending);
    if (fds[2].revents != 0) acceptFrom(shm_->fd(), true, &pending);
  }
}

void PeerConnector::acceptFrom(int listenerFd, bool sharedMemory, std::vector<Pending>* pending) {
  for (;;) {
    const int fd = ::accept4(listenerFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        // Out of descriptors (EMFILE, ENFILE) or memory: the connection waits in the
        // backlog; look again after a pause rather than at once.
        RINGTREE_WARN("rank " << rank_ << ": accepting a connection failed: " << net::errnoText(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      return;
    }
    pending->push_back(Pending{net::Socket(fd), Hello{}, 0, sharedMemory, Clock::now()});
  }
}

bool PeerConnector::readHello(Pending* p) {
  for (;;) {
    const ssize_t n = ::recv(p->socket.fd(), reinterpret_cast<uint8_t*>(&p->hello) + p->received,
                             sizeof(Hello) - p->received, MSG_DONTWAIT);
    if (n > 0) {
      p->received += static_cast<size_t>(n);
      uint32_t magic = 0;
      if (p->received >= sizeof(magic) && (std::memcpy(&magic, &p->hello, sizeof(magic)), isArenaRequest(magic))) {
        // A rank that takes this rank's record for one of a rendezvous still running.
        refuseLateArenaRequest(std::move(p->socket));
        return false;
      }
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    RINGTREE_DEBUG("rank " << rank_ << ": connection from " << net::peerName(p->socket.fd())
                           << " closed before its handshake");
    p->socket.reset();
    return false;
  }
}

void PeerConnector::answer(Pending p) {
  const Hello& h = p.hello;
  if (!validHello(h, nonce_, rank_, size_, -1)) {
    RINGTREE_DEBUG("rank " << rank_ << ": rejecting a connection without a handshake of this communicator");
    return;
  }
  const int peer = h.senderRank;
  const auto transport = static_cast<HelloTransport>(h.transport);
  if (p.sharedMemory != (transport == HelloTransport::kShm)) {
    RINGTREE_DEBUG("rank " << rank_ << ": rejecting a handshake that came on the other listener");
    return;
  }
  try {
    if (transport == HelloTransport::kShmUnreachable) {
      throw NetworkError("rank " + std::to_string(rank_) + ": " + describe(peer, true) +
                         " cannot reach this rank over shared memory, and transport shm is required "
                         "(that rank's error names the cause)");
    }
    const Route r = route(peer);
    if ((transport == HelloTransport::kShm && r == Route::kTcp) ||
        (transport == HelloTransport::kTcp && r == Route::kShmRequired)) {
      throw NetworkError("rank " + std::to_string(rank_) + ": " + describe(peer, false) + " asks for transport " +
                         (transport == HelloTransport::kShm ? "shm" : "tcp") +
                         ", which the two ranks' options exclude");
    }
  } catch (...) {
    fail(peer, std::current_exception());
    return;
  }
  HelloTransport answer = transport;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    State& state = states_[static_cast<size_t>(peer)];
    if (state == State::kDialing && peer < rank_) {
      answer = HelloTransport::kDeclined;
    } else if (state == State::kFailed) {
      answer = HelloTransport::kGaveUp;
    } else if (state == State::kAttaching || state == State::kConnected) {
      answer = HelloTransport::kTaken;
    } else {
      state = State::kAttaching;
    }
  }
  const bool take = answer == transport;
  const net::Deadline deadline = std::min(net::deadlineAfter(options_.timeout), Clock::now() + kHelloTimeout);
  const Hello reply = hello(peer, answer);
  const net::IoResult io = net::sendAll(p.socket.fd(), &reply, sizeof(reply), deadline);
  if (!take) return;
  try {
    if (!io.ok()) {
      throw NetworkError("rank " + std::to_string(rank_) + ": handshake with " + describe(peer, false) +
                         " failed: " + io.describe());
    }
    install(peer,
            makePair(peer, transport == HelloTransport::kShm, std::move(p.socket), /*initiator=*/false,
                     net::deadlineAfter(options_.timeout)),
            State::kAttaching);
  } catch (...) {
    fail(peer, std::current_exception(), State::kAttaching);
  }
}

}  // namespace ringtree::rendezvous
