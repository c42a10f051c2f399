#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ringtree/flight_recorder.h>

#include "transport/pair.h"

// The storage behind <ringtree/flight_recorder.h>: a fixed ring of entries that the
// thread running a communicator's collectives writes and any thread may read.
namespace ringtree::diagnostics {

// How to read a recorded envelope: the algorithm layer's knowledge of the collectives,
// recorded with each call (one pointer) so that the recorder needs none. The functions
// must be callable from any thread; the object must outlive the recorder (a static).
struct CallFormat {
  std::string (*describe)(const transport::Envelope&);  // "allreduce(seq=3, ...)"
  const char* (*collective)(const transport::Envelope&);  // "allreduce"
  const char* (*algorithm)(const transport::Envelope&);   // "ring"
};

// Nanoseconds of the steady clock (CLOCK_MONOTONIC: one time base for every process of
// a host).
inline int64_t steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Nanoseconds since the epoch of the wall clock, at the steady-clock time `steadyNs`
// (converted with the offset between the two clocks measured at the first call in this
// process, so that repeated reads agree; a later wall-clock step is not followed).
int64_t wallNsAt(int64_t steadyNs);

// One call as read back from the recorder.
struct RecordedCall {
  uint64_t index = 0;  // 0 for the communicator's first call
  transport::Envelope envelope;
  const CallFormat* format = nullptr;
  CallState state = CallState::kStarted;
  int64_t startNs = 0;  // steady clock
  int64_t endNs = 0;    // steady clock; 0 while started
};

// The last `capacity` collective calls of one communicator.
//
// Threading: one writer at a time — the thread running the communicator's current call;
// successive calls may run on different threads when something orders them (the
// communicator's contract: calls are serialised by the caller). Writing takes no lock and
// allocates nothing (a failure's text excepted): one cache line per call. Readers
// (calls(), changes(), snapshot(), errorOf(), toRecord()) run on any thread at any time:
// each entry is a seqlock, so a reader retries an entry the writer is rewriting and never
// sees a torn one.
class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  size_t capacity() const { return capacity_; }

  // Writer side. started() opens the entry of a new call; finished() closes the entry
  // last opened (kCompleted or kFailed; for kFailed, `error` is kept as its text).
  void started(const transport::Envelope& envelope, const CallFormat* format, int64_t nowNs);
  void finished(CallState state, int64_t nowNs, const std::string& error = {});

  // Reader side.
  // Calls started since creation.
  uint64_t calls() const { return calls_.load(std::memory_order_acquire); }
  // Changes whenever a call starts or finishes (0 before the first): lets a poller skip
  // unchanged states.
  uint64_t changes() const;
  // The last `limit` recorded calls (at most capacity()), oldest first.
  std::vector<RecordedCall> snapshot(size_t limit = SIZE_MAX) const;
  // The text of failed call `index`; empty when unknown.
  std::string errorOf(uint64_t index) const;

  // The public form of `call` (wall-clock times converted now).
  FlightRecord toRecord(const RecordedCall& call) const;

 private:
  struct Slot;

  bool read(const Slot& slot, RecordedCall* call) const;

  const size_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> calls_{0};  // written by the writer only
  // The writer's: the call last started, its slot, and the word its envelope's last
  // entry holds (dataType | reduceOp << 8, to which finished() adds the state).
  uint64_t currentIndex_ = 0;
  size_t currentSlot_ = 0;
  uint64_t currentTypeWord_ = 0;

  mutable std::mutex errorsMutex_;
  std::map<uint64_t, std::string> errors_;  // by call index; only for calls still kept
};

// Everything a flight-record JSON document says besides the entries.
struct FlightRecordHeader {
  std::string group;
  bool world = true;
  int rank = 0;       // global rank
  int groupRank = 0;  // rank in the group
  int groupSize = 1;
  std::string reason;
  size_t capacity = 0;
  uint64_t calls = 0;
};

// The JSON document described in <ringtree/flight_recorder.h>.
std::string flightRecordJson(const FlightRecordHeader& header, const std::vector<FlightRecord>& records);

// "  allreduce(seq=5, ...) completed in 12.300 us, started at 12:00:00.123456" lines (local
// time), one per record, without error texts: what a failing rank logs about its latest
// calls after its error.
std::string flightRecordLines(const std::vector<FlightRecord>& records);

}  // namespace ringtree::diagnostics
