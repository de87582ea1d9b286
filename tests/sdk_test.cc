// End-to-end tests of the C++ SDK against a real coordinator and four real
// workers on 127.0.0.1, following the scenarios of PyTorch's own
// ShardedTensor tests (test_sharded_tensor.py).
#include <signal.h>

#include <cstring>
#include <random>
#include <thread>

#include "client/tessera_client.h"
#include "core/parse.h"
#include "core/placement.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/convert.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SdkTest : public ClusterSuite<SdkTest> {
 protected:
  // Puts `array`, reads it back whole and checks every byte.
  static void RoundTrip(const std::string& name, const HostArray& array,
                        const LayoutSpec& spec) {
    auto meta = client_->Put(name, array, spec);
    ASSERT_TRUE(meta.ok()) << meta.status();
    auto back = client_->Get(name);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(SameBytes(array, *back)) << name;
  }
};

// Every field a caller reads from a shard, compared one by one.
void ExpectSameShards(const TensorMetadata& got, const TensorMetadata& want) {
  EXPECT_EQ(got.name, want.name);
  EXPECT_EQ(got.version, want.version);
  EXPECT_EQ(got.shape, want.shape);
  EXPECT_EQ(got.dtype, want.dtype);
  ASSERT_EQ(got.shards.size(), want.shards.size());
  for (size_t i = 0; i < got.shards.size(); ++i) {
    EXPECT_EQ(got.shards[i].box.ToString(), want.shards[i].box.ToString())
        << "shard " << i;
    ASSERT_EQ(got.shards[i].replicas.size(), want.shards[i].replicas.size());
    const Replica& a = got.shards[i].replicas[0];
    const Replica& b = want.shards[i].replicas[0];
    EXPECT_EQ(a.shard_id, b.shard_id) << "shard " << i;
    EXPECT_EQ(a.worker, b.worker) << "shard " << i;
    EXPECT_EQ(a.rank, b.rank) << "shard " << i;
    EXPECT_EQ(a.address, b.address) << "shard " << i;
    EXPECT_EQ(a.device, b.device) << "shard " << i;
    EXPECT_EQ(a.available, b.available) << "shard " << i;
  }
}

// The SDK sends enumerable specs packed and asks for packed shard lists;
// what it reads must be what the per-shard encoding says.
// A ScopedCancellation gives up an SDK call from another thread (what an
// asyncio task's cancel does): a get waiting on a hung worker (SIGSTOP)
// returns CANCELLED at once, as do calls started under a cancelled scope.
TEST_F(SdkTest, ACancelledScopeGivesUpTheCallsOfItsThread) {
  ASSERT_TRUE(client_
                  ->Create("cancel_t", {512, 1024}, DType::kFloat32,
                           LayoutSpec::Chunk(0, Ranks({2, 3})),
                           InitSpec{InitSpec::Kind::kOnes})
                  .ok());
  ClientOptions options;
  options.transport = "grpc";
  auto reader = Client::Connect(cluster_->coordinator_address(), options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->Describe("cancel_t").ok());
  std::vector<char> out(512 * 1024 * 4);
  Cancellation cancellation;
  absl::Status status;
  kill(cluster_->worker_pid(3), SIGSTOP);
  const absl::Time start = absl::Now();
  std::thread get([&] {
    ScopedCancellation scope(&cancellation);
    status = (*reader)->GetInto("cancel_t", std::nullopt, out.data(),
                                static_cast<int64_t>(out.size()));
  });
  absl::SleepFor(absl::Milliseconds(300));
  cancellation.Cancel();
  get.join();
  const absl::Duration took = absl::Now() - start;
  kill(cluster_->worker_pid(3), SIGCONT);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_LT(took, absl::Seconds(10)) << "the data timeout is 30 minutes";
  // Under a scope already cancelled, nothing starts.
  {
    ScopedCancellation scope(&cancellation);
    EXPECT_THAT((*reader)->Workers().status(),
                StatusIs(absl::StatusCode::kCancelled));
  }
  // Outside it, the same client works.
  EXPECT_TRUE((*reader)
                  ->GetInto("cancel_t", std::nullopt, out.data(),
                            static_cast<int64_t>(out.size()))
                  .ok());
  EXPECT_TRUE(client_->Delete("cancel_t").ok());
}

