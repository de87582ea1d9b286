#include "core/save_plan.h"

#include <string>
#include <vector>

#include "core/checkpoint_index.h"
#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;

Replica On(const std::string& worker, uint64_t id, bool available = true) {
  Replica r;
  r.worker = worker;
  r.address = worker + ":1";
  r.shard_id = id;
  r.available = available;
  return r;
}

// A [rows, 4] float32 tensor cut into `rows_each`-row shards, shard i on
// workers[i % size].
TensorMetadata RowShards(const std::string& name, int64_t rows,
                         int64_t rows_each,
                         const std::vector<std::string>& workers) {
  TensorMetadata meta;
  meta.name = name;
  meta.version = 3;
  meta.dtype = DType::kFloat32;
  meta.shape = {rows, 4};
  uint64_t id = 100;
  for (int64_t r = 0, i = 0; r < rows || i == 0; r += rows_each, ++i) {
    ShardInfo& shard = meta.shards.emplace_back();
    const int64_t n = std::min(rows_each, rows - r);
    shard.box = Box({r, 0}, {std::max<int64_t>(n, 0), 4});
    shard.replicas.push_back(
        On(workers[static_cast<size_t>(i) % workers.size()], id++));
    if (rows == 0) break;
  }
  return meta;
}

SavePlanOptions Options(int64_t file_bytes = int64_t{1} << 30,
                        int64_t file_items = 1024) {
  SavePlanOptions options;
  options.save_id = "0badcafe";
  options.principal = "trainer";
  options.file_bytes = file_bytes;
  options.file_items = file_items;
  return options;
}

TEST(SavePlanTest, EachShardIsOnePieceOfItsWorkersFile) {
  absl::StatusOr<SavePlan> plan =
      PlanSave({RowShards("w", 8, 2, {"a", "b"})}, Options());
  ASSERT_OK(plan.status());
  ASSERT_EQ(plan->listing.entries.size(), 1u);
  const CheckpointEntry& entry = plan->listing.entries[0];
  EXPECT_EQ(entry.shape, (Shape{8, 4}));
  EXPECT_EQ(entry.bytes, 8 * 4 * 4);
  ASSERT_EQ(entry.pieces.size(), 4u);
  EXPECT_EQ(entry.pieces[0].entry, "w:0");
  EXPECT_EQ(entry.pieces[3].entry, "w:3");
  EXPECT_EQ(plan->bytes, 128);
  ASSERT_EQ(plan->workers.size(), 2u);
  EXPECT_EQ(plan->workers[0].worker, "a");
  EXPECT_EQ(plan->workers[0].address, "a:1");
  ASSERT_EQ(plan->workers[0].files.size(), 1u);
  const SavePlanFile& file = plan->workers[0].files[0];
  EXPECT_EQ(file.name, SavedFileName("a", "0badcafe", 0));
  EXPECT_TRUE(IsSavedFileOf(file.name, "0badcafe"));
  ASSERT_EQ(file.items.size(), 2u);  // shards 0 and 2
  EXPECT_EQ(file.items[0].shard_id, 100u);
  EXPECT_EQ(file.items[1].shard_id, 102u);
  EXPECT_EQ(file.items[1].piece, 2u);
  EXPECT_EQ(file.items[1].version, 3u);
  EXPECT_EQ(file.items[1].bytes, 32);
  EXPECT_EQ(plan->files, 2);
  EXPECT_EQ(plan->listing.save_id, "0badcafe");
  EXPECT_EQ(plan->listing.saved_by, "trainer");
}

TEST(SavePlanTest, FilesAreCutByBytesAndByItems) {
  // 16 shards of 32 bytes on one worker.
  const TensorMetadata meta = RowShards("t", 32, 2, {"a"});
  absl::StatusOr<SavePlan> by_bytes = PlanSave({meta}, Options(100));
  ASSERT_OK(by_bytes.status());
  ASSERT_EQ(by_bytes->workers.size(), 1u);
  EXPECT_EQ(by_bytes->workers[0].files.size(), 6u);  // 3 pieces (96 B) each
  for (const SavePlanFile& f : by_bytes->workers[0].files) {
    EXPECT_LE(f.items.size(), 3u);
  }
  absl::StatusOr<SavePlan> by_items = PlanSave({meta}, Options(1 << 30, 5));
  ASSERT_OK(by_items.status());
  EXPECT_EQ(by_items->workers[0].files.size(), 4u);  // 5 + 5 + 5 + 1
  EXPECT_EQ(by_items->files, 4);
  // A piece larger than a file's bytes still goes, alone in its file.
  absl::StatusOr<SavePlan> big = PlanSave({meta}, Options(10));
  ASSERT_OK(big.status());
  EXPECT_EQ(big->workers[0].files.size(), 16u);
}

