#include "core/replica_placement.h"

#include <set>
#include <string>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ReplicaCandidate Worker(std::string name, std::string zone,
                        int64_t bytes_used = 0, int64_t capacity = 0,
                        WorkerState state = WorkerState::kReady) {
  ReplicaCandidate w;
  w.name = std::move(name);
  w.zone = std::move(zone);
  w.bytes_used = bytes_used;
  w.capacity_bytes = capacity;
  w.state = state;
  return w;
}

std::vector<ShardToPlace> Shards(std::vector<int> firsts, int64_t bytes) {
  std::vector<ShardToPlace> shards;
  for (int first : firsts) shards.push_back({first, bytes});
  return shards;
}

TEST(ReplicaPlacementTest, OneReplicaIsTheSpecsPlacementAlone) {
  ASSERT_OK_AND_ASSIGN(auto placed,
                       PlaceReplicas({Worker("w0", "a"), Worker("w1", "b")},
                                     Shards({1, 0}, 100), 1));
  EXPECT_THAT(placed, ElementsAre(ElementsAre(1), ElementsAre(0)));
}

TEST(ReplicaPlacementTest, ReplicasGoToZonesTheShardDoesNotUseFirst) {
  // w1 shares zone a with the first replica and is idle; w2 (zone b) is the
  // busiest, but a new zone comes before load.
  const std::vector<ReplicaCandidate> workers = {
      Worker("w0", "a"), Worker("w1", "a"), Worker("w2", "b", 1 << 20)};
  ASSERT_OK_AND_ASSIGN(auto placed,
                       PlaceReplicas(workers, Shards({0}, 100), 2));
  EXPECT_THAT(placed, ElementsAre(ElementsAre(0, 2)));
}

TEST(ReplicaPlacementTest, EveryShardSpansAsManyZonesAsTheClusterHas) {
  // Six workers in three zones, R=3: every shard on three zones.
  std::vector<ReplicaCandidate> workers;
  for (int w = 0; w < 6; ++w) {
    workers.push_back(
        Worker("w" + std::to_string(w), "zone" + std::to_string(w % 3)));
  }
  ASSERT_OK_AND_ASSIGN(
      auto placed,
      PlaceReplicas(workers, Shards({0, 1, 2, 3, 4, 5, 0, 1}, 1000), 3));
  for (const std::vector<int>& holders : placed) {
    ASSERT_EQ(holders.size(), 3u);
    std::set<std::string> zones;
    std::set<int> distinct(holders.begin(), holders.end());
    for (int w : holders) zones.insert(workers[w].zone);
    EXPECT_EQ(distinct.size(), 3u);
    EXPECT_EQ(zones.size(), 3u);
  }
}

TEST(ReplicaPlacementTest, FewerZonesThanReplicasFillsTheLeastUsedWorkers) {
  // Two zones, R=3: the third replica goes to a used zone, on its least used
  // worker.
  const std::vector<ReplicaCandidate> workers = {
      Worker("w0", "a"), Worker("w1", "a", 500), Worker("w2", "b"),
      Worker("w3", "a", 100)};
  ASSERT_OK_AND_ASSIGN(auto placed, PlaceReplicas(workers, Shards({0}, 10), 3));
  EXPECT_THAT(placed, ElementsAre(ElementsAre(0, 2, 3)));
}

TEST(ReplicaPlacementTest, WithoutZonesEachWorkerIsItsOwnAndLoadBalances) {
  // Four workers, no zones, six shards all first on w0, R=2: the second
  // replicas spread evenly over w1..w3 (least used first, ties by name).
  const std::vector<ReplicaCandidate> workers = {
      Worker("w0", ""), Worker("w1", ""), Worker("w2", ""), Worker("w3", "")};
  ASSERT_OK_AND_ASSIGN(
      auto placed, PlaceReplicas(workers, Shards({0, 0, 0, 0, 0, 0}, 10), 2));
  std::vector<int> count(4);
  for (const auto& holders : placed) {
    ASSERT_EQ(holders.size(), 2u);
    EXPECT_EQ(holders[0], 0);
    ++count[holders[1]];
  }
  EXPECT_THAT(count, ElementsAre(0, 2, 2, 2));
  EXPECT_THAT(placed[0], ElementsAre(0, 1));
  EXPECT_THAT(placed[1], ElementsAre(0, 2));
  EXPECT_THAT(placed[2], ElementsAre(0, 3));
}

