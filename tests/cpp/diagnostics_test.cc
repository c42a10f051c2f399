// Diagnostics: the flight recorder (entries, states, wraparound, a reader racing the
// writer, the JSON form, the dump directory, the log after a failure), "who did not
// arrive" in timeout errors (store statuses over TCP, the node arena over shared memory),
// the arena's call history, call names in transport errors, Store::clone, and abort.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/error.h>
#include <ringtree/flight_recorder.h>
#include <ringtree/process_group.h>
#include <ringtree/store/file_store.h>
#include <ringtree/store/hash_store.h>
#include <ringtree/store/prefix_store.h>
#include <ringtree/store/tcp_store.h>

#include "arena/node_arena.h"
#include "diagnostics/flight_recorder.h"
#include "diagnostics/peer_status.h"
#include "harness/process_harness.h"
#include "harness/test_util.h"
#include "harness/thread_harness.h"

namespace ringtree {
namespace {

using namespace std::chrono_literals;
using diagnostics::FlightRecorder;
using diagnostics::RecordedCall;
using test::Arrivals;
using test::contains;
using test::ScopedEnv;

// A format that names every call "call(seq=N)", collective "allreduce", algorithm "ring".
const diagnostics::CallFormat kTestFormat{
    [](const transport::Envelope& e) { return "call(seq=" + std::to_string(e.sequence) + ")"; },
    [](const transport::Envelope&) { return "allreduce"; }, [](const transport::Envelope&) { return "ring"; }};

transport::Envelope envelopeFor(uint64_t sequence) {
  transport::Envelope e;
  e.sequence = sequence;
  e.count = sequence * 3;
  e.root = static_cast<int32_t>(sequence % 5);
  e.dataType = static_cast<uint8_t>(DataType::kFloat32);
  e.reduceOp = static_cast<uint8_t>(ReduceOp::kMax);
  return e;
}

// ---------------------------------------------------------------------------------------
// The recorder on its own.

TEST(FlightRecorder, RecordsStartedCompletedAndFailedCalls) {
  FlightRecorder recorder(8);
  recorder.started(envelopeFor(1), &kTestFormat, 1000);
  recorder.finished(CallState::kCompleted, 5000);
  recorder.started(envelopeFor(2), &kTestFormat, 6000);
  recorder.finished(CallState::kFailed, 9000, "it broke");
  recorder.started(envelopeFor(3), &kTestFormat, 10000);

  const std::vector<RecordedCall> calls = recorder.snapshot();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(recorder.calls(), 3u);
  EXPECT_EQ(calls[0].state, CallState::kCompleted);
  EXPECT_EQ(calls[1].state, CallState::kFailed);
  EXPECT_EQ(calls[2].state, CallState::kStarted);

  const FlightRecord first = recorder.toRecord(calls[0]);
  EXPECT_EQ(first.sequence, 1u);
  EXPECT_EQ(first.collective, "allreduce");
  EXPECT_EQ(first.algorithm, "ring");
  EXPECT_EQ(first.dataType, "float32");
  EXPECT_EQ(first.reduceOp, "MAX");
  EXPECT_EQ(first.count, 3u);
  EXPECT_EQ(first.root, 1);
  EXPECT_EQ(first.description, "call(seq=1)");
  EXPECT_EQ(first.duration, std::chrono::nanoseconds(4000));
  EXPECT_EQ(first.endTime - first.startTime, std::chrono::microseconds(4));

  const FlightRecord failed = recorder.toRecord(calls[1]);
  EXPECT_EQ(failed.error, "it broke");
  const FlightRecord running = recorder.toRecord(calls[2]);
  EXPECT_EQ(running.duration.count(), 0);
  EXPECT_EQ(running.endTime, running.startTime);
  EXPECT_TRUE(running.error.empty());
}

TEST(FlightRecorder, KeepsTheLatestCallsWhenItWrapsAround) {
  FlightRecorder recorder(4);
  for (uint64_t sequence = 1; sequence <= 10; ++sequence) {
    recorder.started(envelopeFor(sequence), &kTestFormat, static_cast<int64_t>(sequence));
    if (sequence == 2 || sequence == 9) {
      recorder.finished(CallState::kFailed, static_cast<int64_t>(sequence) + 1, "failure " + std::to_string(sequence));
    } else {
      recorder.finished(CallState::kCompleted, static_cast<int64_t>(sequence) + 1);
    }
  }
  EXPECT_EQ(recorder.calls(), 10u);
  const std::vector<RecordedCall> calls = recorder.snapshot();
  ASSERT_EQ(calls.size(), 4u);
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i].envelope.sequence, 7 + i);
  EXPECT_EQ(recorder.toRecord(calls[2]).error, "failure 9");
  EXPECT_EQ(recorder.errorOf(1), "") << "the text of a call no longer kept is dropped";
  const std::vector<RecordedCall> latest = recorder.snapshot(2);
  ASSERT_EQ(latest.size(), 2u);
  EXPECT_EQ(latest[0].envelope.sequence, 9u);
  EXPECT_EQ(latest[1].envelope.sequence, 10u);
}

