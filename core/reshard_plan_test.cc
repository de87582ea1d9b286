#include "core/reshard_plan.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/sharding_spec.h"
#include "core/testing/adversarial_layouts.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;

std::vector<PlacedBox> Chunked(const Shape& shape, int64_t dim,
                               const std::vector<std::string>& workers) {
  auto boxes = ChunkBoxes(shape, dim, static_cast<int64_t>(workers.size()));
  EXPECT_OK(boxes);
  std::vector<PlacedBox> out;
  for (size_t i = 0; i < workers.size(); ++i)
    out.push_back({(*boxes)[i], {workers[i]}});
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
  std::vector<PlacedBox> one = {{WholeBox({8, 2}), {"c"}}};
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
  std::vector<PlacedBox> grid = {{{{0, 0}, {2, 2}}, {"a"}},
                                 {{{0, 2}, {2, 2}}, {"b"}},
                                 {{{2, 0}, {2, 2}}, {"c"}},
                                 {{{2, 2}, {2, 2}}, {"d"}}};
  auto chunk =
      Chunked({4, 4}, 0, {"a", "b", "c", "d", "a", "b"});  // split 1, two empty
  ReshardPlan plan = PlanReshard(grid, chunk, 4);
  EXPECT_EQ(PieceBytes(plan), 16 * 4);
  for (const ReshardPiece& p : plan.pieces) EXPECT_LT(p.dst_shard, 4u);
}

TEST(ReshardPlanTest, PartialKeepMixesKeptAndMovedShards) {
  auto before = Chunked({6, 1}, 0, {"a", "b", "c"});
  std::vector<PlacedBox> after = {before[0], {{{2, 0}, {4, 1}}, {"b"}}};
  ReshardPlan plan = PlanReshard(before, after, 4);
  EXPECT_EQ(plan.shards_kept, 1);
  EXPECT_EQ(plan.kept_from[0], 0);
  EXPECT_EQ(plan.bytes_copied_locally, 8);
  EXPECT_EQ(plan.bytes_moved, 8);
}

// Replicas: every replica of a new shard gets every piece, read in memory
// where its worker holds a replica of the old shard.
TEST(ReshardPlanTest, EveryReplicaOfANewShardIsFilled) {
  // Rows 0..4 on {a, b} and 4..8 on {c, d}; one new shard on {b, e}.
  const std::vector<PlacedBox> before = {{{{0, 0}, {4, 2}}, {"a", "b"}},
                                         {{{4, 0}, {4, 2}}, {"c", "d"}}};
  const std::vector<PlacedBox> after = {{WholeBox({8, 2}), {"b", "e"}}};
  ReshardPlan plan = PlanReshard(before, after, 4);
  EXPECT_EQ(plan.shards_kept, 0);
  ASSERT_EQ(plan.pieces.size(), 4u);
  // Replica 0 (on b): rows 0..4 from b's own copy, rows 4..8 moved.
  EXPECT_EQ(plan.pieces[0].dst_replica, 0u);
  EXPECT_TRUE(plan.pieces[0].local);
  EXPECT_EQ(plan.pieces[0].src_shard, 0u);
  EXPECT_EQ(plan.pieces[0].src_replica, 1u);
  EXPECT_EQ(plan.pieces[1].dst_replica, 0u);
  EXPECT_FALSE(plan.pieces[1].local);
  // Replica 1 (on e): both moved.
  EXPECT_EQ(plan.pieces[2].dst_replica, 1u);
  EXPECT_FALSE(plan.pieces[2].local);
  EXPECT_EQ(plan.pieces[3].dst_replica, 1u);
  EXPECT_FALSE(plan.pieces[3].local);
  EXPECT_EQ(plan.pieces_moved, 3);
  EXPECT_EQ(plan.bytes_copied_locally, 4 * 2 * 4);
  EXPECT_EQ(plan.bytes_moved, 3 * 4 * 2 * 4);
}

