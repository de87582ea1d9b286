// PieceMover against in-memory workers (FakeWorkerControl): pieces go in
// one batch per pair of workers, a failed source's pieces go again from
// another replica, and a commit's copies fan out or chain.
#include "coordinator/piece_mover.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/coordinator_testutil.h"
#include "coordinator/fake_worker_control.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::FakeClock;
using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::tessera::testing::TestWorker;
using ::tessera::testing::WorkerAddress;
using ::testing::ElementsAre;
using ::testing::Pair;

constexpr int64_t kRows = 8;  // int8 rows of one byte

Replica On(int worker, uint64_t shard_id) {
  Replica r;
  r.rank = worker;
  r.worker = absl::StrCat("w", worker);
  r.address = WorkerAddress(worker);
  r.shard_id = shard_id;
  return r;
}

// One shard of the whole tensor with a replica on each of `replicas`
// (worker, shard id).
TensorMetadata OneShard(std::vector<std::pair<int, uint64_t>> replicas) {
  TensorMetadata meta;
  meta.name = "t";
  meta.version = 1;
  meta.shape = {kRows};
  meta.dtype = DType::kInt8;
  ShardInfo& shard = meta.shards.emplace_back();
  shard.box = Box({0}, {kRows});
  for (const auto& [worker, id] : replicas)
    shard.replicas.push_back(On(worker, id));
  return meta;
}

std::vector<std::pair<std::string, std::string>> Pairs(
    const std::vector<TransferBatch>& transfers) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const TransferBatch& t : transfers)
    out.emplace_back(t.src_worker, t.dst_worker);
  return out;
}

class PieceMoverTest : public ::testing::Test {
 protected:
  PieceMoverTest() : registry_(absl::Seconds(5), clock_.AsClock()) {
    for (int i = 0; i < 4; ++i) {
      workers_.AddWorker(WorkerAddress(i));
      EXPECT_THAT(registry_.Register(TestWorker(i)).status(), IsOk());
    }
  }

  PieceMover Mover(ReplicaForward forward = ReplicaForward::kFanOut) {
    return PieceMover(&registry_, &workers_, &progress_, forward);
  }

  FakeClock clock_;
  WorkerRegistry registry_;
  FakeWorkerControl workers_;
  MoveProgressBoard progress_;
};

ReshardPlan WholeShard() {
  ReshardPlan plan;
  ReshardPiece& piece = plan.pieces.emplace_back();
  piece.global = Box({0}, {kRows});
  piece.bytes = kRows;
  return plan;
}

TEST_F(PieceMoverTest, APieceWhoseSourceFailsGoesAgainFromAnotherReplica) {
  const TensorMetadata from = OneShard({{0, 1}, {1, 2}});
  const TensorMetadata to = OneShard({{2, 3}});
  workers_.Hold(WorkerAddress(0), 1, kRows);
  workers_.Hold(WorkerAddress(1), 2, kRows);
  workers_.Hold(WorkerAddress(2), 3, kRows);
  workers_.FailNext(WorkerAddress(0), absl::UnavailableError("gone"));
  PieceMover mover = Mover();
  EXPECT_THAT(mover.MoveFromAnyReplica(from, to, WholeShard()), IsOk());
  EXPECT_THAT(Pairs(workers_.transfers()), ElementsAre(Pair("w1", "w2")));
  EXPECT_FALSE(progress_.Progress("t").running);  // counted only meanwhile
}

TEST_F(PieceMoverTest, APieceWithNoOtherReplicaFailsNamingThePair) {
  const TensorMetadata from = OneShard({{0, 1}});
  const TensorMetadata to = OneShard({{2, 3}});
  workers_.Hold(WorkerAddress(0), 1, kRows);
  workers_.Hold(WorkerAddress(2), 3, kRows);
  workers_.FailNext(WorkerAddress(0), absl::UnavailableError("gone"));
  std::vector<size_t> failed;
  MoveTally tally;
  PieceMover mover = Mover();
  EXPECT_THAT(
      mover.Move(from, to, WholeShard(), &tally, &failed),
      StatusIs(absl::StatusCode::kUnavailable,
               ::testing::HasSubstr("from worker 'w0' to worker 'w2'")));
  EXPECT_THAT(failed, ElementsAre(0u));
  EXPECT_EQ(tally.done.load(), 0);  // nothing landed
  EXPECT_THAT(mover.MoveFromAnyReplica(from, to, WholeShard()),
              IsOk());  // FailNext is spent: the same source now works
}

