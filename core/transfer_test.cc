#include "core/transfer.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TransferBatch Batch(const std::string& src, const std::string& dst,
                    std::vector<TransferPiece> pieces) {
  TransferBatch batch;
  batch.src_worker = src;
  batch.dst_worker = dst;
  batch.pieces = std::move(pieces);
  return batch;
}

TransferPiece Piece(uint64_t src_id, uint64_t dst_id, int64_t row,
                    int64_t rows) {
  TransferPiece piece;
  piece.src_shard_id = src_id;
  piece.src_offsets = {row, 0};
  piece.dst_shard_id = dst_id;
  piece.dst_offsets = {0, row};
  piece.sizes = {rows, 8};
  return piece;
}

TEST(PlanExchangeTest, EachPieceIsASendAtItsSourceAndAReceiveAtItsDestination) {
  const std::vector<TransferBatch> batches = {
      Batch("w2", "w1", {Piece(20, 10, 0, 4), Piece(21, 11, 4, 2)}),
      Batch("w1", "w1", {Piece(12, 10, 0, 4)}),  // local: not exchanged
      Batch("w1", "w3", {Piece(12, 30, 0, 3)}),
      Batch("w3", "w2", {}),  // empty: names no member
  };
  const Exchange exchange = PlanExchange(batches, 4);
  ASSERT_EQ(exchange.members, (std::vector<std::string>{"w1", "w2", "w3"}));
  ASSERT_EQ(exchange.plans.size(), 3u);
  EXPECT_EQ(exchange.bytes, (4 + 2 + 3) * 8 * 4);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(exchange.plans[r].rank, r);
    EXPECT_EQ(exchange.plans[r].ranks, 3);
  }
  const ExchangePlan& w1 = exchange.plans[0];
  const ExchangePlan& w2 = exchange.plans[1];
  const ExchangePlan& w3 = exchange.plans[2];
  // w2 sends two pieces to w1, which receives them in the same order.
  ASSERT_EQ(w2.sends.size(), 2u);
  ASSERT_EQ(w1.recvs.size(), 2u);
  EXPECT_EQ(w2.sends[0].peer, 0);
  EXPECT_EQ(w2.sends[0].shard_id, 20u);
  EXPECT_EQ(w2.sends[0].offsets, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(w1.recvs[0].peer, 1);
  EXPECT_EQ(w1.recvs[0].shard_id, 10u);
  EXPECT_EQ(w2.sends[1].shard_id, 21u);
  EXPECT_EQ(w1.recvs[1].shard_id, 11u);
  EXPECT_EQ(w1.recvs[1].offsets, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(w1.recvs[1].sizes, (std::vector<int64_t>{2, 8}));
  // w1 sends one to w3.
  ASSERT_EQ(w1.sends.size(), 1u);
  EXPECT_EQ(w1.sends[0].peer, 2);
  ASSERT_EQ(w3.recvs.size(), 1u);
  EXPECT_EQ(w3.recvs[0].peer, 0);
  EXPECT_EQ(w3.recvs[0].shard_id, 30u);
  EXPECT_TRUE(w3.sends.empty());
  EXPECT_TRUE(w2.recvs.empty());
}

TEST(PlanExchangeTest, OnlyLocalPiecesMakeNoExchange) {
  const Exchange exchange =
      PlanExchange({Batch("w1", "w1", {Piece(1, 2, 0, 1)})}, 4);
  EXPECT_TRUE(exchange.members.empty());
  EXPECT_TRUE(exchange.plans.empty());
  EXPECT_EQ(exchange.bytes, 0);
}

// Marks, in a grid of `shape`, each element a batch's pieces land on.
void Mark(const std::vector<TransferBatch>& batches,
          const std::vector<int64_t>& shape, std::vector<int>* seen) {
  for (const TransferBatch& batch : batches) {
    for (const TransferPiece& piece : batch.pieces) {
      ASSERT_EQ(piece.sizes.size(), 3u);
      for (int64_t i = 0; i < piece.sizes[0]; ++i)
        for (int64_t j = 0; j < piece.sizes[1]; ++j)
          for (int64_t k = 0; k < piece.sizes[2]; ++k) {
            const int64_t d0 = piece.dst_offsets[0] + i;
            const int64_t d1 = piece.dst_offsets[1] + j;
            const int64_t d2 = piece.dst_offsets[2] + k;
            // The source moves with the destination, one offset apart.
            EXPECT_EQ(piece.src_offsets[0] + i - d0, 5);
            EXPECT_EQ(piece.src_offsets[1] + j - d1, 0);
            EXPECT_EQ(piece.src_offsets[2] + k - d2, 1);
            ++(*seen)[(d0 * shape[1] + d1) * shape[2] + d2];
          }
    }
  }
}

TEST(SplitBatchTest, PartsCoverEveryElementOnceWithinTheBound) {
  TransferPiece piece;
  piece.src_shard_id = 1;
  piece.dst_shard_id = 2;
  piece.sizes = {6, 5, 7};
  piece.src_offsets = {5, 0, 1};
  piece.dst_offsets = {0, 0, 0};
  TransferPiece small = piece;  // a second piece, behind the first
  small.sizes = {1, 5, 7};
  small.src_offsets = {11, 0, 1};
  small.dst_offsets = {6, 0, 0};
  const TransferBatch batch = Batch("w1", "w2", {piece, small});
  const std::vector<int64_t> grid = {7, 5, 7};
  const int64_t item = 4;
  ASSERT_EQ(BatchBytes(batch, item), 7 * 5 * 7 * item);

  // Bounds from one element to all of it: a row of 7 (28 B) is the least.
  for (int64_t max : {1, 28, 29, 100, 140, 141, 500, 841, 844, 10000}) {
    SCOPED_TRACE(max);
    const std::vector<TransferBatch> parts = SplitBatch(batch, item, max);
    std::vector<int> seen(7 * 5 * 7, 0);
    Mark(parts, grid, &seen);
    for (int count : seen) ASSERT_EQ(count, 1);
    int64_t total = 0;
    for (const TransferBatch& part : parts) {
      EXPECT_EQ(part.src_worker, "w1");
      EXPECT_EQ(part.dst_worker, "w2");
      ASSERT_FALSE(part.pieces.empty());
      const int64_t bytes = BatchBytes(part, item);
      total += bytes;
      EXPECT_LE(bytes, std::max<int64_t>(max, 7 * item));
    }
    EXPECT_EQ(total, BatchBytes(batch, item));
    if (max >= BatchBytes(batch, item)) {
      EXPECT_EQ(parts.size(), 1u);
    }
  }
  // 140 B is one 5x7 slice of dim 0: six slices plus the small piece.
  EXPECT_EQ(SplitBatch(batch, item, 140).size(), 7u);
}

TEST(SplitBatchTest, AnEmptyBatchStaysOne) {
  const std::vector<TransferBatch> parts =
      SplitBatch(Batch("w1", "w2", {}), 4, 64);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_TRUE(parts[0].pieces.empty());
}

}  // namespace
}  // namespace tessera