TEST(ReshardPlanTest, KeptOnlyWithTheSameWorkers) {
  const std::vector<PlacedBox> before = {{WholeBox({4, 4}), {"a", "b"}}};
  EXPECT_EQ(PlanReshard(before, before, 1).shards_kept, 1);
  const std::vector<PlacedBox> fewer = {{WholeBox({4, 4}), {"a"}}};
  ReshardPlan plan = PlanReshard(before, fewer, 1);
  EXPECT_EQ(plan.shards_kept, 0);
  ASSERT_EQ(plan.pieces.size(), 1u);
  EXPECT_TRUE(plan.pieces[0].local);
  EXPECT_EQ(plan.pieces[0].src_replica, 0u);
}

// The plan as the planner defined it before it had an index: every pair
// tested, old shards taken in order of their start on dim 0.
std::vector<ReshardPiece> BrutePieces(const std::vector<PlacedBox>& from,
                                      const std::vector<PlacedBox>& to,
                                      const ReshardPlan& plan, size_t item) {
  std::vector<size_t> order(from.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return from[a].box.offsets[0] < from[b].box.offsets[0];
  });
  std::vector<ReshardPiece> out;
  for (size_t j = 0; j < to.size(); ++j) {
    if (plan.kept_from[j] >= 0) continue;
    for (size_t i : order) {
      std::optional<Box> common = Intersect(from[i].box, to[j].box);
      if (!common.has_value()) continue;
      ReshardPiece p;
      p.src_shard = i;
      p.dst_shard = j;
      p.bytes = common->NumElements() * static_cast<int64_t>(item);
      p.global = *common;
      p.local = from[i].workers == to[j].workers;
      out.push_back(p);
    }
  }
  return out;
}

TEST(ReshardPlanTest, SamePiecesInTheSameOrderAsTestingEveryPair) {
  std::mt19937 rng(9);
  for (int round = 0; round < 80; ++round) {
    const size_t rank = 1 + round % 4;
    Shape shape(rank, rank == 1 ? 3000 : 24);
    std::vector<PlacedBox> from, to;
    std::vector<Box> a = RandomTiling(rng, WholeBox(shape), 150);
    std::vector<Box> b = RandomTiling(rng, WholeBox(shape), 120);
    for (size_t i = 0; i < a.size(); ++i)
      from.push_back({a[i], {std::string(1, 'a' + i % 3)}});
    for (size_t j = 0; j < b.size(); ++j)
      to.push_back({b[j], {std::string(1, 'a' + j % 4)}});
    to.push_back(from[round % from.size()]);  // kept as it is
    ReshardPlan plan = PlanReshard(from, to, 2);
    EXPECT_EQ(plan.kept_from.back(), round % from.size());
    std::vector<ReshardPiece> want = BrutePieces(from, to, plan, 2);
    ASSERT_EQ(plan.pieces.size(), want.size()) << "round " << round;
    int64_t moved = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(plan.pieces[k].src_shard, want[k].src_shard);
      EXPECT_EQ(plan.pieces[k].dst_shard, want[k].dst_shard);
      EXPECT_EQ(plan.pieces[k].global, want[k].global);
      EXPECT_EQ(plan.pieces[k].bytes, want[k].bytes);
      EXPECT_EQ(plan.pieces[k].local, want[k].local);
      if (!want[k].local) moved += want[k].bytes;
    }
    EXPECT_EQ(plan.bytes_moved, moved);
  }
}

// Nested corner shells of [m]^2: column p from row p down, row p right of
// column p. A sort on dim 0 with a bound on extents scans them all.
std::vector<PlacedBox> Shells2(int64_t m, bool transposed) {
  std::vector<PlacedBox> out;
  for (int64_t p = 0; p < m; ++p) {
    Box column{{p, p}, {m - p, 1}};
    Box row{{p, p + 1}, {1, m - p - 1}};
    for (Box b : {column, row}) {
      if (b.IsEmpty()) continue;
      if (transposed) {
        std::swap(b.offsets[0], b.offsets[1]);
        std::swap(b.sizes[0], b.sizes[1]);
      }
      out.push_back({b, {transposed ? "w1" : "w0"}});
    }
  }
  return out;
}

