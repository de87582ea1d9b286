#include "core/reshard_plan.h"

#include "core/sharding_spec.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

std::vector<PlacedBox> Chunked(const Shape& shape, int64_t dim,
                               const std::vector<std::string>& workers) {
  auto boxes = ChunkBoxes(shape, dim, static_cast<int64_t>(workers.size()));
  EXPECT_OK(boxes);
  std::vector<PlacedBox> out;
  for (size_t i = 0; i < workers.size(); ++i)
    out.push_back({(*boxes)[i], workers[i]});
  return out;
}

int64_t PieceBytes(const ReshardPlan& plan) {
  int64_t total = 0;
  for (const ReshardPiece& p : plan.pieces) total += p.bytes;
  return total;
}

TEST(ReshardPlanTest, NoOpReshardKeepsEveryShardAndMovesNothing) {
  auto layout = Chunked({8, 4}, 0, {"a", "b", "c", "d"});
  ReshardPlan plan = PlanReshard(layout, layout, 4);
  EXPECT_EQ(plan.shards_kept, 4);
  EXPECT_TRUE(plan.pieces.empty());
  EXPECT_EQ(plan.bytes_moved, 0);
  EXPECT_EQ(plan.bytes_copied_locally, 0);
  EXPECT_THAT(plan.kept_from, ::testing::ElementsAre(0, 1, 2, 3));
}

TEST(ReshardPlanTest, RowsToColumnsMovesOnlyBytesThatChangeWorker) {
  // 8x8 float32 over 4 workers: each new column block takes one 2x2 piece
  // from each old row block; the piece on the diagonal stays on its worker.
  auto rows = Chunked({8, 8}, 0, {"a", "b", "c", "d"});
  auto cols = Chunked({8, 8}, 1, {"a", "b", "c", "d"});
  ReshardPlan plan = PlanReshard(rows, cols, 4);
  EXPECT_EQ(plan.shards_kept, 0);
  EXPECT_EQ(plan.pieces.size(), 16u);
  EXPECT_EQ(plan.pieces_moved, 12);
  EXPECT_EQ(plan.bytes_moved, 12 * 4 * 4);
  EXPECT_EQ(plan.bytes_copied_locally, 4 * 4 * 4);
  EXPECT_EQ(PieceBytes(plan), 8 * 8 * 4);
}

TEST(ReshardPlanTest, FourWorkersToThreeCoversEveryNewShard) {
  auto four = Chunked({10, 3}, 0, {"a", "b", "c", "d"});
  auto three = Chunked({10, 3}, 0, {"a", "b", "c"});
  ReshardPlan plan = PlanReshard(four, three, 8);
  EXPECT_EQ(PieceBytes(plan), 10 * 3 * 8);
  std::vector<int64_t> filled(3, 0);
  for (const ReshardPiece& p : plan.pieces)
    filled[p.dst_shard] += p.global.NumElements();
  EXPECT_THAT(filled, ::testing::ElementsAre(12, 12, 6));
  // Shard a keeps rows 0..2 in place: bytes of rows 0..2 are local.
  EXPECT_GT(plan.bytes_copied_locally, 0);
  EXPECT_EQ(plan.bytes_moved + plan.bytes_copied_locally, 10 * 3 * 8);
}

TEST(ReshardPlanTest, GatherOntoOneWorkerMovesEverythingElse) {
  auto rows = Chunked({8, 2}, 0, {"a", "b", "c", "d"});
  std::vector<PlacedBox> one = {{WholeBox({8, 2}), "c"}};
  ReshardPlan plan = PlanReshard(rows, one, 4);
  EXPECT_EQ(plan.pieces.size(), 4u);
  EXPECT_EQ(plan.bytes_copied_locally, 2 * 2 * 4);
  EXPECT_EQ(plan.bytes_moved, 6 * 2 * 4);
  EXPECT_EQ(plan.pieces_moved, 3);
}

TEST(ReshardPlanTest, SameBoxOnAnotherWorkerIsMovedNotKept) {
  auto before = Chunked({4, 4}, 0, {"a", "b"});
  auto after = Chunked({4, 4}, 0, {"b", "a"});
  ReshardPlan plan = PlanReshard(before, after, 1);
  EXPECT_EQ(plan.shards_kept, 0);
  EXPECT_EQ(plan.bytes_moved, 16);
  EXPECT_EQ(plan.bytes_copied_locally, 0);
}

TEST(ReshardPlanTest, EnumerableToChunkWithEmptyShards) {
  std::vector<PlacedBox> grid = {{{{0, 0}, {2, 2}}, "a"},
                                 {{{0, 2}, {2, 2}}, "b"},
                                 {{{2, 0}, {2, 2}}, "c"},
                                 {{{2, 2}, {2, 2}}, "d"}};
  auto chunk =
      Chunked({4, 4}, 0, {"a", "b", "c", "d", "a", "b"});  // split 1, two empty
  ReshardPlan plan = PlanReshard(grid, chunk, 4);
  EXPECT_EQ(PieceBytes(plan), 16 * 4);
  for (const ReshardPiece& p : plan.pieces) EXPECT_LT(p.dst_shard, 4u);
}

TEST(ReshardPlanTest, PartialKeepMixesKeptAndMovedShards) {
  auto before = Chunked({6, 1}, 0, {"a", "b", "c"});
  std::vector<PlacedBox> after = {before[0], {{{2, 0}, {4, 1}}, "b"}};
  ReshardPlan plan = PlanReshard(before, after, 4);
  EXPECT_EQ(plan.shards_kept, 1);
  EXPECT_EQ(plan.kept_from[0], 0);
  EXPECT_EQ(plan.bytes_copied_locally, 8);
  EXPECT_EQ(plan.bytes_moved, 8);
}

}  // namespace
}  // namespace tessera