TEST_F(SdkTest, CreateMetadataIsWhatDescribeShows) {
  std::vector<Box> boxes;
  std::vector<Placement> placements;
  for (int64_t r = 0; r < 8; ++r) {
    for (int64_t c = 0; c < 4; ++c) {
      boxes.push_back(Box{{r * 8, c * 8}, {8, 8}});
      Placement p;
      if ((r + c) % 3 == 0) {
        p.worker = cluster_->worker_name(static_cast<int>(c));
      } else {
        p.rank = static_cast<int32_t>((r * 4 + c) % 4);
      }
      placements.push_back(p);
    }
  }
  auto grid = client_->Create("packed_grid", {64, 32}, DType::kFloat32,
                              LayoutSpec::Enumerable(boxes, placements));
  ASSERT_OK(grid);
  auto described = client_->Describe("packed_grid");
  ASSERT_OK(described);
  ExpectSameShards(*grid, *described);

  auto rows = client_->Create("packed_rows", {10, 3}, DType::kInt64,
                              LayoutSpec::Chunk(0, Ranks({3, 1, 2})));
  ASSERT_OK(rows);
  auto rows_described = client_->Describe("packed_rows");
  ASSERT_OK(rows_described);
  ExpectSameShards(*rows, *rows_described);

  // The per-shard encoding, as other clients ask for it.
  auto stub =
      v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address()));
  v1::GetTensorRequest request;
  request.set_name("packed_grid");
  v1::GetTensorResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetTensor(&context, request, &response).ok());
  EXPECT_EQ(response.tensor().shards_size(), 32);
  EXPECT_FALSE(response.tensor().has_packed_shards());
  auto per_shard = TensorMetadataFromProto(response.tensor());
  ASSERT_OK(per_shard);
  ExpectSameShards(*grid, *per_shard);
}

// Other clients may send the per-shard encoding and want the full reply.
TEST_F(SdkTest, CoordinatorStillTakesPerShardSpecsAndGivesFullReplies) {
  auto stub =
      v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address()));
  v1::CreateTensorRequest request;
  request.set_name("per_shard");
  request.add_shape(8);
  request.add_shape(4);
  request.mutable_properties()->set_dtype(DTypeToProto(DType::kFloat32));
  for (int i = 0; i < 4; ++i) {
    v1::ShardMetadata* shard =
        request.mutable_spec()->mutable_enumerable()->add_shards();
    shard->add_offsets(2 * i);
    shard->add_offsets(0);
    shard->add_sizes(2);
    shard->add_sizes(4);
    shard->mutable_placement()->set_rank(3 - i);
  }
  v1::CreateTensorResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->CreateTensor(&context, request, &response).ok());
  EXPECT_FALSE(response.tensor().has_packed_shards());
  auto full = TensorMetadataFromProto(response.tensor());
  ASSERT_OK(full);
  auto described = client_->Describe("per_shard");
  ASSERT_OK(described);
  ExpectSameShards(*full, *described);
  EXPECT_EQ(described->shards[0].replicas[0].rank, 3);
}

TEST_F(SdkTest, WorkersAreListedAliveByRank) {
  auto workers = client_->Workers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ((*workers)[i].name, cluster_->worker_name(i));
    EXPECT_EQ((*workers)[i].rank, i);
    EXPECT_EQ((*workers)[i].address, cluster_->worker_address(i));
    EXPECT_TRUE((*workers)[i].alive);
    EXPECT_EQ((*workers)[i].device.ToString(), "cpu");
  }
}

