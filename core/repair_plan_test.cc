#include "core/repair_plan.h"

#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

Replica On(const std::string& worker, bool available = true) {
  Replica r;
  r.worker = worker;
  r.available = available;
  return r;
}

// Float32 shards of 4 elements, replicas on the workers given.
TensorMetadata Tensor(std::vector<std::vector<Replica>> shards) {
  TensorMetadata meta;
  meta.name = "t";
  meta.dtype = DType::kFloat32;
  meta.shape = {static_cast<int64_t>(4 * shards.size())};
  for (size_t i = 0; i < shards.size(); ++i) {
    ShardInfo& shard = meta.shards.emplace_back();
    shard.box = Box({static_cast<int64_t>(4 * i)}, {4});
    for (const Replica& r : shards[i]) shard.replicas.push_back(r);
  }
  return meta;
}

int CandidateOf(const std::string& worker) { return worker[1] - '0'; }

TEST(RepairPlanTest, LostAndDrainingReplicasLeaveAndAStayingOneIsTheSource) {
  const TensorMetadata meta = Tensor({
      {On("w0"), On("w1")},                // whole: nothing to do
      {On("w2", false), On("w3")},         // lost on w2
      {On("w4"), On("w5")},                // w4 drains, still readable
      {On("w4"), On("w6", false)},         // drains and lost: copy from w4
      {On("w6", false), On("w7", false)},  // nothing to copy from
  });
  const RepairNeeds needs = FindRepairs(
      meta, CandidateOf, [](const std::string& w) { return w == "w4"; });
  EXPECT_EQ(needs.shards_short, 1);
  ASSERT_EQ(needs.shards.size(), 3u);

  EXPECT_EQ(needs.shards[0].shard, 1u);
  EXPECT_THAT(needs.shards[0].leaving, ElementsAre(0u));
  EXPECT_THAT(needs.shards[0].need.kept, ElementsAre(3));
  EXPECT_EQ(needs.shards[0].need.missing, 1);
  EXPECT_EQ(needs.shards[0].need.bytes, 16);
  EXPECT_EQ(needs.shards[0].source, 1u);

  // A draining replica leaves, and the one that stays is read.
  EXPECT_EQ(needs.shards[1].shard, 2u);
  EXPECT_THAT(needs.shards[1].leaving, ElementsAre(0u));
  EXPECT_THAT(needs.shards[1].need.kept, ElementsAre(5));
  EXPECT_EQ(needs.shards[1].source, 1u);

  // Only the draining replica can be read: it is the source, and both go.
  EXPECT_EQ(needs.shards[2].shard, 3u);
  EXPECT_THAT(needs.shards[2].leaving, ElementsAre(0u, 1u));
  EXPECT_THAT(needs.shards[2].need.kept, IsEmpty());
  EXPECT_EQ(needs.shards[2].need.missing, 2);
  EXPECT_EQ(needs.shards[2].source, 0u);
}

Replica Mirror(const std::string& worker, bool available = true) {
  Replica r = On(worker, available);
  r.mirror = true;
  return r;
}

// A leaving replica's place goes to a mirror on a worker that stays, made
// a replica where it is: nothing copied. A mirror that is unavailable or
// drains takes no place; without one the replica is copied anew.
TEST(RepairPlanTest, AStayingMirrorTakesALeavingReplicasPlace) {
  const TensorMetadata meta = Tensor({
      {On("w0"), Mirror("w1"), Mirror("w2")},            // w0 drains
      {On("w3", false), On("w4"), Mirror("w1", false)},  // w3 lost
      {On("w0"), On("w3", false), Mirror("w1"), Mirror("w2")},
  });
  const RepairNeeds needs = FindRepairs(
      meta, CandidateOf, [](const std::string& w) { return w == "w0"; });
  EXPECT_EQ(needs.shards_short, 0);
  ASSERT_EQ(needs.shards.size(), 3u);
  // Shard 0: w2's mirror (the last) takes the place; nothing to copy.
  EXPECT_THAT(needs.shards[0].promoted,
              ElementsAre(std::make_pair(size_t{0}, size_t{2})));
  EXPECT_THAT(needs.shards[0].leaving, IsEmpty());
  EXPECT_EQ(needs.shards[0].need.missing, 0);
  // Shard 1: its mirror is unavailable: w3's replica is copied anew, from
  // the replica on w4.
  EXPECT_THAT(needs.shards[1].promoted, IsEmpty());
  EXPECT_THAT(needs.shards[1].leaving, ElementsAre(0u));
  EXPECT_EQ(needs.shards[1].need.missing, 1);
  EXPECT_EQ(needs.shards[1].source, 1u);
  // Shard 2: both replicas leave; both mirrors take their places.
  EXPECT_THAT(needs.shards[2].promoted,
              ElementsAre(std::make_pair(size_t{1}, size_t{3}),
                          std::make_pair(size_t{0}, size_t{2})));
  EXPECT_THAT(needs.shards[2].leaving, IsEmpty());
}

// With its replica lost, a shard whose only available copy is a mirror on
// a draining worker is copied from that mirror (a mirror that stays is
// preferred); the draining worker takes no place.
TEST(RepairPlanTest, AMirrorOnADrainingWorkerIsASourceOfLastResort) {
  const TensorMetadata meta = Tensor({
      {On("w1", false), Mirror("w0")},                // w0 drains
      {On("w1", false), Mirror("w0"), Mirror("w2")},  // w2 stays
      {On("w1", false), Mirror("w0", false)},         // nothing to copy
  });
  const RepairNeeds needs = FindRepairs(
      meta, CandidateOf, [](const std::string& w) { return w == "w0"; });
  EXPECT_EQ(needs.shards_short, 1);
  ASSERT_EQ(needs.shards.size(), 2u);
  EXPECT_EQ(needs.shards[0].shard, 0u);
  EXPECT_THAT(needs.shards[0].leaving, ElementsAre(0u));
  EXPECT_THAT(needs.shards[0].promoted, IsEmpty());
  EXPECT_THAT(needs.shards[0].need.kept, IsEmpty());
  EXPECT_EQ(needs.shards[0].need.missing, 1);
  EXPECT_EQ(needs.shards[0].source, 1u);
  // The mirror on w2 stays: it takes the lost replica's place.
  EXPECT_EQ(needs.shards[1].shard, 1u);
  EXPECT_THAT(needs.shards[1].promoted,
              ElementsAre(std::make_pair(size_t{0}, size_t{2})));
  EXPECT_THAT(needs.shards[1].leaving, IsEmpty());
}

TEST(RepairPlanTest, AWholeTensorNeedsNothing) {
  const RepairNeeds needs =
      FindRepairs(Tensor({{On("w0")}, {On("w1"), On("w2")}}), CandidateOf,
                  [](const std::string&) { return false; });
  EXPECT_THAT(needs.shards, IsEmpty());
  EXPECT_EQ(needs.shards_short, 0);
}

}  // namespace
}  // namespace tessera