TEST(FlightRecorder, ReaderRacingTheWriterNeverSeesATornEntry) {
  FlightRecorder recorder(16);
  // The writer goes on until the reader has taken this many snapshots of a non-empty
  // recorder while it wrote (bounded in time for a starved reader).
  constexpr int kSnapshots = 200;
  std::atomic<int> snapshots{0};
  std::atomic<bool> done{false};
  uint64_t written = 0;
  std::thread writer([&] {
    const auto limit = std::chrono::steady_clock::now() + 10s;
    while (snapshots < kSnapshots && std::chrono::steady_clock::now() < limit) {
      for (int i = 0; i < 1000; ++i) {
        const uint64_t sequence = ++written;
        const auto start = static_cast<int64_t>(sequence * 10);
        recorder.started(envelopeFor(sequence), &kTestFormat, start);
        recorder.finished(CallState::kCompleted, start + 7);
      }
    }
    done = true;
  });
  // Every entry read must be whole: the fields of one call, never parts of two. Returns
  // how many entries were read.
  const auto checkSnapshot = [&] {
    const std::vector<RecordedCall> calls = recorder.snapshot();
    for (const RecordedCall& call : calls) {
      const uint64_t sequence = call.index + 1;
      EXPECT_EQ(call.envelope.sequence, sequence);
      EXPECT_EQ(call.envelope.count, sequence * 3);
      EXPECT_EQ(call.envelope.root, static_cast<int32_t>(sequence % 5));
      EXPECT_EQ(call.envelope.reduceOp, static_cast<uint8_t>(ReduceOp::kMax));
      EXPECT_EQ(call.format, &kTestFormat);
      EXPECT_EQ(call.startNs, static_cast<int64_t>(sequence * 10));
      if (call.state == CallState::kCompleted) {
        EXPECT_EQ(call.endNs, call.startNs + 7);
      } else {
        EXPECT_EQ(call.state, CallState::kStarted);
        EXPECT_EQ(call.endNs, 0);
      }
    }
    return calls.size();
  };
  while (!done && !testing::Test::HasFailure()) {
    if (checkSnapshot() > 0) ++snapshots;
  }
  writer.join();
  checkSnapshot();
  EXPECT_GE(snapshots, kSnapshots) << "the reader was starved";
  EXPECT_EQ(recorder.calls(), written);
  EXPECT_EQ(recorder.snapshot().size(), 16u);
}

TEST(FlightRecorder, JsonDocumentNamesTheRankAndEveryCall) {
  FlightRecorder recorder(8);
  recorder.started(envelopeFor(1), &kTestFormat, 1000);
  recorder.finished(CallState::kFailed, 3000, "bad \"quote\"\nnext line");
  diagnostics::FlightRecordHeader header;
  header.group = "tp";
  header.world = false;
  header.rank = 5;
  header.groupRank = 1;
  header.groupSize = 2;
  header.reason = "test";
  header.capacity = recorder.capacity();
  header.calls = recorder.calls();
  std::vector<FlightRecord> records;
  for (const RecordedCall& call : recorder.snapshot()) records.push_back(recorder.toRecord(call));
  const std::string json = diagnostics::flightRecordJson(header, records);
  for (const char* part : {"\"format\": \"ringtree-flight-recorder\"", "\"group\": \"tp\"", "\"world\": false",
                           "\"rank\": 5", "\"group_rank\": 1", "\"group_size\": 2", "\"reason\": \"test\"",
                           "\"capacity\": 8", "\"calls\": 1", "\"seq\": 1", "\"state\": \"failed\"",
                           "\"error\": \"bad \\\"quote\\\"\\nnext line\"", "\"duration_us\": 2.000"}) {
    EXPECT_TRUE(contains(json, part)) << part << " not in " << json;
  }
}

