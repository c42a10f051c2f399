// FileStore files that a job which did not finish left behind: started over when every
// process registered in them has exited, refused at once (naming the file, the processes
// and what to do) when the job they hold may still run and has no room left; and the
// process identities this rests on.

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <ringtree/error.h>
#include <ringtree/store/file_store.h>

#include "common/process_identity.h"
#include "common/socket.h"
#include "harness/process_harness.h"
#include "harness/test_util.h"

namespace ringtree {
namespace {

using namespace std::chrono_literals;
using test::contains;
using test::elapsedSince;
using test::messageOf;
using test::TempDir;

constexpr Store::Timeout kTimeout = 10s;

// Forks `count` processes that each join the job in `path` (world size `worldSize`) and
// set a key; once all have joined, they crash together (exit without destroying their
// FileStore). Reaps them.
void leaveCrashedJob(const std::string& path, int count, int worldSize) {
  int joined[2];
  int crash[2];
  ASSERT_EQ(::pipe(joined), 0);
  ASSERT_EQ(::pipe(crash), 0);
  std::vector<pid_t> children;
  for (int rank = 0; rank < count; ++rank) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(crash[1]);
      auto* store = new FileStore(path, worldSize, kTimeout);  // never destroyed: the crash
      store->set("address/" + std::to_string(rank), toBytes("of a dead job"));
      char byte = 1;
      (void)!::write(joined[1], &byte, 1);
      (void)!::read(crash[0], &byte, 1);  // EOF once the parent closes its end
      ::_exit(1);
    }
    children.push_back(pid);
  }
  ::close(crash[0]);
  for (int rank = 0; rank < count; ++rank) {
    char byte = 0;
    ASSERT_EQ(::read(joined[0], &byte, 1), 1);
  }
  ::close(crash[1]);
  ::close(joined[0]);
  ::close(joined[1]);
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status;
  }
}

