#include "core/load_plan.h"

#include <string>
#include <vector>

#include "core/crc32.h"
#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;

// A [rows, 4] int32 tensor of `rows_each`-row shards, shard i's first
// replica on workers[i % size].
TensorMetadata Made(int64_t rows, int64_t rows_each,
                    const std::vector<std::string>& workers) {
  TensorMetadata meta;
  meta.name = "t";
  meta.dtype = DType::kInt32;
  meta.shape = {rows, 4};
  uint64_t id = 10;
  for (int64_t r = 0, i = 0; r < rows; r += rows_each, ++i) {
    ShardInfo& shard = meta.shards.emplace_back();
    shard.box = Box({r, 0}, {std::min(rows_each, rows - r), 4});
    Replica first;
    first.worker = workers[static_cast<size_t>(i) % workers.size()];
    first.address = first.worker + ":1";
    first.shard_id = id++;
    shard.replicas.push_back(first);
    Replica second = first;  // never read by a load
    second.worker = "spare";
    second.address = "spare:1";
    shard.replicas.push_back(second);
  }
  return meta;
}

// A tessera entry of [rows, 4] int32 stored as pieces of `rows_each` rows.
CheckpointEntry Stored(int64_t rows, int64_t rows_each) {
  CheckpointEntry entry;
  entry.name = "t";
  entry.dtype = DType::kInt32;
  entry.shape = {rows, 4};
  entry.bytes = rows * 16;
  for (int64_t r = 0, k = 0; r < rows; r += rows_each, ++k) {
    StoredPiece& piece = entry.pieces.emplace_back();
    piece.box = Box({r, 0}, {std::min(rows_each, rows - r), 4});
    piece.file = "f" + std::to_string(k % 2);
    piece.entry = "t:" + std::to_string(k);
    piece.data_offset = 1000 * k;
    piece.bytes = piece.box.NumElements() * 4;
    piece.crc32 = static_cast<uint32_t>(k + 1);
  }
  entry.file = entry.pieces[0].file;
  return entry;
}

TEST(LoadPlanTest, EachFirstReplicaReadsTheRunsThatLandInIt) {
  const TensorMetadata made = Made(8, 4, {"a", "b"});
  const CheckpointEntry entry = Stored(8, 2);  // 4 pieces, 2 per shard
  const LoadPlan plan = PlanLoad({&made}, {&entry});
  ASSERT_EQ(plan.workers.size(), 2u);  // the spare reads nothing
  EXPECT_EQ(plan.workers[0].worker, "a");
  ASSERT_EQ(plan.workers[0].orders.size(), 2u);
  const LoadPlan::Order& first = plan.workers[0].orders[0];
  EXPECT_EQ(first.order.file, "f0");
  EXPECT_EQ(first.order.shard_id, 10u);
  EXPECT_EQ(first.bytes, 32);
  EXPECT_EQ(first.order.piece_bytes, 32);
  EXPECT_EQ(first.checked, 1u);
  EXPECT_EQ(plan.workers[1].orders[1].order.shard_id, 11u);
  EXPECT_EQ(plan.workers[1].orders[1].order.piece_offset, 3000);
  ASSERT_EQ(plan.checked.size(), 4u);
  int64_t bytes = 0;
  for (const LoadPlan::Worker& w : plan.workers) {
    for (const LoadPlan::Order& o : w.orders) bytes += o.bytes;
  }
  EXPECT_EQ(bytes, entry.bytes);
}

TEST(LoadPlanTest, APieceAcrossShardsIsReadInPartsThatCombine) {
  const TensorMetadata made = Made(8, 2, {"a", "b", "c", "d"});
  const CheckpointEntry entry = Stored(8, 8);  // 1 piece, 4 shards
  const LoadPlan plan = PlanLoad({&made}, {&entry});
  ASSERT_EQ(plan.checked.size(), 1u);
  size_t parts = 0;
  for (const LoadPlan::Worker& w : plan.workers) {
    for (const LoadPlan::Order& o : w.orders) {
      EXPECT_EQ(o.checked, 1u);
      ++parts;
    }
  }
  EXPECT_EQ(parts, 4u);
  // The parts' CRCs are checked against the piece's as a whole.
  const std::string bytes(128, '\x07');
  std::vector<uint32_t> part_crcs;
  for (int p = 0; p < 4; ++p) {
    PartCrc32 part(128);
    part.Add(32 * p, absl::string_view(bytes).substr(32 * p, 32));
    part_crcs.push_back(part.Finish());
  }
  LoadPlan with_crc = plan;
  with_crc.checked[0].crc32 = ExtendCrc32(0, bytes);
  EXPECT_OK(CheckLoadedPieces(with_crc, {part_crcs}, "dir"));
  part_crcs[2] ^= 1;
  EXPECT_THAT(CheckLoadedPieces(with_crc, {part_crcs}, "dir"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LoadPlanTest, AForeignEntryIsReadWholeAndUnchecked) {
  const TensorMetadata made = Made(4, 2, {"a"});
  CheckpointEntry entry;  // a Hugging Face file's: no pieces, no CRC
  entry.name = "t";
  entry.dtype = DType::kInt32;
  entry.shape = {4, 4};
  entry.file = "model.safetensors";
  entry.data_offset = 64;
  entry.bytes = 64;
  const LoadPlan plan = PlanLoad({&made}, {&entry});
  EXPECT_TRUE(plan.checked.empty());
  ASSERT_EQ(plan.workers.size(), 1u);
  ASSERT_EQ(plan.workers[0].orders.size(), 2u);
  EXPECT_EQ(plan.workers[0].orders[1].order.file, "model.safetensors");
  EXPECT_EQ(plan.workers[0].orders[1].order.runs.front().file_offset, 96);
  EXPECT_EQ(plan.workers[0].orders[1].checked, 0u);
  EXPECT_OK(CheckLoadedPieces(plan, {}, "dir"));
}

}  // namespace
}  // namespace tessera
