// WorkerNode without its gRPC layer: allocation all or none, region
// planning, shared-memory naming, and transfers (local copies, and pieces
// read from a real source worker served on 127.0.0.1:0, through shared
// memory or gRPC).
#include "worker/worker_node.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/capability.h"
#include "core/testing/grants.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/server.h"
#include "transport/shared_memory_arena.h"
#include "worker/grpc_relay_upstreams.h"
#include "worker/host_shard_store.h"
#include "worker/testing/served_worker.h"
#include "worker/worker_service.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::MintTestGrant;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

ShardDesc Desc(Shape shape, DType dtype = DType::kInt32) {
  ShardDesc desc;
  desc.tensor = "t";
  desc.dtype = dtype;
  desc.tensor_shape = shape;
  desc.box = WholeBox(shape);
  return desc;
}

const InitSpec kArange{InitSpec::Kind::kArange};

std::vector<int32_t> ReadAll(ShardStore& store, uint64_t id, int64_t n) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  absl::Status status =
      store.ReadBox(id, WholeBox(store.Describe(id)->box.sizes), 0, n,
                    reinterpret_cast<char*>(out.data()));
  EXPECT_THAT(status, IsOk());
  return out;
}

// A store whose memory the host cannot address, as a GPU store: Pin is
// UNIMPLEMENTED, so transfers land through WriteBox.
class UnpinnableStore : public HostShardStore {
 public:
  absl::StatusOr<PinnedShard> Pin(uint64_t) override {
    return absl::UnimplementedError("device memory");
  }
};

// Stands in for NCCL, which needs GPUs: records what the node hands it.
class RecordingExchange : public DeviceExchange {
 public:
  absl::StatusOr<std::string> UniqueId() override {
    std::string id = absl::StrCat("u", ids++);
    id.resize(kExchangeIdBytes, 'u');
    return id;
  }
  absl::StatusOr<int64_t> Run(const ExchangePlan& plan,
                              const StopCondition&) override {
    ++runs;
    if (!fail_with.ok()) return fail_with;
    return static_cast<int64_t>(plan.recvs.size());
  }
  int ids = 0;
  int runs = 0;
  absl::Status fail_with;
};