TEST(SavePlanTest, EmptyShardsStoreNothingButAnEmptyTensorKeepsOne) {
  TensorMetadata meta = RowShards("e", 3, 2, {"a", "b"});
  meta.shards.push_back({Box({3, 0}, {0, 4}), {On("b", 200)}});
  absl::StatusOr<SavePlan> plan = PlanSave({meta}, Options());
  ASSERT_OK(plan.status());
  EXPECT_EQ(plan->listing.entries[0].pieces.size(), 2u);
  absl::StatusOr<SavePlan> empty =
      PlanSave({RowShards("z", 0, 2, {"a"})}, Options());
  ASSERT_OK(empty.status());
  ASSERT_EQ(empty->listing.entries[0].pieces.size(), 1u);
  EXPECT_EQ(empty->listing.entries[0].pieces[0].entry, "z");
  EXPECT_EQ(empty->bytes, 0);
}

TEST(SavePlanTest, AScalarIsStoredZeroDimensional) {
  TensorMetadata meta = RowShards("s", 1, 1, {"a"});
  meta.shape = {1};
  meta.shards[0].box = Box({0}, {1});
  meta.origin.scalar = true;
  absl::StatusOr<SavePlan> plan = PlanSave({meta}, Options());
  ASSERT_OK(plan.status());
  EXPECT_TRUE(plan->listing.entries[0].shape.empty());
  EXPECT_EQ(plan->listing.entries[0].pieces[0].box.rank(), 0u);
  EXPECT_TRUE(plan->workers[0].files[0].items[0].scalar);
}

TEST(SavePlanTest, AFailedReplicaIsSkippedAndAShardWithNoneFailsThePlan) {
  TensorMetadata meta = RowShards("r", 4, 2, {"a"});
  meta.shards[1].replicas = {On("a", 7, false), On("b", 8)};
  absl::StatusOr<SavePlan> plan = PlanSave({meta}, Options());
  ASSERT_OK(plan.status());
  ASSERT_EQ(plan->workers.size(), 2u);
  EXPECT_EQ(plan->workers[1].worker, "b");
  EXPECT_EQ(plan->workers[1].files[0].items[0].shard_id, 8u);
  meta.shards[1].replicas[1].available = false;
  EXPECT_THAT(PlanSave({meta}, Options()).status(),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(SavePlanTest, FileMetadataKeepsTheTensorsOwnAndMarksTheSave) {
  TensorMetadata a = RowShards("a", 2, 2, {"w"});
  a.origin.metadata = {{"format", "np"}, {"step", "7"}};
  TensorMetadata b = RowShards("b", 2, 2, {"w"});
  b.origin.metadata = {{"step", "7"}, {"lr", "0.1"}};
  absl::StatusOr<SavePlan> plan = PlanSave({a, b}, Options());
  ASSERT_OK(plan.status());
  EXPECT_EQ(plan->listing.metadata.size(), 3u);  // "step" once
  const auto& meta = plan->file_metadata;
  EXPECT_EQ(meta.front(),
            (std::pair<std::string, std::string>{"format", "np"}));
  EXPECT_EQ(meta.back(),
            (std::pair<std::string, std::string>{kSavePartKey, "0badcafe"}));
  absl::StatusOr<SavePlan> plain =
      PlanSave({RowShards("c", 2, 2, {"w"})}, Options());
  ASSERT_OK(plain.status());
  EXPECT_EQ(plain->file_metadata.front(),
            (std::pair<std::string, std::string>{"format", "pt"}));
}

}  // namespace
}  // namespace tessera
