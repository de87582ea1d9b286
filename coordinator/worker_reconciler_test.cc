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
  EXPECT_THAT(reconciler_.Register(no_address, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("address")));
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
  const uint64_t id = (*meta)->shards[0].shard_id;
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
  EXPECT_TRUE(filled.shards[0].available);
  EXPECT_FALSE(filled.shards[1].available);
  ASSERT_OK(reconciler_.Register(TestWorker(1), {(*meta)->shards[1].shard_id}));
  filled = **meta;
  orchestrator_.FillWorkerState(&filled);
  EXPECT_TRUE(filled.shards[1].available);
}

TEST_F(WorkerReconcilerTest, ARestartedWorkerKeepsItsRankAndANameClashIsRefused) {
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

}  // namespace
}  // namespace tessera
