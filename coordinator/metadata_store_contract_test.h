// The contract every MetadataStore passes: one parameterised suite, run
// against each implementation by instantiating it with a factory, e.g.
//
//   INSTANTIATE_TEST_SUITE_P(File, MetadataStoreContractTest,
//                            ::testing::Values(FileStoreFactory()),
//                            MetadataStoreContractTest::Name);
//
// What "after a restart" means differs by kind, and the factory says it:
// a durable store (file log, etcd) is reopened as a new object on the same
// place after the old one is destroyed; the memory store cannot outlive its
// process, so its `reopen` hands back the same object and the suite reloads
// through it ("same process" durability). Everything else is the same for
// both: Load of a new store is empty; appended changes come back applied in
// order; a batch is applied in order; Snapshot replaces the history; appends
// after a snapshot survive it; the shard-id high-water mark never goes down;
// a new store draws a cluster id of its own, and keeps it at every reload.
// Torn tails are a file-log matter and are tested in its own test.
#ifndef TESSERA_COORDINATOR_METADATA_STORE_CONTRACT_TEST_H_
#define TESSERA_COORDINATOR_METADATA_STORE_CONTRACT_TEST_H_

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/metadata_store.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace testing {

// Faults for a store's writes, as a disk makes them: a write that stops
// short and fails (ENOSPC), a sync that fails (EIO). A file store takes
// them as the system calls it writes through (Write, Sync); any store takes
// them through FaultInjectingMetadataStore. Thread-safe.
class FaultPlan {
 public:
  // The next `n` writes write half of what they are given (at least one
  // byte), then the one after fails with `err`.
  void FailWrites(int n, int err) {
    absl::MutexLock lock(&mu_);
    write_faults_ = n;
    write_errno_ = err;
    short_written_ = false;
  }
  // The next `n` syncs fail with `err`.
  void FailSyncs(int n, int err) {
    absl::MutexLock lock(&mu_);
    sync_faults_ = n;
    sync_errno_ = err;
  }
  int faults_injected() const {
    absl::MutexLock lock(&mu_);
    return injected_;
  }

  // write(2) and fdatasync(2) with the planned faults.
  ssize_t Write(int fd, const void* data, size_t size) {
    {
      absl::MutexLock lock(&mu_);
      if (write_faults_ > 0) {
        if (short_written_ && size > 0) {
          short_written_ = false;
          --write_faults_;
          ++injected_;
          errno = write_errno_;
          return -1;
        }
        short_written_ = true;
        size = std::max<size_t>(1, size / 2);
      }
    }
    return ::write(fd, data, size);
  }
  int Sync(int fd) {
    {
      absl::MutexLock lock(&mu_);
      if (sync_faults_ > 0) {
        --sync_faults_;
        ++injected_;
        errno = sync_errno_;
        return -1;
      }
    }
    return ::fdatasync(fd);
  }

  // For a store without files: takes the next planned fault, if any (a
  // write fault whole: the short part is a file matter). OK when none.
  absl::Status TakeFault(absl::string_view what) {
    absl::MutexLock lock(&mu_);
    int err = 0;
    if (write_faults_ > 0) {
      --write_faults_;
      err = write_errno_;
    } else if (sync_faults_ > 0) {
      --sync_faults_;
      err = sync_errno_;
    } else {
      return absl::OkStatus();
    }
    ++injected_;
    return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
  }

 private:
  mutable absl::Mutex mu_;
  int write_faults_ ABSL_GUARDED_BY(mu_) = 0;
  int write_errno_ ABSL_GUARDED_BY(mu_) = 0;
  bool short_written_ ABSL_GUARDED_BY(mu_) = false;
  int sync_faults_ ABSL_GUARDED_BY(mu_) = 0;
  int sync_errno_ ABSL_GUARDED_BY(mu_) = 0;
  int injected_ ABSL_GUARDED_BY(mu_) = 0;
};

// Wraps a store: an Append or Snapshot meeting a planned fault fails as the
// contract says a store fails (nothing of it recorded) without reaching the
// inner store; everything else is passed on.
class FaultInjectingMetadataStore : public MetadataStore {
 public:
  using MetadataStore::Append;
  FaultInjectingMetadataStore(std::unique_ptr<MetadataStore> inner,
                              FaultPlan* faults)
      : inner_(std::move(inner)), faults_(faults) {}

  absl::StatusOr<MetadataState> Load() override { return inner_->Load(); }
  absl::Status Append(absl::Span<const MetadataChange> changes) override {
    if (absl::Status fault = faults_->TakeFault("writing the log");
        !fault.ok()) {
      return fault;
    }
    return inner_->Append(changes);
  }
  absl::Status Snapshot(const MetadataState& state) override {
    if (absl::Status fault = faults_->TakeFault("writing the snapshot");
        !fault.ok()) {
      return fault;
    }
    return inner_->Snapshot(state);
  }
  std::string Describe() const override { return inner_->Describe(); }
  MetadataStore* inner() const { return inner_.get(); }

 private:
  const std::unique_ptr<MetadataStore> inner_;
  FaultPlan* const faults_;
};

struct MetadataStoreFactory {
  std::string name;  // a valid gtest name: "Memory", "File"
  // A new, empty store in a place of its own (not yet loaded).
  std::function<std::unique_ptr<MetadataStore>()> make;
  // The same, its writes meeting the faults of `faults` (which outlives it).
  // A restart (`reopen`) gives a store without faults.
  std::function<std::unique_ptr<MetadataStore>(FaultPlan* faults)> make_faulty;
  // What a restart gives: takes the store (and may destroy it) and returns
  // a store, not yet loaded, on the same place.
  std::function<std::unique_ptr<MetadataStore>(std::unique_ptr<MetadataStore>)>
      reopen;
};

class MetadataStoreContractTest
    : public ::testing::TestWithParam<MetadataStoreFactory> {
 public:
  static std::string Name(
      const ::testing::TestParamInfo<MetadataStoreFactory>& info) {
    return info.param.name;
  }

 protected:
  // A new store, loaded.
  std::unique_ptr<MetadataStore> Open() {
    std::unique_ptr<MetadataStore> store = GetParam().make();
    auto state = store->Load();
    EXPECT_TRUE(state.ok()) << state.status();
    return store;
  }
  // The store after a restart, and what it loads.
  MetadataState Reload(std::unique_ptr<MetadataStore>* store) {
    *store = GetParam().reopen(std::move(*store));
    auto state = (*store)->Load();
    EXPECT_TRUE(state.ok()) << state.status();
    return state.ok() ? *std::move(state) : MetadataState{};
  }

  static std::shared_ptr<const TensorMetadata> Tensor(const std::string& name,
                                                      uint64_t version,
                                                      int num_shards) {
    auto tensor = std::make_shared<TensorMetadata>();
    tensor->name = name;
    tensor->shape = {static_cast<int64_t>(num_shards) * 4, 3};
    tensor->dtype = DType::kInt32;
    tensor->requires_grad = version % 2 == 0;
    tensor->version = version;
    for (int i = 0; i < num_shards; ++i) {
      ShardInfo shard;
      shard.box = Box{{4 * i, 0}, {4, 3}};
      Replica& replica = shard.replicas.emplace_back();
      replica.rank = i;
      replica.worker = "w" + std::to_string(i);
      replica.shard_id = 1000 * version + static_cast<uint64_t>(i);
      tensor->shards.push_back(shard);
    }
    return tensor;
  }
  // Tensor(), with `copies` replicas of every shard: shard i's replica r on
  // worker w(i + r) (rank i + r, cpu, as Tensor's), with an id of its own.
  static std::shared_ptr<const TensorMetadata> Replicated(
      const std::string& name, uint64_t version, int num_shards, int copies) {
    auto tensor =
        std::make_shared<TensorMetadata>(*Tensor(name, version, num_shards));
    for (int i = 0; i < num_shards; ++i) {
      ShardInfo& shard = tensor->shards[static_cast<size_t>(i)];
      for (int r = 1; r < copies; ++r) {
        Replica& replica = shard.replicas.emplace_back();
        replica.rank = i + r;
        replica.worker = "w" + std::to_string(i + r);
        replica.shard_id = 1000 * version + static_cast<uint64_t>(100 * r + i);
      }
    }
    return tensor;
  }
  static WorkerInfo Worker(const std::string& name, int32_t rank) {
    WorkerInfo w;
    w.name = name;
    w.rank = rank;
    w.address = "127.0.0.1:" + std::to_string(7000 + rank);
    w.device = Device{Device::Kind::kCuda, rank};
    w.capacity_bytes = 1 << 20;
    return w;
  }
  // The durable fields of two tensors agree.
  static void ExpectSameTensor(const TensorMetadata& got,
                               const TensorMetadata& want) {
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.shape, want.shape);
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.requires_grad, want.requires_grad);
    EXPECT_EQ(got.pin_memory, want.pin_memory);
    EXPECT_EQ(got.version, want.version);
    ASSERT_EQ(got.shards.size(), want.shards.size()) << want.name;
    for (size_t i = 0; i < want.shards.size(); ++i) {
      EXPECT_EQ(got.shards[i].box, want.shards[i].box);
      ASSERT_EQ(got.shards[i].replicas.size(), want.shards[i].replicas.size())
          << want.name << " shard " << i;
      for (size_t r = 0; r < want.shards[i].replicas.size(); ++r) {
        const Replica& a = got.shards[i].replicas[r];
        const Replica& b = want.shards[i].replicas[r];
        EXPECT_EQ(a.rank, b.rank);
        EXPECT_EQ(a.device, b.device);
        EXPECT_EQ(a.worker, b.worker);
        EXPECT_EQ(a.shard_id, b.shard_id);
      }
    }
  }
  static std::vector<std::string> Names(const MetadataState& state) {
    std::vector<std::string> out;
    for (const auto& [name, tensor] : state.tensors) out.push_back(name);
    return out;
  }
};