// ---------------------------------------------------------------------------------------
// The recorder of a communicator.

TEST(FlightRecorder, CommunicatorRecordsEveryCollective) {
  ScopedEnv entries("RINGTREE_FLIGHT_RECORDER_ENTRIES", "3");
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    std::vector<float> data(16, 1.0f);
    allreduce(comm, data.data(), data.size(), DataType::kFloat32);
    BroadcastOptions b;
    b.root = 1;
    broadcast(comm, data.data(), data.size(), DataType::kFloat32, b);
    barrier(comm);
    ReduceOptions r;
    r.op = ReduceOp::kMax;
    reduce(comm, data.data(), 8, DataType::kFloat32, r);
    const std::vector<FlightRecord> records = comm.flightRecord();
    ASSERT_EQ(records.size(), 3u) << "RINGTREE_FLIGHT_RECORDER_ENTRIES=3 keeps 3 calls";
    EXPECT_EQ(records[0].collective, "broadcast");
    EXPECT_EQ(records[0].root, 1);
    EXPECT_EQ(records[1].collective, "barrier");
    EXPECT_EQ(records[2].collective, "reduce");
    EXPECT_EQ(records[2].count, 8u);
    EXPECT_EQ(records[2].reduceOp, "MAX");
    EXPECT_TRUE(contains(records[2].description, "reduce(seq=4")) << records[2].description;
    for (const FlightRecord& record : records) {
      EXPECT_EQ(record.state, CallState::kCompleted);
      EXPECT_GE(record.endTime, record.startTime);
    }
    const std::string json = comm.flightRecordJson("check");
    EXPECT_TRUE(contains(json, "\"group_rank\": " + std::to_string(rank))) << json;
    EXPECT_TRUE(contains(json, "\"calls\": 4")) << json;
  }, test::testOptions(TransportKind::kTcp));
}

TEST(FlightRecorder, RejectsAnInvalidEntryCount) {
  ScopedEnv entries("RINGTREE_FLIGHT_RECORDER_ENTRIES", "lots");
  EXPECT_THROW(Communicator::create(test::freshStore(), 0, 1, test::testOptions()), InvalidArgument);
}

// ---------------------------------------------------------------------------------------
// Who did not arrive.

// Ranks 0 and 1 call allreduce, barrier, allreduce; rank 2 skips the last allreduce and
// stays connected until both timed out. Returns what ranks 0 and 1 saw: its own timeout,
// or the other's, passed on by its abandon notice.
std::vector<std::string> timeoutWithRankTwoMissing(TransportKind transport) {
  std::vector<std::string> messages(2);
  Arrivals failed;
  test::runCommunicators(3, [&](int rank, Communicator& comm) {
    std::vector<float> data(4, 1.0f);
    allreduce(comm, data.data(), data.size(), DataType::kFloat32);
    barrier(comm);
    if (rank != 2) {
      AllreduceOptions o;
      o.timeout = 2000ms;
      messages[static_cast<size_t>(rank)] =
          test::messageOf<TimeoutError>([&] { allreduce(comm, data.data(), data.size(), DataType::kFloat32, o); });
      failed.arrive();
      // Later calls repeat the failure, with its class.
      const std::string again = test::messageOf<TimeoutError>([&] { barrier(comm); });
      EXPECT_TRUE(contains(again, "the communicator is unusable after an earlier failure: rank ")) << again;
    }
    failed.waitFor(2);
  }, test::testOptions(transport));
  return messages;
}

// What each rank's timeout in timeoutWithRankTwoMissing says: its own deadline (or that
// rank 2 did not arrive, from a rank that timed out first), and rank 2's last call.
void expectRankTwoNamedMissing(const std::vector<std::string>& messages) {
  for (const std::string& m : messages) {
    EXPECT_TRUE(contains(m, "ms in allreduce(seq=3, algorithm=") ||
                (contains(m, "rank 2 (host ") && contains(m, " did not arrive in time for allreduce(seq=3, ") &&
                 contains(m, ", reported by rank ")))
        << m;
    EXPECT_TRUE(contains(m, "rank 2 did not enter allreduce(seq=3): rank 2 last completed barrier(seq=2) ")) << m;
    EXPECT_TRUE(contains(m, " s ago")) << m;
  }
}

TEST(WhoDidNotArrive, TimeoutOverTcpNamesTheMissingRankFromItsPublishedStatus) {
  expectRankTwoNamedMissing(timeoutWithRankTwoMissing(TransportKind::kTcp));
}

