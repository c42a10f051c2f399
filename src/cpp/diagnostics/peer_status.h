#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/store/store.h>

#include "diagnostics/flight_recorder.h"

// "Who did not arrive": what each rank last started and finished, as its peers learn it
// when a call times out — from the node arena when the communicator has one
// (arena_status.h), else from the store, where every rank's StatusPublisher keeps it.
namespace ringtree::diagnostics {

// What one peer was last seen doing.
struct PeerProgress {
  int rank = -1;
  bool known = false;
  std::string unknownReason;  // when !known: why
  // The last call the peer started (0: none yet), as describe() text, and how long ago.
  uint64_t startedSequence = 0;
  std::string started;
  double startedSecondsAgo = -1;  // < 0: unknown
  // The last call the peer finished (0: none) and whether it failed.
  uint64_t finishedSequence = 0;
  bool finishedFailed = false;
  double finishedSecondsAgo = -1;  // < 0: unknown
};

// The sentences a timeout appends about the peers, for a call with `sequence` whose
// short name is `callName` ("allreduce(seq=7)"), e.g.
//   "ranks 2, 3 did not enter allreduce(seq=7): rank 2 last completed barrier(seq=6) 41.2 s
//    ago; rank 3 is still in allreduce(seq=6, ...), entered 41.2 s ago. rank 1 entered
//    allreduce(seq=7) 2.0 s ago."
std::string describeProgress(uint64_t sequence, const std::string& callName, const std::vector<PeerProgress>& peers);

// The store key under which `rank` publishes its status.
std::string statusKey(int rank);

// Publishes this rank's status (last started and last finished call, from the flight
// recorder) under statusKey(rank) in `store`, and reads the peers' on request.
//
// A background thread wakes every kPollInterval, and writes the key only when the
// recorder changed since its last write: nothing is added to the collectives' path.
// Store requests run on that thread only, so a hung or slow store never blocks a
// collective for longer than the budget its caller gives readPeers().
//
// Threading: readPeers() and stop() may be called from any thread.
class StatusPublisher {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{100};

  // `store` must be an object no other thread uses (Store::clone()); its timeout is
  // shortened to kStoreTimeout. The recorder must outlive this object.
  StatusPublisher(std::shared_ptr<Store> store, int rank, int size, const FlightRecorder& recorder);
  ~StatusPublisher();
  StatusPublisher(const StatusPublisher&) = delete;
  StatusPublisher& operator=(const StatusPublisher&) = delete;

  // The published status of every other rank, waiting at most `budget` for the store.
  // Ranks whose status could not be read come back with known == false and the reason.
  std::vector<PeerProgress> readPeers(std::chrono::milliseconds budget);

  // Stops the thread (after the store request it is in, if any) and drops the store.
  // Idempotent.
  void stop();

 private:
  static constexpr std::chrono::milliseconds kStoreTimeout{2000};

  void run();
  void publish();
  std::vector<PeerProgress> read();

  std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const FlightRecorder& recorder_;

  std::mutex mutex_;
  std::condition_variable wake_;  // to the thread: stop or read
  std::condition_variable done_;  // from the thread: a read finished
  bool stopping_ = false;
  uint64_t readsRequested_ = 0;
  uint64_t readsDone_ = 0;
  std::vector<PeerProgress> lastRead_;
  std::thread thread_;
};

}  // namespace ringtree::diagnostics
