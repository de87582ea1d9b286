#include "coordinator/orchestrator.h"

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_testutil.h"
#include "coordinator/fake_worker_control.h"
#include "coordinator/repairs.h"
#include "core/testing/adversarial_layouts.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::ChunkOver;
using ::tessera::testing::ControlledStore;
using ::tessera::testing::FakeClock;
using ::tessera::testing::StatusIs;
using ::tessera::testing::TestWorker;
using ::tessera::testing::WorkerAddress;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int kWorkers = 3;

class OrchestratorTest : public ::testing::Test {
 protected:
  OrchestratorTest()
      : store_(std::make_unique<MemoryMetadataStore>()),
        log_(&store_, MetadataLog::Options()),
        registry_(absl::Seconds(5), clock_.AsClock()),
        table_(TableOptions(), &log_),
        orchestrator_(&registry_, &table_, &log_, &workers_) {
    for (int i = 0; i < kWorkers; ++i) {
      workers_.AddWorker(WorkerAddress(i));
      EXPECT_OK(registry_.Register(TestWorker(i, /*capacity_bytes=*/1 << 20)));
    }
  }

  TensorTable::Options TableOptions() {
    TensorTable::Options options;
    options.clock = clock_.AsClock();
    options.retire_grace = absl::Seconds(5);
    options.pending_timeout = absl::Minutes(10);
    return options;
  }

  static CreateTensorArgs Args(const std::string& name, int64_t rows,
                               const std::vector<int32_t>& ranks) {
    CreateTensorArgs args;
    args.name = name;
    args.shape = {rows, 2};
    args.dtype = DType::kFloat32;
    args.spec = ChunkOver(ranks);
    return args;
  }

  // A put begun: Args(...) created pending, invisible until committed.
  absl::StatusOr<TensorMetadataPtr> BeginPut(
      const std::string& name, int64_t rows,
      const std::vector<int32_t>& ranks) {
    CreateTensorArgs put = Args(name, rows, ranks);
    put.pending = true;
    return orchestrator_.Create(put);
  }

  std::vector<uint64_t> Held(int i) const {
    return workers_.Held(WorkerAddress(i));
  }
  size_t TotalHeld() const { return workers_.TotalHeld(); }

  FakeClock clock_;
  FakeWorkerControl workers_;
  ControlledStore store_;
  MetadataLog log_;
  WorkerRegistry registry_;
  TensorTable table_;
  Orchestrator orchestrator_;
  Repairs repairs_{&orchestrator_, &registry_, &table_};
};

TEST_F(OrchestratorTest, CreateAllocatesOneBatchPerWorkerAndRecordsIt) {
  auto meta = orchestrator_.Create(Args("a", 8, {0, 0, 1, 2}));
  ASSERT_OK(meta);
  EXPECT_EQ((*meta)->version, 1u);
  EXPECT_THAT(Held(0), SizeIs(2));
  EXPECT_THAT(Held(1), SizeIs(1));
  EXPECT_THAT(Held(2), SizeIs(1));
  for (int i = 0; i < kWorkers; ++i)
    EXPECT_EQ(workers_.counts(WorkerAddress(i)).allocate, 1) << i;
  EXPECT_EQ(registry_.Find("w0")->bytes_used, 2 * 2 * 2 * 4);
  EXPECT_OK(table_.Get("a"));
  EXPECT_EQ(log_.DurableState().tensors.count("a"), 1u);
}

TEST_F(OrchestratorTest, CreateIsAllOrNothingWhenOneWorkerFails) {
  workers_.FailNext(WorkerAddress(1), absl::UnavailableError("w1 is gone"));
  EXPECT_THAT(orchestrator_.Create(Args("a", 6, {0, 1, 2})).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("allocating"), HasSubstr("w1"))));
  EXPECT_EQ(TotalHeld(), 0u) << "the batches that succeeded were freed";
  EXPECT_THAT(table_.Get("a").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(log_.DurableState().tensors, IsEmpty());
  // The name is free again.
  EXPECT_OK(orchestrator_.Create(Args("a", 6, {0, 1, 2})));
}

TEST_F(OrchestratorTest, CreateWhoseRecordFailsFreesItsShards) {
  ASSERT_OK(orchestrator_.Create(Args("first", 2, {0})));  // high water set
  const size_t before = TotalHeld();
  store_.FailAppends(1, absl::InternalError("no space left"));
  EXPECT_THAT(orchestrator_.Create(Args("a", 4, {0, 1})).status(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("no space")));
  EXPECT_EQ(TotalHeld(), before);
  EXPECT_THAT(table_.Get("a").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(orchestrator_.Create(Args("a", 4, {0, 1})));
}

TEST_F(OrchestratorTest, CreateBeyondCapacityAllocatesNothing) {
  auto args = Args("big", 1 << 18, {0});  // 2 MiB on a 1 MiB worker
  EXPECT_THAT(orchestrator_.Create(args).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("w0")));
  EXPECT_EQ(workers_.counts(WorkerAddress(0)).allocate, 0);
}

