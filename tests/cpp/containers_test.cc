// InlineArray and InlineVector (common/inline_array.h, common/inline_vector.h): elements
// inside the object up to their inline size and on the heap past it, each element
// constructed and destroyed exactly once, contiguous storage either way.

#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <numeric>

#include "common/inline_array.h"
#include "common/inline_vector.h"

namespace ringtree {
namespace {

// Counts its live instances (moved-from ones included, as the containers hold them).
struct Counted {
  explicit Counted(int v, int* live) : value(std::make_unique<int>(v)), live(live) { ++*live; }
  Counted(Counted&& other) noexcept : value(std::move(other.value)), live(other.live) { ++*live; }
  Counted& operator=(Counted&&) = delete;
  ~Counted() { --*live; }
  std::unique_ptr<int> value;
  int* live;
};

TEST(InlineArray, ValueInitialisedInsideOrOnTheHeap) {
  InlineArray<size_t, 4> small(3);
  InlineArray<size_t, 4> large(9);
  EXPECT_EQ(small.size(), 3u);
  EXPECT_EQ(large.size(), 9u);
  for (size_t i = 0; i < large.size(); ++i) {
    EXPECT_EQ(large[i], 0u);
    large[i] = i;
  }
  EXPECT_EQ(std::accumulate(large.data(), large.data() + large.size(), size_t{0}), 36u);
  const auto* object = reinterpret_cast<const unsigned char*>(&small);
  const auto* first = reinterpret_cast<const unsigned char*>(small.data());
  EXPECT_TRUE(first >= object && first < object + sizeof(small)) << "kept inside the object";
}

TEST(InlineVector, KeepsEveryElementAcrossTheMoveToTheHeap) {
  int live = 0;
  {
    InlineVector<Counted, 3> vector;
    EXPECT_TRUE(vector.empty());
    for (int i = 0; i < 3; ++i) vector.push_back(Counted(i, &live));
    EXPECT_EQ(live, 3);
    const auto* object = reinterpret_cast<const unsigned char*>(&vector);
    const auto* first = reinterpret_cast<const unsigned char*>(vector.data());
    EXPECT_TRUE(first >= object && first < object + sizeof(vector)) << "the first three inside the object";
    for (int i = 3; i < 10; ++i) vector.push_back(Counted(i, &live));
    EXPECT_EQ(live, 10);
    ASSERT_EQ(vector.size(), 10u);
    int expected = 0;
    for (Counted& element : vector) EXPECT_EQ(*element.value, expected++);
    EXPECT_EQ(*vector.back().value, 9);

    vector.clear();
    EXPECT_EQ(live, 0);
    EXPECT_TRUE(vector.empty());
    vector.push_back(Counted(42, &live));  // on the heap now, its capacity kept
    EXPECT_EQ(*vector.back().value, 42);
    EXPECT_EQ(live, 1);
  }
  EXPECT_EQ(live, 0) << "the destructor destroys what is left";
}

TEST(InlineVector, TakesOneOfItsOwnElementsAsItMovesToTheHeap) {
  int live = 0;
  InlineVector<Counted, 2> vector;
  vector.push_back(Counted(1, &live));
  vector.push_back(Counted(2, &live));
  vector.push_back(std::move(vector.data()[0]));  // full inside: this push moves them out
  ASSERT_EQ(vector.size(), 3u);
  EXPECT_EQ(vector.data()[0].value, nullptr) << "moved from";
  EXPECT_EQ(*vector.data()[1].value, 2);
  EXPECT_EQ(*vector.back().value, 1);
  vector.clear();
  EXPECT_EQ(live, 0);
}

TEST(InlineVector, ClearedWhileInsideItIsReused) {
  int live = 0;
  InlineVector<Counted, 2> vector;
  for (int round = 0; round < 3; ++round) {
    vector.push_back(Counted(round, &live));
    vector.push_back(Counted(round + 10, &live));
    EXPECT_EQ(*vector.data()[0].value, round);
    EXPECT_EQ(*vector.back().value, round + 10);
    vector.clear();
    EXPECT_EQ(live, 0);
  }
}

}  // namespace
}  // namespace ringtree
