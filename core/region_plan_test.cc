#include "core/region_plan.h"

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

}  // namespace
}  // namespace tessera