TEST_F(OrchestratorTest, ReshardSendsOneTransferPerPairOfWorkers) {
  // Four shards, two on w0 and two on w1, become two shards on w2.
  auto v1 = orchestrator_.Create(Args("a", 8, {0, 0, 1, 1}));
  ASSERT_OK(v1);
  ASSERT_OK(table_.GetLeased("a"));  // a reader of version 1, never done
  auto result = orchestrator_.Reshard("a", ChunkOver({2, 2}), 1);
  ASSERT_OK(result);
  EXPECT_EQ(result->version, 2u);
  EXPECT_EQ(result->pieces_moved, 4);
  const std::vector<TransferBatch> transfers = workers_.transfers();
  ASSERT_THAT(transfers, SizeIs(2));
  std::set<std::pair<std::string, std::string>> pairs;
  for (const TransferBatch& t : transfers) {
    pairs.insert({t.src_worker, t.dst_worker});
    EXPECT_THAT(t.pieces, SizeIs(2));
    EXPECT_EQ(t.dst_address, WorkerAddress(2));
  }
  EXPECT_EQ(pairs, (std::set<std::pair<std::string, std::string>>{
                       {"w0", "w2"}, {"w1", "w2"}}));
  EXPECT_EQ((*table_.Get("a"))->version, 2u);
  // Version 1's shards stay readable while its reader's lease lasts.
  EXPECT_THAT(Held(0), SizeIs(2));
  orchestrator_.FreeDue();
  EXPECT_THAT(Held(0), SizeIs(2));
  clock_.Advance(absl::Seconds(6));
  orchestrator_.FreeDue();
  EXPECT_THAT(Held(0), IsEmpty());
  EXPECT_THAT(Held(1), IsEmpty());
  EXPECT_THAT(Held(2), SizeIs(2));
}

// Workers w3, w4 and w5 hold their shards on GPUs: cuda:0, cuda:1 and
// cuda:0 of one host (w5 shares w3's GPU).
class GpuOrchestratorTest : public OrchestratorTest {
 protected:
  GpuOrchestratorTest() {
    for (int i = 3; i < 6; ++i) {
      workers_.AddWorker(WorkerAddress(i));
      WorkerRegistration gpu = TestWorker(i, 1 << 20);
      gpu.worker.device.kind = Device::Kind::kCuda;
      gpu.worker.device.index = i == 4 ? 1 : 0;
      EXPECT_OK(registry_.Register(gpu));
    }
  }
  // Each rank's shards on its worker's own GPU.
  static LayoutSpec OnGpus(const std::vector<int32_t>& ranks, int dim) {
    std::vector<Placement> placements;
    for (int32_t rank : ranks) {
      Placement p;
      p.rank = rank;
      placements.push_back(p);
    }
    return LayoutSpec::Chunk(dim, placements);
  }
};

TEST_F(GpuOrchestratorTest, PiecesBetweenGpuWorkersMoveByOneExchange) {
  workers_.EnableExchanges(WorkerAddress(3));
  workers_.EnableExchanges(WorkerAddress(4));
  CreateTensorArgs args = Args("g", 8, {});
  args.spec = OnGpus({3, 4}, 0);
  ASSERT_OK(orchestrator_.Create(args));
  auto result = orchestrator_.Reshard("g", OnGpus({3, 4}, 1), 1);
  ASSERT_OK(result);
  // Rows -> columns over two workers: each keeps a quarter (copied in
  // place by a Transfer to itself) and swaps a quarter with the other.
  const auto shares = workers_.exchanges();
  ASSERT_THAT(shares, SizeIs(2));
  for (const auto& [address, plan] : shares) {
    EXPECT_THAT(plan.sends, SizeIs(1)) << address;
    EXPECT_THAT(plan.recvs, SizeIs(1)) << address;
  }
  for (const TransferBatch& t : workers_.transfers()) {
    EXPECT_EQ(t.src_worker, t.dst_worker) << "pulled across workers";
  }
  EXPECT_EQ(orchestrator_.exchange_stats().exchanges, 1);
}