TEST_P(MetadataStoreContractTest, NewStoreLoadsEmpty) {
  std::unique_ptr<MetadataStore> store = GetParam().make();
  auto state = store->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->tensors.empty());
  EXPECT_TRUE(state->workers.empty());
  EXPECT_EQ(state->shard_id_high_water, 0u);
  EXPECT_FALSE(store->Describe().empty());
}

TEST_P(MetadataStoreContractTest, AppendedChangesComeBackApplied) {
  std::unique_ptr<MetadataStore> store = Open();
  ASSERT_OK(store->Append(MetadataChange::Worker(Worker("w0", 0))));
  ASSERT_OK(store->Append(MetadataChange::Worker(Worker("w1", 1))));
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("a", 1, 2))));
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("b", 1, 3))));
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("a", 2, 4))));
  ASSERT_OK(store->Append(MetadataChange::DeletedTensor("b")));
  ASSERT_OK(store->Append(MetadataChange::ShardIdHighWater(70000)));
  WorkerInfo moved = Worker("w1", 1);
  moved.address = "127.0.0.1:9999";
  ASSERT_OK(store->Append(MetadataChange::Worker(moved)));

  const MetadataState state = Reload(&store);
  EXPECT_THAT(Names(state), ::testing::ElementsAre("a"));
  ExpectSameTensor(*state.tensors.at("a"), *Tensor("a", 2, 4));
  ASSERT_EQ(state.workers.size(), 2u);
  const WorkerInfo& w0 = state.workers.at("w0");
  EXPECT_EQ(w0.rank, 0);
  EXPECT_EQ(w0.address, "127.0.0.1:7000");
  EXPECT_EQ(w0.device, (Device{Device::Kind::kCuda, 0}));
  EXPECT_EQ(w0.capacity_bytes, 1 << 20);
  EXPECT_EQ(state.workers.at("w1").address, "127.0.0.1:9999");
  EXPECT_EQ(state.shard_id_high_water, 70000u);
}

