#include "coordinator/metadata_log.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/coordinator_testutil.h"
#include "coordinator/file_metadata_store.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::ControlledStore;
using ::tessera::testing::StatusIs;
using ::tessera::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

MetadataChange TensorChange(const std::string& name, uint64_t version = 1) {
  auto tensor = std::make_shared<TensorMetadata>();
  tensor->name = name;
  tensor->shape = {4};
  tensor->version = version;
  ShardInfo shard;
  shard.box = Box{{0}, {4}};
  shard.worker = "w0";
  shard.shard_id = version;
  tensor->shards.push_back(shard);
  return MetadataChange::Tensor(std::move(tensor));
}

std::vector<std::string> Names(const MetadataState& state) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : state.tensors) out.push_back(name);
  return out;
}

TEST(MetadataLogTest, ConcurrentAppendsAreAllDurable) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog log(&store, MetadataLog::Options());
  constexpr int kThreads = 16;
  constexpr int kEach = 40;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        if (!log.Append(TensorChange(absl::StrCat("t", t, "_", i))).ok())
          ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(log.DurableState().tensors.size(), size_t{kThreads * kEach});
  auto stored = store.Load();
  ASSERT_OK(stored);
  EXPECT_EQ(stored->tensors.size(), size_t{kThreads * kEach});
  EXPECT_EQ(log.stats().records, kThreads * kEach);
  EXPECT_EQ(store.records(), kThreads * kEach);
  EXPECT_LE(store.appends(), kThreads * kEach);
}

TEST(MetadataLogTest, RecordsQueuedBehindASlowAppendGoOutInOneBatch) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog log(&store, MetadataLog::Options());
  store.Hold();
  const MetadataLog::Ticket first = log.Enqueue(TensorChange("first"));
  store.WaitUntilBlocked();  // the writer is "fsyncing" the first record
  std::vector<MetadataLog::Ticket> queued;
  for (int i = 0; i < 10; ++i)
    queued.push_back(log.Enqueue(TensorChange(absl::StrCat("q", i))));
  EXPECT_EQ(log.DurableState().tensors.size(), 0u);
  store.Release();
  ASSERT_OK(log.Wait(first));
  for (MetadataLog::Ticket t : queued) ASSERT_OK(log.Wait(t));
  EXPECT_EQ(store.appends(), 2);  // one for "first", one for the ten others
  EXPECT_EQ(log.stats().batches, 2);
  EXPECT_EQ(log.DurableState().tensors.size(), 11u);
}

TEST(MetadataLogTest, RecordsReachTheStoreInEnqueueOrder) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog log(&store, MetadataLog::Options());
  store.Hold();
  log.Enqueue(TensorChange("a", 1));
  store.WaitUntilBlocked();
  log.Enqueue(MetadataChange::DeletedTensor("a"));
  log.Enqueue(TensorChange("b", 1));
  log.Enqueue(TensorChange("a", 2));
  const MetadataLog::Ticket last =
      log.Enqueue(MetadataChange::DeletedTensor("b"));
  store.Release();
  ASSERT_OK(log.Wait(last));
  const MetadataState state = log.DurableState();
  EXPECT_THAT(Names(state), ElementsAre("a"));
  EXPECT_EQ(state.tensors.at("a")->version, 2u);
}

TEST(MetadataLogTest, AFailedBatchFailsItsRecordsOnlyAndLeavesTheMirror) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog log(&store, MetadataLog::Options());
  store.FailAppends(2, absl::InternalError("disk on fire"));
  store.Hold();
  const MetadataLog::Ticket x = log.Enqueue(TensorChange("x"));
  store.WaitUntilBlocked();
  const MetadataLog::Ticket a = log.Enqueue(TensorChange("a"));
  const MetadataLog::Ticket b = log.Enqueue(TensorChange("b"));
  store.Release();
  EXPECT_THAT(log.Wait(x),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("disk on fire")));
  EXPECT_THAT(log.Wait(a), StatusIs(absl::StatusCode::kInternal,
                                    HasSubstr("recording metadata")));
  EXPECT_THAT(log.Wait(b), StatusIs(absl::StatusCode::kInternal));
  EXPECT_TRUE(log.Failed(a));
  // Later records are written as usual.
  const MetadataLog::Ticket c = log.Enqueue(TensorChange("c"));
  ASSERT_OK(log.Wait(c));
  EXPECT_FALSE(log.Failed(c));
  EXPECT_FALSE(log.Failed(0));
  EXPECT_THAT(Names(log.DurableState()), ElementsAre("c"));
  EXPECT_EQ(log.stats().failed_batches, 2);
  EXPECT_EQ(log.stats().records, 1);
}

