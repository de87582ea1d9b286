// The wire forms of a layout spec: the packed enumerable encoding the SDK
// sends, and the errors a malformed one gets.
#include "rpc/convert.h"

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
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
    Replica& replica = shard.replicas.emplace_back();
    replica.rank = static_cast<int32_t>(i % 2);
    replica.worker = i % 2 == 0 ? "w0" : "w1";
    replica.address = i % 2 == 0 ? "10.0.0.1:7001" : "10.0.0.2:7001";
    replica.shard_id = 100 + static_cast<uint64_t>(i) * 7;
    replica.available = i != 1;
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
      ASSERT_EQ(m->shards[i].replicas.size(), 1u);
      const Replica& got = m->shards[i].replicas[0];
      const Replica& want = meta.shards[i].replicas[0];
      EXPECT_EQ(got.worker, want.worker);
      EXPECT_EQ(got.address, want.address);
      EXPECT_EQ(got.rank, want.rank);
      EXPECT_EQ(got.shard_id, want.shard_id);
      EXPECT_EQ(got.available, want.available) << i;
    }
  }
}

// `good` with `damage` done to its packed shard list is refused as
// INVALID_ARGUMENT, the message saying `words`.
void ExpectPackedRefused(
    const v1::ShardedTensorMetadata& good, const std::string& words,
    const std::function<void(v1::PackedShardList&)>& damage) {
  SCOPED_TRACE(words);
  v1::ShardedTensorMetadata bad = good;
  damage(*bad.mutable_packed_shards());
  EXPECT_THAT(TensorMetadataFromProto(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(words)));
}