TEST_P(MetadataStoreContractTest, ABatchIsAppliedInOrder) {
  std::unique_ptr<MetadataStore> store = Open();
  const std::vector<MetadataChange> batch = {
      MetadataChange::Tensor(Tensor("a", 1, 1)),
      MetadataChange::Tensor(Tensor("b", 1, 1)),
      MetadataChange::DeletedTensor("a"),
      MetadataChange::Tensor(Tensor("b", 2, 2)),
      MetadataChange::Tensor(Tensor("c", 1, 1)),
  };
  ASSERT_OK(store->Append(batch));
  ASSERT_OK(store->Append(std::vector<MetadataChange>{}));  // empty: no-op
  const MetadataState state = Reload(&store);
  EXPECT_THAT(Names(state), ::testing::ElementsAre("b", "c"));
  EXPECT_EQ(state.tensors.at("b")->version, 2u);
}

TEST_P(MetadataStoreContractTest, SnapshotReplacesTheHistory) {
  std::unique_ptr<MetadataStore> store = Open();
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("a", 1, 2))));
  ASSERT_OK(store->Append(MetadataChange::Worker(Worker("w0", 0))));
  ASSERT_OK(store->Append(MetadataChange::ShardIdHighWater(5000)));
  MetadataState snapshot;
  snapshot.tensors["c"] = Tensor("c", 3, 2);
  snapshot.workers["w1"] = Worker("w1", 1);
  snapshot.shard_id_high_water = 9000;
  ASSERT_OK(store->Snapshot(snapshot));
  const MetadataState state = Reload(&store);
  EXPECT_THAT(Names(state), ::testing::ElementsAre("c"));
  ExpectSameTensor(*state.tensors.at("c"), *Tensor("c", 3, 2));
  ASSERT_EQ(state.workers.size(), 1u);
  EXPECT_EQ(state.workers.count("w1"), 1u);
  EXPECT_EQ(state.shard_id_high_water, 9000u);
}

