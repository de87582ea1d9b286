// The wire forms of a layout spec: the packed enumerable encoding the SDK
// sends, and the errors a malformed one gets.
#include "rpc/convert.h"

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

Placement Rank(int32_t rank) {
  Placement p;
  p.rank = rank;
  return p;
}

Placement Named(const std::string& worker) {
  Placement p;
  p.worker = worker;
  return p;
}

TEST(ConvertTest, EnumerableSpecsTravelPackedAndComeBackEqual) {
  std::vector<Box> boxes;
  std::vector<Placement> placements;
  for (int64_t i = 0; i < 6; ++i) {
    boxes.push_back(Box{{i * 2, 0}, {2, 5}});
    placements.push_back(i % 3 == 0 ? Named("w1") : Rank(i % 2));
  }
  v1::ShardingSpec proto;
  LayoutSpecToProto(LayoutSpec::Enumerable(boxes, placements), &proto);
  ASSERT_TRUE(proto.enumerable().has_packed());
  EXPECT_EQ(proto.enumerable().shards_size(), 0);
  EXPECT_EQ(proto.enumerable().packed().placements_size(), 3);
  EXPECT_EQ(proto.enumerable().packed().offsets_size(), 12);

  auto back = LayoutSpecFromProto(proto);
  ASSERT_OK(back);
  ASSERT_EQ(back->kind, LayoutSpec::Kind::kEnumerable);
  ASSERT_EQ(back->boxes.size(), boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    EXPECT_EQ(back->boxes[i].ToString(), boxes[i].ToString());
    EXPECT_EQ(back->placements[i], placements[i]) << i;
  }
}

TEST(ConvertTest, BoxesOfDifferentRanksGoShardByShard) {
  // Invalid, but the coordinator is the one to say so, naming the shard.
  v1::ShardingSpec proto;
  LayoutSpecToProto(LayoutSpec::Enumerable({Box{{0}, {2}}, Box{{0, 0}, {2, 2}}},
                                           {Rank(0), Rank(1)}),
                    &proto);
  EXPECT_FALSE(proto.enumerable().has_packed());
  EXPECT_EQ(proto.enumerable().shards_size(), 2);
}

// A valid packed spec of two 1-D shards, to break one field at a time.
v1::ShardingSpec TwoPackedShards() {
  v1::ShardingSpec proto;
  LayoutSpecToProto(LayoutSpec::Enumerable({Box{{0}, {2}}, Box{{2}, {2}}},
                                           {Rank(0), Rank(1)}),
                    &proto);
  return proto;
}

TEST(ConvertTest, MalformedPackedSpecsAreInvalidArgumentsNamingTheField) {
  ASSERT_OK(LayoutSpecFromProto(TwoPackedShards()));

  v1::ShardingSpec uneven = TwoPackedShards();
  uneven.mutable_enumerable()->mutable_packed()->add_offsets(7);
  EXPECT_THAT(LayoutSpecFromProto(uneven),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("3 offsets but 2 sizes")));

  v1::ShardingSpec ragged = TwoPackedShards();
  ragged.mutable_enumerable()->mutable_packed()->add_offsets(7);
  ragged.mutable_enumerable()->mutable_packed()->add_sizes(7);
  EXPECT_THAT(LayoutSpecFromProto(ragged),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("do not split into 2 shards")));

  v1::ShardingSpec bad_index = TwoPackedShards();
  bad_index.mutable_enumerable()->mutable_packed()->set_placement_of(1, 5);
  EXPECT_THAT(LayoutSpecFromProto(bad_index),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.enumerable.packed.placement_of[1]")));

  v1::ShardingSpec both = TwoPackedShards();
  both.mutable_enumerable()->add_shards();
  EXPECT_THAT(LayoutSpecFromProto(both),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("either shards or packed")));

  v1::ShardingSpec deep;
  v1::ShardingSpec::PackedShards* packed =
      deep.mutable_enumerable()->mutable_packed();
  for (int d = 0; d < 33; ++d) {
    packed->add_offsets(0);
    packed->add_sizes(1);
  }
  packed->add_placements()->set_rank(0);
  packed->add_placement_of(0);
  EXPECT_THAT(LayoutSpecFromProto(deep),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("more than 32 dims")));
}

TensorMetadata ThreeShards() {
  TensorMetadata meta;
  meta.name = "t";
  meta.shape = {6, 2};
  meta.version = 3;
  for (int64_t i = 0; i < 3; ++i) {
    ShardInfo shard;
    shard.box = Box{{i * 2, 0}, {2, 2}};
    shard.rank = static_cast<int32_t>(i % 2);
    shard.worker = i % 2 == 0 ? "w0" : "w1";
    shard.address = i % 2 == 0 ? "10.0.0.1:7001" : "10.0.0.2:7001";
    shard.shard_id = 100 + static_cast<uint64_t>(i) * 7;
    shard.available = i != 1;
    meta.shards.push_back(shard);
  }
  return meta;
}