TEST(WhoDidNotArrive, TimeoutOverTheArenaSaysTheSame) {
  expectRankTwoNamedMissing(timeoutWithRankTwoMissing(TransportKind::kShm));
}

TEST(WhoDidNotArrive, APeerInAnotherCallUnderTheSameNumberIsAMismatch) {
  // Each rank is the root of its own reduce: both wait to receive and no message tells
  // them apart; the statuses they publish do, by the deadline at the latest.
  std::vector<std::string> messages(2);
  Arrivals failed;
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    std::vector<float> data(4, 1.0f);
    ReduceOptions o;
    o.root = rank;
    o.algorithm = Algorithm::kTree;
    o.timeout = 800ms;
    messages[static_cast<size_t>(rank)] = test::messageOf<CollectiveMismatchError>(
        [&] { reduce(comm, data.data(), data.size(), DataType::kFloat32, o); });
    failed.arrive();
    failed.waitFor(2);
  }, test::testOptions(TransportKind::kTcp));
  for (int rank = 0; rank < 2; ++rank) {
    const std::string& m = messages[static_cast<size_t>(rank)];
    EXPECT_TRUE(contains(m, "collective mismatch between rank " + std::to_string(rank) + " and rank " +
                                std::to_string(1 - rank)))
        << m;
    for (int root = 0; root < 2; ++root) {
      EXPECT_TRUE(contains(m, "reduce(seq=1, algorithm=tree, dtype=float32, count=4, op=SUM, root=" +
                                  std::to_string(root) + ")"))
          << m;
    }
  }
}

// Rank 3 calls a broadcast while the others run a ring allreduce: its neighbours see its
// messages, and the ranks that never hear from it learn of it from their peers' abandon
// notices (or its published status), long before their deadline, naming rank 3.
TEST(AbandonNotice, RanksThatDoNotTalkToTheCulpritFailFastNamingIt) {
  std::vector<std::string> messages(3);
  std::vector<std::chrono::steady_clock::duration> took(3);
  Arrivals failed;
  test::runCommunicators(4, [&](int rank, Communicator& comm) {
    std::vector<float> data(64, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    if (rank == 3) {
      BroadcastOptions o;
      o.root = 3;
      o.timeout = 30s;
      try {
        broadcast(comm, data.data(), data.size(), DataType::kFloat32, o);
      } catch (const Error&) {
        // Its own outcome depends on which peer speaks first; the others' is under test.
      }
    } else {
      AllreduceOptions o;
      o.algorithm = Algorithm::kRing;
      o.timeout = 30s;
      messages[static_cast<size_t>(rank)] = test::messageOf<CollectiveMismatchError>(
          [&] { allreduce(comm, data.data(), data.size(), DataType::kFloat32, o); });
      took[static_cast<size_t>(rank)] = std::chrono::steady_clock::now() - start;
      // The next call fails with the same class.
      EXPECT_THROW(barrier(comm), CollectiveMismatchError);
    }
    failed.arrive();
    failed.waitFor(4);
  }, test::testOptions(TransportKind::kTcp));
  for (size_t rank = 0; rank < 3; ++rank) {
    // Its neighbours name both calls; the others name rank 3 with its host and pid, and the
    // call they were in (the notice carries the call of the rank that passed it on).
    EXPECT_TRUE(contains(messages[rank], "rank 3")) << messages[rank];
    EXPECT_TRUE(contains(messages[rank], "broadcast(seq=1") || contains(messages[rank], "rank 3 (host "))
        << messages[rank];
    // Long before their 30 s deadline.
    EXPECT_LT(took[rank], test::kPrompt) << "rank " << rank << ": " << messages[rank];
  }
}

TEST(WhoDidNotArrive, DescribesEveryKindOfPeer) {
  std::vector<diagnostics::PeerProgress> peers(5);
  for (int i = 0; i < 5; ++i) {
    peers[static_cast<size_t>(i)].rank = i + 1;
    peers[static_cast<size_t>(i)].known = true;
  }
  peers[0].startedSequence = 0;  // never started
  peers[1].startedSequence = 6;  // stuck in an earlier call
  peers[1].started = "barrier(seq=6)";
  peers[1].startedSecondsAgo = 41.25;
  peers[1].finishedSequence = 5;
  peers[2].startedSequence = 7;  // in it
  peers[2].startedSecondsAgo = 2.0;
  peers[2].finishedSequence = 6;
  peers[3].startedSequence = 8;  // past it
  peers[3].started = "allreduce(seq=8)";
  peers[3].finishedSequence = 7;
  peers[4].known = false;
  peers[4].unknownReason = "the store failed";
  const std::string text = diagnostics::describeProgress(7, "allreduce(seq=7)", peers);
  EXPECT_EQ(text,
            "ranks 1, 2 did not enter allreduce(seq=7): rank 1 has not published its status yet (no "
            "collective started, or not published since); rank 2 is still in "
            "barrier(seq=6), entered 41.2 s ago. rank 3 entered allreduce(seq=7) 2.0 s ago. rank 4 is past "
            "allreduce(seq=7), in allreduce(seq=8). rank 5: status unknown (the store failed)");
}

// ---------------------------------------------------------------------------------------
// Failure traces: the log and the dump directory.

TEST(FailureTraces, TimeoutLogsTheLatestCallsAndWritesTheFlightRecord) {
  test::TempDir dir;
  ScopedEnv directory("RINGTREE_FLIGHT_RECORDER_DIR", dir.path().c_str());
  testing::internal::CaptureStderr();
  Arrivals failed;
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    comm.setIdentity(CommunicatorIdentity{"tp", 10 + rank, false});
    barrier(comm);
    if (rank == 0) {
      std::vector<float> data(4, 1.0f);
      AllreduceOptions o;
      o.timeout = 500ms;
      EXPECT_THROW(allreduce(comm, data.data(), data.size(), DataType::kFloat32, o), TimeoutError);
      failed.arrive();
    }
    failed.waitFor(1);
  }, test::testOptions(TransportKind::kTcp));
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "latest calls of rank 0 (flight recorder, oldest first):")) << log;
  EXPECT_TRUE(contains(log, "barrier(seq=1) completed in ")) << log;
  EXPECT_TRUE(contains(log, "allreduce(seq=2, algorithm=")) << log;

  std::ifstream file(dir.file("rank_10.tp.json"));
  ASSERT_TRUE(file.good()) << "no dump of rank 0";
  std::stringstream json;
  json << file.rdbuf();
  EXPECT_TRUE(contains(json.str(), "\"group\": \"tp\"")) << json.str();
  EXPECT_TRUE(contains(json.str(), "\"rank\": 10")) << json.str();
  EXPECT_TRUE(contains(json.str(), "\"state\": \"failed\"")) << json.str();
  EXPECT_TRUE(contains(json.str(), "\"reason\": \"failure: rank 0: timed out")) << json.str();
  EXPECT_FALSE(std::ifstream(dir.file("rank_11.tp.json")).good()) << "rank 1 did not fail";
}