TEST_F(GpuOrchestratorTest, AFailedExchangeIsPulledInstead) {
  workers_.EnableExchanges(WorkerAddress(3));  // g4 takes no part
  CreateTensorArgs args = Args("g", 8, {});
  args.spec = OnGpus({3, 4}, 0);
  ASSERT_OK(orchestrator_.Create(args));
  auto result = orchestrator_.Reshard("g", OnGpus({3, 4}, 1), 1);
  ASSERT_OK(result);
  EXPECT_EQ((*table_.Get("g"))->version, 2u);
  std::set<std::pair<std::string, std::string>> pairs;
  for (const TransferBatch& t : workers_.transfers()) {
    pairs.insert({t.src_worker, t.dst_worker});
  }
  EXPECT_TRUE(pairs.count({"w3", "w4"}) == 1 && pairs.count({"w4", "w3"}) == 1)
      << "the pieces were not pulled";
  EXPECT_EQ(orchestrator_.exchange_stats().failures, 1);
}

TEST_F(GpuOrchestratorTest, WorkersSharingAGpuArePulled) {
  for (int i = 3; i < 6; ++i) workers_.EnableExchanges(WorkerAddress(i));
  CreateTensorArgs args = Args("g", 8, {});
  args.spec = OnGpus({3, 5}, 0);
  ASSERT_OK(orchestrator_.Create(args));
  ASSERT_OK(orchestrator_.Reshard("g", OnGpus({3, 5}, 1), 1));
  EXPECT_THAT(workers_.exchanges(), IsEmpty());
  EXPECT_EQ(orchestrator_.exchange_stats().failures, 0);
}

// Workers that each see their GPU as cuda:0 (CUDA_VISIBLE_DEVICES) are told
// apart by the UUIDs they registered; the same UUID under two indices is
// one GPU.
TEST_F(GpuOrchestratorTest, GpuUuidsDecideWhichWorkersShareAGpu) {
  auto reregister = [&](int i, int index, const std::string& uuid) {
    WorkerRegistration gpu = TestWorker(i, 1 << 20);
    gpu.worker.device.kind = Device::Kind::kCuda;
    gpu.worker.device.index = index;
    gpu.worker.gpu_uuid = uuid;
    ASSERT_OK(registry_.Register(gpu));
  };
  for (int i = 3; i < 6; ++i) workers_.EnableExchanges(WorkerAddress(i));
  reregister(3, 0, "GPU-0003");
  reregister(5, 0, "GPU-0005");
  CreateTensorArgs args = Args("g", 8, {});
  args.spec = OnGpus({3, 5}, 0);
  ASSERT_OK(orchestrator_.Create(args));
  ASSERT_OK(orchestrator_.Reshard("g", OnGpus({3, 5}, 1), 1));
  EXPECT_THAT(workers_.exchanges(), SizeIs(2)) << "separate GPUs: exchanged";
  reregister(5, 1, "GPU-0003");
  ASSERT_OK(orchestrator_.Reshard("g", OnGpus({3, 5}, 0), 2));
  EXPECT_THAT(workers_.exchanges(), SizeIs(2)) << "one GPU: pulled";
  EXPECT_EQ(orchestrator_.exchange_stats().failures, 0);
}

TEST_F(GpuOrchestratorTest, PiecesFromHostWorkersArePulled) {
  for (int i = 0; i < 5; ++i) workers_.EnableExchanges(WorkerAddress(i));
  ASSERT_OK(orchestrator_.Create(Args("h", 8, {0, 1})));
  ASSERT_OK(orchestrator_.Reshard("h", OnGpus({3, 4}, 0), 1));
  EXPECT_THAT(workers_.exchanges(), IsEmpty());
  EXPECT_FALSE(workers_.transfers().empty());
}

TEST_F(OrchestratorTest, ReshardKeepsShardsThatDoNotMove) {
  auto v1 = orchestrator_.Create(Args("a", 4, {0, 1}));
  ASSERT_OK(v1);
  // Same layout: every shard is kept, nothing moves or is allocated.
  auto result = orchestrator_.Reshard("a", ChunkOver({0, 1}), 0);
  ASSERT_OK(result);
  EXPECT_EQ(result->shards_kept, 2);
  EXPECT_THAT(workers_.transfers(), IsEmpty());
  EXPECT_EQ((*table_.Get("a"))->shards[0].replicas[0].shard_id,
            (*v1)->shards[0].replicas[0].shard_id);
  clock_.Advance(absl::Seconds(6));
  orchestrator_.FreeDue();
  EXPECT_THAT(Held(0), SizeIs(1));
}