TEST_P(MetadataStoreContractTest, AppendsAfterASnapshotSurviveIt) {
  std::unique_ptr<MetadataStore> store = Open();
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("old", 1, 1))));
  MetadataState snapshot;
  snapshot.tensors["a"] = Tensor("a", 1, 2);
  snapshot.tensors["b"] = Tensor("b", 1, 2);
  ASSERT_OK(store->Snapshot(snapshot));
  ASSERT_OK(store->Append(MetadataChange::DeletedTensor("a")));
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("b", 2, 3))));
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("c", 1, 1))));
  MetadataState state = Reload(&store);
  EXPECT_THAT(Names(state), ::testing::ElementsAre("b", "c"));
  ExpectSameTensor(*state.tensors.at("b"), *Tensor("b", 2, 3));
  // And once more: the reopened store keeps appending where it was.
  ASSERT_OK(store->Append(MetadataChange::DeletedTensor("c")));
  state = Reload(&store);
  EXPECT_THAT(Names(state), ::testing::ElementsAre("b"));
}

TEST_P(MetadataStoreContractTest, SnapshotOfTheLoadedStateKeepsEverything) {
  // What the coordinator does at every start: load, then snapshot what was
  // loaded. Three starts in a row must give the same state.
  std::unique_ptr<MetadataStore> store = Open();
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("a", 1, 2))));
  ASSERT_OK(store->Append(MetadataChange::Worker(Worker("w0", 0))));
  for (int start = 0; start < 3; ++start) {
    MetadataState state = Reload(&store);
    ASSERT_THAT(Names(state), ::testing::ElementsAre("a")) << start;
    ExpectSameTensor(*state.tensors.at("a"), *Tensor("a", 1, 2));
    EXPECT_EQ(state.workers.count("w0"), 1u);
    ASSERT_OK(store->Snapshot(state));
  }
}