// ---------------------------------------------------------------------------------------
// The arena's history: a mismatch is caught in the call where it happens.

TEST(ArenaHistory, KeepsTheLastCallsOfEveryRankAndWhenTheyFinished) {
  using arena::NodeArena;
  const auto zero = NodeArena::create(2);
  const auto one = NodeArena::attach(net::Socket(::dup(zero->descriptor())), 1, 2, zero->slotBytes());
  transport::Envelope seen;
  EXPECT_EQ(zero->peerCallAt(1, 1, &seen), NodeArena::History::kRewriting) << "nothing published yet";
  for (uint64_t sequence = 1; sequence <= 40; ++sequence) one->publishCall(envelopeFor(sequence), 1000);
  ASSERT_EQ(zero->peerCallAt(1, 30, &seen), NodeArena::History::kFound);
  EXPECT_TRUE(seen == envelopeFor(30));
  EXPECT_EQ(zero->peerCallAt(1, 40 - NodeArena::kHistory + 1, &seen), NodeArena::History::kFound);
  EXPECT_EQ(zero->peerCallAt(1, 40 - NodeArena::kHistory, &seen), NodeArena::History::kAbsent) << "overwritten";
  EXPECT_EQ(zero->peerCallAt(1, 41, &seen), NodeArena::History::kAbsent) << "not made yet";
  ASSERT_TRUE(zero->peerCall(1, &seen));
  EXPECT_EQ(seen.sequence, 40u);

  one->noteFinished(39, false, 2000);
  NodeArena::PeerStatus status = zero->peerStatus(1);
  EXPECT_EQ(status.startNs, 1000);
  EXPECT_EQ(status.finishedSequence, 39u);
  EXPECT_FALSE(status.finishedFailed);
  EXPECT_EQ(status.finishedNs, 2000);
  one->noteFinished(40, true, 3000);
  status = zero->peerStatus(1);
  EXPECT_EQ(status.finishedSequence, 40u);
  EXPECT_TRUE(status.finishedFailed);
}

