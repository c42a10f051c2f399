// The Store contract (see ringtree/store/store.h), one typed suite run over every Store:
// HashStore, FileStore, TcpStore and PrefixStore. Then what only FileStore and PrefixStore
// promise: FileStore's worldSize cleanup, sharing between processes and corrupt files;
// PrefixStore's key isolation and timeout forwarding.

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <ringtree/error.h>
#include <ringtree/store/file_store.h>
#include <ringtree/store/hash_store.h>
#include <ringtree/store/prefix_store.h>
#include <ringtree/store/tcp_store.h>

#include "harness/process_harness.h"
#include "harness/test_util.h"

namespace ringtree {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Every store's default timeout: long enough for any blocking call that should succeed,
// short enough that a lost wake-up fails the test instead of hanging it.
constexpr Store::Timeout kStoreTimeout = 10s;
// The timeout that timeout tests wait out (a number to find in the error message), and
// how late after it the error may come (far below kStoreTimeout, which a store that
// ignored the short timeout would wait out).
constexpr Store::Timeout kShortTimeout = 150ms;
constexpr auto kLateness = test::kLateBy;
// How long a helper thread waits before it sets what the test thread is blocked on.
constexpr auto kSetterDelay = 100ms;

Bytes bytes(const std::string& s) { return toBytes(s); }

using test::contains;
using test::elapsedSince;
using test::messageOf;
using test::TempDir;

// Two clients of the same data: store, the one under test, and other, a second client
// object (the same object for stores that live in one object). other is destroyed first.
struct Clients {
  std::shared_ptr<Store> store;
  std::shared_ptr<Store> other;
};

struct HashStores {
  static constexpr const char* kName = "HashStore";
  Clients make() {
    auto store = std::make_shared<HashStore>(kStoreTimeout);
    return {store, store};
  }
};

// Two objects of a worldSize = 2 job on one file.
struct FileStores {
  static constexpr const char* kName = "FileStore";
  TempDir dir;
  Clients make() {
    const std::string path = dir.file("store");
    return {std::make_shared<FileStore>(path, 2, kStoreTimeout),
            std::make_shared<FileStore>(path, 2, kStoreTimeout)};
  }
};

// The server's own client (server on a kernel-picked port) and a second client.
struct TcpStores {
  static constexpr const char* kName = "TcpStore";
  Clients make() {
    TcpStoreOptions serverOptions;
    serverOptions.isServer = true;
    serverOptions.numWorkers = -1;
    auto server = std::make_shared<TcpStore>("127.0.0.1", serverOptions, kStoreTimeout);
    TcpStoreOptions clientOptions;
    clientOptions.port = server->port();
    return {server, std::make_shared<TcpStore>("127.0.0.1", clientOptions, kStoreTimeout)};
  }
};

// Two PrefixStores with the same prefix over one HashStore.
struct PrefixStores {
  static constexpr const char* kName = "PrefixStore";
  Clients make() {
    auto underlying = std::make_shared<HashStore>(kStoreTimeout);
    return {std::make_shared<PrefixStore>("job", underlying),
            std::make_shared<PrefixStore>("job", underlying)};
  }
};

template <typename Stores>
class StoreContractTest : public ::testing::Test {
 protected:
  void SetUp() override { clients_ = stores_.make(); }

  Store& store() { return *clients_.store; }
  Store& other() { return *clients_.other; }