TEST_F(OrchestratorTest, FailedMoveLeavesVersionNAndFreesTheNewShards) {
  auto v1 = orchestrator_.Create(Args("a", 8, {0, 0, 1, 1}));
  ASSERT_OK(v1);
  const std::vector<uint64_t> held0 = Held(0), held1 = Held(1);
  // The pull from w0 fails (its allocation on w2 succeeds first).
  workers_.FailNext(WorkerAddress(0), absl::UnavailableError("w0 is gone"));
  EXPECT_THAT(
      orchestrator_.Reshard("a", ChunkOver({2, 2}), 1).status(),
      StatusIs(absl::StatusCode::kUnavailable,
               AllOf(HasSubstr("version 1 is unchanged"), HasSubstr("w0"))));
  auto current = table_.Get("a");
  ASSERT_OK(current);
  EXPECT_EQ(*current, *v1);
  EXPECT_THAT(Held(2), IsEmpty()) << "new shards freed";
  EXPECT_EQ(Held(0), held0);
  EXPECT_EQ(Held(1), held1);
  EXPECT_EQ(log_.DurableState().tensors.at("a")->version, 1u);
  // A later reshard works.
  EXPECT_OK(orchestrator_.Reshard("a", ChunkOver({2, 2}), 1));
}

TEST_F(OrchestratorTest, ReshardWhoseRecordFailsLeavesVersionN) {
  auto v1 = orchestrator_.Create(Args("a", 4, {0, 1}));
  ASSERT_OK(v1);
  store_.FailAppends(1, absl::InternalError("no space left"));
  EXPECT_THAT(orchestrator_.Reshard("a", ChunkOver({2}), 0).status(),
              StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(*table_.Get("a"), *v1);
  EXPECT_THAT(Held(2), IsEmpty());
  EXPECT_EQ(table_.NumRetired(), 0u);
}

TEST_F(OrchestratorTest, ReshardToAnUnavailableWorkerAllocatesNothing) {
  ASSERT_OK(orchestrator_.Create(Args("a", 4, {0, 1})));
  clock_.Advance(absl::Seconds(10));  // every lease expires
  EXPECT_THAT(orchestrator_.Reshard("a", ChunkOver({2}), 0).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("w2")));
  EXPECT_EQ(workers_.counts(WorkerAddress(2)).allocate, 0);
}

