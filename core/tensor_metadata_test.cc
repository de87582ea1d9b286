#include "core/tensor_metadata.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;

TensorMetadata Emb() {
  TensorMetadata meta;
  meta.name = "emb";
  meta.shape = {10, 20};
  meta.dtype = DType::kFloat16;
  meta.version = 3;
  ShardInfo a;
  a.box = Box{{0, 0}, {5, 20}};
  a.rank = 0;
  a.worker = "w0";
  a.shard_id = 11;
  ShardInfo b;
  b.box = Box{{5, 0}, {5, 20}};
  b.rank = 1;
  b.device.kind = Device::Kind::kCuda;
  b.device.index = 2;
  b.worker = "w1";
  b.shard_id = 12;
  meta.shards = {a, b};
  return meta;
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
  EXPECT_EQ(meta.shards[0].PlacementString(), "rank:0/cpu");
  EXPECT_EQ(meta.shards[1].PlacementString(), "rank:1/cuda:2");
  EXPECT_EQ(meta.HandleString(1), "emb@v3#12");
}

}  // namespace
}  // namespace tessera
