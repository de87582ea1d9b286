#include "core/region_plan.h"

#include <random>
#include <vector>

#include "core/sharding_spec.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::testing::IsEmpty;
using ::testing::SizeIs;

TEST(RegionPlanTest, PiecesCarryShardRegionAndGlobalCoordinates) {
  // Rows 0:3, 3:6, 6:9, 9:10 of a 10x20 tensor.
  auto shards = ChunkBoxes({10, 20}, 0, 4);
  ASSERT_THAT(shards, IsOk());
  const Box region{{2, 5}, {6, 10}};  // rows 2:8, cols 5:15
  std::vector<RegionPiece> pieces = PlanRegion(*shards, region);
  ASSERT_THAT(pieces, SizeIs(3));
  EXPECT_EQ(pieces[0].shard_index, 0u);
  EXPECT_EQ(pieces[0].global, (Box{{2, 5}, {1, 10}}));
  EXPECT_EQ(pieces[0].in_shard, (Box{{2, 5}, {1, 10}}));
  EXPECT_EQ(pieces[0].in_region, (Box{{0, 0}, {1, 10}}));
  EXPECT_EQ(pieces[1].shard_index, 1u);
  EXPECT_EQ(pieces[1].global, (Box{{3, 5}, {3, 10}}));
  EXPECT_EQ(pieces[1].in_shard, (Box{{0, 5}, {3, 10}}));
  EXPECT_EQ(pieces[1].in_region, (Box{{1, 0}, {3, 10}}));
  EXPECT_EQ(pieces[2].shard_index, 2u);
  EXPECT_EQ(pieces[2].global, (Box{{6, 5}, {2, 10}}));
  EXPECT_EQ(pieces[2].in_shard, (Box{{0, 5}, {2, 10}}));
  EXPECT_EQ(pieces[2].in_region, (Box{{4, 0}, {2, 10}}));
  EXPECT_EQ(PiecesElements(pieces), region.NumElements());
}

TEST(RegionPlanTest, WholeTensorUsesEveryNonEmptyShardInOrder) {
  auto shards = ChunkBoxes({5}, 0, 4);  // sizes 2,2,1,0
  std::vector<RegionPiece> pieces = PlanRegion(*shards, WholeBox({5}));
  ASSERT_THAT(pieces, SizeIs(3));
  EXPECT_EQ(pieces[0].shard_index, 0u);
  EXPECT_EQ(pieces[1].shard_index, 1u);
  EXPECT_EQ(pieces[2].shard_index, 2u);
  EXPECT_EQ(PiecesElements(pieces), 5);
}

TEST(RegionPlanTest, EmptyRegionHasNoPieces) {
  auto shards = ChunkBoxes({10, 4}, 0, 2);
  EXPECT_THAT(PlanRegion(*shards, Box{{3, 0}, {0, 4}}), IsEmpty());
}

TEST(RegionPlanTest, EnumerableShardsInTheirGivenOrder) {
  std::vector<Box> shards = {{{0, 10}, {4, 10}}, {{0, 0}, {4, 10}}};
  std::vector<RegionPiece> pieces = PlanRegion(shards, Box{{1, 8}, {2, 4}});
  ASSERT_THAT(pieces, SizeIs(2));
  EXPECT_EQ(pieces[0].shard_index, 0u);
  EXPECT_EQ(pieces[0].in_shard, (Box{{1, 0}, {2, 2}}));
  EXPECT_EQ(pieces[0].in_region, (Box{{0, 2}, {2, 2}}));
  EXPECT_EQ(pieces[1].shard_index, 1u);
  EXPECT_EQ(pieces[1].in_shard, (Box{{1, 8}, {2, 2}}));
  EXPECT_EQ(pieces[1].in_region, (Box{{0, 0}, {2, 2}}));
}