TEST_F(OrchestratorTest, DeleteFreesEveryVersionIncludingRetiredOnes) {
  ASSERT_OK(orchestrator_.Create(Args("a", 4, {0, 1})));
  ASSERT_OK(orchestrator_.Reshard("a", ChunkOver({2}), 0));
  ASSERT_OK(orchestrator_.Create(Args("kept", 2, {1})));
  EXPECT_THAT(Held(0), SizeIs(1)) << "version 1 is still in its grace";
  ASSERT_OK(orchestrator_.Delete("a"));
  EXPECT_THAT(Held(0), IsEmpty());
  EXPECT_THAT(Held(1), SizeIs(1));  // only "kept"
  EXPECT_THAT(Held(2), IsEmpty());
  EXPECT_THAT(table_.Get("a").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(log_.DurableState().tensors.count("a"), 0u);
  EXPECT_THAT(orchestrator_.Delete("a"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(OrchestratorTest, DeleteWhoseRecordFailsFreesNothing) {
  ASSERT_OK(orchestrator_.Create(Args("a", 4, {0, 1})));
  store_.FailAppends(1, absl::InternalError("no space left"));
  EXPECT_THAT(orchestrator_.Delete("a"), StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(TotalHeld(), 2u);
  EXPECT_OK(table_.Get("a"));
}

TEST_F(OrchestratorTest,
       APutIsInvisibleUntilCommittedAndReapedIfNeverCommitted) {
  absl::StatusOr<TensorMetadataPtr> made = BeginPut("p", 4, {0, 1});
  ASSERT_OK(made);
  const uint64_t change = (*made)->change;
  EXPECT_NE(change, 0u);
  EXPECT_THAT(log_.DurableState().tensors, IsEmpty()) << "no record yet";
  EXPECT_THAT(table_.Get("p").status(), StatusIs(absl::StatusCode::kNotFound));
  // The commit seals the put's shards on their workers first.
  EXPECT_FALSE(workers_.Sealed(WorkerAddress(0),
                               (*made)->shards[0].replicas[0].shard_id));
  ASSERT_OK(orchestrator_.Commit("p", 1, "", change));
  for (const ShardInfo& shard : (*made)->shards) {
    EXPECT_TRUE(
        workers_.Sealed(shard.replicas[0].address, shard.replicas[0].shard_id));
  }
  EXPECT_OK(table_.Get("p"));
  EXPECT_EQ(log_.DurableState().tensors.count("p"), 1u);

  made = BeginPut("q", 2, {2});  // never committed
  ASSERT_OK(made);
  EXPECT_THAT(Held(2), SizeIs(1));
  clock_.Advance(absl::Minutes(11));
  orchestrator_.FreeDue();
  EXPECT_THAT(Held(2), IsEmpty());
  EXPECT_THAT(orchestrator_.Commit("q", 1, "", (*made)->change),
              StatusIs(absl::StatusCode::kNotFound));
}

// A worker that lost a put's shard before its commit (it restarted): the
// commit fails, nothing is recorded, and the put stays pending.
TEST_F(OrchestratorTest,
       ACommitWhoseShardsCannotBeSealedFailsAndRecordsNothing) {
  absl::StatusOr<TensorMetadataPtr> made = BeginPut("p", 4, {0, 1});
  ASSERT_OK(made);
  workers_.FailNext(WorkerAddress(1), absl::UnavailableError("restarting"));
  EXPECT_THAT(orchestrator_.Commit("p", 1, "", (*made)->change),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("sealing")));
  EXPECT_THAT(log_.DurableState().tensors, IsEmpty());
  EXPECT_THAT(table_.Get("p").status(), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(orchestrator_.Commit("p", 1, "", (*made)->change));
  EXPECT_OK(table_.Get("p"));
}

TEST_F(OrchestratorTest, APutAndItsGrantsCarryTheTensorsIncarnation) {
  absl::StatusOr<TensorMetadataPtr> a = orchestrator_.Create(Args("a", 2, {0}));
  ASSERT_OK(a);
  ASSERT_OK(orchestrator_.Delete("a"));
  absl::StatusOr<TensorMetadataPtr> again =
      orchestrator_.Create(Args("a", 2, {0}));
  ASSERT_OK(again);
  EXPECT_NE((*a)->incarnation, 0u);
  EXPECT_NE((*a)->incarnation, (*again)->incarnation);
}

// A put to a mirrored tensor: a mirror copy its commit cannot fill does not
// fail the write; it is freed and counted lost (reads pass it over), and
// SyncMirrors fills another.
TEST_F(OrchestratorTest, AMirrorThatFailsAtTheCommitDoesNotFailTheWrite) {
  WorkerRegistration mirror = TestWorker(2, 1 << 20);
  mirror.worker.labels = {{"role", "inference"}};
  ASSERT_OK(registry_.Register(mirror));
  CreateTensorArgs args = Args("p", 4, {0, 1});
  args.pending = true;
  args.spec.mirror = "role=inference";
  absl::StatusOr<TensorMetadataPtr> made = orchestrator_.Create(args);
  ASSERT_OK(made);
  ASSERT_EQ((*made)->mirror, "role=inference");
  for (const ShardInfo& shard : (*made)->shards) {
    ASSERT_EQ(shard.replicas.size(), 2u);
    EXPECT_TRUE(shard.replicas[1].mirror);
    EXPECT_EQ(shard.replicas[1].worker, "w2");
  }
  EXPECT_EQ(Held(2).size(), 2u);
  // w2 fails the commit's first call to it (sealing its copies).
  workers_.FailNext(WorkerAddress(2), absl::UnavailableError("unplugged"));
  ASSERT_OK(orchestrator_.Commit("p", 1, "", (*made)->change));
  TensorMetadata now = **table_.Get("p");
  orchestrator_.FillWorkerState(&now);
  int lost = 0;
  for (const ShardInfo& shard : now.shards) {
    EXPECT_TRUE(shard.replicas[0].available);
    lost += shard.replicas[1].available ? 0 : 1;
  }
  EXPECT_EQ(lost, 2);
  EXPECT_THAT(Held(2), IsEmpty());  // the unfilled copies are freed
  EXPECT_TRUE(repairs_.MirrorsBehind(now));

  absl::StatusOr<MirrorSyncResult> synced = repairs_.SyncMirrors("p");
  ASSERT_OK(synced);
  EXPECT_EQ(synced->mirrors_made, 2);
  EXPECT_EQ(synced->mirrors_dropped, 2);
  now = **table_.Get("p");
  orchestrator_.FillWorkerState(&now);
  for (const ShardInfo& shard : now.shards) {
    ASSERT_EQ(shard.replicas.size(), 2u);
    EXPECT_TRUE(shard.replicas[1].available);
    EXPECT_TRUE(shard.replicas[1].mirror);
  }
  EXPECT_EQ(Held(2).size(), 2u);
  EXPECT_FALSE(repairs_.MirrorsBehind(now));
}

// The crash harness's lost tensor: a shard's replica is lost (its worker
// came back empty) as the worker of its only mirror begins to drain. That
// mirror holds the last bytes, and in either order of the repair thread's
// two passes they are copied before it goes: a repair copies them into a
// new replica on a ready worker; a mirror sync keeps the mirror and fills
// a mirror on that worker from it, which the repair then makes the replica.
TEST_F(OrchestratorTest,
       AMirrorOnADrainingWorkerThatHoldsTheLastCopyIsCopiedNotDropped) {
  for (const char* name : {"repair_first", "sync_first"}) {
    CreateTensorArgs args = Args(name, 4, {1});
    args.spec.mirror = "all";
    ASSERT_OK(orchestrator_.Create(args));
  }
  auto copies = [&](const std::string& name) {
    TensorMetadata now = **table_.Get(name);
    orchestrator_.FillWorkerState(&now);
    std::vector<std::string> out;
    for (const Replica& r : now.shards[0].replicas) {
      out.push_back(absl::StrCat(r.mirror ? "+" : "", r.worker,
                                 r.available ? "" : " (lost)"));
    }
    return out;
  };
  // Cordoned, w2 leaves the group: its mirrors go; w0's stay.
  ASSERT_OK(registry_.SetAdminState("w2", WorkerState::kCordoned));
  for (const char* name : {"repair_first", "sync_first"}) {
    ASSERT_OK(repairs_.SyncMirrors(name));
    ASSERT_THAT(copies(name), ElementsAre("w1", "+w0"));
  }
  table_.Reconcile("w1", {});  // w1 came back without its shards
  ASSERT_OK(registry_.SetAdminState("w0", WorkerState::kDraining));

  // The repair first: w0's mirror is copied into a new replica on w1, the
  // one ready worker; then the sync takes the mirror.
  absl::StatusOr<RepairResult> repaired = repairs_.Repair("repair_first");
  ASSERT_OK(repaired);
  EXPECT_EQ(repaired->replicas_made, 1);
  EXPECT_EQ(repaired->shards_short, 0);
  ASSERT_THAT(workers_.transfers(), SizeIs(1));
  EXPECT_EQ(workers_.transfers()[0].src_worker, "w0");
  EXPECT_EQ(workers_.transfers()[0].dst_worker, "w1");
  EXPECT_THAT(copies("repair_first"), ElementsAre("w1", "+w0"));
  absl::StatusOr<MirrorSyncResult> synced =
      repairs_.SyncMirrors("repair_first");
  ASSERT_OK(synced);
  EXPECT_EQ(synced->mirrors_dropped, 1);
  EXPECT_THAT(copies("repair_first"), ElementsAre("w1"));

  // The sync first: the mirror outside the group stays and fills w1's.
  synced = repairs_.SyncMirrors("sync_first");
  ASSERT_OK(synced);
  EXPECT_EQ(synced->mirrors_dropped, 0);
  EXPECT_EQ(synced->mirrors_made, 1);
  EXPECT_THAT(copies("sync_first"), ElementsAre("w1 (lost)", "+w0", "+w1"));
  repaired = repairs_.Repair("sync_first");
  ASSERT_OK(repaired);
  EXPECT_EQ(repaired->mirrors_promoted, 1);
  synced = repairs_.SyncMirrors("sync_first");
  ASSERT_OK(synced);
  EXPECT_EQ(synced->mirrors_dropped, 1);
  EXPECT_THAT(copies("sync_first"), ElementsAre("w1"));
}

TEST_F(OrchestratorTest, FillWorkerStateReportsDeadWorkersAndLostShards) {
  auto meta = orchestrator_.Create(Args("a", 4, {0, 1}));
  ASSERT_OK(meta);
  TensorMetadata filled = **meta;
  orchestrator_.FillWorkerState(&filled);
  EXPECT_TRUE(filled.shards[0].replicas[0].available);
  table_.Reconcile("w1", {});  // w1 came back without its shard
  filled = **meta;
  orchestrator_.FillWorkerState(&filled);
  EXPECT_TRUE(filled.shards[0].replicas[0].available);
  EXPECT_FALSE(filled.shards[1].replicas[0].available);
  clock_.Advance(absl::Seconds(10));
  filled = **meta;
  orchestrator_.FillWorkerState(&filled);
  EXPECT_FALSE(filled.shards[0].replicas[0].available) << "w0's lease expired";
}

// The spec of Suffixes(m, true): a valid tiling of [m]^4 whose overlap
// search is the costliest of the adversarial layouts, all on rank 0.
LayoutSpec AdversarialSpec(int64_t m) {
  std::vector<Box> boxes = Suffixes(m, /*fill=*/true);
  Placement rank0;
  rank0.rank = 0;
  std::vector<Placement> placements(boxes.size(), rank0);
  return LayoutSpec::Enumerable(std::move(boxes), std::move(placements));
}

CreateTensorArgs AdversarialArgs(const std::string& name, int64_t m) {
  CreateTensorArgs args;
  args.name = name;
  args.shape = {m, m, m, m};
  args.dtype = DType::kInt8;
  args.spec = AdversarialSpec(m);
  return args;
}

TEST_F(OrchestratorTest, CreateStopsWhenItsCallerHasGivenUp) {
  CreateTensorArgs args = AdversarialArgs("a", 60);
  args.stop.cancelled = [] { return true; };
  EXPECT_THAT(orchestrator_.Create(args).status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("gave up validating the layout of 'a'")));
  args.stop = StopCondition();
  args.stop.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_THAT(orchestrator_.Create(args).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("gave up validating the layout of 'a'")));
  // A small layout is validated before anyone looks, but nothing is
  // allocated for a caller that gave up.
  CreateTensorArgs small = Args("b", 4, {0, 1});
  int polls = 0;
  small.stop.cancelled = [&] { return ++polls > 1; };
  EXPECT_THAT(orchestrator_.Create(small).status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("gave up creating 'b'")));
  EXPECT_EQ(TotalHeld(), 0u);
  EXPECT_EQ(workers_.counts(WorkerAddress(0)).allocate, 0);
  EXPECT_THAT(table_.Get("b").status(), StatusIs(absl::StatusCode::kNotFound));
  // The name is free again.
  EXPECT_OK(orchestrator_.Create(Args("b", 4, {0, 1})));
}

TEST_F(OrchestratorTest, CreateStopsPartWayThroughALongValidation) {
  CreateTensorArgs args = AdversarialArgs("a", 100);
  int polls = 0;
  args.stop.cancelled = [&] { return ++polls >= 2; };
  EXPECT_THAT(orchestrator_.Create(args).status(),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(polls, 2) << "stopped at the first poll that said so";
}

TEST_F(OrchestratorTest, ValidationStopsAfterThePlanBudget) {
  TensorLimits limits;
  limits.plan_budget = absl::Milliseconds(1);
  Orchestrator budgeted(&registry_, &table_, &log_, &workers_, limits);
  // No deadline from the caller: the budget alone stops it.
  EXPECT_THAT(budgeted.Create(AdversarialArgs("a", 100)).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("gave up validating the layout of 'a'"),
                             HasSubstr("plan_budget"))));
  EXPECT_EQ(TotalHeld(), 0u);
}

TEST_F(OrchestratorTest, ReshardStopsWhenItsCallerHasGivenUp) {
  ASSERT_OK(orchestrator_.Create(Args("a", 8, {0, 0, 1, 1})));
  const size_t held = TotalHeld();
  StopCondition cancelled;
  cancelled.cancelled = [] { return true; };
  EXPECT_THAT(
      orchestrator_.Reshard("a", ChunkOver({2, 2}), 1, cancelled).status(),
      StatusIs(absl::StatusCode::kCancelled, HasSubstr("gave up")));
  EXPECT_EQ((*table_.Get("a"))->version, 1u);
  EXPECT_EQ(TotalHeld(), held) << "nothing allocated";
  EXPECT_THAT(workers_.transfers(), IsEmpty());
  // Not held up: the next reshard goes through.
  EXPECT_OK(orchestrator_.Reshard("a", ChunkOver({2, 2}), 1));
}

TEST_F(OrchestratorTest, AHugeRank32CreateFailsBeforeAnythingIsBuilt) {
  // 2^20 placements on a rank-32 tensor: a 4 MiB request that once took
  // the coordinator from 17 to 945 MiB before it failed.
  CreateTensorArgs args;
  args.name = "huge";
  args.shape = Shape(32, 1);
  args.dtype = DType::kInt8;
  Placement rank0;
  rank0.rank = 0;
  args.spec = LayoutSpec::Chunk(0, std::vector<Placement>(1 << 20, rank0));
  const absl::Time start = absl::Now();
  EXPECT_THAT(orchestrator_.Create(args).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("1048576 shards of rank 32"),
                             HasSubstr("max_tensor_metadata_bytes"))));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(workers_.counts(WorkerAddress(0)).allocate, 0);
}