TEST(ReshardPlanTest, TransposingCornerShellsMovesEveryElementOnce) {
  const int64_t m = 20000;
  ReshardPlan plan = PlanReshard(Shells2(m, false), Shells2(m, true), 1);
  EXPECT_EQ(plan.shards_kept, 0);
  EXPECT_EQ(PieceBytes(plan), m * m);
  EXPECT_EQ(plan.bytes_moved, m * m);
  EXPECT_EQ(plan.pieces.size(), 3u * (m - 1) + 1);  // the corner cell: one
}

TEST(ReshardPlanTest, ColumnChunksToFewerColumnChunks) {
  const int64_t n = 20000;
  auto boxes = ChunkBoxes({16, 8 * n}, 1, n);
  auto fewer = ChunkBoxes({16, 8 * n}, 1, n - 1);  // 9 columns each
  std::vector<PlacedBox> from, to;
  for (const Box& b : *boxes) from.push_back({b, {"a"}});
  for (const Box& b : *fewer) to.push_back({b, {"b"}});
  ReshardPlan plan = PlanReshard(from, to, 4);
  EXPECT_EQ(PieceBytes(plan), 16 * 8 * n * 4);
  for (size_t k = 1; k < plan.pieces.size(); ++k) {
    const ReshardPiece& a = plan.pieces[k - 1];
    const ReshardPiece& b = plan.pieces[k];
    EXPECT_TRUE(a.dst_shard < b.dst_shard ||
                (a.dst_shard == b.dst_shard && a.src_shard < b.src_shard));
  }
}

TEST(ReshardPlanTest, CancellationAndDeadlineStopALongPlan) {
  const int64_t m = 20000;
  const std::vector<PlacedBox> from = Shells2(m, false);
  const std::vector<PlacedBox> to = Shells2(m, true);
  StopCondition cancelled;
  cancelled.cancelled = [] { return true; };
  EXPECT_THAT(PlanReshard(from, to, 1, cancelled),
              StatusIs(absl::StatusCode::kCancelled));
  StopCondition late;
  late.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_THAT(PlanReshard(from, to, 1, late),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // Cancelled only once the pair search runs: stopped on the way.
  int polls = 0;
  StopCondition midway;
  midway.cancelled = [&] { return ++polls > 1; };
  EXPECT_THAT(PlanReshard(from, to, 1, midway),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_GT(polls, 1);
}

TEST(ReshardPlanTest, AStopThatNeverComesGivesTheSamePlan) {
  auto rows = Chunked({8, 8}, 0, {"a", "b", "c", "d"});
  auto cols = Chunked({8, 8}, 1, {"a", "b", "c", "d"});
  StopCondition far;
  far.deadline = absl::Now() + absl::Hours(1);
  far.cancelled = [] { return false; };
  absl::StatusOr<ReshardPlan> stoppable = PlanReshard(rows, cols, 4, far);
  ASSERT_OK(stoppable);
  const ReshardPlan plain = PlanReshard(rows, cols, 4);
  ASSERT_EQ(stoppable->pieces.size(), plain.pieces.size());
  for (size_t k = 0; k < plain.pieces.size(); ++k) {
    EXPECT_EQ(stoppable->pieces[k].src_shard, plain.pieces[k].src_shard);
    EXPECT_EQ(stoppable->pieces[k].dst_shard, plain.pieces[k].dst_shard);
    EXPECT_EQ(stoppable->pieces[k].global, plain.pieces[k].global);
  }
  EXPECT_EQ(stoppable->bytes_moved, plain.bytes_moved);
}

}  // namespace
}  // namespace tessera