TEST(WorkerNodeTest, ExchangeSharesAreCheckedBeforeAnythingMoves) {
  HostShardStore store;
  ASSERT_THAT(store.Allocate(1, Desc({4, 8}), kArange), IsOk());
  WorkerNode plain(&store, WorkerNodeOptions{});
  EXPECT_THAT(plain.ExchangeId().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  RecordingExchange nccl;
  WorkerNodeOptions options;
  options.exchange = &nccl;
  WorkerNode node(&store, options);
  ASSERT_THAT(node.ExchangeId().status(), IsOk());
  ExchangePlan plan;
  plan.unique_id = std::string(kExchangeIdBytes, 'u');
  plan.ranks = 2;
  plan.recvs.push_back({1, 1, {0, 4}, {4, 4}});
  EXPECT_THAT(node.Exchange(plan, {}), IsOk());
  EXPECT_EQ(nccl.runs, 1);
  ExchangePlan outside = plan;
  outside.recvs[0].offsets = {1, 4};  // one row past the shard
  EXPECT_THAT(node.Exchange(outside, {}).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("recvs[0]")));
  ExchangePlan unknown = plan;
  unknown.sends.push_back({1, 9, {0, 0}, {1, 1}});
  EXPECT_THAT(node.Exchange(unknown, {}).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(nccl.runs, 1) << "a bad share reached NCCL";
}

// Each id this worker makes leaves NCCL's bootstrap thread waiting until its
// communicator forms. Ids whose exchange failed are bounded: past the bound
// the worker makes no more (the coordinator pulls instead), and an exchange
// that succeeded frees its id's place.
TEST(WorkerNodeTest, BootstrapsThatNeverFormedAreBounded) {
  HostShardStore store;
  ASSERT_THAT(store.Allocate(1, Desc({4, 8}), kArange), IsOk());
  RecordingExchange nccl;
  WorkerNodeOptions options;
  options.exchange = &nccl;
  WorkerNode node(&store, options);
  auto share = [](const std::string& id) {
    ExchangePlan plan;
    plan.unique_id = id;
    plan.ranks = 2;
    plan.recvs.push_back({1, 1, {0, 4}, {4, 4}});
    return plan;
  };
  std::vector<std::string> ids;
  nccl.fail_with = absl::UnavailableError("a peer never joined");
  for (size_t i = 0; i < WorkerNode::kMaxUnformedExchanges; ++i) {
    absl::StatusOr<std::string> id = node.ExchangeId();
    ASSERT_THAT(id.status(), IsOk()) << i;
    ids.push_back(*id);
    EXPECT_THAT(node.Exchange(share(*id), {}).status(),
                StatusIs(absl::StatusCode::kUnavailable));
  }
  EXPECT_THAT(node.ExchangeId().status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("NCCL bootstraps")));
  EXPECT_EQ(nccl.ids, static_cast<int>(WorkerNode::kMaxUnformedExchanges));
  // A later exchange under one of them forms: its place is free again.
  nccl.fail_with = absl::OkStatus();
  ASSERT_THAT(node.Exchange(share(ids[3]), {}), IsOk());
  EXPECT_THAT(node.ExchangeId().status(), IsOk());
  EXPECT_THAT(node.ExchangeId().status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(WorkerNodeTest, AllocationIsAllOrNothing) {
  HostShardStore store;
  WorkerNode node(&store, WorkerNodeOptions{});
  ASSERT_THAT(store.Allocate(7, Desc({4}), InitSpec{}), IsOk());
  const std::vector<ShardAllocation> shards = {
      {1, Desc({100})}, {2, Desc({100})}, {7, Desc({4})}};
  EXPECT_THAT(node.Allocate(shards, kArange),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(store.ShardIds(), ::testing::ElementsAre(7));
  EXPECT_EQ(node.BytesUsed(), 16);
}

TEST(WorkerNodeTest, CancelledAllocationLeavesNothing) {
  HostShardStore store;
  WorkerNode node(&store, WorkerNodeOptions{});
  EXPECT_THAT(node.Allocate({{1, Desc({10})}}, kArange, [] { return true; }),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(node.BytesUsed(), 0);
  EXPECT_THAT(node.Allocate({{1, Desc({10})}}, kArange, [] { return false; }),
              IsOk());
  EXPECT_EQ(node.BytesUsed(), 40);
}

// The coordinator keeps the reading with the larger number
// (core/worker_info.h): one taken after a change must carry a larger number
// than one taken before it.
TEST(WorkerNodeTest, BytesUsedReadingsAreNumberedInTheOrderTheyAreRead) {
  HostShardStore store;
  WorkerNode node(&store, WorkerNodeOptions{});
  const BytesUsedReading before = node.ReadBytesUsed();
  ASSERT_THAT(node.Allocate({{1, Desc({10})}}, kArange), IsOk());
  const BytesUsedReading allocated = node.ReadBytesUsed();
  ASSERT_THAT(node.Free(std::vector<uint64_t>{1}), IsOk());
  const BytesUsedReading freed = node.ReadBytesUsed();
  EXPECT_EQ(before.bytes, 0);
  EXPECT_EQ(allocated.bytes, 40);
  EXPECT_EQ(freed.bytes, 0);
  EXPECT_GT(before.seq, 0u);
  EXPECT_LT(before.seq, allocated.seq);
  EXPECT_LT(allocated.seq, freed.seq);
}

// A restarted worker (a new store) numbers its readings after every one its
// previous process sent, so a late answer from that process is never taken
// over the new one's.
TEST(WorkerNodeTest, ARestartedWorkersReadingsOutnumberThePreviousProcesss) {
  uint64_t last_before_restart = 0;
  {
    HostShardStore store;
    WorkerNode node(&store, WorkerNodeOptions{});
    for (int i = 0; i < 1000; ++i)
      last_before_restart = node.ReadBytesUsed().seq;
  }
  HostShardStore store;
  WorkerNode node(&store, WorkerNodeOptions{});
  EXPECT_GT(node.ReadBytesUsed().seq, last_before_restart);
}

TEST(WorkerNodeTest, AllocateParsesTheInitValueOncePerRequest) {
  // 1000 one-byte shards with a 4 MiB full:V ("1.000...0"): parsing V costs
  // milliseconds, so parsing it per shard would take many seconds.
  HostShardStore store;
  WorkerNode node(&store, WorkerNodeOptions{});
  InitSpec init{InitSpec::Kind::kFull};
  init.value = "1." + std::string(4 << 20, '0');
  std::vector<ShardAllocation> shards;
  for (int64_t i = 0; i < 1000; ++i) {
    ShardDesc desc;
    desc.tensor = "t";
    desc.dtype = DType::kInt8;
    desc.tensor_shape = {1000};
    desc.box = Box{{i}, {1}};
    shards.push_back({static_cast<uint64_t>(i + 1), desc});
  }
  const absl::Time start = absl::Now();
  ASSERT_THAT(node.Allocate(shards, init), IsOk());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  char value = 0;
  ASSERT_THAT(store.ReadBox(500, Box{{0}, {1}}, 0, 1, &value), IsOk());
  EXPECT_EQ(value, 1);
}

TEST(WorkerNodeTest, AllocateRefusesMoreShardsThanOneRequestMayName) {
  HostShardStore store;
  WorkerNodeOptions options;
  EXPECT_GE(options.max_shards_per_request, kMaxShardsPerTensor);
  options.max_shards_per_request = 2;
  WorkerNode node(&store, options);
  EXPECT_THAT(
      node.Allocate({{1, Desc({1})}, {2, Desc({1})}, {3, Desc({1})}}, kArange),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("at most 2 per request")));
  EXPECT_TRUE(store.ShardIds().empty());
  EXPECT_THAT(node.Allocate({{1, Desc({1})}, {2, Desc({1})}}, kArange), IsOk());
}

TEST(WorkerNodeTest, RegionReaderSendsContiguousBoxesFromShardMemory) {
  HostShardStore store;
  WorkerNode node(&store, WorkerNodeOptions{});
  ASSERT_THAT(node.Allocate({{1, Desc({64, 32})}}, kArange), IsOk());
  absl::StatusOr<RegionReader> rows =
      node.OpenRegion(1, Box{{3, 0}, {5, 32}}, 0);
  ASSERT_THAT(rows.status(), IsOk());
  ASSERT_NE(rows->contiguous_base(), nullptr);
  int32_t first;
  std::memcpy(&first, rows->contiguous_base(), 4);
  EXPECT_EQ(first, 3 * 32);
  EXPECT_EQ(rows->total(), 5 * 32);
  EXPECT_EQ(rows->chunk_elements(), kChunkBytes / 4);
  // Part of one row is contiguous too; columns are not.
  EXPECT_NE(node.OpenRegion(1, Box{{3, 4}, {1, 8}}, 0)->contiguous_base(),
            nullptr);
  absl::StatusOr<RegionReader> cols =
      node.OpenRegion(1, Box{{0, 4}, {64, 2}}, 64);
  ASSERT_THAT(cols.status(), IsOk());
  EXPECT_EQ(cols->contiguous_base(), nullptr);
  EXPECT_EQ(cols->chunk_elements(), 16);
  std::vector<int32_t> got(4);
  ASSERT_THAT(cols->Read(2, 4, reinterpret_cast<char*>(got.data())), IsOk());
  EXPECT_THAT(got, ::testing::ElementsAre(32 + 4, 32 + 5, 64 + 4, 64 + 5));
}

TEST(WorkerNodeTest, RegionOutsideTheShardOrOfAnUnknownShardIsRefused) {
  HostShardStore store;
  WorkerNode node(&store, WorkerNodeOptions{});
  ASSERT_THAT(node.Allocate({{1, Desc({8, 8})}}, kArange), IsOk());
  EXPECT_THAT(node.OpenRegion(1, Box{{4, 0}, {5, 8}}, 0).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("region")));
  EXPECT_THAT(node.OpenRegion(2, Box{{0, 0}, {1, 1}}, 0).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(WorkerNodeTest, ReadAllRefusesRegionsLargerThanOneMessage) {
  HostShardStore store;
  WorkerNode node(&store, WorkerNodeOptions{});
  ASSERT_THAT(node.Allocate({{1, Desc({kMaxChunkBytes / 4 + 1})}}, InitSpec{}),
              IsOk());
  std::string out;
  EXPECT_THAT(
      node.OpenRegion(1, Box{{0}, {kMaxChunkBytes / 4 + 1}}, 0)->ReadAll(&out),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("too large for one message")));
  ASSERT_THAT(
      node.OpenRegion(1, Box{{1}, {kMaxChunkBytes / 4}}, 0)->ReadAll(&out),
      IsOk());
  EXPECT_EQ(out.size(), static_cast<size_t>(kMaxChunkBytes));
}

TEST(WorkerNodeTest, MapShardNamesTheSegmentOfASharedShard) {
  if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no writable /dev/shm";
  auto arena = std::make_shared<SharedMemoryArena>();
  HostShardStoreOptions store_options;
  store_options.arena = arena;
  HostShardStore store(store_options);
  WorkerNodeOptions options;
  options.arena = arena;
  WorkerNode node(&store, options);
  ASSERT_THAT(node.Allocate({{1, Desc({512, 1024})}, {2, Desc({4})}}, kArange),
              IsOk());
  absl::StatusOr<SharedShardInfo> info = node.MapShard(1);
  ASSERT_THAT(info.status(), IsOk());
  EXPECT_EQ(info->host_id, LocalHostId());
  EXPECT_THAT(info->segment.name, HasSubstr("tessera-"));
  EXPECT_EQ(info->segment.bytes, 512 * 1024 * 4);
  EXPECT_EQ(info->segment.liveness, arena->liveness());
  EXPECT_EQ(info->shape, (Shape{512, 1024}));
  EXPECT_EQ(info->item_bytes, 4);
  EXPECT_FALSE(info->staged);
  // Small shards are private: a same-host reader has them staged. Freed
  // ones are not found.
  absl::StatusOr<SharedShardInfo> small = node.MapShard(2);
  ASSERT_THAT(small.status(), IsOk());
  EXPECT_TRUE(small->staged);
  EXPECT_TRUE(small->segment.name.empty());
  EXPECT_THAT(node.OpenStaged(2, Box{{0}, {4}}, 16, 4).status(), IsOk());
  ASSERT_THAT(node.Free({1}), IsOk());
  EXPECT_THAT(node.MapShard(1).status(), StatusIs(absl::StatusCode::kNotFound));
  // A node that was given no arena offers nothing for mapping.
  WorkerNode plain(&store, WorkerNodeOptions{});
  EXPECT_THAT(plain.MapShard(2).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(WorkerNodeTest, OnlyShardsOutsideSharedMemoryAreStagedOrExported) {
  if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no writable /dev/shm";
  auto arena = std::make_shared<SharedMemoryArena>();
  HostShardStoreOptions store_options;
  store_options.arena = arena;
  HostShardStore store(store_options);
  WorkerNodeOptions options;
  options.arena = arena;
  WorkerNode node(&store, options);
  ASSERT_THAT(node.Allocate({{1, Desc({512, 1024})}}, kArange), IsOk());
  // Shards in shared memory are mapped, never staged: StageRead says so.
  EXPECT_THAT(node.OpenStaged(1, Box{{0, 0}, {512, 1024}}, 1 << 20, 4).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("in shared memory: map it")));
  // Asking for a device handle of a host shard names its segment as ever.
  absl::StatusOr<SharedShardInfo> info = node.MapShard(1, true);
  ASSERT_THAT(info.status(), IsOk());
  EXPECT_FALSE(info->device.has_value());
  EXPECT_TRUE(info->ipc_handle.empty());
  EXPECT_THAT(info->segment.name, HasSubstr("tessera-"));
  EXPECT_THAT(store.ExportDevice(1, absl::Seconds(1)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(WorkerNodeTest, TransferCopiesPiecesHeldHereInMemory) {
  HostShardStore store;
  WorkerNode node(&store, WorkerNodeOptions{});
  ASSERT_THAT(node.Allocate({{1, Desc({8, 8})}, {2, Desc({4, 4})}}, kArange),
              IsOk());
  ASSERT_THAT(store.Free(2), IsOk());
  ASSERT_THAT(node.Allocate({{2, Desc({4, 4})}}, InitSpec{}), IsOk());
  TransferBatch batch;
  batch.src_address = "127.0.0.1:1";  // never dialled: the source is here
  batch.pieces.push_back(TransferPiece{1, {2, 3}, 2, {0, 0}, {2, 2}});
  batch.pieces.push_back(TransferPiece{1, {7, 7}, 2, {3, 3}, {1, 1}});
  absl::StatusOr<int64_t> bytes = node.Transfer(batch);
  ASSERT_THAT(bytes.status(), IsOk());
  EXPECT_EQ(*bytes, 5 * 4);
  EXPECT_THAT(ReadAll(store, 2, 16),
              ::testing::ElementsAre(19, 20, 0, 0, 27, 28, 0, 0, 0, 0, 0, 0, 0,
                                     0, 0, 63));
}

TEST(WorkerNodeTest, TransferChecksDestinationsFirst) {
  HostShardStore store;
  WorkerNode node(&store, WorkerNodeOptions{});
  ASSERT_THAT(node.Allocate({{1, Desc({8})}, {2, Desc({4})}}, kArange), IsOk());
  TransferBatch batch;
  batch.src_address = "127.0.0.1:1";
  batch.pieces.push_back(TransferPiece{1, {0}, 3, {0}, {2}});
  EXPECT_THAT(node.Transfer(batch).status(),
              StatusIs(absl::StatusCode::kNotFound));
  batch.pieces[0] = TransferPiece{1, {0}, 2, {3}, {2}};
  EXPECT_THAT(node.Transfer(batch).status(),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("pieces[0] destination")));
}

TEST(WorkerNodeTest, TransferRefusesAPieceOntoItsOwnShard) {
  HostShardStore store;
  WorkerNode node(&store, WorkerNodeOptions{});
  ASSERT_THAT(node.Allocate({{1, Desc({8})}, {2, Desc({4})}}, kArange), IsOk());
  TransferBatch batch;
  batch.src_address = "127.0.0.1:1";
  batch.pieces.push_back(TransferPiece{1, {0}, 2, {0}, {2}});
  batch.pieces.push_back(TransferPiece{1, {0}, 1, {1}, {2}});  // overlapping
  EXPECT_THAT(node.Transfer(batch).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pieces[1] copies shard 1 onto itself")));
  // Nothing moved, the good piece included.
  EXPECT_THAT(ReadAll(store, 1, 8),
              ::testing::ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(ReadAll(store, 2, 4), ::testing::ElementsAre(0, 1, 2, 3));
}

// A source worker served for real, and a destination node that pulls.
class RelayOfChanges;

class WorkerNodeTransferTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const bool shared_memory = GetParam();
    if (shared_memory && access("/dev/shm", W_OK) != 0)
      GTEST_SKIP() << "no writable /dev/shm";
    HostShardStoreOptions source_options;
    source_options.arena = arena_;
    source_options.shared_memory_min_bytes = 0;
    source_store_ = std::make_unique<HostShardStore>(source_options);
    WorkerNodeOptions node_options;
    node_options.arena = arena_;
    source_ = std::make_unique<WorkerNode>(source_store_.get(), node_options);
    source_->SetIdentity("w0", "node-test-key");
    ASSERT_OK_AND_ASSIGN(served_, ServeWorker(source_.get()));
    WorkerNodeOptions dst_options;
    dst_options.peers.shared_memory = shared_memory;
    dst_options.peers.timeout = absl::Seconds(30);
    node_ = std::make_unique<WorkerNode>(&store_, dst_options);
  }
  void TearDown() override { served_.Shutdown(); }

  TransferBatch Batch() {
    TransferBatch batch;
    batch.src_worker = "w0";
    // What the coordinator grants the destination on the source.
    batch.src_capability = MintTestGrant("node-test-key");
    batch.src_address = served_.address;
    batch.dst_worker = "w1";
    batch.dst_address = "127.0.0.1:2";
    return batch;
  }

  // Runs `relay`'s hop on node_: it must succeed (`*bytes`: what it wrote)
  // and leave N+1 in shard 2. `*sent`: what each worker sent for it.
  void RunHop(const RelayOfChanges& relay, SentBytes* sent,
              int64_t* bytes = nullptr);

  std::shared_ptr<SharedMemoryArena> arena_ =
      std::make_shared<SharedMemoryArena>();
  std::unique_ptr<HostShardStore> source_store_;
  std::unique_ptr<WorkerNode> source_;
  ServedWorker served_;
  UnpinnableStore store_;  // the destination: lands through WriteBox
  std::unique_ptr<WorkerNode> node_;
};

TEST_P(WorkerNodeTransferTest, RemotePiecesAreReadFromTheSourceWorker) {
  ASSERT_THAT(source_->Allocate({{1, Desc({8, 8})}}, kArange), IsOk());
  ASSERT_THAT(node_->Allocate({{2, Desc({4, 4})}, {3, Desc({2})}}, InitSpec{}),
              IsOk());
  ASSERT_THAT(node_->Allocate({{4, Desc({3})}}, kArange), IsOk());
  TransferBatch batch = Batch();
  batch.pieces.push_back(TransferPiece{1, {2, 3}, 2, {0, 0}, {2, 2}});
  batch.pieces.push_back(TransferPiece{1, {7, 7}, 2, {3, 3}, {1, 1}});
  batch.pieces.push_back(TransferPiece{4, {2}, 3, {1}, {1}});  // held here
  absl::StatusOr<int64_t> bytes = node_->Transfer(batch);
  ASSERT_THAT(bytes.status(), IsOk());
  EXPECT_EQ(*bytes, 6 * 4);
  EXPECT_THAT(ReadAll(store_, 2, 16),
              ::testing::ElementsAre(19, 20, 0, 0, 27, 28, 0, 0, 0, 0, 0, 0, 0,
                                     0, 0, 63));
  EXPECT_THAT(ReadAll(store_, 3, 2), ::testing::ElementsAre(0, 2));
  // The remote bytes went by the transport the options chose.
  const DataPlaneStats stats = node_->PeerStats();
  EXPECT_EQ(stats.bytes.at(GetParam() ? "shm" : "grpc"), 5 * 4);
}

TEST_P(WorkerNodeTransferTest, FreedSourceIsNotFound) {
  ASSERT_THAT(node_->Allocate({{2, Desc({4})}}, InitSpec{}), IsOk());
  TransferBatch batch = Batch();
  batch.pieces.push_back(TransferPiece{1, {0}, 2, {0}, {4}});
  EXPECT_THAT(node_->Transfer(batch).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("shard 1")));
}

TEST_P(WorkerNodeTransferTest, UnreachableSourceIsUnavailable) {
  ASSERT_THAT(node_->Allocate({{2, Desc({4})}}, InitSpec{}), IsOk());
  TransferBatch batch = Batch();
  batch.src_address = "127.0.0.1:1";  // nothing listens there
  batch.pieces.push_back(TransferPiece{1, {0}, 2, {0}, {4}});
  EXPECT_THAT(node_->Transfer(batch).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("source worker at 127.0.0.1:1")));
}

// A relay source whose fill the test drives (what AwaitRelayFill on its
// worker would answer).
class DrivenUpstream : public RelayUpstreams {
 public:
  absl::StatusOr<RelayFillProgress> Await(const RelayUpstream& upstream,
                                          uint64_t relay,
                                          int64_t have) override {
    ++asked;
    return fills.Await(relay, upstream.shard_id, have,
                       absl::Now() + absl::Milliseconds(100));
  }
  absl::StatusOr<ShardDelta> ReadDelta(
      const RelayUpstream& upstream,
      const ShardDeltaRequest& request) override {
    return absl::UnimplementedError("a driven source encodes no changes");
  }
  RelayFills fills;
  std::atomic<int> asked{0};
};

// A relay hop: one whole shard, in chunks of 4 rows of 8 int32 (128 bytes).
TransferBatch RelayBatch(TransferBatch batch, bool src_filling) {
  batch.pieces.push_back(TransferPiece{1, {0, 0}, 2, {0, 0}, {16, 8}});
  batch.relay.id = 7;
  batch.relay.chunk_bytes = 128;
  batch.relay.src_filling = src_filling;
  return batch;
}

std::vector<int32_t> Arange(int n) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out[static_cast<size_t>(i)] = i;
  return out;
}

TEST_P(WorkerNodeTransferTest, ARelayHopPullsEveryChunkAndSaysWhoSentIt) {
  ASSERT_THAT(source_->Allocate({{1, Desc({16, 8})}}, kArange), IsOk());
  ASSERT_THAT(node_->Allocate({{2, Desc({16, 8})}}, InitSpec{}), IsOk());
  SentBytes sent;
  absl::StatusOr<int64_t> bytes =
      node_->Transfer(RelayBatch(Batch(), /*src_filling=*/false), {}, &sent);
  ASSERT_THAT(bytes.status(), IsOk());
  EXPECT_EQ(*bytes, 16 * 8 * 4);
  EXPECT_EQ(ReadAll(store_, 2, 128), Arange(128));
  EXPECT_THAT(sent, ::testing::ElementsAre(::testing::Pair("w0", 512)));
  // The hop after it learns it is done.
  absl::StatusOr<RelayFillProgress> progress =
      node_->AwaitRelayFill(7, 2, 0, absl::Now());
  ASSERT_THAT(progress.status(), IsOk());
  EXPECT_TRUE(progress->done);
  EXPECT_EQ(progress->chunks_done, 4);
}

TEST_P(WorkerNodeTransferTest, ARelayHopWaitsForItsSourcesChunks) {
  ASSERT_THAT(source_->Allocate({{1, Desc({16, 8})}}, kArange), IsOk());
  ASSERT_THAT(node_->Allocate({{2, Desc({16, 8})}}, InitSpec{}), IsOk());
  DrivenUpstream upstream;
  node_->SetRelayUpstreams(&upstream);
  ASSERT_THAT(upstream.fills.Begin(7, 1), IsOk());
  absl::Notification finished;
  absl::StatusOr<int64_t> bytes;
  std::thread hop([&] {
    bytes = node_->Transfer(RelayBatch(Batch(), /*src_filling=*/true));
    finished.Notify();
  });
  // Two chunks held there: the hop takes those two and waits.
  upstream.fills.Advance(7, 1, 2);
  absl::Time until = absl::Now() + absl::Seconds(10);
  absl::StatusOr<RelayFillProgress> mine;
  do {
    mine = node_->AwaitRelayFill(7, 2, 1, absl::Now() + absl::Seconds(1));
  } while (mine.ok() && mine->chunks_done < 2 && absl::Now() < until);
  ASSERT_THAT(mine.status(), IsOk());
  EXPECT_EQ(mine->chunks_done, 2);
  EXPECT_FALSE(
      finished.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  upstream.fills.Advance(7, 1, 4);
  upstream.fills.Finish(7, 1, /*done=*/true);
  hop.join();
  ASSERT_THAT(bytes.status(), IsOk());
  EXPECT_EQ(ReadAll(store_, 2, 128), Arange(128));
}

TEST_P(WorkerNodeTransferTest,
       ARelayHopCarriesOnFromFurtherUpWhenItsSourceFails) {
  ASSERT_THAT(source_->Allocate({{1, Desc({16, 8})}}, kArange), IsOk());
  ASSERT_THAT(node_->Allocate({{2, Desc({16, 8})}}, InitSpec{}), IsOk());
  DrivenUpstream upstream;
  node_->SetRelayUpstreams(&upstream);
  // The parent (a hop on a worker that dies after two chunks) and, further
  // up, the relay's source holding the shard whole.
  TransferBatch batch = RelayBatch(Batch(), /*src_filling=*/true);
  batch.relay.fallbacks.push_back(RelayUpstream{
      "w0", served_.address, 1, batch.src_capability, /*filling=*/false});
  ASSERT_THAT(upstream.fills.Begin(7, 1), IsOk());
  upstream.fills.Advance(7, 1, 2);
  absl::StatusOr<int64_t> bytes;
  SentBytes sent;
  std::thread hop([&] { bytes = node_->Transfer(batch, {}, &sent); });
  // It holds the two chunks its parent had; then the parent fails.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  absl::StatusOr<RelayFillProgress> mine;
  do {
    mine = node_->AwaitRelayFill(7, 2, 1, absl::Now() + absl::Seconds(1));
  } while (mine.ok() && mine->chunks_done < 2 && absl::Now() < until);
  ASSERT_THAT(mine.status(), IsOk());
  EXPECT_EQ(mine->chunks_done, 2);
  upstream.fills.Finish(7, 1, /*done=*/false);
  hop.join();
  ASSERT_THAT(bytes.status(), IsOk());
  EXPECT_EQ(*bytes, 512);  // every chunk once: not started over
  EXPECT_EQ(ReadAll(store_, 2, 128), Arange(128));
  // Both are the same worker here: what it sent as parent and as source.
  EXPECT_EQ(sent["w0"], 512);
}

// An update's relay hop: the source holds version N (shard 1) and N+1
// (shard 3) of a shard, the destination N (shard 4) and fills N+1 (shard 2).
class RelayOfChanges {
 public:
  // `changed`: elements of N+1 (arange) made negative; `mine`: the
  // destination's N.
  RelayOfChanges(WorkerNode& source, ShardStore& source_store, WorkerNode& node,
                 const std::vector<int>& changed,
                 const InitSpec& mine = kArange)
      : upstreams_(node.peer_channels()) {
    next_ = Arange(128);
    for (int e : changed) next_[static_cast<size_t>(e)] = -e - 1;
    EXPECT_THAT(
        source.Allocate({{1, Desc({16, 8})}, {3, Desc({16, 8})}}, kArange),
        IsOk());
    EXPECT_THAT(
        source_store.Write(
            3, 0,
            absl::string_view(reinterpret_cast<const char*>(next_.data()),
                              next_.size() * 4)),
        IsOk());
    EXPECT_THAT(node.Allocate({{4, Desc({16, 8})}}, mine), IsOk());
    EXPECT_THAT(node.Allocate({{2, Desc({16, 8})}}, InitSpec{}), IsOk());
    node.SetRelayUpstreams(&upstreams_);
  }
  TransferBatch Hop(TransferBatch batch) const {
    batch.pieces.push_back(TransferPiece{3, {0, 0}, 2, {0, 0}, {16, 8}});
    batch.relay.id = 7;
    batch.relay.chunk_bytes = 128;  // 4 chunks of 4 rows
    batch.relay.base_shard_id = 4;
    batch.relay.src_base_shard_id = 1;
    return batch;
  }
  const std::vector<int32_t>& next() const { return next_; }

 private:
  GrpcRelayUpstreams upstreams_;
  std::vector<int32_t> next_;
};

void WorkerNodeTransferTest::RunHop(const RelayOfChanges& relay,
                                    SentBytes* sent, int64_t* bytes) {
  absl::StatusOr<int64_t> written =
      node_->Transfer(relay.Hop(Batch()), {}, sent);
  ASSERT_THAT(written.status(), IsOk());
  if (bytes != nullptr) *bytes = *written;
  EXPECT_EQ(ReadAll(store_, 2, 128), relay.next());
}

TEST_P(WorkerNodeTransferTest, AnUpdatesRelayHopCarriesOnlyTheChanges) {
  ASSERT_NE(node_->peer_channels(), nullptr);
  // One element in chunk 0, two in chunk 2; chunks 1 and 3 unchanged.
  RelayOfChanges relay(*source_, *source_store_, *node_, {5, 70, 90});
  SentBytes sent;
  int64_t bytes = 0;
  ASSERT_NO_FATAL_FAILURE(RunHop(relay, &sent, &bytes));
  EXPECT_EQ(bytes, 512);  // every byte of the shard written here
  // Each changed element: a one-byte gap, a one-byte count, its 4 bytes.
  EXPECT_EQ(sent["w0"], 3 * 6);
}

TEST_P(WorkerNodeTransferTest,
       ARelayHopWhoseEarlierVersionDiffersGetsWholeBytes) {
  ASSERT_NE(node_->peer_channels(), nullptr);
  // The destination's N is zeros, not the source's: the changes applied to
  // it fail the CRC check, and each chunk comes whole.
  RelayOfChanges relay(*source_, *source_store_, *node_, {5, 70, 90},
                       InitSpec{InitSpec::Kind::kZeros});
  SentBytes sent;
  ASSERT_NO_FATAL_FAILURE(RunHop(relay, &sent));
  EXPECT_EQ(sent["w0"], 512);
}

TEST_P(WorkerNodeTransferTest, ARelayHopOfANewContentGetsWholeBytes) {
  ASSERT_NE(node_->peer_channels(), nullptr);
  std::vector<int> all(128);
  for (int e = 0; e < 128; ++e) all[static_cast<size_t>(e)] = e;
  RelayOfChanges relay(*source_, *source_store_, *node_, all);
  SentBytes sent;
  ASSERT_NO_FATAL_FAILURE(RunHop(relay, &sent));
  EXPECT_EQ(sent["w0"], 512);
}

TEST_P(WorkerNodeTransferTest, AnUpdatesRelayHopOfAnEmptyShardHoldsIt) {
  ASSERT_NE(node_->peer_channels(), nullptr);
  ASSERT_THAT(
      source_->Allocate({{1, Desc({0, 8})}, {3, Desc({0, 8})}}, kArange),
      IsOk());
  ASSERT_THAT(node_->Allocate({{4, Desc({0, 8})}, {2, Desc({0, 8})}}, kArange),
              IsOk());
  GrpcRelayUpstreams upstreams(node_->peer_channels());
  node_->SetRelayUpstreams(&upstreams);
  TransferBatch batch = Batch();
  batch.pieces.push_back(TransferPiece{3, {0, 0}, 2, {0, 0}, {0, 8}});
  batch.relay.id = 7;
  batch.relay.chunk_bytes = 128;
  batch.relay.base_shard_id = 4;
  batch.relay.src_base_shard_id = 1;
  absl::StatusOr<int64_t> bytes = node_->Transfer(batch);
  ASSERT_THAT(bytes.status(), IsOk());
  EXPECT_EQ(*bytes, 0);
  absl::StatusOr<RelayFillProgress> progress =
      node_->AwaitRelayFill(7, 2, 0, absl::Now());
  ASSERT_THAT(progress.status(), IsOk());
  EXPECT_TRUE(progress->done);
}

TEST_P(WorkerNodeTransferTest, ChangesAreReadOnlyBetweenVersionsOfOneShard) {
  ASSERT_THAT(
      source_->Allocate(
          {{1, Desc({16, 8})}, {3, Desc({16, 8})}, {5, Desc({8, 8})}}, kArange),
      IsOk());
  const auto read = [&](uint64_t id, uint64_t base, int64_t offset,
                        int64_t bytes) {
    return source_
        ->ReadShardDelta(id, base, ShardDeltaRequest{offset, bytes, bytes})
        .status();
  };
  EXPECT_THAT(read(3, 1, 0, 512), IsOk());
  EXPECT_THAT(read(3, 5, 0, 256), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("another version")));
  EXPECT_THAT(read(3, 3, 0, 512), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(read(3, 9, 0, 512), StatusIs(absl::StatusCode::kNotFound));
  for (auto [offset, bytes] : std::vector<std::pair<int64_t, int64_t>>{
           {-4, 8}, {0, 516}, {2, 8}, {0, 6}, {512, 4}, {0, -4}}) {
    EXPECT_THAT(read(3, 1, offset, bytes),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("whole 4-byte elements")))
        << offset << " " << bytes;
  }
  // Unchanged: encoded as nothing, with the CRC-32 of the bytes.
  absl::StatusOr<ShardDelta> same =
      source_->ReadShardDelta(3, 1, ShardDeltaRequest{0, 512, 0});
  ASSERT_THAT(same.status(), IsOk());
  EXPECT_TRUE(same->encoded);
  EXPECT_EQ(same->changes, "");
}

TEST_P(WorkerNodeTransferTest, ARelayHopOfPartOfAShardIsRefused) {
  ASSERT_THAT(node_->Allocate({{2, Desc({16, 8})}}, InitSpec{}), IsOk());
  TransferBatch batch = RelayBatch(Batch(), /*src_filling=*/false);
  batch.pieces[0].sizes = {8, 8};
  EXPECT_THAT(
      node_->Transfer(batch).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("whole shard")));
}

// A source worker that accepts reads and then sends nothing (alive, and
// answering keepalive pings): a stalled peer.
class StalledWorker final : public v1::Worker::Service {
 public:
  grpc::Status ReadSmallRegion(grpc::ServerContext* context,
                               const v1::ReadRegionRequest*,
                               v1::ReadRegionResponse*) override {
    return Stall(context);
  }
  grpc::Status ReadRegion(
      grpc::ServerContext* context, const v1::ReadRegionRequest*,
      grpc::ServerWriter<v1::ReadRegionResponse>*) override {
    return Stall(context);
  }
  grpc::Status MapShard(grpc::ServerContext* context,
                        const v1::MapShardRequest*,
                        v1::MapShardResponse*) override {
    return Stall(context);
  }
  void Release() { release_.Notify(); }

 private:
  grpc::Status Stall(grpc::ServerContext* context) {
    while (!context->IsCancelled() &&
           !release_.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "released");
  }
  absl::Notification release_;
};

class StalledPeerTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    absl::StatusOr<RunningServer> server =
        StartServer("127.0.0.1:0", {&stalled_});
    ASSERT_THAT(server.status(), IsOk());
    server_ = std::move(*server);
    ASSERT_THAT(store_.Allocate(2, Desc({4}), InitSpec{}), IsOk());
  }
  void TearDown() override {
    stalled_.Release();
    if (server_.server != nullptr) server_.server->Shutdown();
  }

  // Pulls one piece from the stalled worker; returns how long it took.
  absl::Duration Pull(const WorkerNodeOptions& options, absl::Time deadline,
                      absl::Status* status,
                      std::function<bool()> cancelled = {}) {
    WorkerNode node(&store_, options);
    TransferBatch batch;
    batch.src_worker = "w0";
    batch.src_address = absl::StrCat("127.0.0.1:", server_.port);
    batch.pieces.push_back(TransferPiece{1, {0}, 2, {0}, {4}});
    const absl::Time start = absl::Now();
    *status =
        node.Transfer(batch, StopCondition{deadline, std::move(cancelled)})
            .status();
    return absl::Now() - start;
  }

  WorkerNodeOptions Options() const {
    WorkerNodeOptions options;
    options.peers.shared_memory = GetParam();
    // Without the limits under test, the pull would wait this long.
    options.pull_timeout = absl::Seconds(20);
    return options;
  }

  StalledWorker stalled_;
  RunningServer server_;
  HostShardStore store_;
};