TEST(ReplicaPlacementTest, CordonedDrainingAndDeadWorkersGetNoReplicas) {
  const std::vector<ReplicaCandidate> workers = {
      Worker("w0", "a"), Worker("w1", "b", 0, 0, WorkerState::kCordoned),
      Worker("w2", "c", 0, 0, WorkerState::kDraining),
      Worker("w3", "d", 0, 0, WorkerState::kDead), Worker("w4", "a", 1 << 30)};
  ASSERT_OK_AND_ASSIGN(auto placed,
                       PlaceReplicas(workers, Shards({0, 0}, 10), 2));
  EXPECT_THAT(placed, ElementsAre(ElementsAre(0, 4), ElementsAre(0, 4)));
  // With R=3 only two workers can hold a shard.
  EXPECT_THAT(
      PlaceReplicas(workers, Shards({0}, 10), 3),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("replicas")));
}

TEST(ReplicaPlacementTest, MoreReplicasThanWorkersIsRefused) {
  const std::vector<ReplicaCandidate> workers = {Worker("w0", "a"),
                                                 Worker("w1", "b")};
  EXPECT_THAT(PlaceReplicas(workers, Shards({0}, 10), 3),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("replicas: --replicas=3 needs 3")));
}

TEST(ReplicaPlacementTest, CapacityLimitsAreKeptAcrossTheWholeTensor) {
  // w1 has room for one 60-byte replica, w2 for any: the second shard's
  // replica skips the full w1 even though w1 is on a new zone.
  const std::vector<ReplicaCandidate> workers = {
      Worker("w0", "a"), Worker("w1", "b", 0, 100), Worker("w2", "a", 10)};
  ASSERT_OK_AND_ASSIGN(auto placed,
                       PlaceReplicas(workers, Shards({0, 0}, 60), 2));
  EXPECT_THAT(placed, ElementsAre(ElementsAre(0, 1), ElementsAre(0, 2)));
  // Nobody with room: RESOURCE_EXHAUSTED naming capacity.
  const std::vector<ReplicaCandidate> full = {Worker("w0", "a"),
                                              Worker("w1", "b", 90, 100)};
  EXPECT_THAT(
      PlaceReplicas(full, Shards({0}, 60), 2),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("capacity")));
}

TEST(ReplicaPlacementTest, TheFirstReplicasBytesCountTowardsItsWorkersLoad) {
  // Shards first on w1 make it busier than w2 before any further replica
  // is placed, so w0's shards get their second replicas on w2.
  const std::vector<ReplicaCandidate> workers = {
      Worker("w0", ""), Worker("w1", ""), Worker("w2", "")};
  ASSERT_OK_AND_ASSIGN(auto placed,
                       PlaceReplicas(workers, Shards({1, 1, 1, 0}, 100), 2));
  EXPECT_EQ(placed[3][1], 2);
}