TEST_F(SdkTest, EvenChunkShardingOnRowsRoundTrips) {
  HostArray a = Iota(DType::kFloat32, {16, 20});
  RoundTrip("even_rows", a, LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3})));
  auto meta = client_->Describe("even_rows");
  ASSERT_OK(meta);
  ASSERT_EQ(meta->shards.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_THAT(meta->shards[i].box.offsets, ElementsAre(4 * i, 0));
    EXPECT_THAT(meta->shards[i].box.sizes, ElementsAre(4, 20));
    EXPECT_EQ(meta->shards[i].replicas[0].worker, cluster_->worker_name(i));
    EXPECT_EQ(meta->shards[i].replicas[0].PlacementString(),
              "rank:" + std::to_string(i) + "/cpu");
  }
  EXPECT_EQ(meta->version, 1u);
}

TEST_F(SdkTest, UnevenChunkShardingOnColumnsRoundTrips) {
  HostArray a = Iota(DType::kFloat32, {7, 10});
  RoundTrip("uneven_cols", a, LayoutSpec::Chunk(1, Ranks({0, 1, 2, 3})));
  auto meta = client_->Describe("uneven_cols");
  ASSERT_OK(meta);
  // torch.chunk(10, 4): split 3 -> 3, 3, 3, 1.
  std::vector<int64_t> sizes;
  for (const ShardInfo& s : meta->shards) sizes.push_back(s.box.sizes[1]);
  EXPECT_THAT(sizes, ElementsAre(3, 3, 3, 1));
}

TEST_F(SdkTest, NegativeChunkDimCountsFromTheEnd) {
  HostArray a = Iota(DType::kFloat32, {3, 8});
  RoundTrip("negative_dim", a, LayoutSpec::Chunk(-1, Ranks({0, 1})));
  auto meta = client_->Describe("negative_dim");
  ASSERT_OK(meta);
  EXPECT_THAT(meta->shards[1].box.offsets, ElementsAre(0, 4));
}

TEST_F(SdkTest, MorePlacementsThanRowsKeepsEmptyShards) {
  HostArray a = Iota(DType::kFloat32, {2, 5});
  RoundTrip("empty_shards", a, LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3})));
  auto meta = client_->Describe("empty_shards");
  ASSERT_OK(meta);
  ASSERT_EQ(meta->shards.size(), 4u);
  EXPECT_THAT(meta->shards[2].box.offsets, ElementsAre(2, 0));
  EXPECT_THAT(meta->shards[2].box.sizes, ElementsAre(0, 5));
  EXPECT_THAT(meta->shards[3].box.offsets, ElementsAre(3, 0));
  auto empty = client_->GetShard("empty_shards", 3);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->num_bytes, 0);
}

TEST_F(SdkTest, SeveralShardsOnOneWorker) {
  HostArray a = Iota(DType::kFloat32, {12, 3});
  RoundTrip("same_worker", a, LayoutSpec::Chunk(0, Ranks({1, 1, 1})));
  auto meta = client_->Describe("same_worker");
  ASSERT_OK(meta);
  for (const ShardInfo& s : meta->shards) EXPECT_EQ(s.replicas[0].worker, "w1");
}

TEST_F(SdkTest, PlacementsOnASubsetOfWorkersByName) {
  HostArray a = Iota(DType::kFloat32, {9, 4});
  std::vector<Placement> placements;
  for (const char* text : {"w3", "w2/cpu"}) {
    auto p = ParsePlacement(text);
    ASSERT_OK(p);
    placements.push_back(*p);
  }
  RoundTrip("subset", a, LayoutSpec::Chunk(0, placements));
  auto meta = client_->Describe("subset");
  ASSERT_OK(meta);
  EXPECT_EQ(meta->shards[0].replicas[0].PlacementString(), "rank:3/cpu");
  EXPECT_EQ(meta->shards[1].replicas[0].PlacementString(), "rank:2/cpu");
}

