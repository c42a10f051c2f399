#pragma once

// Shared-memory pairs built directly with shm::Listener / connect / createPair, between
// two threads or between this process and a forked child, and the loops that drive them:
// for the shm transport's tests and its benchmark. Every wait is bounded (kPairTimeout
// unless given) and throws std::runtime_error past it; children are killed by their Child
// handle and by an alarm, so a regression fails instead of hanging.

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "common/socket.h"
#include "transport/shm/device.h"
#include "transport/shm/pair.h"

namespace ringtree::test {

using transport::Pair;
using transport::shm::Listener;
using transport::shm::PairOptions;

// Longest any single wait on a pair may take.
constexpr std::chrono::milliseconds kPairTimeout(10000);

// dst[i] += src[i] for T elements at any alignment, in blocks the compiler vectorises.
template <typename T>
void sumElements(void* inout, const void* in, size_t count) {
  auto* dst = static_cast<unsigned char*>(inout);
  const auto* src = static_cast<const unsigned char*>(in);
  constexpr size_t kBlock = 64 / sizeof(T);
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    T a[kBlock];
    T b[kBlock];
    std::memcpy(a, dst + i * sizeof(T), sizeof(a));
    std::memcpy(b, src + i * sizeof(T), sizeof(b));
    for (size_t k = 0; k < kBlock; ++k) a[k] += b[k];
    std::memcpy(dst + i * sizeof(T), a, sizeof(a));
  }
  for (; i < count; ++i) {
    T a;
    T b;
    std::memcpy(&a, dst + i * sizeof(T), sizeof(T));
    std::memcpy(&b, src + i * sizeof(T), sizeof(T));
    a += b;
    std::memcpy(dst + i * sizeof(T), &a, sizeof(T));
  }
}

// Runs progress() until the pair is idle: spins spinCalls times, then sleeps in poll()
// the way the communicator does (arm, progress once more, poll, disarm) and spins again
// after each wake-up. A lost wake-up therefore shows up as a timeout, never as a slow
// pass. Throws std::runtime_error after `timeout`.
inline void waitIdle(Pair& pair, std::chrono::milliseconds timeout = kPairTimeout, int spinCalls = 1000) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int calls = 0;; ++calls) {
    if (pair.progress()) return;
    if ((calls & 1023) == 0 && std::chrono::steady_clock::now() >= deadline) throw std::runtime_error("waitIdle timed out");
    if (calls < spinCalls) continue;
    calls = 0;
    pollfd pfd{};
    pair.armWait(&pfd);
    if (pair.progress()) {
      pair.disarmWait();
      return;
    }
    const int rc = ::poll(&pfd, 1, net::pollTimeoutMs(deadline));
    pair.disarmWait();
    if (rc == 0) throw std::runtime_error("waitIdle timed out sleeping (lost wake-up?)");
  }
}

// Runs progress() until the pair is idle, spinning only: for latency and bandwidth.
inline void spinIdle(Pair& pair) {
  const auto deadline = std::chrono::steady_clock::now() + kPairTimeout;
  for (unsigned calls = 1; !pair.progress(); ++calls) {
    if ((calls & 0xffff) == 0 && std::chrono::steady_clock::now() >= deadline) throw std::runtime_error("spinIdle timed out");
  }
}

// Options that send every message through a ring of ringBytes (no direct copy).
inline PairOptions ringOnly(size_t ringBytes = size_t{1} << 20) {
  PairOptions options;
  options.ringBytes = ringBytes;
  options.directCopyThreshold = std::numeric_limits<size_t>::max();
  return options;
}

struct TwoPairs {
  std::unique_ptr<Pair> rank0;  // the connecting side
  std::unique_ptr<Pair> rank1;  // the accepting side
};

// Two pairs between threads of this process: rank 0 connects, rank 1 accepts.
inline TwoPairs connectThreads(const PairOptions& options0 = {}, const PairOptions& options1 = {}) {
  Listener listener;
  const auto deadline = net::deadlineAfter(kPairTimeout);
  auto accepted = std::async(std::launch::async, [&] {
    return transport::shm::createPair(listener.accept(deadline), false, 1, 0, "rank 0 (test thread)", options1, deadline);
  });
  std::string error;
  net::Socket socket = transport::shm::connect(listener.name(), deadline, &error);
  if (!socket.valid()) throw std::runtime_error("connect: " + error);
  TwoPairs pairs;
  pairs.rank0 = transport::shm::createPair(std::move(socket), true, 0, 1, "rank 1 (test thread)", options0, deadline);
  pairs.rank1 = accepted.get();
  return pairs;
}

// A forked child process, SIGKILLed and reaped on destruction unless already reaped.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  Child(Child&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  void kill() const { ::kill(pid_, SIGKILL); }
  // The exit code, 128 + signal when killed, or -1 (after killing it) on timeout.
  int wait(std::chrono::milliseconds timeout = kPairTimeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int status = 0;
      const pid_t rc = ::waitpid(pid_, &status, WNOHANG);
      if (rc == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        kill();
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  pid_t pid_;
};

using Role = std::function<bool(Pair& pair, int side)>;

// Forks a child that connects to listener as rank 1 and exits with 0 when role returns
// true (1 when false, 2 on an exception). Fork-safe: the role must not use gtest.
inline Child forkPeer(const Listener& listener, const PairOptions& options, const Role& role) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid > 0) return Child(pid);
  ::alarm(30);
  int code = 0;
  try {
    const auto deadline = net::deadlineAfter(kPairTimeout);
    std::string error;
    net::Socket socket = transport::shm::connect(listener.name(), deadline, &error);
    if (!socket.valid()) throw std::runtime_error("connect: " + error);
    auto pair = transport::shm::createPair(std::move(socket), true, 1, 0, "rank 0 (parent process)", options, deadline);
    code = role(*pair, 1) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    code = 2;
  }
  ::_exit(code);
}

inline std::unique_ptr<Pair> acceptChild(Listener& listener, const Child& child, const PairOptions& options) {
  const auto deadline = net::deadlineAfter(kPairTimeout);
  return transport::shm::createPair(listener.accept(deadline), false, 0, 1, "rank 1 (child pid " + std::to_string(child.pid()) + ")",
                    options, deadline);
}

}  // namespace ringtree::test
