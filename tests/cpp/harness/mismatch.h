#pragma once

// The check every collective-mismatch test makes: both ranks fail, both name both calls.

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <ringtree/collectives.h>
#include <ringtree/communicator.h>
#include <ringtree/error.h>

#include "test_util.h"
#include "thread_harness.h"

namespace ringtree::test {

// Runs call(rank, communicator) on two ranks over `transport`: both must fail in it with
// CollectiveMismatchError, each message naming both ranks and containing every part of
// `expected`, and the communicator must be unusable afterwards (a barrier throws). Records
// gtest failures; a rank that hangs is bounded by a 10 s timeout.
inline void expectMismatchOnBothRanks(TransportKind transport,
                                      const std::function<void(int rank, Communicator&)>& call,
                                      const std::vector<std::string>& expected) {
  std::vector<std::string> messages(2);
  runCommunicators(2, [&](int rank, Communicator& comm) {
    try {
      call(rank, comm);
      ADD_FAILURE() << "rank " << rank << " did not detect the mismatch";
    } catch (const CollectiveMismatchError& e) {
      messages[static_cast<size_t>(rank)] = e.what();
    }
    EXPECT_THROW(barrier(comm), Error);  // unusable afterwards
  }, testOptions(transport, std::chrono::seconds(10)));
  for (const auto& m : messages) {
    EXPECT_TRUE(contains(m, "rank 0") && contains(m, "rank 1")) << m;
    for (const auto& part : expected) EXPECT_TRUE(contains(m, part)) << "expected '" << part << "' in: " << m;
  }
}

}  // namespace ringtree::test
