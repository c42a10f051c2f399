#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <ringtree/export.h>

// The flight recorder: every Communicator remembers its latest collective calls (the last
// RINGTREE_FLIGHT_RECORDER_ENTRIES, default 2048), so that after a hang or a failure each
// rank can tell what it called, in which order, and how each call ended.
//
// Reading it: Communicator::flightRecord() (entries, oldest first) and
// Communicator::flightRecordJson() (the same as one JSON document); from Python,
// ringtree.dump_flight_recorder(). Recording costs one steady-clock read and the stores
// of one cache line of a fixed ring per call: no lock, no allocation.
//
// Automatic output:
//  - when a collective fails with TimeoutError or NetworkError, the rank logs its latest
//    calls (at error level, on stderr) after the error;
//  - when RINGTREE_FLIGHT_RECORDER_DIR is set, the rank writes its whole record as JSON to
//    <dir>/rank_<global rank>.json (rank_<global rank>.<group>.json for a group other than
//    the world; see CommunicatorIdentity) when a collective fails (timeout, network
//    error, mismatch), and Communicator::dumpFlightRecord() writes it on demand (the
//    Python layer does at destroy_process_group and abort).
//
// JSON document (one per rank and communicator; `python -m ringtree.flight_recorder <dir>`
// merges the files of all ranks):
//   {"format": "ringtree-flight-recorder", "version": 1,
//    "group": "<group name>", "world": true|false,
//    "rank": <global rank>, "group_rank": <rank in the group>, "group_size": <n>,
//    "host": "<host name>", "pid": <pid>, "reason": "<why it was written>",
//    "written_at": <wall clock, seconds since the epoch>,
//    "capacity": <entries kept>, "calls": <calls started since creation>,
//    "entries": [{"seq": 1, "collective": "allreduce", "algorithm": "ring",
//                 "dtype": "float32", "count": 1024, "root": -1, "op": "SUM",
//                 "description": "allreduce(seq=1, algorithm=ring, dtype=float32, count=1024, op=SUM)",
//                 "state": "started"|"completed"|"failed", "error": null|"<text>",
//                 "start_time": <seconds since the epoch>, "end_time": null|<seconds>,
//                 "duration_us": null|<microseconds>}, ...]}
//   Entries are oldest first; when calls > capacity the oldest calls - capacity are gone.
namespace ringtree {

// What became of a recorded call.
enum class CallState : uint8_t { kStarted, kCompleted, kFailed };

// "started", "completed", "failed".
RINGTREE_API const char* callStateName(CallState state);

// One collective call as this rank's flight recorder saw it.
struct FlightRecord {
  // The call's sequence number on its communicator (1 for the first call): calls with
  // the same sequence number on different ranks are meant to be the same collective.
  uint64_t sequence = 0;
  std::string collective;  // "allreduce", "broadcast", "reduce", "barrier", ...
  std::string algorithm;   // "ring", "tree", "shm_direct", ...
  // The call's arguments as recorded. Which of them matter depends on the collective
  // (a barrier has no data type, only reductions have an op): `description` shows those.
  std::string dataType;  // "float32", ...
  uint64_t count = 0;    // elements
  int root = -1;         // -1: none
  std::string reduceOp;  // "SUM", ...
  // "allreduce(seq=3, algorithm=ring, dtype=float32, count=1024, op=SUM)": the text
  // errors use for this call.
  std::string description;
  CallState state = CallState::kStarted;
  std::string error;  // kFailed: the error's text
  // Wall-clock start and end (derived from the steady clock, so that durations are
  // exact); endTime equals startTime and duration is 0 while the call runs.
  std::chrono::system_clock::time_point startTime;
  std::chrono::system_clock::time_point endTime;
  std::chrono::nanoseconds duration{0};
};

}  // namespace ringtree
