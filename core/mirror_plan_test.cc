#include "core/mirror_plan.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

Replica On(const std::string& worker, bool mirror = false,
           bool available = true) {
  Replica r;
  r.worker = worker;
  r.mirror = mirror;
  r.available = available;
  return r;
}

// Two shards, one replica each: shard 0 on a, shard 1 on b.
TensorMetadata TwoShards() {
  TensorMetadata meta;
  meta.name = "w";
  meta.shape = {4};
  for (const char* w : {"a", "b"}) {
    ShardInfo& s = meta.shards.emplace_back();
    s.box = Box({0}, {2});
    s.replicas.push_back(On(w));
  }
  return meta;
}

TEST(MirrorPlanTest, TheGroupIsTheReadyMatchingWorkers) {
  const LabelSelector inference = *ParseLabelSelector("role=inference");
  std::vector<MirrorCandidate> all = {
      {"a", {{"role", "trainer"}}, true, WorkerState::kReady},
      {"b", {{"role", "inference"}}, true, WorkerState::kReady},
      {"c", {{"role", "inference"}, {"zone", "z1"}}, true, WorkerState::kReady},
      {"d", {{"role", "inference"}}, false, WorkerState::kDead},
      {"e", {{"role", "inference"}}, true, WorkerState::kCordoned},
      {"f", {{"role", "inference"}}, true, WorkerState::kDraining},
  };
  EXPECT_THAT(MirrorGroup(inference, all), ElementsAre("b", "c"));
  EXPECT_THAT(MirrorGroup(*ParseLabelSelector("all"), all),
              ElementsAre("a", "b", "c"));
  EXPECT_THAT(MirrorGroup(*ParseLabelSelector("role=inference,zone=z1"), all),
              ElementsAre("c"));
}

// Every member gets a copy of every shard it holds no replica of, filled
// from the replica.
TEST(MirrorPlanTest, MembersWithoutACopyGetOne) {
  const std::vector<ShardMirrors> plan =
      PlanMirrors(TwoShards(), {"b", "c", "d"});
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].shard, 0u);
  EXPECT_THAT(plan[0].added, ElementsAre("b", "c", "d"));
  EXPECT_EQ(plan[0].source, 0u);
  EXPECT_THAT(plan[0].dropped, IsEmpty());
  EXPECT_THAT(plan[1].added, ElementsAre("c", "d"));  // b holds shard 1
}

// Mirrors of workers that left the group, or lost their copy, go; a member
// that lost its copy gets a new one; nothing changes when all is in place.
TEST(MirrorPlanTest, MirrorsOutsideTheGroupOrLostAreDropped) {
  TensorMetadata meta = TwoShards();
  meta.shards[0].replicas.push_back(On("c", true));
  meta.shards[0].replicas.push_back(On("d", true, /*available=*/false));
  meta.shards[1].replicas.push_back(On("c", true));
  EXPECT_THAT(PlanMirrors(meta, {"c"}).size(), 1u);  // only d's goes
  const std::vector<ShardMirrors> plan = PlanMirrors(meta, {"c", "d"});
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_THAT(plan[0].dropped, ElementsAre(2));
  EXPECT_THAT(plan[0].added, ElementsAre("d"));
  EXPECT_THAT(plan[1].dropped, IsEmpty());
  EXPECT_THAT(plan[1].added, ElementsAre("d"));
  EXPECT_THAT(PlanMirrors(meta, {}).front().dropped, ElementsAre(1, 2));
  meta.shards[0].replicas.pop_back();
  EXPECT_THAT(PlanMirrors(meta, {"c"}), IsEmpty());
}

// A shard with no available replica keeps its available mirrors, in the
// group or not: they may be its last bytes, which a repair copies first.
// Once a replica is available again, the mirror outside the group goes.
TEST(MirrorPlanTest, MirrorsOutsideTheGroupStayWhileNoReplicaIsAvailable) {
  TensorMetadata meta = TwoShards();
  meta.shards[0].replicas[0].available = false;  // a lost, b drains
  meta.shards[0].replicas.push_back(On("b", true));
  std::vector<ShardMirrors> plan = PlanMirrors(meta, {"c"});
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_THAT(plan[0].dropped, IsEmpty());
  EXPECT_THAT(plan[0].added, ElementsAre("c"));
  EXPECT_EQ(plan[0].source, 1u);               // b's mirror
  meta.shards[0].replicas.push_back(On("c"));  // the repair's new replica
  plan = PlanMirrors(meta, {"c"});
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_THAT(plan[0].dropped, ElementsAre(1u));
  EXPECT_THAT(plan[0].added, IsEmpty());
}

// New mirrors are filled from a replica, else a mirror; a shard with no
// available copy gets none.
TEST(MirrorPlanTest, SourcesAreAvailableCopiesReplicasFirst) {
  TensorMetadata meta = TwoShards();
  meta.shards[0].replicas[0].available = false;
  meta.shards[0].replicas.push_back(On("c", true));
  meta.shards[1].replicas[0].available = false;
  const std::vector<ShardMirrors> plan = PlanMirrors(meta, {"c", "e"});
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].shard, 0u);
  EXPECT_EQ(plan[0].source, 1u);  // the mirror on c: the replica is gone
  EXPECT_THAT(plan[0].added, ElementsAre("e"));
  meta.shards[0].replicas.push_back(On("f"));  // an available replica
  EXPECT_EQ(PlanMirrors(meta, {"c", "e"})[0].source, 2u);
}

}  // namespace
}  // namespace tessera
