#include "coordinator/worker_reconciler.h"

#include <memory>
#include <thread>
#include <vector>

#include "coordinator/coordinator_testutil.h"
#include "coordinator/fake_worker_control.h"
#include "coordinator/orchestrator.h"
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
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class WorkerReconcilerTest : public ::testing::Test {
 protected:
  WorkerReconcilerTest()
      : store_(std::make_unique<MemoryMetadataStore>()),
        log_(&store_, MetadataLog::Options()),
        registry_(absl::Seconds(5), clock_.AsClock()),
        table_(TableOptions(), &log_),
        orchestrator_(&registry_, &table_, &log_, &workers_),
        reconciler_(&registry_, &table_, &log_, &workers_) {
    for (int i = 0; i < 2; ++i) workers_.AddWorker(WorkerAddress(i));
  }

  TensorTable::Options TableOptions() {
    TensorTable::Options options;
    options.clock = clock_.AsClock();
    return options;
  }

  FakeClock clock_;
  FakeWorkerControl workers_;
  ControlledStore store_;
  MetadataLog log_;
  WorkerRegistry registry_;
  TensorTable table_;
  Orchestrator orchestrator_;
  WorkerReconciler reconciler_;
};

TEST_F(WorkerReconcilerTest, AWorkerShowsOnlyOnceItsRecordIsDurable) {
  store_.Hold();
  absl::StatusOr<RegisterResult> result;
  std::thread registering(
      [&] { result = reconciler_.Register(TestWorker(0), {}); });
  store_.WaitUntilBlocked();
  EXPECT_THAT(registry_.List(), IsEmpty());
  store_.Release();
  registering.join();
  ASSERT_OK(result);
  EXPECT_EQ(result->rank, 0);
  ASSERT_EQ(registry_.List().size(), 1u);
  EXPECT_TRUE(registry_.List()[0].alive);
  const MetadataState durable = log_.DurableState();
  ASSERT_EQ(durable.workers.count("w0"), 1u);
  EXPECT_EQ(durable.workers.at("w0").address, WorkerAddress(0));
  EXPECT_EQ(workers_.counts(WorkerAddress(0)).reset, 1);
}

TEST_F(WorkerReconcilerTest, AFailedRecordLeavesTheRegistryUnchanged) {
  store_.FailAppends(1, absl::InternalError("no space left"));
  EXPECT_THAT(reconciler_.Register(TestWorker(0), {}).status(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("no space")));
  EXPECT_THAT(registry_.List(), IsEmpty());
  EXPECT_OK(reconciler_.Register(TestWorker(0), {}));
}

