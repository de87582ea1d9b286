#include "worker/exchange_layout.h"

#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

// A float32 shard of `rows` x `cols`.
ShardDesc Shard(int64_t rows, int64_t cols) {
  ShardDesc desc;
  desc.dtype = DType::kFloat32;
  desc.tensor_shape = {rows, cols};
  desc.box = Box({0, 0}, {rows, cols});
  return desc;
}

TEST(ExchangeLayoutTest, RangesOfTheirShardArePostedInPlaceOthersPacked) {
  ExchangePlan plan;
  plan.ranks = 3;
  plan.rank = 0;
  // Rows 2..3 of an 8 x 16 shard: one range, from byte 2 * 16 * 4.
  plan.sends.push_back({1, 7, {2, 0}, {2, 16}});
  // Columns 4..7 of every row: not one range, packed.
  plan.sends.push_back({2, 7, {0, 4}, {8, 4}});
  // 3 x 3 elements (36 bytes) into another shard: packed after it.
  plan.recvs.push_back({1, 8, {1, 1}, {3, 3}});
  // Part of one row: one range.
  plan.recvs.push_back({2, 8, {5, 1}, {1, 5}});
  const std::vector<ShardDesc> shards = {Shard(8, 16), Shard(8, 16),
                                         Shard(6, 6), Shard(6, 6)};
  ASSERT_OK_AND_ASSIGN(ShareLayout layout, LayOutShare(plan, shards));
  ASSERT_THAT(layout.sends, SizeIs(2));
  ASSERT_THAT(layout.recvs, SizeIs(2));

  const PostedPiece& rows = layout.sends[0];
  EXPECT_FALSE(rows.packed());
  EXPECT_EQ(rows.peer, 1);
  EXPECT_EQ(rows.bytes, 2 * 16 * 4);
  EXPECT_EQ(rows.shard_offset, 2 * 16 * 4);
  EXPECT_EQ(rows.piece, &plan.sends[0]);
  EXPECT_EQ(rows.shard, 0u);

  const PostedPiece& cols = layout.sends[1];
  EXPECT_TRUE(cols.packed());
  EXPECT_EQ(cols.bytes, 8 * 4 * 4);
  EXPECT_EQ(cols.buffer_offset, 0);
  EXPECT_EQ(cols.shard, 1u);

  const PostedPiece& square = layout.recvs[0];
  EXPECT_TRUE(square.packed());
  EXPECT_EQ(square.bytes, 36);
  // After the first packed piece, rounded up to the alignment.
  EXPECT_EQ(square.buffer_offset, 256);
  EXPECT_EQ(square.shard, 2u);

  const PostedPiece& part = layout.recvs[1];
  EXPECT_FALSE(part.packed());
  EXPECT_EQ(part.shard_offset, (5 * 6 + 1) * 4);
  EXPECT_EQ(part.bytes, 5 * 4);

  EXPECT_EQ(layout.buffer_bytes, 256 + 256);
  EXPECT_EQ(layout.received_bytes, 36 + 20);
}

TEST(ExchangeLayoutTest, PackedPiecesNeverOverlapAndStayAligned) {
  ExchangePlan plan;
  plan.ranks = 2;
  plan.rank = 1;
  std::vector<ShardDesc> shards;
  for (int64_t c = 1; c <= 9; ++c) {
    plan.sends.push_back({0, 1, {0, 0}, {3, c}});  // c of 10 columns
    shards.push_back(Shard(3, 10));
  }
  ASSERT_OK_AND_ASSIGN(ShareLayout layout, LayOutShare(plan, shards));
  ASSERT_THAT(layout.sends, SizeIs(9));
  int64_t end = 0;
  for (const PostedPiece& posted : layout.sends) {
    ASSERT_TRUE(posted.packed());
    EXPECT_EQ(posted.buffer_offset % kExchangeBufferAlignment, 0);
    EXPECT_GE(posted.buffer_offset, end);
    end = posted.buffer_offset + posted.bytes;
  }
  EXPECT_LE(end, layout.buffer_bytes);
  EXPECT_EQ(layout.received_bytes, 0);
}

TEST(ExchangeLayoutTest, EmptyPiecesAreLeftOutAndNothingPacksWithoutNeed) {
  ExchangePlan plan;
  plan.ranks = 2;
  plan.sends.push_back({1, 1, {0, 0}, {0, 4}});
  plan.recvs.push_back({1, 2, {0, 0}, {4, 4}});  // the whole shard
  ASSERT_OK_AND_ASSIGN(ShareLayout layout,
                       LayOutShare(plan, {Shard(4, 4), Shard(4, 4)}));
  EXPECT_THAT(layout.sends, SizeIs(0));
  ASSERT_THAT(layout.recvs, SizeIs(1));
  EXPECT_EQ(layout.recvs[0].shard, 1u);
  EXPECT_EQ(layout.recvs[0].shard_offset, 0);
  EXPECT_EQ(layout.buffer_bytes, 0);
  EXPECT_EQ(layout.received_bytes, 64);
}

TEST(ExchangeLayoutTest, PiecesOutsideTheirShardAreRefused) {
  ExchangePlan plan;
  plan.ranks = 2;
  plan.sends.push_back({1, 1, {0, 0}, {2, 2}});
  plan.recvs.push_back({1, 2, {3, 0}, {2, 4}});  // rows 3..4 of 4
  EXPECT_THAT(LayOutShare(plan, {Shard(4, 4), Shard(4, 4)}).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("recvs[0]")));
  plan.recvs[0] = {1, 2, {0}, {4}};  // one dim of two
  EXPECT_THAT(LayOutShare(plan, {Shard(4, 4), Shard(4, 4)}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(LayOutShare(plan, {Shard(4, 4)}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 shards for 2 pieces")));
}

}  // namespace
}  // namespace tessera