TEST_P(MetadataStoreContractTest, ReplicasSurviveLogAndSnapshot) {
  std::unique_ptr<MetadataStore> store = Open();
  ASSERT_OK(store->Append(MetadataChange::Tensor(Replicated("a", 1, 3, 2))));
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("b", 1, 2))));
  MetadataState state = Reload(&store);
  ExpectSameTensor(*state.tensors.at("a"), *Replicated("a", 1, 3, 2));
  ExpectSameTensor(*state.tensors.at("b"), *Tensor("b", 1, 2));
  ASSERT_OK(store->Snapshot(state));
  ASSERT_OK(store->Append(MetadataChange::Tensor(Replicated("b", 2, 2, 3))));
  state = Reload(&store);
  ExpectSameTensor(*state.tensors.at("a"), *Replicated("a", 1, 3, 2));
  ExpectSameTensor(*state.tensors.at("b"), *Replicated("b", 2, 2, 3));
}

TEST_P(MetadataStoreContractTest, CordonsDrainsAndRemovedWorkersSurvive) {
  std::unique_ptr<MetadataStore> store = Open();
  ASSERT_OK(store->Append(MetadataChange::Worker(Worker("w0", 0))));
  ASSERT_OK(store->Append(MetadataChange::Worker(Worker("w1", 1))));
  ASSERT_OK(store->Append(MetadataChange::Worker(Worker("w2", 2))));
  WorkerInfo cordoned = Worker("w0", 0);
  cordoned.state = WorkerState::kCordoned;
  WorkerInfo draining = Worker("w1", 1);
  draining.state = WorkerState::kDraining;
  ASSERT_OK(store->Append(MetadataChange::Worker(cordoned)));
  ASSERT_OK(store->Append(MetadataChange::Worker(draining)));
  ASSERT_OK(store->Append(MetadataChange::DeletedWorker("w2")));
  for (int start = 0; start < 2; ++start) {  // the log, then a snapshot
    MetadataState state = Reload(&store);
    ASSERT_EQ(state.workers.size(), 2u) << start;
    EXPECT_EQ(state.workers.at("w0").state, WorkerState::kCordoned) << start;
    EXPECT_EQ(state.workers.at("w1").state, WorkerState::kDraining) << start;
    EXPECT_EQ(state.workers.count("w2"), 0u) << start;
    ASSERT_OK(store->Snapshot(state));
  }
}

TEST_P(MetadataStoreContractTest, ShardIdHighWaterNeverGoesDown) {
  std::unique_ptr<MetadataStore> store = Open();
  ASSERT_OK(store->Append(MetadataChange::ShardIdHighWater(100)));
  ASSERT_OK(store->Append(MetadataChange::ShardIdHighWater(50)));
  EXPECT_EQ(Reload(&store).shard_id_high_water, 100u);
}

TEST_P(MetadataStoreContractTest, ClusterIdIsDrawnOnceAndKept) {
  std::unique_ptr<MetadataStore> store = GetParam().make();
  auto first = store->Load();
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string id = first->cluster_id;
  EXPECT_EQ(id.size(), 32u) << id;
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("a", 1, 1))));
  EXPECT_EQ(Reload(&store).cluster_id, id);
  MetadataState snapshot;
  snapshot.tensors["b"] = Tensor("b", 1, 1);
  ASSERT_OK(store->Snapshot(snapshot));
  EXPECT_EQ(Reload(&store).cluster_id, id);
  // Another new store is another cluster.
  std::unique_ptr<MetadataStore> other = GetParam().make();
  auto other_state = other->Load();
  ASSERT_TRUE(other_state.ok()) << other_state.status();
  EXPECT_NE(other_state->cluster_id, id);
}