TEST(ReplicaPlacementTest, BadCountsAndFirstsAreRefused) {
  const std::vector<ReplicaCandidate> workers = {Worker("w0", "a")};
  for (int r : {0, -1, kMaxReplicas + 1}) {
    EXPECT_THAT(
        PlaceReplicas(workers, Shards({0}, 1), r),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--replicas=")));
  }
  EXPECT_THAT(PlaceReplicas(workers, Shards({1}, 1), 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PlaceReplicas(workers, Shards({-1}, 1), 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PlaceReplicas(workers, {{0, -5}}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ReplicaPlacementTest, HugeSizesDoNotOverflowTheCapacityCheck) {
  const std::vector<ReplicaCandidate> workers = {
      Worker("w0", "a"), Worker("w1", "b", INT64_MAX - 10, INT64_MAX)};
  EXPECT_THAT(PlaceReplicas(workers, Shards({0}, INT64_MAX), 2),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(ReplicaPlacementTest, ZonesAreChecked) {
  EXPECT_THAT(CheckZone("us-east-1a"), IsOk());
  EXPECT_THAT(CheckZone("topology.kubernetes.io/zone:eu-west"), IsOk());
  for (const char* bad : {"", "has space", "semi;colon", "zone\n"}) {
    EXPECT_THAT(CheckZone(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("--zone=")))
        << bad;
  }
  EXPECT_THAT(CheckZone(std::string(65, 'z')),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ReplicaPlacementTest, StatesHaveTheContractsNames) {
  EXPECT_EQ(WorkerStateName(WorkerState::kReady), "ready");
  EXPECT_EQ(WorkerStateName(WorkerState::kCordoned), "cordoned");
  EXPECT_EQ(WorkerStateName(WorkerState::kDraining), "draining");
  EXPECT_EQ(WorkerStateName(WorkerState::kDead), "dead");
}

TEST(ReplicaRepairTest, ANewReplicaGoesToAZoneTheShardDoesNotUseYet) {
  // w0 (zone a) died; the shard keeps w1 (zone b). w2 shares b, w3 is in c.
  const std::vector<ReplicaCandidate> workers = {
      Worker("w0", "a", 0, 0, WorkerState::kDead), Worker("w1", "b"),
      Worker("w2", "b"), Worker("w3", "c", 500)};
  ASSERT_OK_AND_ASSIGN(auto placed, PlaceRepairs(workers, {{{1}, 1, 100}}));
  EXPECT_THAT(placed, ElementsAre(ElementsAre(3)));
}

TEST(ReplicaRepairTest, DeadDrainingAndCordonedWorkersGetNothing) {
  const std::vector<ReplicaCandidate> workers = {
      Worker("w0", "a", 0, 0, WorkerState::kDead),
      Worker("w1", "b", 0, 0, WorkerState::kDraining),
      Worker("w2", "c", 0, 0, WorkerState::kCordoned), Worker("w3", "d", 900),
      Worker("w4", "d", 800)};
  // A shard of R=3 that lost two replicas keeps w3: one new replica fits
  // (w4), the third waits for another ready worker.
  ASSERT_OK_AND_ASSIGN(auto placed, PlaceRepairs(workers, {{{3}, 2, 10}}));
  EXPECT_THAT(placed, ElementsAre(ElementsAre(4)));
}

TEST(ReplicaRepairTest, LostShardsSpreadOverTheLeastUsedWorkersWithRoom) {
  // A drain of w0 with R=1: nothing is kept; each shard goes where the
  // least is used, and a worker without room gets none.
  const std::vector<ReplicaCandidate> workers = {
      Worker("w0", "a", 300, 0, WorkerState::kDraining), Worker("w1", "a"),
      Worker("w2", "a"), Worker("w3", "a", 0, /*capacity=*/50)};
  ASSERT_OK_AND_ASSIGN(
      auto placed,
      PlaceRepairs(workers, {{{}, 1, 100}, {{}, 1, 100}, {{}, 1, 100}}));
  EXPECT_THAT(placed,
              ElementsAre(ElementsAre(1), ElementsAre(2), ElementsAre(1)));
}

TEST(ReplicaRepairTest, NoReadyWorkerLeavesTheShardForLater) {
  const std::vector<ReplicaCandidate> workers = {
      Worker("w0", "a", 0, 0, WorkerState::kDead), Worker("w1", "b")};
  ASSERT_OK_AND_ASSIGN(auto placed, PlaceRepairs(workers, {{{1}, 1, 10}}));
  EXPECT_THAT(placed, ElementsAre(ElementsAre()));
}

TEST(ReplicaRepairTest, BadInputIsRefused) {
  const std::vector<ReplicaCandidate> workers = {Worker("w0", "a")};
  EXPECT_THAT(PlaceRepairs(workers, {{{5}, 1, 10}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PlaceRepairs(workers, {{{}, -1, 10}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PlaceRepairs(workers, {{{}, 1, -10}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tessera