TEST_F(OrchestratorTest, LayoutsAreSizedBeforeTheyAreBuilt) {
  TensorLimits limits;
  limits.max_shards = 100;
  limits.max_metadata_bytes = 100 * (kShardMetadataBytes + 2 * 16);
  limits.max_reply_bytes = 1 << 20;
  Orchestrator limited(&registry_, &table_, &log_, &workers_, limits);
  std::vector<int32_t> ranks(101, 0);
  EXPECT_THAT(limited.Create(Args("a", 200, ranks)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("too many shards: 101 (at most 100")));
  ranks.resize(100);
  EXPECT_OK(limited.Create(Args("a", 200, ranks)));
  // Rank 3 takes more memory per shard than the limit allows for 100.
  CreateTensorArgs deeper = Args("b", 200, ranks);
  deeper.shape = {200, 2, 1};
  EXPECT_THAT(limited.Create(deeper).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_tensor_metadata_bytes")));
  // Reshards are held to the same limits.
  ranks.push_back(1);
  EXPECT_THAT(limited.Reshard("a", ChunkOver(ranks), 0).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("too many shards")));
  EXPECT_EQ((*table_.Get("a"))->version, 1u);
}

TEST_F(OrchestratorTest, LayoutsThatCouldNotBeDescribedInOneReplyAreRefused) {
  TensorLimits limits;
  limits.max_reply_bytes = 64 << 10;
  Orchestrator limited(&registry_, &table_, &log_, &workers_, limits);
  std::vector<int32_t> ranks(4000, 0);
  EXPECT_THAT(
      limited.Create(Args("a", 4000, ranks)).status(),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("to describe"), HasSubstr("(65536 bytes)"))));
  ranks.resize(1000);
  EXPECT_OK(limited.Create(Args("a", 4000, ranks)));
}