TEST(RegionPlanTest, PrebuiltIndexGivesTheSamePiecesAsTheScan) {
  std::mt19937 rng(13);
  for (int round = 0; round < 40; ++round) {
    const size_t rank = 1 + round % 4;
    Shape shape(rank, rank == 1 ? 5000 : 30);
    // A grid, a row split and a column split, in turn, with a few empty
    // boxes from the chunking.
    auto shards = ChunkBoxes(shape, round % rank, 7 + round);
    ASSERT_THAT(shards, IsOk());
    if (round % 3 == 0 && rank > 1) {
      std::vector<Box> grid;
      for (const Box& b : *shards) {
        auto sub = ChunkBoxes(ToShape(b.sizes), (round + 1) % rank, 5);
        for (Box s : *sub) {
          for (size_t d = 0; d < rank; ++d) s.offsets[d] += b.offsets[d];
          grid.push_back(s);
        }
      }
      *shards = grid;
    }
    const BoxIndex index(*shards);
    for (int q = 0; q < 50; ++q) {
      Box region;
      for (size_t d = 0; d < rank; ++d) {
        const int64_t lo =
            std::uniform_int_distribution<int64_t>(0, shape[d])(rng);
        region.offsets.push_back(lo);
        region.sizes.push_back(
            std::uniform_int_distribution<int64_t>(0, shape[d] - lo)(rng));
      }
      const std::vector<RegionPiece> want = PlanRegion(*shards, region);
      const std::vector<RegionPiece> got = PlanRegion(index, *shards, region);
      ASSERT_EQ(got.size(), want.size()) << region.ToString();
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_EQ(got[k].shard_index, want[k].shard_index);
        EXPECT_EQ(got[k].in_shard, want[k].in_shard);
        EXPECT_EQ(got[k].in_region, want[k].in_region);
        EXPECT_EQ(got[k].global, want[k].global);
      }
    }
  }
}

TEST(PlanRows, DistinctRowsOnceWithEveryPositionTheyFill) {
  absl::StatusOr<RowPlan> planned = PlanRows({5, -1, 0, 5, 9, 0}, 10);
  ASSERT_OK(planned.status());
  const RowPlan& plan = *planned;
  EXPECT_EQ(plan.rows, (std::vector<int64_t>{0, 5, 9}));
  EXPECT_EQ(plan.first, (std::vector<int64_t>{0, 2, 4, 6}));
  // Row 0 fills positions 2 and 5, row 5 positions 0 and 3, row 9 (-1 and 9).
  EXPECT_EQ(plan.positions, (std::vector<int64_t>{2, 5, 0, 3, 1, 4}));
  EXPECT_EQ(plan.Within(1, 9), (std::pair<size_t, size_t>{1, 2}));
  EXPECT_EQ(plan.Within(0, 10), (std::pair<size_t, size_t>{0, 3}));
  EXPECT_EQ(plan.Within(6, 9), (std::pair<size_t, size_t>{2, 2}));
}

TEST(PlanRows, EmptyAndOutOfBounds) {
  absl::StatusOr<RowPlan> planned = PlanRows({}, 10);
  ASSERT_OK(planned.status());
  const RowPlan& empty = *planned;
  EXPECT_TRUE(empty.rows.empty());
  EXPECT_EQ(empty.first, (std::vector<int64_t>{0}));
  for (int64_t bad : {int64_t{10}, int64_t{-11}, INT64_MIN, INT64_MAX}) {
    absl::StatusOr<RowPlan> plan = PlanRows({1, bad}, 10);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kOutOfRange) << bad;
    EXPECT_THAT(std::string(plan.status().message()),
                ::testing::HasSubstr("out of bounds"));
  }
  EXPECT_EQ(PlanRows({0}, 0).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(ClassifyForUpdate, KeepRewriteOrPatch) {
  const Box shard({10, 0}, {10, 8});
  Box in_shard;
  EXPECT_EQ(ClassifyForUpdate(shard, std::nullopt, &in_shard),
            UpdateAction::kRewrite);
  EXPECT_EQ(in_shard, Box({0, 0}, {10, 8}));
  EXPECT_EQ(ClassifyForUpdate(shard, Box({0, 0}, {10, 8}), &in_shard),
            UpdateAction::kKeep);
  EXPECT_EQ(ClassifyForUpdate(shard, Box({5, 0}, {30, 8}), &in_shard),
            UpdateAction::kRewrite);
  EXPECT_EQ(in_shard, Box({0, 0}, {10, 8}));
  EXPECT_EQ(ClassifyForUpdate(shard, Box({12, 2}, {3, 4}), &in_shard),
            UpdateAction::kPatch);
  EXPECT_EQ(in_shard, Box({2, 2}, {3, 4}));
  // An empty region changes nothing.
  EXPECT_EQ(ClassifyForUpdate(shard, Box({12, 2}, {0, 4}), &in_shard),
            UpdateAction::kKeep);
}

}  // namespace
}  // namespace tessera