TEST_F(PieceMoverTest, ACommitsCopiesFanOutFromTheFirstOrChain) {
  const TensorMetadata written = OneShard({{0, 1}, {1, 2}, {2, 3}, {3, 4}});
  for (int i = 0; i < 4; ++i) workers_.Hold(WorkerAddress(i), i + 1, kRows);
  PieceMover fan_out = Mover(ReplicaForward::kFanOut);
  ASSERT_THAT(fan_out.ForwardReplicas(written), IsOk());
  std::vector<std::pair<std::string, std::string>> pairs =
      Pairs(workers_.transfers());
  std::sort(pairs.begin(), pairs.end());
  EXPECT_THAT(
      pairs, ElementsAre(Pair("w0", "w1"), Pair("w0", "w2"), Pair("w0", "w3")));

  FakeWorkerControl chained_workers;
  for (int i = 0; i < 4; ++i) {
    chained_workers.AddWorker(WorkerAddress(i));
    chained_workers.Hold(WorkerAddress(i), i + 1, kRows);
  }
  PieceMover chain(&registry_, &chained_workers, &progress_,
                   ReplicaForward::kChain);
  ASSERT_THAT(chain.ForwardReplicas(written), IsOk());
  // One round after another: each replica from the one before it.
  EXPECT_THAT(
      Pairs(chained_workers.transfers()),
      ElementsAre(Pair("w0", "w1"), Pair("w1", "w2"), Pair("w2", "w3")));
}

// New whole copies of a shard (a repair's, joining mirrors') go as one
// relay in relay mode: its source sends once, each copy passes it on; in
// the other modes each copy pulls from the source.
TEST_F(PieceMoverTest, NewCopiesOfAShardGoAsOneRelay) {
  const TensorMetadata from = OneShard({{0, 1}});
  const TensorMetadata to = OneShard({{0, 1}, {2, 3}, {3, 4}});
  workers_.Hold(WorkerAddress(0), 1, kRows);
  workers_.Hold(WorkerAddress(2), 3, kRows);
  workers_.Hold(WorkerAddress(3), 4, kRows);
  ReshardPlan plan;
  for (size_t copy : {1, 2}) {
    ReshardPiece& piece = plan.pieces.emplace_back(WholeShard().pieces[0]);
    piece.dst_replica = copy;
  }
  PieceMover relay = Mover(ReplicaForward::kRelay);
  ASSERT_THAT(relay.FillCopies(from, to, plan), IsOk());
  std::vector<std::pair<std::string, std::string>> pairs =
      Pairs(workers_.transfers());
  ASSERT_EQ(pairs.size(), 2u);
  for (const TransferBatch& hop : workers_.transfers())
    EXPECT_NE(hop.relay.id, 0u);
  std::sort(pairs.begin(), pairs.end());
  // w0 sends once; the copy it feeds passes the shard on to the other.
  EXPECT_TRUE(pairs == (std::vector<std::pair<std::string, std::string>>{
                           {"w0", "w2"}, {"w2", "w3"}}) ||
              pairs == (std::vector<std::pair<std::string, std::string>>{
                           {"w0", "w3"}, {"w3", "w2"}}))
      << pairs[0].first << ">" << pairs[0].second << " " << pairs[1].first
      << ">" << pairs[1].second;

  FakeWorkerControl fan_workers;
  for (int i : {0, 2, 3}) {
    fan_workers.AddWorker(WorkerAddress(i));
    fan_workers.Hold(WorkerAddress(i), i == 0 ? 1 : i + 1, kRows);
  }
  PieceMover fan_out(&registry_, &fan_workers, &progress_,
                     ReplicaForward::kFanOut);
  ASSERT_THAT(fan_out.FillCopies(from, to, plan), IsOk());
  pairs = Pairs(fan_workers.transfers());
  std::sort(pairs.begin(), pairs.end());
  EXPECT_THAT(pairs, ElementsAre(Pair("w0", "w2"), Pair("w0", "w3")));
}