TEST(ArenaHistory, PeerThatMovedOnAfterAnotherCallIsAMismatchInThatCall) {
  std::vector<std::string> messages(2);
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    std::vector<float> data(4, 1.0f);
    AllreduceOptions arena;
    arena.algorithm = Algorithm::kShmDirect;
    try {
      if (rank == 0) {
        // A pair-based reduce to rank 1 (done once its bytes are sent), then an arena
        // allreduce that publishes its first step while rank 1 is still in call 1.
        ReduceOptions r;
        r.root = 1;
        r.algorithm = Algorithm::kTree;
        reduce(comm, data.data(), data.size(), DataType::kFloat32, r);
        allreduce(comm, data.data(), data.size(), DataType::kFloat32, arena);
      } else {
        std::this_thread::sleep_for(300ms);  // rank 0 is in its second call by now
        allreduce(comm, data.data(), data.size(), DataType::kFloat32, arena);
      }
      ADD_FAILURE() << "rank " << rank << " did not detect the mismatch";
    } catch (const CollectiveMismatchError& e) {
      messages[static_cast<size_t>(rank)] = e.what();
    }
  }, test::testOptions(TransportKind::kShm, 10s));
  EXPECT_TRUE(contains(messages[1], "rank 1 called allreduce(seq=1, algorithm=shm_direct")) << messages[1];
  EXPECT_TRUE(contains(messages[1], "rank 0 called reduce(seq=1, algorithm=tree")) << messages[1];
  EXPECT_TRUE(contains(messages[0], "rank 0")) << messages[0];
}

// ---------------------------------------------------------------------------------------
// Transport errors name the call, not raw envelope fields.

TEST(TransportErrors, APeerThatLeavesIsReportedWithTheCallItInterrupted) {
  std::string message;
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    if (rank == 1) return;  // closes its connection without entering the collective
    std::vector<float> data(4, 1.0f);
    AllreduceOptions o;
    o.algorithm = Algorithm::kTree;
    message = test::messageOf<NetworkError>([&] { allreduce(comm, data.data(), data.size(), DataType::kFloat32, o); });
  }, test::testOptions(TransportKind::kTcp));
  EXPECT_TRUE(contains(message, "16 bytes of allreduce(seq=1, algorithm=tree, dtype=float32, count=4, op=SUM)")) << message;
  EXPECT_FALSE(contains(message, "operation ")) << message;
  EXPECT_FALSE(contains(message, "[in ")) << "the call is named once: " << message;
}

// ---------------------------------------------------------------------------------------
// Store::clone.

void expectCloneSharesKeys(Store& store) {
  const std::shared_ptr<Store> clone = store.clone();
  ASSERT_NE(clone, nullptr);
  store.set("from-original", toBytes("a"));
  clone->set("from-clone", toBytes("b"));
  EXPECT_EQ(toString(clone->get("from-original")), "a");
  EXPECT_EQ(toString(store.get("from-clone")), "b");
  EXPECT_EQ(clone->timeout(), store.timeout());
  clone->setTimeout(1ms);
  EXPECT_NE(store.timeout(), clone->timeout()) << "timeouts are independent";
}

TEST(StoreClone, HashStore) {
  HashStore store(5s);
  expectCloneSharesKeys(store);
}

TEST(StoreClone, FileStore) {
  test::TempDir dir;
  FileStore store(dir.file("store"), -1, 5s);
  expectCloneSharesKeys(store);
}

TEST(StoreClone, TcpStoreMakesItsOwnConnection) {
  TcpStoreOptions options;
  options.isServer = true;
  options.token = "secret";
  TcpStore store("127.0.0.1", options, 5s);
  expectCloneSharesKeys(store);
  const int before = store.numServerClients();
  const std::shared_ptr<Store> clone = store.clone();
  EXPECT_EQ(store.totalServerClients(), 3) << "this client, the clone of expectCloneSharesKeys, this clone";
  EXPECT_GE(store.numServerClients(), before);
}