TEST_P(MetadataStoreContractTest, AFailedWriteLeavesNothingAndTheLogGoesOn) {
  FaultPlan faults;
  std::unique_ptr<MetadataStore> store = GetParam().make_faulty(&faults);
  ASSERT_OK(store->Load().status());
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("a", 1, 2))));
  faults.FailWrites(1, ENOSPC);
  EXPECT_THAT(store->Append(std::vector<MetadataChange>{
                  MetadataChange::Tensor(Tensor("b", 1, 2)),
                  MetadataChange::Tensor(Tensor("c", 1, 30))}),
              StatusIs(absl::StatusCode::kInternal,
                       ::testing::HasSubstr("No space left")));
  EXPECT_EQ(faults.faults_injected(), 1);
  // Space is back: what is acknowledged now follows what was before.
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("d", 1, 2))));
  const MetadataState state = Reload(&store);
  EXPECT_THAT(Names(state), ::testing::ElementsAre("a", "d"));
  ExpectSameTensor(*state.tensors.at("d"), *Tensor("d", 1, 2));
}

TEST_P(MetadataStoreContractTest, AFailedSyncIsNotReplayedAfterARestart) {
  FaultPlan faults;
  std::unique_ptr<MetadataStore> store = GetParam().make_faulty(&faults);
  ASSERT_OK(store->Load().status());
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("a", 1, 2))));
  faults.FailSyncs(1, EIO);
  // The caller undoes "b": it must not come back at the next start.
  EXPECT_THAT(store->Append(MetadataChange::Tensor(Tensor("b", 1, 2))),
              StatusIs(absl::StatusCode::kInternal,
                       ::testing::HasSubstr("Input/output error")));
  absl::Status later = store->Append(MetadataChange::DeletedTensor("a"));
  const MetadataState state = Reload(&store);
  EXPECT_EQ(state.tensors.count("b"), 0u);
  // A change acknowledged after the fault is kept; a refused one is not.
  EXPECT_EQ(state.tensors.count("a"), later.ok() ? 0u : 1u) << later;
}

// A seeded random run of batches, snapshots, faults and restarts: after each
// restart the store holds exactly the changes it acknowledged.
TEST_P(MetadataStoreContractTest,
       RandomFaultsKeepExactlyTheAcknowledgedChanges) {
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937 random(seed);
    FaultPlan faults;
    std::unique_ptr<MetadataStore> store = GetParam().make_faulty(&faults);
    ASSERT_OK(store->Load().status());
    std::map<std::string, uint64_t> want;  // name -> version acknowledged
    for (int step = 0; step < 60; ++step) {
      const int fault = static_cast<int>(random() % 6);
      if (fault == 0) faults.FailWrites(1, ENOSPC);
      if (fault == 1) faults.FailSyncs(1, EIO);
      std::vector<MetadataChange> batch;
      std::map<std::string, uint64_t> after = want;
      const int size = 1 + static_cast<int>(random() % 3);
      for (int i = 0; i < size; ++i) {
        const std::string name = absl::StrCat("t", random() % 8);
        if (random() % 4 == 0 && after.count(name) != 0) {
          batch.push_back(MetadataChange::DeletedTensor(name));
          after.erase(name);
        } else {
          const uint64_t version = after.count(name) ? after[name] + 1 : 1;
          batch.push_back(MetadataChange::Tensor(
              Tensor(name, version, 1 + static_cast<int>(random() % 4))));
          after[name] = version;
        }
      }
      if (store->Append(batch).ok()) want = std::move(after);
      faults.FailWrites(0, 0);
      faults.FailSyncs(0, 0);
      if (random() % 10 == 0 || step == 59) {
        MetadataState state = Reload(&store);
        std::map<std::string, uint64_t> got;
        for (const auto& [name, tensor] : state.tensors)
          got[name] = tensor->version;
        ASSERT_EQ(got, want) << "step " << step;
        if (random() % 2 == 0) {
          ASSERT_OK(store->Snapshot(state));
        }
      }
    }
  }
}

}  // namespace testing
}  // namespace tessera

#endif  // TESSERA_COORDINATOR_METADATA_STORE_CONTRACT_TEST_H_
