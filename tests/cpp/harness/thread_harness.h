#pragma once

// A thread harness for tests of everything built on Communicator (transports,
// algorithms): one thread per rank, all in this process, meeting through one in-process
// store. Header-only.

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/communicator.h>
#include <ringtree/store/hash_store.h>
#include <ringtree/store/prefix_store.h>

namespace ringtree::test {

// What the harness throws when a rank failed: the first failure in time, naming the rank.
// cause holds the original exception; rethrowCause() throws it again so that a test can
// check its type (EXPECT_THROW(failure.rethrowCause(), NetworkError)).
class RankFailure : public std::runtime_error {
 public:
  RankFailure(int rank, std::exception_ptr cause, const std::string& what)
      : std::runtime_error("rank " + std::to_string(rank) + ": " + what), rank(rank), cause(std::move(cause)) {}

  [[noreturn]] void rethrowCause() const { std::rethrow_exception(cause); }

  int rank;
  std::exception_ptr cause;
};

// Runs fn(rank) for every rank in [0, size), each on its own thread, and joins them all.
// Once all have returned, throws RankFailure for the rank that failed first, if any.
// Blocks for as long as the slowest rank: ranks waiting for a failed one must be bounded
// by their own timeouts (see testOptions()).
inline void runOnThreads(int size, const std::function<void(int rank)>& fn) {
  std::mutex mutex;
  std::unique_ptr<RankFailure> first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(size));
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank);
      } catch (...) {
        std::string what = "unknown exception";
        try {
          throw;
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        std::lock_guard<std::mutex> lock(mutex);
        if (first == nullptr) first = std::make_unique<RankFailure>(rank, std::current_exception(), what);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (first != nullptr) throw *first;
}

// A store of its own for one group of ranks: a PrefixStore with a fresh prefix over one
// HashStore shared by the whole test program.
inline std::shared_ptr<Store> freshStore() {
  static const auto shared = std::make_shared<HashStore>(std::chrono::seconds(30));
  static std::atomic<int> next{0};
  return std::make_shared<PrefixStore>("thread_harness/" + std::to_string(next++), shared);
}

// "auto", "tcp" or "shm": for test names and messages.
inline const char* kindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kAuto: return "auto";
    case TransportKind::kTcp: return "tcp";
    case TransportKind::kShm: return "shm";
  }
  return "?";
}

// Options for tests: a timeout short enough that a bug fails the test instead of hanging
// it, long enough for a loaded two-core machine.
inline CommunicatorOptions testOptions(TransportKind transport = TransportKind::kAuto,
                                       std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  CommunicatorOptions options;
  options.transport = transport;
  options.timeout = timeout;
  return options;
}

// Runs body(rank, communicator) on `size` threads: each creates its communicator with
// options from one fresh store, runs body, and destroys it. Failures (creation
// included) are reported as by runOnThreads.
inline void runCommunicators(int size, const std::function<void(int rank, Communicator& communicator)>& body,
                             const CommunicatorOptions& options = testOptions()) {
  const std::shared_ptr<Store> store = freshStore();
  runOnThreads(size, [&](int rank) {
    const std::shared_ptr<Communicator> communicator = Communicator::create(store, rank, size, options);
    body(rank, *communicator);
  });
}

}  // namespace ringtree::test