TEST_F(SdkTest, TwoDimensionalGridEnumerableLayout) {
  HostArray a = Iota(DType::kFloat32, {10, 10});
  std::vector<Box> boxes = {
      {{0, 0}, {5, 5}}, {{0, 5}, {5, 5}}, {{5, 0}, {5, 5}}, {{5, 5}, {5, 5}}};
  RoundTrip("grid", a, LayoutSpec::Enumerable(boxes, Ranks({0, 1, 2, 3})));
  auto region = client_->Get("grid", Box{{3, 2}, {4, 6}});
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_TRUE(SameBytes(*region, Slice(a, Box{{3, 2}, {4, 6}})));
}

TEST_F(SdkTest, UnevenEnumerableLayout) {
  HostArray a = Iota(DType::kFloat32, {10, 5});
  std::vector<Box> boxes = {
      {{0, 0}, {2, 5}}, {{2, 0}, {8, 1}}, {{2, 1}, {1, 4}}, {{3, 1}, {7, 4}}};
  RoundTrip("uneven_enum", a,
            LayoutSpec::Enumerable(boxes, Ranks({2, 0, 3, 1})));
}

TEST_F(SdkTest, PutGetRoundTripsEveryDType) {
  for (DType dtype : AllDTypes()) {
    const std::string name =
        std::string("dtype_") + std::string(DTypeName(dtype));
    HostArray a = Iota(dtype, {6, 7, 3}, static_cast<uint64_t>(dtype));
    RoundTrip(name, a, LayoutSpec::Chunk(1, Ranks({0, 1, 2})));
    auto back = client_->Describe(name);
    ASSERT_OK(back);
    EXPECT_EQ(back->dtype, dtype);
  }
}

TEST_F(SdkTest, RandomRegionsEqualTheExpectedSlice) {
  HostArray a = Iota(DType::kFloat32, {37, 23, 5});
  std::vector<Box> boxes = {{{0, 0, 0}, {20, 23, 5}},
                            {{20, 0, 0}, {17, 10, 5}},
                            {{20, 10, 0}, {17, 13, 2}},
                            {{20, 10, 2}, {17, 13, 3}}};
  RoundTrip("regions", a, LayoutSpec::Enumerable(boxes, Ranks({0, 1, 2, 3})));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    Box region;
    for (int64_t n : a.shape) {
      int64_t lo = rng() % (n + 1);
      int64_t hi = lo + rng() % (n - lo + 1);
      region.offsets.push_back(lo);
      region.sizes.push_back(hi - lo);
    }
    auto got = client_->Get("regions", region);
    ASSERT_TRUE(got.ok()) << got.status() << " for " << region.ToString();
    EXPECT_TRUE(SameBytes(*got, Slice(a, region))) << region.ToString();
  }
}