// Replicas count toward the memory and the reply a layout needs: a layout
// that fits with one replica per shard may not with sixteen.
TEST(CheckLayoutSizeTest, ReplicasCountTowardMemoryAndReplyBounds) {
  TensorLimits limits;
  limits.max_metadata_bytes = 1000 * (kShardMetadataBytes + 16) * 4;
  EXPECT_OK(CheckLayoutSize({1000}, 1000, limits, 0, 1));
  EXPECT_THAT(CheckLayoutSize({1000}, 1000, limits, 0, 16),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("(16 replicas each)"),
                             HasSubstr("max_tensor_metadata_bytes"))));
  TensorLimits replies;
  replies.max_reply_bytes = PackedDescribeBytesBound({1000}, 1000, 4, 1) + 1;
  replies.max_workers = 4;
  EXPECT_OK(CheckLayoutSize({1000}, 1000, replies, 0, 1));
  EXPECT_THAT(
      CheckLayoutSize({1000}, 1000, replies, 0, 2),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("to describe")));
  EXPECT_LT(PackedDescribeBytesBound({100}, 10, 4096, 1),
            PackedDescribeBytesBound({100}, 10, 4096, 2));
  // Mirrors: past 16 copies, up to one more per worker counts.
  TensorLimits mirrored;
  mirrored.max_workers = 100;
  mirrored.max_metadata_bytes =
      1000 * (kShardMetadataBytes + 16 + 20 * kReplicaMetadataBytes);
  EXPECT_OK(CheckLayoutSize({1000}, 1000, mirrored, 0, 16));
  EXPECT_THAT(CheckLayoutSize({1000}, 1000, mirrored, 0, 116),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("(116 replicas each)")));
  EXPECT_LT(PackedDescribeBytesBound({100}, 10, 100, 16),
            PackedDescribeBytesBound({100}, 10, 100, 116));
}

TEST(PackedDescribeBytesBoundTest, GrowsWithShardsDimsAndWorkers) {
  const int64_t one = PackedDescribeBytesBound({100}, 1, 4096);
  EXPECT_LT(PackedDescribeBytesBound({100}, 10, 4096),
            PackedDescribeBytesBound({100}, 100, 4096));
  EXPECT_LT(one, PackedDescribeBytesBound({100, 100}, 1, 4096));
  EXPECT_LT(one, PackedDescribeBytesBound({int64_t{1} << 40}, 1, 4096));
  // Workers are counted once each, at most max_workers of them.
  EXPECT_EQ(PackedDescribeBytesBound({100}, 1000000, 1) -
                PackedDescribeBytesBound({100}, 1000000, 0),
            PackedDescribeBytesBound({100}, 1, 1) -
                PackedDescribeBytesBound({100}, 1, 0));
  // The largest tensors the defaults allow describe in one message.
  EXPECT_LE(PackedDescribeBytesBound({1 << 20, 1 << 20}, 1 << 20, 4096),
            kMaxMessageBytes);
}

}  // namespace
}  // namespace tessera