TEST(MetadataLogTest, ABatchOfUnknownOutcomeStopsInsteadOfFailing) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog::Options options;
  std::atomic<int> stops{0};
  options.on_unknown_outcome = [&](const absl::Status& status) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss));
    ++stops;
  };
  MetadataLog log(&store, options);
  store.FailAppends(1, absl::InternalError("no space left on device"));
  EXPECT_THAT(log.Append(TensorChange("a")),
              StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(stops.load(), 0);  // known not written: the caller undoes it
  store.FailAppends(1, absl::DataLossError("outcome unknown"));
  EXPECT_THAT(log.Append(TensorChange("b")),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(stops.load(), 1);
}

TEST(MetadataLogTest, ABatchOfUnknownOutcomeEndsTheProcessByDefault) {
  EXPECT_DEATH(
      {
        ControlledStore store(std::make_unique<MemoryMetadataStore>());
        MetadataLog log(&store, MetadataLog::Options());
        store.FailAppends(1, absl::DataLossError("outcome unknown"));
        log.Append(TensorChange("b")).IgnoreError();
      },
      "");
}

TEST(MetadataLogTest, DestroyingTheLogWritesWhatIsQueued) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  {
    MetadataLog log(&store, MetadataLog::Options());
    for (int i = 0; i < 20; ++i)
      log.Enqueue(TensorChange(absl::StrCat("t", i)));
  }
  auto stored = store.Load();
  ASSERT_OK(stored);
  EXPECT_EQ(stored->tensors.size(), 20u);
}

TEST(MetadataLogTest, BatchesAreBoundedInRecordsAndShards) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog::Options options;
  options.max_batch_records = 3;
  options.max_batch_shards = 2;
  MetadataLog log(&store, options);
  store.Hold();
  log.Enqueue(TensorChange("first"));
  store.WaitUntilBlocked();
  MetadataLog::Ticket last = 0;
  // Each tensor has one shard: at most two per batch, so 6 -> 3 batches.
  for (int i = 0; i < 6; ++i) last = log.Enqueue(TensorChange(absl::StrCat(i)));
  store.Release();
  ASSERT_OK(log.Wait(last));
  EXPECT_EQ(store.appends(), 4);
}

// Every snapshot interval, with changes on both sides of a restart: what
// was acknowledged is what comes back (a snapshot is written from the
// durable state, after the record that triggered it).
TEST(MetadataLogTest, EverySnapshotIntervalKeepsEveryAcknowledgedChange) {
  for (int every = 1; every <= 3; ++every) {
    SCOPED_TRACE(absl::StrCat("snapshot_every=", every));
    const std::string dir = TempDir();
    MetadataLog::Options options;
    options.snapshot_every = every;
    std::vector<std::string> expected;
    for (int start = 0; start < 3; ++start) {
      FileMetadataStore store(dir);
      MetadataLog log(&store, options);
      auto recovered = log.Recover();
      ASSERT_OK(recovered);
      EXPECT_EQ(Names(*recovered), expected) << "start " << start;
      for (int i = 0; i < 4; ++i) {
        const std::string name = absl::StrCat("s", start, "_", i);
        ASSERT_OK(log.Append(TensorChange(name)));
        expected.push_back(name);
      }
      ASSERT_OK(log.Append(MetadataChange::DeletedTensor(expected.front())));
      expected.erase(expected.begin());
      std::sort(expected.begin(), expected.end());
      EXPECT_EQ(Names(log.DurableState()), expected);
    }
  }
}

TEST(MetadataLogTest, RecoverRaisesTheHighWaterPastEveryShardId) {
  MemoryMetadataStore store;
  ASSERT_OK(store.Append(TensorChange("a", 41)));  // shard id 41
  ASSERT_OK(store.Append(MetadataChange::ShardIdHighWater(7)));
  MetadataLog log(&store, MetadataLog::Options());
  auto state = log.Recover();
  ASSERT_OK(state);
  EXPECT_EQ(state->shard_id_high_water, 42u);
  EXPECT_EQ(log.DurableState().shard_id_high_water, 42u);
}

}  // namespace
}  // namespace tessera
