// Coordinator: the logic behind the Coordinator service — worker membership
// and the global metadata of every sharded tensor. Core types in, StatusOr
// out; no gRPC here (workers are reached through WorkerControl).
//
// Thread-safe. Locks are never held while talking to workers: a create
// reserves the name under the lock, allocates on the workers without it, and
// commits (or undoes) under the lock again.
#ifndef TESSERA_COORDINATOR_COORDINATOR_H_
#define TESSERA_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/metadata_store.h"
#include "coordinator/worker_control.h"
#include "coordinator/worker_registry.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/init_fill.h"
#include "core/layout_spec.h"
#include "core/reshard_plan.h"
#include "core/tensor_metadata.h"

namespace tessera {

struct CoordinatorOptions {
  // A worker is dead when it has not heartbeated for this long.
  absl::Duration lease = absl::Seconds(5);
  // How often workers heartbeat (sent to them at registration).
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Snapshot the metadata after this many log records.
  int64_t snapshot_every = 1000;
  // Time source; tests inject a fake clock.
  Clock clock = [] { return absl::Now(); };
  // After a reshard commits version N+1, version N's shards stay readable
  // this long, so gets that started on N finish on N; then they are freed.
  // A read still running after that fails with ABORTED and the SDK reads
  // the new version instead: a reader never sees a mix of versions.
  absl::Duration retire_grace = absl::Seconds(5);
  // A tensor created pending (a put) and never committed is removed after
  // this long: its client died mid-put.
  absl::Duration pending_timeout = absl::Minutes(10);
};

struct CreateTensorArgs {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  bool requires_grad = false;
  bool pin_memory = false;
  LayoutSpec spec;
  InitSpec init;
  // Invisible to list/get until CommitTensor (a put writes the shards first).
  bool pending = false;
};

struct RegisterResult {
  int32_t rank = 0;
  std::vector<uint64_t> free_shard_ids;  // held shards no tensor references
};

struct TensorSummary {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  uint64_t version = 0;
  int64_t num_shards = 0;
};

class Coordinator {
 public:
  Coordinator(CoordinatorOptions options,
              std::unique_ptr<WorkerControl> workers,
              std::unique_ptr<MetadataStore> store =
                  std::make_unique<MemoryMetadataStore>());
  ~Coordinator();

  // Loads the metadata the store kept (call once, before serving). Known
  // workers come back dead until they register again and report the shards
  // they still hold.
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);
  // Counts of what Recover found, for the start-up log.
  struct Recovered {
    size_t tensors = 0;
    size_t workers = 0;
  };
  Recovered recovered() const { return recovered_; }

  const CoordinatorOptions& options() const { return options_; }

  absl::StatusOr<RegisterResult> RegisterWorker(
      const WorkerRegistration& registration,
      const std::vector<uint64_t>& held_shard_ids) ABSL_LOCKS_EXCLUDED(mu_);
  // False when the worker is unknown and must register again.
  bool Heartbeat(const std::string& name, int64_t bytes_used);
  std::vector<WorkerRecord> ListWorkers() const;

  // Validates, resolves placements, allocates every shard (all or nothing)
  // and commits version 1. Returns the committed (immutable) metadata itself,
  // not a copy: it can hold very many shards.
  absl::StatusOr<std::shared_ptr<const TensorMetadata>> CreateTensor(
      const CreateTensorArgs& args) ABSL_LOCKS_EXCLUDED(mu_);
  // Makes a pending tensor visible.
  absl::Status CommitTensor(const std::string& name, uint64_t version)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Current metadata, with each shard's worker address and availability.
  absl::StatusOr<TensorMetadata> GetTensor(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<TensorSummary> ListTensors() const ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the tensor (visible or pending) and frees its shards.
  absl::Status DeleteTensor(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // Moves a tensor to a new layout as version N+1: allocates the new shards,
  // has destination workers pull their pieces from the source workers (in
  // parallel), then commits atomically. On any failure version N stays
  // intact and every new shard is freed. One reshard per tensor at a time:
  // a second one fails with ABORTED. expected_version 0 means any.
  absl::StatusOr<ReshardResult> ReshardTensor(const std::string& name,
                                              const LayoutSpec& spec,
                                              uint64_t expected_version)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class State { kCreating, kPending, kReady };
  struct TensorEntry {
    State state = State::kCreating;
    bool resharding = false;  // a reshard of this tensor is running
    absl::Time created;  // when the create began (for reaping abandoned puts)
    // Immutable once published; shared so readers copy out cheaply.
    std::shared_ptr<const TensorMetadata> meta;
  };

  // Shards of a replaced version, freed once `due` has passed.
  struct Retirement {
    absl::Time due;
    TensorMetadata shards;
  };

  // Refuses shards that would not fit in their workers' capacity.
  absl::Status CheckCapacity(const TensorMetadata& shards) const;
  // Hands out `n` shard ids, recording a new high-water mark first when needed.
  absl::StatusOr<uint64_t> TakeShardIds(size_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Durably records a change; snapshots every options_.snapshot_every records.
  absl::Status Record(const MetadataChange& change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the shards `worker` should hold as held or lost; returns the held
  // ids that no tensor references.
  std::vector<uint64_t> Reconcile(const std::string& worker,
                                  const std::vector<uint64_t>& held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Resolves spec.placements[i] for every box into `meta->shards`.
  absl::Status PlaceShards(const LayoutSpec& spec, std::vector<Box> boxes,
                           TensorMetadata* meta);
  // Runs the pieces of a reshard: each destination worker pulls its pieces.
  absl::Status MovePieces(const TensorMetadata& old_meta,
                          const TensorMetadata& new_meta,
                          const ReshardPlan& plan);
  // Frees retired versions whose grace period is over; runs on retire_thread_.
  void RetireLoop();

  // Allocates `meta`'s shards on their workers, one batch per worker in
  // parallel; on failure frees whatever was allocated.
  absl::Status AllocateShards(const TensorMetadata& meta, const InitSpec& init);
  // Frees shards on their workers (best effort; failures are logged).
  void FreeShards(const TensorMetadata& meta);
  // Fills in addresses and availability from the registry.
  void FillWorkerState(TensorMetadata* meta) const;

  const CoordinatorOptions options_;
  const std::unique_ptr<WorkerControl> workers_;
  const std::unique_ptr<MetadataStore> store_;
  WorkerRegistry registry_;
  Recovered recovered_;

  // Invariants: every name in tensors_ is a valid tensor name; a kReady or
  // kPending entry has meta != nullptr; every shard id of every entry is in
  // referenced_shards_; shard ids are never reused (next_shard_id_ only grows).
  mutable absl::Mutex mu_;
  std::map<std::string, TensorEntry> tensors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> referenced_shards_ ABSL_GUARDED_BY(mu_);
  uint64_t next_shard_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Ids below this may have been handed out before a restart; recorded in the
  // store.
  uint64_t shard_id_high_water_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t records_since_snapshot_ ABSL_GUARDED_BY(mu_) = 0;
  // Shards whose worker re-registered without them.
  absl::flat_hash_set<uint64_t> lost_ ABSL_GUARDED_BY(mu_);
  std::vector<Retirement> retirements_ ABSL_GUARDED_BY(mu_);

  absl::Notification stop_;
  std::thread retire_thread_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_COORDINATOR_H_
