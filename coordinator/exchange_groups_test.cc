#include "coordinator/exchange_groups.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "coordinator/fake_worker_control.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

std::string Address(int i) { return absl::StrCat("10.0.0.", i, ":7000"); }

TransferBatch Batch(int src, int dst, uint64_t src_id, uint64_t dst_id) {
  TransferBatch batch;
  batch.src_worker = absl::StrCat("g", src);
  batch.src_address = Address(src);
  batch.dst_worker = absl::StrCat("g", dst);
  batch.dst_address = Address(dst);
  TransferPiece piece;
  piece.src_shard_id = src_id;
  piece.src_offsets = {0, 0};
  piece.dst_shard_id = dst_id;
  piece.dst_offsets = {0, 0};
  piece.sizes = {4, 4};
  batch.pieces.push_back(piece);
  return batch;
}

class ExchangeGroupsTest : public ::testing::Test {
 protected:
  ExchangeGroupsTest() {
    for (int i = 0; i < 3; ++i) {
      workers_.AddWorker(Address(i));
      workers_.Hold(Address(i), 10 + i, 64);  // a source shard
      workers_.Hold(Address(i), 20 + i, 64);  // a destination shard
    }
    // g0 -> g1, g1 -> g2, g2 -> g0, and one piece g0 keeps.
    batches_ = {Batch(0, 1, 10, 21), Batch(1, 2, 11, 22), Batch(2, 0, 12, 20),
                Batch(0, 0, 10, 20)};
  }

  FakeWorkerControl workers_;
  std::vector<TransferBatch> batches_;
};

TEST_F(ExchangeGroupsTest, EveryMemberGetsItsShareUnderOneIdKeptForLater) {
  for (int i = 0; i < 3; ++i) workers_.EnableExchanges(Address(i));
  ExchangeGroups groups(&workers_);
  ASSERT_OK(groups.Run(batches_, 4));
  auto shares = workers_.exchanges();
  ASSERT_THAT(shares, SizeIs(3));
  const std::string id = shares[0].second.unique_id;
  EXPECT_EQ(id.size(), kExchangeIdBytes);
  for (const auto& [address, plan] : shares) {
    EXPECT_EQ(plan.unique_id, id) << address;
    EXPECT_EQ(plan.ranks, 3);
    // One piece out and one in each: the local piece is not exchanged.
    EXPECT_THAT(plan.sends, SizeIs(1)) << address;
    EXPECT_THAT(plan.recvs, SizeIs(1)) << address;
  }
  // The first member (by name) made the id.
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 1);
  EXPECT_EQ(workers_.counts(Address(1)).exchange_id, 0);
  // The next exchange among the same workers reuses it.
  ASSERT_OK(groups.Run(batches_, 4));
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 1);
  shares = workers_.exchanges();
  ASSERT_THAT(shares, SizeIs(6));
  EXPECT_EQ(shares[5].second.unique_id, id);
  EXPECT_EQ(groups.stats().exchanges, 2);
  EXPECT_EQ(groups.stats().failures, 0);
  EXPECT_EQ(groups.stats().bytes, 2 * 3 * 16 * 4);
}

TEST_F(ExchangeGroupsTest, OnlyLocalPiecesNeedNoExchange) {
  ExchangeGroups groups(&workers_);
  EXPECT_OK(groups.Run({Batch(1, 1, 11, 21)}, 4));
  EXPECT_EQ(workers_.counts(Address(1)).exchange_id, 0);
  EXPECT_EQ(workers_.counts(Address(1)).exchange, 0);
}

TEST_F(ExchangeGroupsTest, AMemberWithoutNcclFailsItAndTheSetCoolsDown) {
  workers_.EnableExchanges(Address(0));
  workers_.EnableExchanges(Address(1));  // g2 takes no part
  ExchangeGroups groups(&workers_, absl::Milliseconds(200));
  EXPECT_THAT(
      groups.Run(batches_, 4),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("NCCL exchange among 3"), HasSubstr("'g2'"))));
  EXPECT_EQ(groups.stats().failures, 1);
  const int asked = workers_.counts(Address(0)).exchange;
  // Cooling down: refused without asking any worker.
  EXPECT_THAT(groups.Run(batches_, 4),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("pulled for now")));
  EXPECT_EQ(workers_.counts(Address(0)).exchange, asked);
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 1);
  // Afterwards a fresh communicator id is made.
  workers_.EnableExchanges(Address(2));
  absl::SleepFor(absl::Milliseconds(250));
  ASSERT_OK(groups.Run(batches_, 4));
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 2);
  const auto shares = workers_.exchanges();
  ASSERT_FALSE(shares.empty());
  EXPECT_EQ(shares.back().second.unique_id.substr(0, 5), "id-2-");
}

TEST_F(ExchangeGroupsTest, AFailedMemberNamesItselfAndTheIdIsForgotten) {
  for (int i = 0; i < 3; ++i) workers_.EnableExchanges(Address(i));
  ExchangeGroups groups(&workers_, absl::ZeroDuration());
  ASSERT_OK(groups.Run(batches_, 4));
  workers_.FailNext(Address(1), absl::DeadlineExceededError("peer hung"));
  EXPECT_THAT(groups.Run(batches_, 4),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("'g1'"), HasSubstr("peer hung"))));
  ASSERT_OK(groups.Run(batches_, 4));
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 2)
      << "members aborted their communicator: a fresh id is needed";
}