TEST_F(WorkerReconcilerTest, BadRegistrationsAreRefusedBeforeAnything) {
  WorkerRegistration no_address = TestWorker(0);
  no_address.worker.address.clear();
  EXPECT_THAT(
      reconciler_.Register(no_address, {}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("address")));
  WorkerRegistration negative = TestWorker(0);
  negative.rank = -1;
  EXPECT_THAT(reconciler_.Register(negative, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank")));
  WorkerRegistration bad_name = TestWorker(0);
  bad_name.worker.name = "no spaces allowed";
  EXPECT_THAT(reconciler_.Register(bad_name, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(store_.appends(), 0);
}

TEST_F(WorkerReconcilerTest, HeldShardsNothingReferencesAreHandedBack) {
  ASSERT_OK(reconciler_.Register(TestWorker(0), {}));
  CreateTensorArgs args;
  args.name = "a";
  args.shape = {4, 2};
  args.spec = ChunkOver({0});
  auto meta = orchestrator_.Create(args);
  ASSERT_OK(meta);
  const uint64_t id = (*meta)->shards[0].replicas[0].shard_id;
  // The worker restarts holding its shard and two left over from before.
  auto result = reconciler_.Register(TestWorker(0), {id, id + 100, id + 101});
  ASSERT_OK(result);
  EXPECT_THAT(result->free_shard_ids, ElementsAre(id + 100, id + 101));
  EXPECT_FALSE(table_.IsLost(id));
}

TEST_F(WorkerReconcilerTest, ShardsAWorkerComesBackWithoutAreLostUntilFound) {
  ASSERT_OK(reconciler_.Register(TestWorker(0), {}));
  ASSERT_OK(reconciler_.Register(TestWorker(1), {}));
  CreateTensorArgs args;
  args.name = "a";
  args.shape = {4, 2};
  args.spec = ChunkOver({0, 1});
  auto meta = orchestrator_.Create(args);
  ASSERT_OK(meta);
  ASSERT_OK(reconciler_.Register(TestWorker(1), {}));  // restarted empty
  TensorMetadata filled = **meta;
  orchestrator_.FillWorkerState(&filled);
  EXPECT_TRUE(filled.shards[0].replicas[0].available);
  EXPECT_FALSE(filled.shards[1].replicas[0].available);
  ASSERT_OK(reconciler_.Register(TestWorker(1),
                                 {(*meta)->shards[1].replicas[0].shard_id}));
  filled = **meta;
  orchestrator_.FillWorkerState(&filled);
  EXPECT_TRUE(filled.shards[1].replicas[0].available);
}

TEST_F(WorkerReconcilerTest,
       ARestartedWorkerKeepsItsRankAndANameClashIsRefused) {
  ASSERT_OK(reconciler_.Register(TestWorker(0), {}));
  WorkerRegistration again = TestWorker(0);
  again.rank.reset();
  auto result = reconciler_.Register(again, {});
  ASSERT_OK(result);
  EXPECT_EQ(result->rank, 0);
  WorkerRegistration elsewhere = again;
  elsewhere.worker.address = "fake:99";
  EXPECT_THAT(reconciler_.Register(elsewhere, {}).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("alive")));
  EXPECT_EQ(log_.DurableState().workers.at("w0").address, WorkerAddress(0));
}

// What a worker holding `ids` reports in a heartbeat.
HeldReport Report(const std::vector<uint64_t>& ids, bool with_list = false) {
  HeldReport report;
  report.count = static_cast<int64_t>(ids.size());
  for (uint64_t id : ids) report.xor_ids ^= id;
  if (with_list) report.ids = ids;
  return report;
}

// Orders go through a HeldShardTracker, as in the coordinator: heartbeats
// find and free what a worker holds that nothing references.
class HeldShardsTest : public ::testing::Test {
 protected:
  HeldShardsTest()
      : store_(std::make_unique<MemoryMetadataStore>()),
        log_(&store_, MetadataLog::Options()),
        registry_(absl::Seconds(5), clock_.AsClock()),
        table_(TensorTable::Options(), &log_),
        held_(&workers_),
        orchestrator_(&registry_, &table_, &log_, &held_),
        reconciler_(&registry_, &table_, &log_, &held_, &held_,
                    absl::Seconds(2), clock_.AsClock()) {
    workers_.AddWorker(WorkerAddress(0));
  }

  std::vector<uint64_t> Held() { return workers_.Held(WorkerAddress(0)); }
  HeartbeatResult Beat(bool with_list = false) {
    return reconciler_.Heartbeat("w0", {0}, Report(Held(), with_list));
  }
  absl::StatusOr<TensorMetadataPtr> Create(const std::string& name) {
    CreateTensorArgs args;
    args.name = name;
    args.shape = {4, 2};
    args.spec = ChunkOver({0});
    return orchestrator_.Create(args);
  }

  FakeClock clock_;
  FakeWorkerControl workers_;
  ControlledStore store_;
  MetadataLog log_;
  WorkerRegistry registry_;
  TensorTable table_;
  HeldShardTracker held_;
  Orchestrator orchestrator_;
  WorkerReconciler reconciler_;
};

TEST_F(HeldShardsTest, AWorkerInStepIsNotAskedForItsList) {
  ASSERT_OK(reconciler_.Register(TestWorker(0), {}));
  ASSERT_OK(Create("a"));
  ASSERT_OK(Create("b"));
  ASSERT_OK(orchestrator_.Delete("a"));
  const HeartbeatResult result = Beat();
  EXPECT_TRUE(result.known);
  EXPECT_FALSE(result.send_held);
  EXPECT_THAT(result.free_shard_ids, IsEmpty());
  EXPECT_FALSE(reconciler_.Heartbeat("w9", {0}, HeldReport()).known);
}

TEST_F(HeldShardsTest, AFreeThatNeverArrivedIsRetriedUntilTheWorkerHasDoneIt) {
  ASSERT_OK(reconciler_.Register(TestWorker(0), {}));
  auto meta = Create("a");
  ASSERT_OK(meta);
  const uint64_t id = (*meta)->shards[0].replicas[0].shard_id;
  workers_.FailNext(WorkerAddress(0), absl::DeadlineExceededError("stopped"));
  ASSERT_OK(orchestrator_.Delete("a"));
  ASSERT_THAT(Held(), ElementsAre(id));  // the free never arrived

  HeartbeatResult result = Beat();
  EXPECT_TRUE(result.send_held);
  result = Beat(/*with_list=*/true);
  EXPECT_THAT(result.free_shard_ids, ElementsAre(id));
  // Until the worker has freed it, its digest still differs: asked again
  // once the interval has passed, told again.
  EXPECT_FALSE(Beat().send_held);
  clock_.Advance(absl::Seconds(2));
  EXPECT_TRUE(Beat().send_held);
  EXPECT_THAT(Beat(/*with_list=*/true).free_shard_ids, ElementsAre(id));
  ASSERT_OK(workers_.Free(WorkerRef{"w0", WorkerAddress(0)}, {id}));
  clock_.Advance(absl::Seconds(2));
  result = Beat();
  EXPECT_FALSE(result.send_held);
  EXPECT_THAT(result.free_shard_ids, IsEmpty());
}

TEST_F(HeldShardsTest, AnOrphanAllocationIsFreedAndLiveShardsAreKept) {
  ASSERT_OK(reconciler_.Register(TestWorker(0), {}));
  auto meta = Create("a");
  ASSERT_OK(meta);
  // An allocation whose answer never came back (the coordinator gave up and
  // released its ids), but which the worker made.
  workers_.Hold(WorkerAddress(0), 4242, 64);
  EXPECT_TRUE(Beat().send_held);
  EXPECT_THAT(Beat(/*with_list=*/true).free_shard_ids, ElementsAre(4242));
}

TEST_F(HeldShardsTest, ShardsAfterARegistrationCountFromWhatItKept) {
  auto meta = Create("a");
  EXPECT_FALSE(meta.ok());  // no worker yet
  ASSERT_OK(reconciler_.Register(TestWorker(0), {}));
  meta = Create("a");
  ASSERT_OK(meta);
  const uint64_t id = (*meta)->shards[0].replicas[0].shard_id;
  // Registers again holding its shard and a stray one it is told to free
  // (and frees).
  auto result = reconciler_.Register(TestWorker(0), {id, 99});
  ASSERT_OK(result);
  EXPECT_THAT(result->free_shard_ids, ElementsAre(99));
  EXPECT_FALSE(reconciler_.Heartbeat("w0", {0}, Report({id})).send_held);
}

}  // namespace
}  // namespace tessera