TEST_P(StalledPeerTest, PeerThatSendsNothingIsGivenUpOnAfterTheIdleTimeout) {
  WorkerNodeOptions options = Options();
  options.pull_idle_timeout = absl::Milliseconds(300);
  absl::Status status;
  EXPECT_LT(Pull(options, absl::InfiniteFuture(), &status), absl::Seconds(5));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable,
                               AllOf(HasSubstr("source worker at 127.0.0.1:"),
                                     HasSubstr("sent nothing for 300ms"))));
}

TEST_P(StalledPeerTest, PullEndsAtTheOrdersDeadline) {
  // One deadline for the whole order (the coordinator's), not a fresh
  // timeout per piece and per transport.
  absl::Status status;
  EXPECT_LT(Pull(Options(), absl::Now() + absl::Milliseconds(300), &status),
            absl::Seconds(5));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                               HasSubstr("deadline")));
}

TEST_P(StalledPeerTest, PullStopsSoonAfterItsCallerCancels) {
  // The coordinator gave up on the order (its caller went, or it stops):
  // the read under way ends, not at the idle timeout or the deadline.
  WorkerNodeOptions options = Options();
  options.pull_idle_timeout = absl::Seconds(20);
  const absl::Time cancel_at = absl::Now() + absl::Milliseconds(300);
  absl::Status status;
  EXPECT_LT(Pull(options, absl::InfiniteFuture(), &status,
                 [cancel_at] { return absl::Now() >= cancel_at; }),
            absl::Seconds(3));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kCancelled));
}

INSTANTIATE_TEST_SUITE_P(Transports, StalledPeerTest,
                         ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "SharedMemory" : "Grpc";
                         });

INSTANTIATE_TEST_SUITE_P(Transports, WorkerNodeTransferTest,
                         ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "SharedMemory" : "Grpc";
                         });

}  // namespace
}  // namespace tessera