TEST_F(ExchangeGroupsTest, AFailedMemberGivesUpThePeersWaitingForIt) {
  workers_.EnableExchanges(Address(0));
  workers_.EnableExchanges(Address(2));  // g1 takes no part
  // g0 and g2 would wait in their NCCL group for g1 until their deadline.
  workers_.WaitInExchanges(Address(0), absl::Seconds(60));
  workers_.WaitInExchanges(Address(2), absl::Seconds(60));
  ExchangeGroups groups(&workers_, absl::ZeroDuration());
  const absl::Time start = absl::Now();
  // The failure reported is g1's, not the cancellations it caused.
  EXPECT_THAT(
      groups.Run(batches_, 4),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("'g1'")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "peers waited it out";
  EXPECT_EQ(workers_.counts(Address(0)).exchange, 1);
  EXPECT_EQ(workers_.counts(Address(2)).exchange, 1);
  EXPECT_THAT(workers_.exchanges(), ::testing::IsEmpty());
  EXPECT_EQ(groups.stats().failures, 1);
}

TEST_F(ExchangeGroupsTest, SharesTooLargeForOneNcclGroupArePulled) {
  for (int i = 0; i < 3; ++i) workers_.EnableExchanges(Address(i));
  ExchangeGroups groups(&workers_);
  TransferBatch big = Batch(0, 1, 10, 21);
  big.pieces.resize(kMaxExchangePieces + 1, big.pieces[0]);
  EXPECT_THAT(groups.Run({big}, 4),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("2049 NCCL operations in one group")));
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 0);
  big.pieces.resize(kMaxExchangePieces);  // as many as a worker accepts
  ASSERT_OK(groups.Run({big}, 4));
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 1);
}

TEST_F(ExchangeGroupsTest, AMemberRestartedDuringAnExchangeMakesTheNextAfresh) {
  for (int i = 0; i < 2; ++i) {
    workers_.EnableExchanges(Address(i));
    workers_.TakeTimeInExchanges(Address(i), absl::Milliseconds(200));
  }
  ExchangeGroups groups(&workers_);
  std::thread running([&] { EXPECT_OK(groups.Run({Batch(0, 1, 10, 21)}, 4)); });
  while (workers_.counts(Address(1)).exchange == 0) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  groups.Forget("g1");  // g1 registered again meanwhile
  running.join();
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 1);
  ASSERT_OK(groups.Run({Batch(0, 1, 10, 21)}, 4));
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 2)
      << "the old communicator was used after the restart";
  ASSERT_OK(groups.Run({Batch(0, 1, 10, 21)}, 4));
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 2) << "kept again";
}

TEST_F(ExchangeGroupsTest, ExchangesSharingAWorkerTakeTurns) {
  for (int i = 0; i < 3; ++i) {
    workers_.EnableExchanges(Address(i));
    workers_.TakeTimeInExchanges(Address(i), absl::Milliseconds(20));
  }
  ExchangeGroups groups(&workers_);
  // Three sets, each pair sharing a worker: in any order of turns but one
  // they would wait on each other in a cycle.
  std::vector<std::thread> reshards;
  for (const TransferBatch& batch :
       {Batch(0, 1, 10, 21), Batch(1, 2, 11, 22), Batch(2, 0, 12, 20)}) {
    reshards.emplace_back([&, batch] {
      for (int i = 0; i < 4; ++i) EXPECT_OK(groups.Run({batch}, 4));
    });
  }
  for (std::thread& t : reshards) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(workers_.counts(Address(i)).most_exchanges_at_once, 1)
        << "two exchanges at once on g" << i;
    EXPECT_EQ(workers_.counts(Address(i)).exchange, 8);
  }
  EXPECT_EQ(groups.stats().exchanges, 12);
}

TEST_F(ExchangeGroupsTest, ExchangesAmongOtherWorkersRunAlongside) {
  workers_.AddWorker(Address(3));
  workers_.Hold(Address(3), 23, 64);
  for (int i = 0; i < 4; ++i) {
    workers_.EnableExchanges(Address(i));
    workers_.TakeTimeInExchanges(Address(i), absl::Milliseconds(300));
  }
  ExchangeGroups groups(&workers_);
  std::thread other([&] { EXPECT_OK(groups.Run({Batch(2, 3, 12, 23)}, 4)); });
  EXPECT_OK(groups.Run({Batch(0, 1, 10, 21)}, 4));
  other.join();
  EXPECT_EQ(workers_.most_shares_at_once(), 4) << "one waited for the other";
}

TEST_F(ExchangeGroupsTest, ARestartedMemberMakesItsSetsJoinAfresh) {
  for (int i = 0; i < 3; ++i) workers_.EnableExchanges(Address(i));
  ExchangeGroups groups(&workers_);
  ASSERT_OK(groups.Run(batches_, 4));
  ASSERT_OK(groups.Run({Batch(0, 1, 10, 21)}, 4));
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 2);
  groups.Forget("g2");  // only the three-member set has g2
  ASSERT_OK(groups.Run({Batch(0, 1, 10, 21)}, 4));
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 2) << "kept";
  ASSERT_OK(groups.Run(batches_, 4));
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 3) << "made afresh";
}

TEST_F(ExchangeGroupsTest, ANewMemberIsANewSet) {
  for (int i = 0; i < 3; ++i) workers_.EnableExchanges(Address(i));
  ExchangeGroups groups(&workers_);
  ASSERT_OK(groups.Run({Batch(0, 1, 10, 21)}, 4));
  ASSERT_OK(groups.Run(batches_, 4));  // g2 joins: another communicator
  EXPECT_EQ(workers_.counts(Address(0)).exchange_id, 2);
  const auto shares = workers_.exchanges();
  ASSERT_THAT(shares, SizeIs(5));
  EXPECT_EQ(shares[0].second.ranks, 2);
  EXPECT_EQ(shares[4].second.ranks, 3);
  EXPECT_NE(shares[0].second.unique_id, shares[4].second.unique_id);
}

}  // namespace
}  // namespace tessera