// A process that joined the job in `path` and keeps running until release() (its FileStore
// is then destroyed as usual).
class RunningMember {
 public:
  RunningMember(const std::string& path, int worldSize) {
    int toChild[2];
    int fromChild[2];
    if (::pipe(toChild) != 0 || ::pipe(fromChild) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      int status = 0;
      try {
        FileStore store(path, worldSize, kTimeout);
        char byte = 1;
        if (::write(fromChild[1], &byte, 1) != 1) status = 2;
        if (::read(toChild[0], &byte, 1) != 1) status = 3;  // until released
      } catch (...) {
        status = 1;
      }
      ::_exit(status);
    }
    ::close(toChild[0]);
    ::close(fromChild[1]);
    release_ = toChild[1];
    char byte = 0;
    if (::read(fromChild[0], &byte, 1) != 1) throw std::runtime_error("the member failed to join");
    ::close(fromChild[0]);
  }
  ~RunningMember() { release(); }
  pid_t pid() const { return pid_; }
  // Lets the member destroy its FileStore and exit; returns its exit status.
  int release() {
    if (release_ < 0) return status_;
    const char byte = 1;
    (void)!::write(release_, &byte, 1);
    ::close(release_);
    release_ = -1;
    ::waitpid(pid_, &status_, 0);
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int release_ = -1;
  int status_ = 0;
};

void appendRecord(const std::string& path, uint8_t type, const std::string& value) {
  std::ofstream file(path, std::ios::binary | std::ios::app);
  const uint32_t size = static_cast<uint32_t>(value.size());
  const char header[9] = {static_cast<char>(type), 0, 0, 0, 0,
                          static_cast<char>(size & 0xff), static_cast<char>((size >> 8) & 0xff),
                          static_cast<char>((size >> 16) & 0xff), static_cast<char>(size >> 24)};
  file.write(header, sizeof(header));
  file.write(value.data(), static_cast<std::streamsize>(value.size()));
}

class Leftover : public ::testing::TestWithParam<int> {};

TEST_P(Leftover, OfAJobWhoseProcessesAllExitedIsStartedOver) {
  const int worldSize = GetParam();
  TempDir dir;
  const std::string path = dir.file("rendezvous");
  leaveCrashedJob(path, worldSize, worldSize);
  ASSERT_TRUE(std::filesystem::exists(path));
  // The next job on the same path: its first member starts the file over, the others join.
  {
    std::vector<std::unique_ptr<FileStore>> job;
    for (int rank = 0; rank < worldSize; ++rank) {
      const auto start = std::chrono::steady_clock::now();
      job.push_back(std::make_unique<FileStore>(path, worldSize, kTimeout));
      EXPECT_LT(elapsedSince(start).count(), 1000);
      EXPECT_FALSE(job.back()->check({"address/0"})) << "the dead job's keys are still there";
    }
    job[0]->set("address/0", toBytes("of this job"));
    EXPECT_EQ(job[worldSize - 1]->get("address/0"), toBytes("of this job"));
    EXPECT_EQ(job[0]->numKeys(), 1);
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "the job finished: its file goes";
}

TEST_P(Leftover, OfAJobThatRunsAndHasNoRoomIsRefusedAtOnce) {
  const int worldSize = GetParam();
  TempDir dir;
  const std::string path = dir.file("rendezvous");
  std::vector<std::unique_ptr<RunningMember>> job;
  for (int rank = 0; rank < worldSize; ++rank) job.push_back(std::make_unique<RunningMember>(path, worldSize));
  const auto start = std::chrono::steady_clock::now();
  const std::string message = messageOf<StoreError>([&] { FileStore late(path, worldSize, kTimeout); });
  EXPECT_LT(elapsedSince(start).count(), 1000);
  EXPECT_TRUE(contains(message, "FileStore '" + path + "'")) << message;
  EXPECT_TRUE(contains(message, "holds " + std::to_string(worldSize) + " registrations of a job that has not finished"))
      << message;
  EXPECT_TRUE(contains(message, "pid " + std::to_string(job[0]->pid()) + ", registered ")) << message;
  EXPECT_TRUE(contains(message, "still running")) << message;
  EXPECT_TRUE(contains(message, "world size " + std::to_string(worldSize))) << message;
  EXPECT_TRUE(contains(message, "Use another path, or delete the file once no process of that job runs")) << message;
  for (auto& member : job) EXPECT_EQ(member->release(), 0);
  EXPECT_FALSE(std::filesystem::exists(path)) << "the running job finished normally: its file goes";
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Leftover, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(LeftoverMixed, ARunningJobWithRoomIsJoinedAsBefore) {
  TempDir dir;
  const std::string path = dir.file("rendezvous");
  RunningMember first(path, 3);
  {
    FileStore second(path, 3, kTimeout);
    FileStore third(path, 3, kTimeout);
    second.set("key", toBytes("shared"));
    EXPECT_EQ(third.get("key"), toBytes("shared"));
  }
  EXPECT_EQ(first.release(), 0);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(LeftoverMixed, AnExitedAndARunningMemberAreNotStartedOver) {
  // One member crashed, one still runs: the file may belong to a job in progress, so it
  // is kept, and a full job refuses the newcomer naming both.
  TempDir dir;
  const std::string path = dir.file("rendezvous");
  RunningMember running(path, 2);
  leaveCrashedJob(path, 1, 2);
  const std::string message = messageOf<StoreError>([&] { FileStore late(path, 2, kTimeout); });
  EXPECT_TRUE(contains(message, "exited")) << message;
  EXPECT_TRUE(contains(message, "still running")) << message;
  EXPECT_EQ(running.release(), 0);
}

TEST(LeftoverMixed, RegistrationsFromElsewhereCannotBeJudgedAndAreKept) {
  // Members on another host (or pid namespace) cannot be checked from here.
  TempDir dir;
  const std::string path = dir.file("rendezvous");
  FileStore(path).set("key", toBytes("value"));  // writes the header; not a job member
  ProcessIdentity elsewhere = localProcessIdentity();
  elsewhere.bootId = "another-kernel";
  elsewhere.hostname = "node-7";
  appendRecord(path, 4, encodeProcessIdentity(elsewhere));
  appendRecord(path, 4, encodeProcessIdentity(elsewhere) + " ");  // a second member
  const std::string message = messageOf<StoreError>([&] { FileStore late(path, 2, kTimeout); });
  EXPECT_TRUE(contains(message, "host 'node-7', pid ")) << message;
  EXPECT_TRUE(contains(message, "on another host or pid namespace")) << message;
  // With room, it joins them (a member from elsewhere may be this job's).
  FileStore joined(path, 3, kTimeout);
  EXPECT_EQ(joined.get("key"), toBytes("value"));
}

TEST(LeftoverMixed, RegistrationsOfAnOlderFormatAreKept) {
  TempDir dir;
  const std::string path = dir.file("rendezvous");
  FileStore(path).set("key", toBytes("value"));
  appendRecord(path, 4, "");  // registrations written before they named their process
  appendRecord(path, 4, "");
  const std::string message = messageOf<StoreError>([&] { FileStore late(path, 2, kTimeout); });
  EXPECT_TRUE(contains(message, "a process of an older ringtree")) << message;
}

// --- Process identities

TEST(ProcessIdentityTest, RoundTripsThroughText) {
  ProcessIdentity identity = localProcessIdentity();
  identity.hostname = "a host name with spaces";
  ProcessIdentity decoded;
  ASSERT_TRUE(decodeProcessIdentity(encodeProcessIdentity(identity), &decoded));
  EXPECT_EQ(decoded.hostname, identity.hostname);
  EXPECT_EQ(decoded.bootId, identity.bootId);
  EXPECT_EQ(decoded.pidNamespace, identity.pidNamespace);
  EXPECT_EQ(decoded.pid, identity.pid);
  EXPECT_EQ(decoded.startTicks, identity.startTicks);
  EXPECT_EQ(decoded.takenAtMs, identity.takenAtMs);
  EXPECT_FALSE(decodeProcessIdentity("", &decoded));
  EXPECT_FALSE(decodeProcessIdentity("ringtree-process 2 b 1 2 3 4 h", &decoded));
  EXPECT_FALSE(decodeProcessIdentity("something else entirely", &decoded));
}

TEST(ProcessIdentityTest, TellsRunningFromExitedFromUnknown) {
  EXPECT_EQ(livenessOf(localProcessIdentity()), Liveness::kRunning);

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::pause();  // killed below
    ::_exit(0);
  }
  ProcessIdentity child = localProcessIdentity();
  child.pid = pid;
  child.startTicks = 0;  // not known: any process with the pid counts
  ProcessIdentity self = localProcessIdentity();
  EXPECT_EQ(livenessOf(child), Liveness::kRunning);
  ::kill(pid, SIGKILL);
  // A zombie runs no code: gone before it is reaped, and after.
  for (int i = 0; i < 200 && livenessOf(child) != Liveness::kGone; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(livenessOf(child), Liveness::kGone);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_EQ(livenessOf(child), Liveness::kGone);

  // A reused pid: this process, but with another start time.
  self.startTicks += 1;
  EXPECT_EQ(livenessOf(self), Liveness::kGone);

  ProcessIdentity elsewhere = localProcessIdentity();
  elsewhere.bootId = "another-kernel";
  EXPECT_EQ(livenessOf(elsewhere), Liveness::kUnknown);
  elsewhere = localProcessIdentity();
  elsewhere.pidNamespace += 1;
  EXPECT_EQ(livenessOf(elsewhere), Liveness::kUnknown);
}

TEST(ProcessIdentityTest, NamesTheProcessesListeningOnAPort) {
  const net::Socket listener = net::listenTcp("", 0);
  const uint16_t port = net::localPort(listener.fd());
  EXPECT_EQ(processesListeningOn(port), std::vector<int64_t>{::getpid()});
  const std::string text = describeLocalProcess(::getpid());
  EXPECT_EQ(text.rfind("pid " + std::to_string(::getpid()) + " ('", 0), 0u) << text;
  EXPECT_NE(text.find("', running for "), std::string::npos) << text;
  // A port nothing listens on any more has no listener to name.
  const uint16_t closed = [] {
    const net::Socket socket = net::listenTcp("127.0.0.1", 0);
    return net::localPort(socket.fd());
  }();
  EXPECT_TRUE(processesListeningOn(closed).empty());
}

TEST(ProcessIdentityTest, TellsOneProcessFromAnother) {
  const ProcessIdentity self = localProcessIdentity();
  EXPECT_TRUE(sameProcess(self, localProcessIdentity()));
  ProcessIdentity other = self;
  other.startTicks += 1;
  EXPECT_FALSE(sameProcess(self, other));
  other = self;
  other.hostname = "node-7";
  EXPECT_FALSE(sameProcess(self, other));
}

}  // namespace
}  // namespace ringtree
