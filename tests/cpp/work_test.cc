// Work (include/ringtree/work.h) on its own: wait() with and without a timeout on a Work
// another thread finishes, timeouts past the steady clock's range, errors rethrown.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>

#include <ringtree/error.h>
#include <ringtree/work.h>

namespace ringtree {
namespace {

using std::chrono::milliseconds;

// Finishes `work` (with `error`) from a thread of its own after `delay`.
std::thread finishLater(const std::shared_ptr<Work>& work, milliseconds delay, std::exception_ptr error = nullptr) {
  return std::thread([work, delay, error] {
    std::this_thread::sleep_for(delay);
    work->finish(error);
  });
}

TEST(Work, WaitReturnsOnceAnotherThreadFinishesIt) {
  for (const milliseconds timeout : {milliseconds(0), milliseconds(10000)}) {
    auto work = std::make_shared<Work>("allreduce");
    std::thread finisher = finishLater(work, milliseconds(20));
    EXPECT_TRUE(work->wait(timeout));
    EXPECT_TRUE(work->isCompleted() && work->isSuccess());
    finisher.join();
  }
}

TEST(Work, ATimeoutPastTheClocksRangeIsNoLimit) {
  // now + timeout would overflow the steady clock: no deadline rather than one already past.
  for (const milliseconds timeout : {milliseconds::max(), milliseconds(milliseconds::max().count() / 2)}) {
    auto work = std::make_shared<Work>("broadcast");
    std::thread finisher = finishLater(work, milliseconds(20));
    EXPECT_TRUE(work->wait(timeout));
    finisher.join();
  }
}

TEST(Work, AShortTimeoutThrowsAndTheWorkStillFinishes) {
  auto work = std::make_shared<Work>("barrier");
  std::thread finisher = finishLater(work, milliseconds(200));
  try {
    work->wait(milliseconds(10));
    ADD_FAILURE() << "wait(10 ms) returned before the Work finished";
  } catch (const TimeoutError& error) {
    EXPECT_NE(std::string(error.what()).find("barrier is still running"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(work->wait());
  finisher.join();
}

TEST(Work, TheOperationsErrorIsRethrownByEveryWait) {
  auto work = std::make_shared<Work>("recv");
  std::thread finisher = finishLater(work, milliseconds(5), std::make_exception_ptr(NetworkError("peer gone")));
  EXPECT_THROW(work->wait(milliseconds::max()), NetworkError);
  EXPECT_THROW(work->wait(), NetworkError);
  EXPECT_FALSE(work->isSuccess());
  finisher.join();
}

}  // namespace
}  // namespace ringtree