TEST(ConvertTest, MalformedPackedShardListsAreRefused) {
  v1::ShardedTensorMetadata good;
  TensorMetadataToProto(ThreeShards(), &good, ShardEncoding::kPacked);

  ExpectPackedRefused(
      good, "do not describe shards of rank 2",
      [](v1::PackedShardList& p) { p.mutable_sizes()->RemoveLast(); });

  ExpectPackedRefused(good, "packed_shards.worker_of[2]",
                      [](v1::PackedShardList& p) { p.set_worker_of(2, 9); });

  ExpectPackedRefused(good, "3 is not a shard index",
                      [](v1::PackedShardList& p) { p.add_unavailable(3); });

  v1::ShardedTensorMetadata both = good;
  both.add_shards();
  EXPECT_THAT(
      TensorMetadataFromProto(both),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not both")));
}

// The one-owner form that every tensor had before shards had replicas (and
// that a shard of one replica still has on the wire and on disk): shard i
// on rank i % 2, device cpu or cuda:1, shard 1 unavailable.
v1::ShardedTensorMetadata OneOwnerPerShard() {
  v1::ShardedTensorMetadata out;
  out.set_name("t");
  out.add_shape(6);
  out.add_shape(2);
  out.mutable_properties()->set_dtype(v1::INT32);
  out.set_version(4);
  out.set_incarnation(77);
  for (int i = 0; i < 3; ++i) {
    v1::Shard* shard = out.add_shards();
    shard->mutable_metadata()->add_offsets(2 * i);
    shard->mutable_metadata()->add_offsets(0);
    shard->mutable_metadata()->add_sizes(2);
    shard->mutable_metadata()->add_sizes(2);
    v1::Placement* placement = shard->mutable_metadata()->mutable_placement();
    placement->set_rank(i % 2);
    placement->mutable_device()->set_kind(i % 2 == 0 ? v1::Device::CPU
                                                     : v1::Device::CUDA);
    placement->mutable_device()->set_index(i % 2);
    v1::ShardHandle* handle = shard->mutable_handle();
    handle->set_tensor("t");
    handle->set_version(4);
    handle->set_shard_id(500 + i);
    handle->set_index(i);
    handle->set_worker(i % 2 == 0 ? "w0" : "w1");
    handle->set_address(i % 2 == 0 ? "10.0.0.1:7001" : "10.0.0.2:7001");
    shard->set_available(i != 1);
  }
  return out;
}

// The same tensor as the packed columns wrote it before replicas.
v1::ShardedTensorMetadata OneOwnerPacked() {
  v1::ShardedTensorMetadata out = OneOwnerPerShard();
  out.clear_shards();
  v1::PackedShardList* packed = out.mutable_packed_shards();
  for (int i = 0; i < 3; ++i) {
    packed->add_offsets(2 * i);
    packed->add_offsets(0);
    packed->add_sizes(2);
    packed->add_sizes(2);
    packed->add_shard_ids(500 + i);
    packed->add_worker_of(i % 2);
  }
  for (int w = 0; w < 2; ++w) {
    v1::PackedShardList::Worker* worker = packed->add_workers();
    worker->set_name(w == 0 ? "w0" : "w1");
    worker->set_rank(w);
    worker->set_address(w == 0 ? "10.0.0.1:7001" : "10.0.0.2:7001");
    worker->mutable_device()->set_kind(w == 0 ? v1::Device::CPU
                                              : v1::Device::CUDA);
    worker->mutable_device()->set_index(w);
  }
  packed->add_unavailable(1);
  return out;
}

TEST(ConvertTest, OneOwnerShardsReadAsOneReplicaAndWriteBackTheSameBytes) {
  for (const bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed" : "per shard");
    const v1::ShardedTensorMetadata wire =
        packed ? OneOwnerPacked() : OneOwnerPerShard();
    absl::StatusOr<TensorMetadata> meta = TensorMetadataFromProto(wire);
    ASSERT_OK(meta);
    ASSERT_EQ(meta->shards.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_EQ(meta->shards[i].replicas.size(), 1u);
      const Replica& r = meta->shards[i].replicas[0];
      EXPECT_EQ(r.rank, static_cast<int32_t>(i % 2));
      EXPECT_EQ(r.device.ToString(), i % 2 == 0 ? "cpu" : "cuda:1");
      EXPECT_EQ(r.worker, i % 2 == 0 ? "w0" : "w1");
      EXPECT_EQ(r.address, i % 2 == 0 ? "10.0.0.1:7001" : "10.0.0.2:7001");
      EXPECT_EQ(r.shard_id, 500 + i);
      EXPECT_EQ(r.available, i != 1);
    }
    // Written again, a shard of one replica is exactly the one-owner form.
    v1::ShardedTensorMetadata again;
    TensorMetadataToProto(
        *meta, &again,
        packed ? ShardEncoding::kPacked : ShardEncoding::kPerShard);
    EXPECT_EQ(again.SerializeAsString(), wire.SerializeAsString());
  }
}

// Shard 0 on w0 (unavailable), w1 and w2; shard 1 on w1 alone; shard 2 on
// w2 and w0.
TensorMetadata Replicated() {
  TensorMetadata meta = ThreeShards();
  auto copy = [](int32_t rank, uint64_t id, bool available) {
    Replica r;
    r.rank = rank;
    r.worker = absl::StrCat("w", rank);
    r.address = absl::StrCat("10.0.0.", rank + 1, ":7001");
    r.device.kind = rank == 2 ? Device::Kind::kCuda : Device::Kind::kCpu;
    r.device.index = rank == 2 ? 3 : 0;
    r.shard_id = id;
    r.available = available;
    return r;
  };
  meta.shards[0].replicas = {copy(0, 10, false), copy(1, 11, true),
                             copy(2, 12, true)};
  meta.shards[1].replicas = {copy(1, 20, true)};
  meta.shards[2].replicas = {copy(2, 30, true), copy(0, 31, false)};
  return meta;
}

// `meta` to the wire in `encoding` and back.
absl::StatusOr<TensorMetadata> RoundTrip(const TensorMetadata& meta,
                                         ShardEncoding encoding) {
  v1::ShardedTensorMetadata wire;
  TensorMetadataToProto(meta, &wire, encoding);
  return TensorMetadataFromProto(wire);
}

TEST(ConvertTest, ReplicasTravelInBothEncodings) {
  const TensorMetadata meta = Replicated();
  for (const ShardEncoding encoding :
       {ShardEncoding::kPerShard, ShardEncoding::kPacked}) {
    absl::StatusOr<TensorMetadata> back = RoundTrip(meta, encoding);
    ASSERT_OK(back);
    ASSERT_EQ(back->shards.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(back->shards[i].box, meta.shards[i].box);
      EXPECT_THAT(back->shards[i].replicas,
                  ::testing::ElementsAreArray(meta.shards[i].replicas))
          << "shard " << i;
    }
  }
}

TEST(ConvertTest, FileOriginTravelsAndIsBounded) {
  TensorMetadata meta = Replicated();
  meta.origin.metadata = {{"format", "pt"}, {"z", ""}};
  meta.origin.entry = 7;
  for (const ShardEncoding encoding :
       {ShardEncoding::kPerShard, ShardEncoding::kPacked}) {
    absl::StatusOr<TensorMetadata> back = RoundTrip(meta, encoding);
    ASSERT_OK(back);
    EXPECT_EQ(back->origin, meta.origin);
  }
  // None: nothing on the wire.
  v1::ShardedTensorMetadata plain;
  TensorMetadataToProto(Replicated(), &plain);
  EXPECT_FALSE(plain.has_origin());

  v1::FileOrigin bad;
  bad.set_entry(-1);
  EXPECT_THAT(
      FileOriginFromProto(bad).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("origin.entry")));
  bad.set_entry(kMaxOriginEntry + 1);
  EXPECT_FALSE(FileOriginFromProto(bad).ok());
  bad.set_entry(1);
  for (int64_t i = 0; i <= kMaxOriginPairs; ++i) bad.add_metadata();
  EXPECT_THAT(FileOriginFromProto(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pairs are more than")));
  v1::FileOrigin big;
  big.add_metadata()->set_value(std::string(kMaxOriginBytes + 1, 'x'));
  EXPECT_THAT(FileOriginFromProto(big).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bytes of keys and values")));
}

TEST(ConvertTest, OneOwnerFieldsOfAReplicatedShardNameItsFirstAvailable) {
  const TensorMetadata meta = Replicated();
  v1::ShardedTensorMetadata per_shard, packed;
  TensorMetadataToProto(meta, &per_shard);
  TensorMetadataToProto(meta, &packed, ShardEncoding::kPacked);
  // Shard 0: w0 is unavailable, so w1 is shown.
  const v1::Shard& zero = per_shard.shards(0);
  EXPECT_EQ(zero.handle().worker(), "w1");
  EXPECT_EQ(zero.handle().shard_id(), 11u);
  EXPECT_EQ(zero.metadata().placement().rank(), 1);
  EXPECT_TRUE(zero.available());
  EXPECT_EQ(zero.replicas_size(), 3);
  EXPECT_EQ(per_shard.shards(1).replicas_size(), 0);  // one replica
  EXPECT_EQ(per_shard.shards(2).handle().worker(), "w2");
  EXPECT_EQ(per_shard.shards(2).metadata().placement().device().index(), 3);
  const v1::PackedShardList& list = packed.packed_shards();
  EXPECT_THAT(list.shard_ids(), ::testing::ElementsAre(11, 20, 30));
  EXPECT_THAT(list.unavailable(), ::testing::ElementsAre());
  EXPECT_THAT(list.replica_count(), ::testing::ElementsAre(3, 1, 2));
  EXPECT_THAT(list.replica_shard_ids(),
              ::testing::ElementsAre(10, 11, 12, 20, 30, 31));
  EXPECT_THAT(list.replica_unavailable(), ::testing::ElementsAre(0, 5));
  // A reader that knows one owner per shard reads the shown ones.
  v1::ShardedTensorMetadata one_owner = per_shard;
  for (v1::Shard& shard : *one_owner.mutable_shards()) shard.clear_replicas();
  absl::StatusOr<TensorMetadata> seen = TensorMetadataFromProto(one_owner);
  ASSERT_OK(seen);
  EXPECT_EQ(seen->shards[0].replicas.size(), 1u);
  EXPECT_EQ(seen->shards[0].replicas[0], meta.shards[0].replicas[1]);
  EXPECT_EQ(seen->shards[2].replicas[0], meta.shards[2].replicas[0]);
}

TEST(ConvertTest, MalformedReplicaColumnsAreRefused) {
  v1::ShardedTensorMetadata good;
  TensorMetadataToProto(Replicated(), &good, ShardEncoding::kPacked);
  ASSERT_OK(TensorMetadataFromProto(good));

  ExpectPackedRefused(
      good, "2 replica counts for 3 shards",
      [](v1::PackedShardList& p) { p.mutable_replica_count()->RemoveLast(); });

  ExpectPackedRefused(
      good, "packed_shards.replica_count[1]: 0",
      [](v1::PackedShardList& p) { p.set_replica_count(1, 0); });

  ExpectPackedRefused(
      good, "7 replicas but 6 replica ids",
      [](v1::PackedShardList& p) { p.set_replica_count(1, 2); });

  ExpectPackedRefused(
      good, "packed_shards.replica_worker_of[4]: -1",
      [](v1::PackedShardList& p) { p.set_replica_worker_of(4, -1); });

  ExpectPackedRefused(
      good, "6 is not a replica index",
      [](v1::PackedShardList& p) { p.add_replica_unavailable(6); });

  v1::ShardedTensorMetadata bad_device;
  TensorMetadataToProto(Replicated(), &bad_device);
  // Replica 0 of shard 2 is on cuda:3.
  bad_device.mutable_shards(2)
      ->mutable_replicas(0)
      ->mutable_device()
      ->set_index(-2);
  EXPECT_THAT(TensorMetadataFromProto(bad_device),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shards[2].replicas[0]")));
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
