#include "core/box_index.h"

#include <algorithm>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "core/testing/adversarial_layouts.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

using Pairs = std::set<std::pair<size_t, size_t>>;

Pairs SelfPairs(const BoxIndex& index) {
  Pairs out;
  EXPECT_THAT(index.ForEachIntersectingPair([&](size_t i, size_t j) {
    EXPECT_LT(i, j);
    EXPECT_TRUE(out.insert({i, j}).second)
        << "reported twice: " << i << " " << j;
    return true;
  }),
              IsOk());
  return out;
}

Pairs CrossPairs(const BoxIndex& a, const BoxIndex& b) {
  Pairs out;
  EXPECT_THAT(a.ForEachIntersectingPair(b,
                                        [&](size_t i, size_t j) {
                                          EXPECT_TRUE(out.insert({i, j}).second)
                                              << "reported twice: " << i << " "
                                              << j;
                                          return true;
                                        }),
              IsOk());
  return out;
}

bool Meet(const Box& a, const Box& b) { return Intersect(a, b).has_value(); }

Pairs BruteSelf(const std::vector<Box>& boxes) {
  Pairs out;
  for (size_t i = 0; i < boxes.size(); ++i)
    for (size_t j = i + 1; j < boxes.size(); ++j)
      if (Meet(boxes[i], boxes[j])) out.insert({i, j});
  return out;
}

Pairs BruteCross(const std::vector<Box>& a, const std::vector<Box>& b) {
  Pairs out;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < b.size(); ++j)
      if (Meet(a[i], b[j])) out.insert({i, j});
  return out;
}

std::vector<size_t> BruteQuery(const std::vector<Box>& boxes, const Box& q) {
  std::vector<size_t> out;
  for (size_t i = 0; i < boxes.size(); ++i)
    if (Meet(boxes[i], q)) out.push_back(i);
  return out;
}

// Boxes anywhere in [0, span)^rank, some empty, many coinciding on a dim.
std::vector<Box> RandomBoxes(std::mt19937& rng, size_t rank, size_t n,
                             int64_t span) {
  std::uniform_int_distribution<int64_t> coord(0, span - 1);
  std::uniform_int_distribution<int64_t> size(0, span / 2);
  std::vector<Box> boxes(n);
  for (Box& b : boxes) {
    for (size_t d = 0; d < rank; ++d) {
      b.offsets.push_back(coord(rng));
      b.sizes.push_back(size(rng));
    }
  }
  return boxes;
}

TEST(BoxIndexTest, QueryFindsTheBoxesMeetingIt) {
  std::vector<Box> boxes = {
      {{0, 0}, {2, 4}}, {{2, 0}, {2, 4}}, {{4, 0}, {0, 4}}, {{4, 0}, {2, 4}}};
  BoxIndex index(boxes);
  EXPECT_EQ(index.size(), 4u);
  EXPECT_EQ(index.indexed(), 3u);  // the empty box is left out
  EXPECT_THAT(index.Intersecting({{1, 1}, {2, 1}}), ElementsAre(0, 1));
  EXPECT_THAT(index.Intersecting({{2, 0}, {4, 4}}), ElementsAre(1, 3));
  EXPECT_THAT(index.Intersecting({{1, 1}, {0, 1}}), IsEmpty());
  EXPECT_THAT(index.Intersecting({{6, 0}, {1, 1}}), IsEmpty());
  EXPECT_THAT(index.Intersecting({{0}, {1}}), IsEmpty());  // another rank
}

TEST(BoxIndexTest, EmptyIndexAndRankZero) {
  BoxIndex none(std::vector<Box>{});
  EXPECT_THAT(none.Intersecting({{0}, {1}}), IsEmpty());
  EXPECT_THAT(SelfPairs(none), IsEmpty());
  std::vector<Box> scalars(3);  // rank 0: one element each, all the same
  BoxIndex index(scalars);
  EXPECT_THAT(index.Intersecting(Box()), ElementsAre(0, 1, 2));
  EXPECT_EQ(SelfPairs(index), (Pairs{{0, 1}, {0, 2}, {1, 2}}));
}