TEST(ConvertTest, PackedShardListsReadBackAsThePerShardOnes) {
  const TensorMetadata meta = ThreeShards();
  v1::ShardedTensorMetadata packed, per_shard;
  TensorMetadataToProto(meta, &packed, ShardEncoding::kPacked);
  TensorMetadataToProto(meta, &per_shard);
  EXPECT_EQ(packed.shards_size(), 0);
  EXPECT_EQ(packed.packed_shards().workers_size(), 2);
  EXPECT_EQ(per_shard.shards_size(), 3);
  auto a = TensorMetadataFromProto(packed);
  auto b = TensorMetadataFromProto(per_shard);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_EQ(a->shards.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    for (const TensorMetadata* m : {&*a, &*b}) {
      EXPECT_EQ(m->shards[i].box.ToString(), meta.shards[i].box.ToString());
      EXPECT_EQ(m->shards[i].worker, meta.shards[i].worker);
      EXPECT_EQ(m->shards[i].address, meta.shards[i].address);
      EXPECT_EQ(m->shards[i].rank, meta.shards[i].rank);
      EXPECT_EQ(m->shards[i].shard_id, meta.shards[i].shard_id);
      EXPECT_EQ(m->shards[i].available, meta.shards[i].available) << i;
    }
  }
}

TEST(ConvertTest, MalformedPackedShardListsAreRefused) {
  v1::ShardedTensorMetadata good;
  TensorMetadataToProto(ThreeShards(), &good, ShardEncoding::kPacked);

  v1::ShardedTensorMetadata short_sizes = good;
  short_sizes.mutable_packed_shards()->mutable_sizes()->RemoveLast();
  EXPECT_THAT(TensorMetadataFromProto(short_sizes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("do not describe shards of rank 2")));

  v1::ShardedTensorMetadata bad_worker = good;
  bad_worker.mutable_packed_shards()->set_worker_of(2, 9);
  EXPECT_THAT(TensorMetadataFromProto(bad_worker),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("packed_shards.worker_of[2]")));

  v1::ShardedTensorMetadata bad_unavailable = good;
  bad_unavailable.mutable_packed_shards()->add_unavailable(3);
  EXPECT_THAT(TensorMetadataFromProto(bad_unavailable),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("3 is not a shard index")));

  v1::ShardedTensorMetadata both = good;
  both.add_shards();
  EXPECT_THAT(
      TensorMetadataFromProto(both),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not both")));
}

TEST(ConvertTest, ExchangePlansReadBackAndMalformedOnesAreRefused) {
  ExchangePlan plan;
  plan.unique_id = std::string(kExchangeIdBytes, '\x07');
  plan.ranks = 3;
  plan.rank = 1;
  plan.sends.push_back({2, 40, {0, 8}, {16, 8}});
  plan.recvs.push_back({0, 41, {4, 0}, {4, 16}});
  v1::NcclExchangeRequest request;
  ExchangePlanToProto(plan, &request);
  absl::StatusOr<ExchangePlan> back = ExchangePlanFromProto(request);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->unique_id, plan.unique_id);
  EXPECT_EQ(back->ranks, 3);
  EXPECT_EQ(back->rank, 1);
  ASSERT_EQ(back->sends.size(), 1u);
  EXPECT_EQ(back->sends[0].peer, 2);
  EXPECT_EQ(back->sends[0].shard_id, 40u);
  EXPECT_EQ(back->sends[0].offsets, (std::vector<int64_t>{0, 8}));
  ASSERT_EQ(back->recvs.size(), 1u);
  EXPECT_EQ(back->recvs[0].sizes, (std::vector<int64_t>{4, 16}));

  auto refused = [&](auto mutate, const std::string& says) {
    v1::NcclExchangeRequest bad = request;
    mutate(bad);
    EXPECT_THAT(ExchangePlanFromProto(bad).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(says)));
  };
  refused([](auto& r) { r.set_unique_id("short"); }, "communicator id");
  refused([](auto& r) { r.set_ranks(1); }, "members");
  refused([](auto& r) { r.set_ranks(kMaxExchangeRanks + 1); }, "members");
  refused([](auto& r) { r.set_rank(3); }, "rank 3 of 3");
  refused([](auto& r) { r.set_rank(-1); }, "rank -1");
  refused([](auto& r) { r.mutable_sends(0)->set_peer(1); }, "sends[0]: peer 1");
  refused([](auto& r) { r.mutable_recvs(0)->set_peer(7); }, "recvs[0]: peer 7");
  refused([](auto& r) { r.mutable_sends(0)->add_offsets(0); }, "3 offsets");
  refused([](auto& r) { r.mutable_recvs(0)->set_sizes(1, -4); }, "negative");
  // One share is one NCCL group: its bound holds sends and receives
  // together, the full bound is accepted and one more piece refused.
  v1::NcclExchangeRequest full = request;
  while (full.sends_size() + full.recvs_size() < kMaxExchangePieces) {
    *full.add_sends() = full.sends(0);
  }
  EXPECT_TRUE(ExchangePlanFromProto(full).ok());
  refused(
      [&](auto& r) {
        r = full;
        *r.add_recvs() = r.recvs(0);
      },
      "2049 pieces (at most 2048)");
}

}  // namespace
}  // namespace tessera
