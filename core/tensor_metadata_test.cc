#include "core/tensor_metadata.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;

Replica Copy(int32_t rank, const std::string& worker, uint64_t id) {
  Replica r;
  r.rank = rank;
  r.worker = worker;
  r.address = worker + ":7071";
  r.shard_id = id;
  return r;
}

TensorMetadata Emb() {
  TensorMetadata meta;
  meta.name = "emb";
  meta.shape = {10, 20};
  meta.dtype = DType::kFloat16;
  meta.version = 3;
  ShardInfo a;
  a.box = Box{{0, 0}, {5, 20}};
  a.replicas.push_back(Copy(0, "w0", 11));
  ShardInfo b;
  b.box = Box{{5, 0}, {5, 20}};
  b.replicas.push_back(Copy(1, "w1", 12));
  b.replicas[0].device.kind = Device::Kind::kCuda;
  b.replicas[0].device.index = 2;
  meta.shards = {a, b};
  return meta;
}

// Shard 0 of `meta` held by three replicas, on w0, w1 and w2.
TensorMetadata Replicated() {
  TensorMetadata meta = Emb();
  meta.shards[0].replicas = {Copy(0, "w0", 11), Copy(1, "w1", 21),
                             Copy(2, "w2", 31)};
  meta.capabilities = {{"w0", "cap0"}, {"w1", "cap1"}, {"w2", "cap2"}};
  return meta;
}

std::vector<std::string> Workers(const ShardLocations& locations) {
  std::vector<std::string> out;
  for (const ShardLocation& l : locations) out.push_back(l.worker);
  return out;
}

TEST(TensorMetadataTest, SizesFollowShapeAndDType) {
  const TensorMetadata meta = Emb();
  EXPECT_EQ(meta.NumElements(), 200);
  EXPECT_EQ(meta.ByteSize(), 400);
}

TEST(TensorMetadataTest, BoxesKeepSpecOrder) {
  EXPECT_THAT(Emb().Boxes(),
              ElementsAre(Box{{0, 0}, {5, 20}}, Box{{5, 0}, {5, 20}}));
}

TEST(TensorMetadataTest, PlacementsAndHandlesPrint) {
  const TensorMetadata meta = Emb();
  EXPECT_EQ(ShownReplica(meta.shards[0]).PlacementString(), "rank:0/cpu");
  EXPECT_EQ(ShownReplica(meta.shards[1]).PlacementString(), "rank:1/cuda:2");
  EXPECT_EQ(meta.HandleString(1), "emb@v3#12");
}

TEST(TensorMetadataTest, OneReplicaIsReadAndWrittenThere) {
  TensorMetadata meta = Emb();
  meta.capabilities["w1"] = "cap1";
  const ShardLocations reads = ReadLocations(meta, 1);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].replica, 0u);
  EXPECT_EQ(reads[0].worker, "w1");
  EXPECT_EQ(reads[0].address, "w1:7071");
  EXPECT_EQ(reads[0].shard_id, 12u);
  EXPECT_TRUE(reads[0].available);
  EXPECT_EQ(reads[0].capability, "cap1");
  const ShardLocations writes = WriteLocations(meta, 1);
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0].worker, "w1");
  EXPECT_EQ(writes[0].shard_id, 12u);
  EXPECT_EQ(writes[0].capability, "cap1");
  // No capability for w0: none presented.
  EXPECT_EQ(ReadLocations(meta, 0)[0].capability, "");
}

TEST(TensorMetadataTest, AnUnavailableReplicaIsStillListedForReads) {
  TensorMetadata meta = Emb();
  meta.shards[0].replicas[0].available = false;
  const ShardLocations reads = ReadLocations(meta, 0);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].worker, "w0");
  EXPECT_FALSE(reads[0].available);
  EXPECT_FALSE(ShownReplica(meta.shards[0]).available);
}

TEST(TensorMetadataTest, ReadsTryAvailableReplicasFirstInReplicaOrder) {
  TensorMetadata meta = Replicated();
  EXPECT_THAT(Workers(ReadLocations(meta, 0)), ElementsAre("w0", "w1", "w2"));
  meta.shards[0].replicas[0].available = false;
  const ShardLocations reads = ReadLocations(meta, 0);
  EXPECT_THAT(Workers(reads), ElementsAre("w1", "w2", "w0"));
  EXPECT_EQ(reads[0].replica, 1u);
  EXPECT_EQ(reads[0].shard_id, 21u);
  EXPECT_EQ(reads[0].capability, "cap1");
  EXPECT_FALSE(reads[2].available);
  EXPECT_EQ(reads[2].replica, 0u);
}

TEST(TensorMetadataTest, ReadsGoToTheNearestReplica) {
  TensorMetadata meta = Replicated();  // w0, w1, w2
  auto order = [&](std::map<std::string, ReplicaNearness> near) {
    ShardLocations reads = ReadLocations(meta, 0);
    NearestFirst(&reads,
                 [&](const ShardLocation& at) { return near[at.worker]; });
    return Workers(reads);
  };
  // Same host beats same zone, which beats fewer bytes in flight.
  EXPECT_THAT(order({{"w0", {false, true, 0}}, {"w2", {true, false, 900}}}),
              ElementsAre("w2", "w0", "w1"));
  EXPECT_THAT(order({{"w1", {false, true, 50}}}),
              ElementsAre("w1", "w0", "w2"));
  EXPECT_THAT(order({{"w0", {false, false, 300}},
                     {"w1", {false, false, 200}},
                     {"w2", {false, false, 100}}}),
              ElementsAre("w2", "w1", "w0"));
  // Ties keep replica order; an unavailable replica stays last however near.
  EXPECT_THAT(order({}), ElementsAre("w0", "w1", "w2"));
  meta.shards[0].replicas[1].available = false;
  EXPECT_THAT(order({{"w1", {true, true, 0}}}), ElementsAre("w0", "w2", "w1"));
}

TEST(TensorMetadataTest, ClientsWriteTheFirstReplicaOnly) {
  // The coordinator forwards the bytes to the others at the commit.
  TensorMetadata meta = Replicated();
  meta.shards[0].replicas[1].available = false;
  const ShardLocations writes = WriteLocations(meta, 0);
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0].worker, "w0");
  EXPECT_EQ(writes[0].replica, 0u);
  EXPECT_EQ(writes[0].shard_id, meta.shards[0].replicas[0].shard_id);
  EXPECT_EQ(writes[0].capability, "cap0");
}

TEST(TensorMetadataTest, ShownReplicaIsTheFirstAvailable) {
  TensorMetadata meta = Replicated();
  EXPECT_EQ(ShownReplica(meta.shards[0]).worker, "w0");
  EXPECT_EQ(meta.HandleString(0), "emb@v3#11");
  meta.shards[0].replicas[0].available = false;
  EXPECT_EQ(ShownReplica(meta.shards[0]).worker, "w1");
  EXPECT_EQ(meta.HandleString(0), "emb@v3#21");
  for (Replica& r : meta.shards[0].replicas) r.available = false;
  EXPECT_EQ(ShownReplica(meta.shards[0]).worker, "w0");
}

TEST(TensorMetadataTest, AShardWithoutReplicasShowsAsUnavailableNowhere) {
  const ShardInfo nowhere;
  EXPECT_FALSE(ShownReplica(nowhere).available);
  EXPECT_EQ(ShownReplica(nowhere).worker, "");
}

}  // namespace
}  // namespace tessera
