#include "core/transfer.h"

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

}  // namespace
}  // namespace tessera