TEST_F(SdkTest, RegionTextFollowsNumpyRules) {
  HostArray a = Iota(DType::kFloat32, {8, 6});
  RoundTrip("region_text", a, LayoutSpec::Chunk(0, Ranks({0, 1, 2})));
  auto got = client_->GetRegion("region_text", "-3:,1:-1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(*got, Slice(a, Box{{5, 1}, {3, 4}})));
  auto rows =
      client_->GetRegion("region_text", "2:4");  // missing trailing dim = whole
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_TRUE(SameBytes(*rows, Slice(a, Box{{2, 0}, {2, 6}})));
  EXPECT_THAT(
      client_->GetRegion("region_text", "0:9").status(),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out of bounds")));
  EXPECT_THAT(client_->GetRegion("region_text", "0:1,0:1,0:1").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dims")));
}

TEST_F(SdkTest, ShardHandlesFetchTheirShard) {
  HostArray a = Iota(DType::kFloat32, {10, 4});
  RoundTrip("handles", a, LayoutSpec::Chunk(0, Ranks({3, 2, 1})));
  auto handles = client_->Handles("handles");
  ASSERT_TRUE(handles.ok()) << handles.status();
  ASSERT_EQ(handles->size(), 3u);
  for (const ShardHandle& h : *handles) {
    auto data = h.ToHere();
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_TRUE(SameBytes(*data, Slice(a, h.shard().box)));
    EXPECT_EQ(h.version(), 1u);
  }
  ASSERT_OK(client_->Delete("handles"));
  EXPECT_THAT(
      (*handles)[0].ToHere().status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("freed")));
}

TEST_F(SdkTest, ConcurrentGetsAllSeeTheSameData) {
  HostArray a = Iota(DType::kFloat32, {256, 64});
  RoundTrip("concurrent", a, LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3})));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        Box region{{(t * 13 + i) % 200, 3}, {50, 40}};
        auto got = client_->Get("concurrent", region);
        if (!got.ok() || !SameBytes(*got, Slice(a, region))) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(SdkTest, GetIntoWritesTheCallersBuffer) {
  HostArray a = Iota(DType::kInt32, {5, 5});
  RoundTrip("get_into", a, LayoutSpec::Chunk(0, Ranks({0, 1})));
  std::vector<char> buf(a.num_bytes);
  ASSERT_OK(client_->GetInto("get_into", std::nullopt, buf.data(), buf.size()));
  EXPECT_EQ(std::memcmp(buf.data(), a.data(), a.num_bytes), 0);
  EXPECT_THAT(client_->GetInto("get_into", std::nullopt, buf.data(), 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes")));
}

TEST_F(SdkTest, CreateFillsAndDeleteFreesBytes) {
  const int64_t before = BytesUsed();
  InitSpec init;
  init.kind = InitSpec::Kind::kArange;
  auto meta = client_->Create("created", {100, 10}, DType::kInt64,
                              LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3})), init);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(BytesUsed(), before + 100 * 10 * 8);
  auto got = client_->Get("created", Box{{42, 0}, {1, 10}});
  ASSERT_OK(got);
  for (int j = 0; j < 10; ++j) EXPECT_EQ(got->As<int64_t>()[j], 420 + j);
  ASSERT_OK(client_->Delete("created"));
  EXPECT_EQ(BytesUsed(), before);
  EXPECT_THAT(client_->Describe("created").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
}

TEST_F(SdkTest, BadSpecsAreRejectedAndLeaveNothingBehind) {
  const int64_t before = BytesUsed();
  auto list_before = client_->List();
  ASSERT_OK(list_before);
  const Shape shape = {10, 10};
  struct Case {
    LayoutSpec spec;
    absl::StatusCode code;
    const char* words;
  };
  std::vector<Case> cases = {
      {LayoutSpec::Chunk(2, Ranks({0, 1})), absl::StatusCode::kInvalidArgument,
       "invalid sharding dim"},
      {LayoutSpec::Chunk(0, Ranks({0, 9})), absl::StatusCode::kInvalidArgument,
       "does not exist"},
      {LayoutSpec::Enumerable({{{0, 0}, {6, 10}}, {{5, 0}, {5, 10}}},
                              Ranks({0, 1})),
       absl::StatusCode::kInvalidArgument, "overlap"},
      {LayoutSpec::Enumerable({{{0, 0}, {5, 10}}, {{5, 0}, {4, 10}}},
                              Ranks({0, 1})),
       absl::StatusCode::kInvalidArgument, "cover"},
      {LayoutSpec::Enumerable({{{0, 0}, {5, 10}}, {{5, 0}, {6, 10}}},
                              Ranks({0, 1})),
       absl::StatusCode::kOutOfRange, "out of bounds"},
      {LayoutSpec::Enumerable({{{0}, {10}}}, Ranks({0})),
       absl::StatusCode::kInvalidArgument, "dims"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(client_->Create("bad", shape, DType::kFloat32, c.spec).status(),
                StatusIs(c.code, HasSubstr(c.words)));
  }
  ASSERT_OK(client_->Create("taken", shape, DType::kFloat32,
                            LayoutSpec::Chunk(0, Ranks({0}))));
  EXPECT_THAT(
      client_
          ->Create("taken", shape, DType::kFloat32,
                   LayoutSpec::Chunk(0, Ranks({1})))
          .status(),
      StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("already exists")));
  ASSERT_OK(client_->Delete("taken"));
  EXPECT_THAT(client_->Delete("taken"), StatusIs(absl::StatusCode::kNotFound));
  auto list_after = client_->List();
  ASSERT_OK(list_after);
  EXPECT_EQ(list_after->size(), list_before->size());
  EXPECT_EQ(BytesUsed(), before);
}