TEST(BoxIndexTest, AgreesWithBruteForceOnRandomBoxes) {
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    const size_t rank = 1 + round % 5;
    const size_t n = std::uniform_int_distribution<size_t>(0, 120)(rng);
    const int64_t span = round % 3 == 0 ? 4 : 40;  // few values: many ties
    std::vector<Box> boxes = RandomBoxes(rng, rank, n, span);
    std::vector<Box> others = RandomBoxes(rng, rank, n / 2 + 1, span);
    BoxIndex index(boxes);
    BoxIndex other(others);
    ASSERT_EQ(SelfPairs(index), BruteSelf(boxes)) << "round " << round;
    ASSERT_EQ(CrossPairs(index, other), BruteCross(boxes, others))
        << "round " << round;
    for (const Box& q : others) {
      ASSERT_EQ(index.Intersecting(q), BruteQuery(boxes, q))
          << "round " << round << " query " << q.ToString();
    }
  }
}

TEST(BoxIndexTest, AgreesWithBruteForceInHighRanks) {
  std::mt19937 rng(17);
  for (size_t rank : {6, 8, 9, 12}) {
    for (int round = 0; round < 20; ++round) {
      std::vector<Box> boxes = RandomBoxes(rng, rank, 150, 6);
      std::vector<Box> others = RandomBoxes(rng, rank, 60, 6);
      BoxIndex index(boxes);
      BoxIndex other(others);
      ASSERT_EQ(SelfPairs(index), BruteSelf(boxes)) << "rank " << rank;
      ASSERT_EQ(CrossPairs(index, other), BruteCross(boxes, others))
          << "rank " << rank;
      for (const Box& q : others) {
        ASSERT_EQ(index.Intersecting(q), BruteQuery(boxes, q));
      }
    }
  }
}

TEST(BoxIndexTest, AgreesWithBruteForceOnRandomTilings) {
  std::mt19937 rng(11);
  for (int round = 0; round < 60; ++round) {
    const size_t rank = 1 + round % 4;
    Box whole;
    for (size_t d = 0; d < rank; ++d) {
      whole.offsets.push_back(0);
      whole.sizes.push_back(rank == 1 ? 5000 : 60);
    }
    std::vector<Box> a = RandomTiling(rng, whole, 400);
    std::vector<Box> b = RandomTiling(rng, whole, 300);
    BoxIndex ia(a), ib(b);
    EXPECT_THAT(SelfPairs(ia), IsEmpty());
    ASSERT_EQ(CrossPairs(ia, ib), BruteCross(a, b)) << "round " << round;
    ASSERT_EQ(CrossPairs(ib, ia), BruteCross(b, a)) << "round " << round;
    for (size_t i = 0; i < b.size(); i += 7) {
      ASSERT_EQ(ia.Intersecting(b[i]), BruteQuery(a, b[i]));
    }
    // One box more, overlapping: found, and only with the boxes it meets.
    a.push_back(b[0]);
    BoxIndex with(a);
    Pairs want;
    for (size_t i : BruteQuery(a, b[0]))
      if (i + 1 < a.size()) want.insert({i, a.size() - 1});
    ASSERT_EQ(SelfPairs(with), want);
  }
}

TEST(BoxIndexTest, PairsStopWhenTheCallbackSaysSo) {
  std::vector<Box> boxes(1000, Box{{0, 0}, {4, 4}});
  for (size_t i = 0; i < boxes.size(); ++i) boxes[i].offsets[0] = i % 3;
  BoxIndex index(boxes);
  int calls = 0;
  EXPECT_THAT(index.ForEachIntersectingPair([&](size_t, size_t) {
    ++calls;
    return calls < 5;
  }),
              IsOk());
  EXPECT_EQ(calls, 5);
}

TEST(BoxIndexTest, CancellationAndDeadlineStopLongJoins) {
  std::mt19937 rng(3);
  Box whole{{0, 0, 0}, {100, 100, 100}};
  std::vector<Box> boxes = RandomTiling(rng, whole, 50000);
  BoxIndex index(boxes);
  StopCondition cancelled;
  cancelled.cancelled = [] { return true; };
  auto never = [](size_t, size_t) { return true; };
  EXPECT_THAT(index.ForEachIntersectingPair(never, cancelled),
              StatusIs(absl::StatusCode::kCancelled));
  StopCondition late;
  late.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_THAT(index.ForEachIntersectingPair(index, never, late),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(index.ForEachIntersectingPair(never, StopCondition()), IsOk());
}

}  // namespace
}  // namespace tessera