// Workers whose every Transfer first notes how far the board says the
// tensor's move has got.
class BoardWatchingWorkers : public FakeWorkerControl {
 public:
  explicit BoardWatchingWorkers(const MoveProgressBoard* board)
      : board_(board) {}
  absl::Status Transfer(const TransferBatch& batch, SentBytes* sent) override {
    {
      absl::MutexLock lock(&mu_);
      seen_.push_back(board_->Progress(batch.tensor));
    }
    return FakeWorkerControl::Transfer(batch, sent);
  }
  std::vector<MoveProgress> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  const MoveProgressBoard* const board_;
  absl::Mutex mu_;
  std::vector<MoveProgress> seen_;
};

TEST_F(PieceMoverTest, RelayedCopiesAreCountedOnTheProgressBoard) {
  BoardWatchingWorkers watched(&progress_);
  for (int i : {0, 2, 3}) {
    watched.AddWorker(WorkerAddress(i));
    watched.Hold(WorkerAddress(i), i == 0 ? 1 : i + 1, kRows);
  }
  const TensorMetadata from = OneShard({{0, 1}});
  const TensorMetadata to = OneShard({{0, 1}, {2, 3}, {3, 4}});
  ReshardPlan plan;
  for (size_t copy : {1, 2}) {
    ReshardPiece& piece = plan.pieces.emplace_back(WholeShard().pieces[0]);
    piece.dst_replica = copy;
  }
  PieceMover relay(&registry_, &watched, &progress_, ReplicaForward::kRelay);
  ASSERT_THAT(relay.FillCopies(from, to, plan), IsOk());
  // Each hop ran while the fill was on the board, both copies' bytes to
  // move (the fake lands a hop at once: done is what landed before it).
  const std::vector<MoveProgress> seen = watched.seen();
  ASSERT_EQ(seen.size(), 2u);
  for (const MoveProgress& p : seen) {
    EXPECT_TRUE(p.running);
    EXPECT_EQ(p.bytes_total, 2 * kRows);
    EXPECT_LE(p.bytes_done, kRows);
  }
  EXPECT_FALSE(progress_.Progress("t").running);  // counted only meanwhile
}

// Mirrors are filled after the replicas, each from the first; one that
// fails is reported, not the forward's failure, when the caller asks.
TEST_F(PieceMoverTest, MirrorsFollowTheReplicasAndTheirFailuresAreListed) {
  TensorMetadata written = OneShard({{0, 1}, {1, 2}, {2, 3}, {3, 4}});
  written.shards[0].replicas[2].mirror = true;
  written.shards[0].replicas[3].mirror = true;
  for (int i = 0; i < 4; ++i) workers_.Hold(WorkerAddress(i), i + 1, kRows);
  PieceMover chain = Mover(ReplicaForward::kChain);
  workers_.FailNext(WorkerAddress(3), absl::UnavailableError("unplugged"));
  std::vector<std::pair<size_t, size_t>> failed;
  ASSERT_THAT(chain.ForwardReplicas(written, &failed), IsOk());
  EXPECT_THAT(failed, ElementsAre(Pair(0u, 3u)));
  // The replica first (a round of its own), then the mirrors from w0.
  std::vector<std::pair<std::string, std::string>> pairs =
      Pairs(workers_.transfers());
  EXPECT_THAT(pairs, ElementsAre(Pair("w0", "w1"), Pair("w0", "w2")));
  // Without the list, a mirror's failure is the forward's.
  workers_.FailNext(WorkerAddress(2), absl::UnavailableError("unplugged"));
  EXPECT_THAT(chain.ForwardReplicas(written),
              StatusIs(absl::StatusCode::kUnavailable,
                       ::testing::HasSubstr("mirrors")));
}

}  // namespace
}  // namespace tessera