TEST_F(SdkTest, HugeTensorsAreRefusedBeforeAllocating) {
  const int64_t before = BytesUsed();
  EXPECT_THAT(client_
                  ->Create("huge", {int64_t{1} << 40, int64_t{1} << 30},
                           DType::kFloat32, LayoutSpec::Chunk(0, Ranks({0})))
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(BytesUsed(), before);
}

TEST_F(SdkTest, PutOfAnExistingNameChangesNothing) {
  HostArray a = Iota(DType::kFloat32, {4, 4});
  RoundTrip("put_twice", a, LayoutSpec::Chunk(0, Ranks({0, 1})));
  const int64_t before = BytesUsed();
  HostArray b = Iota(DType::kFloat32, {4, 4}, 99);
  EXPECT_THAT(
      client_->Put("put_twice", b, LayoutSpec::Chunk(0, Ranks({2}))).status(),
      StatusIs(absl::StatusCode::kAlreadyExists));
  auto back = client_->Get("put_twice");
  ASSERT_OK(back);
  EXPECT_TRUE(SameBytes(a, *back));
  EXPECT_EQ(BytesUsed(), before);
}

TEST_F(SdkTest, CachedMetadataNeverServesAReplacedTensor) {
  HostArray first = Iota(DType::kFloat32, {8, 8}, 1);
  RoundTrip("replaced", first,
            LayoutSpec::Chunk(0, Ranks({0, 1})));  // cached by this client
  auto other = Client::Connect(cluster_->coordinator_address());
  ASSERT_OK(other);
  ASSERT_OK((*other)->Delete("replaced"));
  HostArray second = Iota(DType::kFloat32, {20, 8}, 2);
  ASSERT_OK(
      (*other)->Put("replaced", second, LayoutSpec::Chunk(1, Ranks({2, 3}))));
  auto whole = client_->Get("replaced");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(SameBytes(*whole, second));
  ASSERT_OK((*other)->Delete("replaced"));
  ASSERT_OK((*other)->Put("replaced", first, LayoutSpec::Chunk(0, Ranks({3}))));
  // A region that only the previous shape had is now out of bounds.
  EXPECT_THAT(
      client_->Get("replaced", Box{{10, 0}, {5, 8}}).status(),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out of bounds")));
  auto back = client_->Get("replaced");
  ASSERT_OK(back);
  EXPECT_TRUE(SameBytes(*back, first));
}

TEST_F(SdkTest, CachedSharedMemoryMappingsNeverServeAFreedShard) {
  // 4 MiB shards: large enough for same-host shared memory.
  HostArray first = Iota(DType::kFloat32, {2048, 1024}, 5);
  RoundTrip("mapped", first, LayoutSpec::Chunk(0, Ranks({0, 1})));
  auto other = Client::Connect(cluster_->coordinator_address());
  ASSERT_OK(other);
  ASSERT_OK((*other)->Delete("mapped"));
  HostArray second = Iota(DType::kFloat32, {2048, 1024}, 6);
  ASSERT_OK(
      (*other)->Put("mapped", second, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  // This client still caches the old metadata and mappings of the freed shards.
  auto got = client_->Get("mapped");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(*got, second));
  auto rows = client_->Get("mapped", Box{{1000, 0}, {100, 1024}});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_TRUE(SameBytes(*rows, Slice(second, Box{{1000, 0}, {100, 1024}})));
}

}  // namespace
}  // namespace tessera