 private:
  // Declared first so that it outlives the clients (FileStores' directory).
  Stores stores_;
  Clients clients_;
};

struct StoreName {
  template <typename Stores>
  static std::string GetName(int) {
    return Stores::kName;
  }
};

using AllStores = ::testing::Types<HashStores, FileStores, TcpStores, PrefixStores>;
TYPED_TEST_SUITE(StoreContractTest, AllStores, StoreName);

TYPED_TEST(StoreContractTest, GetReturnsTheLatestSetValue) {
  Store& s = this->store();
  s.set("key", bytes("one"));
  EXPECT_EQ(s.get("key"), bytes("one"));
  s.set("key", bytes("two"));
  EXPECT_EQ(s.get("key"), bytes("two"));
}

TYPED_TEST(StoreContractTest, CloneSharesKeysAndIsUsableConcurrently) {
  Store& s = this->store();
  s.setTimeout(kShortTimeout);
  std::shared_ptr<Store> copy = s.clone();
  EXPECT_EQ(copy->timeout(), kShortTimeout);
  copy->setTimeout(kStoreTimeout);
  EXPECT_EQ(s.timeout(), kShortTimeout);  // independent after cloning
  s.set("from_original", bytes("a"));
  EXPECT_EQ(copy->get("from_original"), bytes("a"));
  // The clone waits while the original sets, from another thread.
  auto waiter = std::async(std::launch::async, [&] { return copy->get("late"); });
  std::this_thread::sleep_for(kSetterDelay);
  s.set("late", bytes("b"));
  EXPECT_EQ(waiter.get(), bytes("b"));
  EXPECT_EQ(copy->add("counter", 2), 2);
  EXPECT_EQ(s.add("counter", 3), 5);
}

TYPED_TEST(StoreContractTest, ValuesAreBinaryWithZeroBytes) {
  Store& s = this->store();
  Bytes all(256);
  std::iota(all.begin(), all.end(), 0);
  const Bytes zeros = {0, 0, 'x', 0};
  s.set("binary", all);
  s.set("dir/key with spaces", zeros);
  EXPECT_EQ(s.get("binary"), all);
  EXPECT_EQ(s.get("dir/key with spaces"), zeros);
}

TYPED_TEST(StoreContractTest, EmptyValueIsStoredAsAValue) {
  Store& s = this->store();
  s.set("empty", Bytes{});
  EXPECT_TRUE(s.check({"empty"}));
  EXPECT_EQ(s.get("empty"), Bytes{});
}

TYPED_TEST(StoreContractTest, GetBlocksUntilAnotherClientSets) {
  Store& s = this->store();
  auto setter = std::async(std::launch::async, [this] {
    std::this_thread::sleep_for(kSetterDelay);
    this->other().set("late", bytes("here"));
  });
  const auto start = Clock::now();
  EXPECT_EQ(s.get("late"), bytes("here"));
  EXPECT_GE(elapsedSince(start), kSetterDelay - 20ms);
  setter.get();
}

TYPED_TEST(StoreContractTest, GetTimeoutThrowsStoreErrorNamingKeyAndTimeout) {
  Store& s = this->store();
  s.setTimeout(kShortTimeout);
  const auto start = Clock::now();
  const std::string message = messageOf<StoreError>([&] { s.get("missing_key"); });
  const auto elapsed = elapsedSince(start);
  EXPECT_GE(elapsed, kShortTimeout - 10ms);
  EXPECT_LE(elapsed, kShortTimeout + kLateness);
  EXPECT_TRUE(contains(message, "missing_key")) << message;
  EXPECT_TRUE(contains(message, std::to_string(kShortTimeout.count()))) << message;
}

TYPED_TEST(StoreContractTest, WaitTimeoutThrowsStoreErrorNamingKeyAndTimeout) {
  Store& s = this->store();
  s.set("present", bytes("1"));
  auto start = Clock::now();
  std::string message =
      messageOf<StoreError>([&] { s.wait({"present", "absent_key"}, kShortTimeout); });
  auto elapsed = elapsedSince(start);
  EXPECT_GE(elapsed, kShortTimeout - 10ms);
  EXPECT_LE(elapsed, kShortTimeout + kLateness);
  EXPECT_TRUE(contains(message, "absent_key")) << message;
  EXPECT_TRUE(contains(message, std::to_string(kShortTimeout.count()))) << message;

  // Without an explicit timeout, wait() uses the store's.
  s.setTimeout(kShortTimeout);
  start = Clock::now();
  message = messageOf<StoreError>([&] { s.wait({"absent_key"}); });
  elapsed = elapsedSince(start);
  EXPECT_GE(elapsed, kShortTimeout - 10ms);
  EXPECT_LE(elapsed, kShortTimeout + kLateness);
  EXPECT_TRUE(contains(message, "absent_key")) << message;
}

TYPED_TEST(StoreContractTest, ZeroTimeoutChecksOnce) {
  Store& s = this->store();
  s.set("present", bytes("1"));
  s.setTimeout(0ms);
  EXPECT_EQ(s.get("present"), bytes("1"));
  s.wait({"present"}, 0ms);

  // Checking once needs no waiting.
  auto start = Clock::now();
  EXPECT_TRUE(contains(messageOf<StoreError>([&] { s.get("absent_key"); }), "absent_key"));
  EXPECT_LE(elapsedSince(start), test::kPrompt);
  start = Clock::now();
  EXPECT_TRUE(contains(messageOf<StoreError>([&] { s.wait({"present", "absent_key"}, 0ms); }),
                       "absent_key"));
  EXPECT_LE(elapsedSince(start), test::kPrompt);
}

TYPED_TEST(StoreContractTest, NegativeTimeoutIsInvalidArgument) {
  Store& s = this->store();
  s.set("present", bytes("1"));
  EXPECT_THROW(s.setTimeout(-1ms), InvalidArgument);
  EXPECT_EQ(s.timeout(), kStoreTimeout);
  EXPECT_THROW(s.wait({"present"}, -1ms), InvalidArgument);
}

TYPED_TEST(StoreContractTest, AddOnMissingKeyStartsFromZero) {
  Store& s = this->store();
  EXPECT_EQ(s.add("counter", 5), 5);
  EXPECT_EQ(s.add("counter", 0), 5);
  EXPECT_EQ(s.get("counter"), bytes("5"));
}

TYPED_TEST(StoreContractTest, AddTakesNegativeDeltasAndStoresDecimal) {
  Store& s = this->store();
  EXPECT_EQ(s.add("counter", -3), -3);
  EXPECT_EQ(s.get("counter"), bytes("-3"));
  EXPECT_EQ(s.add("counter", 10), 7);
  EXPECT_EQ(s.get("counter"), bytes("7"));
  EXPECT_EQ(s.add("counter", -7), 0);
  EXPECT_EQ(s.get("counter"), bytes("0"));
}

TYPED_TEST(StoreContractTest, AddContinuesFromADecimalSetValue) {
  Store& s = this->store();
  s.set("counter", bytes("41"));
  EXPECT_EQ(s.add("counter", 1), 42);
  EXPECT_EQ(s.get("counter"), bytes("42"));
}

TYPED_TEST(StoreContractTest, AddOnNonIntegerValueIsInvalidArgument) {
  Store& s = this->store();
  for (const std::string value : {"abc", "12abc", "1.5", ""}) {
    s.set("text", bytes(value));
    EXPECT_THROW(s.add("text", 1), InvalidArgument) << "value '" << value << "'";
    EXPECT_EQ(s.get("text"), bytes(value));
  }
}

TYPED_TEST(StoreContractTest, AddThatOverflowsIsInvalidArgumentAndStoresNothing) {
  Store& s = this->store();
  s.set("big", bytes("9223372036854775807"));
  const std::string message = messageOf<InvalidArgument>([&] { s.add("big", 1); });
  EXPECT_TRUE(contains(message, "big' holds 9223372036854775807; adding 1 overflows int64")) << message;
  EXPECT_EQ(s.get("big"), bytes("9223372036854775807"));
  s.set("text", bytes("abc"));
  const std::string notCounter = messageOf<InvalidArgument>([&] { s.add("text", 1); });
  EXPECT_TRUE(contains(notCounter, "text' does not hold a decimal int64 counter")) << notCounter;
}

TYPED_TEST(StoreContractTest, CompareSetOnMissingKeyWithEmptyExpectedSets) {
  Store& s = this->store();
  EXPECT_EQ(s.compareSet("key", {}, bytes("desired")), bytes("desired"));
  EXPECT_EQ(s.get("key"), bytes("desired"));
}

TYPED_TEST(StoreContractTest, CompareSetOnMissingKeyWithExpectedReturnsItAndStoresNothing) {
  Store& s = this->store();
  EXPECT_EQ(s.compareSet("key", bytes("expected"), bytes("desired")), bytes("expected"));
  EXPECT_FALSE(s.check({"key"}));
}

TYPED_TEST(StoreContractTest, CompareSetSwapsOnlyWhenTheValueMatches) {
  Store& s = this->store();
  s.set("key", bytes("old"));
  EXPECT_EQ(s.compareSet("key", bytes("other"), bytes("new")), bytes("old"));
  EXPECT_EQ(s.get("key"), bytes("old"));
  EXPECT_EQ(s.compareSet("key", bytes("old"), bytes("new")), bytes("new"));
  EXPECT_EQ(s.get("key"), bytes("new"));
}

TYPED_TEST(StoreContractTest, CheckTellsWhetherEveryKeyExists) {
  Store& s = this->store();
  EXPECT_FALSE(s.check({"a"}));
  s.set("a", bytes("1"));
  EXPECT_TRUE(s.check({"a"}));
  EXPECT_FALSE(s.check({"a", "b"}));
  s.set("b", bytes("2"));
  EXPECT_TRUE(s.check({"a", "b"}));
}

TYPED_TEST(StoreContractTest, WaitReturnsOnceEveryKeyIsSet) {
  Store& s = this->store();
  auto setter = std::async(std::launch::async, [this] {
    std::this_thread::sleep_for(kSetterDelay);
    this->other().set("a", bytes("1"));
    std::this_thread::sleep_for(kSetterDelay / 4);
    this->other().set("b", bytes("2"));
    this->other().add("c", 3);
  });
  const auto start = Clock::now();
  s.wait({"a", "b", "c"});
  EXPECT_GE(elapsedSince(start), kSetterDelay - 20ms);
  EXPECT_TRUE(s.check({"a", "b", "c"}));
  setter.get();
  s.wait({"a", "b", "c"}, 0ms);
}

TYPED_TEST(StoreContractTest, BarrierReturnsOnceWorldSizeCallersArrived) {
  Store& s = this->store();
  auto late = std::async(std::launch::async, [this] {
    std::this_thread::sleep_for(kSetterDelay);
    this->other().barrier("b", 2);
  });
  const auto start = Clock::now();
  s.barrier("b", 2);
  EXPECT_GE(elapsedSince(start), kSetterDelay - 20ms);
  late.get();
  EXPECT_EQ(s.add("b/num_members", 0), 2);
  s.barrier("alone", 1);  // nobody else to wait for
  EXPECT_THROW(s.barrier("short", 2, 50ms), StoreError);
  EXPECT_THROW(s.barrier("none", 0), InvalidArgument);
}

TYPED_TEST(StoreContractTest, DeleteKeyReportsWhetherTheKeyExisted) {
  Store& s = this->store();
  s.set("key", bytes("1"));
  EXPECT_TRUE(s.deleteKey("key"));
  EXPECT_FALSE(s.check({"key"}));
  EXPECT_FALSE(s.deleteKey("key"));
  EXPECT_FALSE(s.deleteKey("never_set"));
  s.setTimeout(0ms);
  EXPECT_THROW(s.get("key"), StoreError);
}

TYPED_TEST(StoreContractTest, NumKeysCountsUserKeys) {
  Store& s = this->store();
  EXPECT_EQ(s.numKeys(), 0);
  s.set("a", bytes("1"));
  s.set("b", bytes("2"));
  EXPECT_EQ(s.numKeys(), 2);
  s.set("a", bytes("3"));
  EXPECT_EQ(s.numKeys(), 2);
  s.add("c", 1);
  s.append("d", bytes("x"));
  EXPECT_EQ(s.numKeys(), 4);
  s.deleteKey("a");
  EXPECT_EQ(s.numKeys(), 3);
}

TYPED_TEST(StoreContractTest, AppendCreatesThenAppends) {
  Store& s = this->store();
  s.append("log", bytes("ab"));
  EXPECT_EQ(s.get("log"), bytes("ab"));
  s.append("log", Bytes{0, 'c'});
  EXPECT_EQ(s.get("log"), (Bytes{'a', 'b', 0, 'c'}));
  s.append("empty", Bytes{});
  EXPECT_TRUE(s.check({"empty"}));
  EXPECT_EQ(s.get("empty"), Bytes{});
}

TYPED_TEST(StoreContractTest, MultiSetThenMultiGetInKeyOrder) {
  Store& s = this->store();
  s.multiSet({"a", "b", "c"}, {bytes("1"), bytes("2"), Bytes{0}});
  EXPECT_EQ(s.multiGet({"c", "a", "b"}), (std::vector<Bytes>{Bytes{0}, bytes("1"), bytes("2")}));
  EXPECT_EQ(s.multiGet({}), std::vector<Bytes>{});
}

TYPED_TEST(StoreContractTest, MultiSetWithMismatchedSizesIsInvalidArgument) {
  Store& s = this->store();
  EXPECT_THROW(s.multiSet({"a", "b"}, {bytes("1")}), InvalidArgument);
  EXPECT_FALSE(s.check({"a"}));
}

TYPED_TEST(StoreContractTest, MultiGetTimesOutOnAMissingKey) {
  Store& s = this->store();
  s.set("a", bytes("1"));
  s.setTimeout(kShortTimeout);
  const auto start = Clock::now();
  const std::string message = messageOf<StoreError>([&] { s.multiGet({"a", "missing_key"}); });
  EXPECT_GE(elapsedSince(start), kShortTimeout - 10ms);
  EXPECT_LE(elapsedSince(start), kShortTimeout + kLateness);
  EXPECT_TRUE(contains(message, "missing_key")) << message;
}

TYPED_TEST(StoreContractTest, ConcurrentAddsAreAtomic) {
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 500;
  std::vector<std::vector<int64_t>> results(kThreads);
  {
    std::vector<std::future<void>> adders;
    for (int t = 0; t < kThreads; ++t) {
      // Half of the threads go through the second client.
      Store& s = t % 2 == 0 ? this->store() : this->other();
      adders.push_back(std::async(std::launch::async, [&s, &results, t] {
        for (int i = 0; i < kAddsPerThread; ++i) {
          results[t].push_back(s.add("counter", 1));
        }
      }));
    }
    for (auto& adder : adders) {
      adder.get();
    }
  }
  EXPECT_EQ(this->store().get("counter"), bytes(std::to_string(kThreads * kAddsPerThread)));
  // Every add saw a distinct intermediate value: 1..4000, each once.
  std::vector<int64_t> all;
  for (const auto& r : results) {
    all.insert(all.end(), r.begin(), r.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(kThreads * kAddsPerThread);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(all, expected);
}

TYPED_TEST(StoreContractTest, SecondClientSeesTheFirstOnesWrites) {
  Store& s = this->store();
  Store& o = this->other();
  s.set("from_first", bytes("1"));
  EXPECT_EQ(o.get("from_first"), bytes("1"));
  o.add("counter", 2);
  EXPECT_EQ(s.add("counter", 3), 5);
  o.append("log", bytes("x"));
  s.append("log", bytes("y"));
  EXPECT_EQ(o.get("log"), bytes("xy"));
  EXPECT_TRUE(o.deleteKey("from_first"));
  EXPECT_FALSE(s.check({"from_first"}));
  EXPECT_EQ(s.numKeys(), 2);
  EXPECT_EQ(o.numKeys(), 2);
}

// --- FileStore ---

// Constructing a FileStore on path must fail with a StoreError that names the path.
void expectCorrupt(const std::string& path) {
  const std::string message = messageOf<StoreError>([&] { FileStore store(path); });
  EXPECT_TRUE(contains(message, path)) << message;
}

void appendRaw(const std::string& path, const Bytes& data) {
  std::ofstream file(path, std::ios::binary | std::ios::app);
  file.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

TEST(FileStoreTest, LastOfWorldSizeObjectsRemovesTheFile) {
  TempDir dir;
  const std::string path = dir.file("store");
  auto first = std::make_unique<FileStore>(path, 2);
  auto second = std::make_unique<FileStore>(path, 2);
  first->set("key", bytes("1"));
  first.reset();
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(second->get("key"), bytes("1"));
  second.reset();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(FileStoreTest, FileStaysUntilWorldSizeObjectsHaveFinished) {
  TempDir dir;
  const std::string path = dir.file("store");
  FileStore(path, 2).set("key", bytes("early"));
  EXPECT_TRUE(std::filesystem::exists(path));
  {
    FileStore late(path, 2);
    EXPECT_EQ(late.get("key"), bytes("early"));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(FileStoreTest, WithoutWorldSizeTheFileStays) {
  TempDir dir;
  const std::string path = dir.file("store");
  FileStore(path).set("key", bytes("kept"));
  ASSERT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(FileStore(path).get("key"), bytes("kept"));
}

TEST(FileStoreTest, SharedBetweenProcesses) {
  constexpr int kAdds = 200;
  TempDir dir;
  const std::string path = dir.file("store");
  {
    FileStore parent(path, 2, kStoreTimeout);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int status = 0;
      try {
        FileStore child(path, 2, kStoreTimeout);
        child.set("child/hello", bytes("from child"));
        for (int i = 0; i < kAdds; ++i) {
          child.add("counter", 1);
        }
        child.get("parent/ready");
        child.set("child/done", bytes("1"));
      } catch (...) {
        status = 1;
      }
      ::_exit(status);
    }
    for (int i = 0; i < kAdds; ++i) {
      parent.add("counter", 1);
    }
    EXPECT_EQ(parent.get("child/hello"), bytes("from child"));
    parent.set("parent/ready", bytes("1"));
    parent.wait({"child/done"});
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    EXPECT_EQ(parent.get("counter"), bytes(std::to_string(2 * kAdds)));
    EXPECT_EQ(parent.numKeys(), 4);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(FileStoreTest, ForeignFileIsStoreError) {
  TempDir dir;
  const std::string path = dir.file("store");
  appendRaw(path, bytes("this is not a ringtree store"));
  expectCorrupt(path);
}

TEST(FileStoreTest, FileShorterThanItsHeaderIsStoreError) {
  TempDir dir;
  const std::string path = dir.file("store");
  appendRaw(path, bytes("RT"));
  expectCorrupt(path);
}

TEST(FileStoreTest, RecordClaimingMoreThanTheFileHoldsIsStoreError) {
  TempDir dir;
  const std::string path = dir.file("store");
  FileStore(path).set("key", bytes("value"));
  // A set record whose key length is 4 GiB - 1: must be rejected, not allocated.
  appendRaw(path, Bytes{1, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 'k'});
  expectCorrupt(path);
}

TEST(FileStoreTest, UnknownRecordTypeIsStoreError) {
  TempDir dir;
  const std::string path = dir.file("store");
  FileStore(path).set("key", bytes("value"));
  appendRaw(path, Bytes{0x7f, 0, 0, 0, 0, 0, 0, 0, 0});
  expectCorrupt(path);
}

TEST(FileStoreTest, TruncatedFileIsStoreError) {
  TempDir dir;
  const std::string path = dir.file("store");
  FileStore open(path);
  open.set("key", bytes("value"));
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  expectCorrupt(path);
  // An object that had already read the lost bytes notices that the file shrank.
  const std::string message = messageOf<StoreError>([&] { open.get("key"); });
  EXPECT_TRUE(contains(message, path)) << message;
  EXPECT_THROW(open.set("other", bytes("1")), StoreError);
}

TEST(FileStoreTest, MissingDirectoryIsStoreErrorNamingThePath) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/store");
  const std::string message = messageOf<StoreError>([&] { FileStore store(path); });
  EXPECT_TRUE(contains(message, path)) << message;
}

TEST(FileStoreTest, EmptyPathIsInvalidArgument) {
  EXPECT_THROW(FileStore(""), InvalidArgument);
}

// --- PrefixStore ---

TEST(PrefixStoreTest, PrefixesDoNotSeeEachOthersKeys) {
  auto underlying = std::make_shared<HashStore>(kStoreTimeout);
  PrefixStore one("one", underlying);
  PrefixStore two("two", underlying);
  one.set("key", bytes("1"));
  EXPECT_FALSE(two.check({"key"}));
  two.set("key", bytes("2"));
  EXPECT_EQ(one.get("key"), bytes("1"));
  EXPECT_EQ(two.get("key"), bytes("2"));
  EXPECT_EQ(underlying->get("one/key"), bytes("1"));
  EXPECT_EQ(underlying->get("two/key"), bytes("2"));
  EXPECT_EQ(one.numKeys(), 2);  // the underlying store's count
  EXPECT_TRUE(one.deleteKey("key"));
  EXPECT_FALSE(one.check({"key"}));
  EXPECT_TRUE(two.check({"key"}));
}

TEST(PrefixStoreTest, NullUnderlyingStoreIsInvalidArgument) {
  EXPECT_THROW(PrefixStore("p", nullptr), InvalidArgument);
}

TEST(PrefixStoreTest, TimeoutIsTheUnderlyingStores) {
  auto underlying = std::make_shared<HashStore>(777ms);
  PrefixStore prefixed("p", underlying);
  EXPECT_EQ(prefixed.timeout(), 777ms);
  prefixed.setTimeout(123ms);
  EXPECT_EQ(prefixed.timeout(), 123ms);
  EXPECT_EQ(underlying->timeout(), 123ms);
  EXPECT_THROW(prefixed.setTimeout(-5ms), InvalidArgument);
  EXPECT_EQ(prefixed.timeout(), 123ms);
  EXPECT_EQ(underlying->timeout(), 123ms);
}

}  // namespace
}  // namespace ringtree