TEST(StoreClone, PrefixStoreKeepsItsPrefix) {
  auto inner = std::make_shared<HashStore>(5s);
  PrefixStore store("p", inner);
  expectCloneSharesKeys(store);
  EXPECT_TRUE(inner->check({"p/from-clone"}));
}

// ---------------------------------------------------------------------------------------
// abort.

// Rank 0 runs an allreduce on another thread that rank 1 never joins, aborts its group
// after 300 ms, and checks the call fails promptly saying so; rank 1 then sees rank 0 leave.
void abortInterruptsABlockedCollective(TransportKind transport) {
  std::atomic<bool> aborted{false};
  test::runCommunicators(2, [&](int rank, Communicator& comm) {
    std::vector<float> data(4, 1.0f);
    if (rank == 1) {
      while (!aborted) std::this_thread::sleep_for(5ms);
      // Rank 0 closed its connections: rank 1's collectives fail promptly. (Over the
      // arena the first may still complete: rank 0 had published its part of it.)
      const auto start = std::chrono::steady_clock::now();
      try {
        allreduce(comm, data.data(), data.size(), DataType::kFloat32);
        barrier(comm);
        ADD_FAILURE() << "rank 1 did not notice that rank 0 left";
      } catch (const NetworkError& e) {
        EXPECT_TRUE(contains(e.what(), "rank 0 (")) << e.what();
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, test::kPrompt);  // not its 20 s timeout
      return;
    }
    // The ProcessGroup shares the communicator with the harness, which destroys it last.
    std::shared_ptr<Communicator> shared(&comm, [](Communicator*) {});
    ProcessGroup group(shared);
    std::string message;
    std::chrono::steady_clock::time_point failedAt;
    std::thread caller([&] {
      message = test::messageOf<Error>([&] { group.allreduce(BufferView(data.data(), data.size())); });
      failedAt = std::chrono::steady_clock::now();
    });
    std::this_thread::sleep_for(300ms);
    auto queued = group.barrierAsync();
    const auto abortedAt = std::chrono::steady_clock::now();
    group.abort();
    caller.join();
    aborted = true;
    // The blocked call fails, and abort() returns, at once: not at the 20 s timeout.
    EXPECT_LT(failedAt - abortedAt, test::kPrompt);
    EXPECT_LT(std::chrono::steady_clock::now() - abortedAt, test::kPrompt) << "abort() returned late";
    EXPECT_TRUE(contains(message, "allreduce(seq=1")) << message;
    EXPECT_TRUE(contains(message, "was aborted")) << message;
    EXPECT_TRUE(comm.isAborted());
    const std::string queuedError = test::messageOf<Error>([&] { queued->wait(); });
    EXPECT_TRUE(contains(queuedError, "barrier on rank 0 was aborted before it started")) << queuedError;
    const std::string refused = test::messageOf<Error>([&] { group.barrier(); });
    EXPECT_TRUE(contains(refused, "barrier on a ProcessGroup that has been aborted")) << refused;
    EXPECT_THROW(comm.transportTo(1), Error);
    EXPECT_THROW(barrier(comm), Error);
    const std::vector<FlightRecord> records = comm.flightRecord();
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0].state, CallState::kFailed);
    EXPECT_TRUE(contains(records[0].error, "was aborted")) << records[0].error;
  }, test::testOptions(transport, 20s));
}

TEST(Abort, InterruptsACollectiveBlockedOnTcp) { abortInterruptsABlockedCollective(TransportKind::kTcp); }

TEST(Abort, InterruptsACollectiveBlockedInTheArena) { abortInterruptsABlockedCollective(TransportKind::kShm); }

TEST(Abort, IdleGroupAbortsAtOnceAndTheProcessCanConnectAgain) {
  test::runCommunicators(2, [&](int, Communicator& comm) {
    std::shared_ptr<Communicator> shared(&comm, [](Communicator*) {});
    ProcessGroup group(shared);
    group.barrier();
    const auto start = std::chrono::steady_clock::now();
    group.abort();
    group.abort();  // idempotent
    EXPECT_LT(std::chrono::steady_clock::now() - start, test::kPrompt);  // nothing to wait for
  }, test::testOptions(TransportKind::kShm));
  test::runCommunicators(2, [&](int, Communicator& comm) {
    std::vector<int32_t> data(4, 1);
    allreduce(comm, data.data(), data.size(), DataType::kInt32);
    EXPECT_EQ(data[0], 2);
  }, test::testOptions(TransportKind::kShm));
}

}  // namespace
}  // namespace ringtree
