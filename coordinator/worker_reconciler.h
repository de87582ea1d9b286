// WorkerReconciler: a worker registering (for the first time, after its own
// restart, or after the coordinator's). It checks the registration, records
// the worker durably before the registry shows it, and reconciles the shards
// the worker reports against the tensor table: held shards that nothing
// references are handed back to be freed, expected shards it does not hold
// are marked lost (unavailable to readers) until it has them again.
//
// Between registrations, heartbeats keep what a worker holds in line with
// what the coordinator wants it to hold, so that a free that never arrived
// (a worker stopped during `rm`) or an allocation the coordinator gave up on
// after the worker made it (an orphan) is found and freed without a restart:
//
//   * Every allocate and free order goes through a HeldShardTracker, which
//     keeps, per worker, the count and the XOR of the shard ids the
//     coordinator wants it to hold (allocations that succeeded, less every
//     shard it was told to free, whatever the outcome of that order).
//   * Each heartbeat carries the same digest of what the worker holds. When
//     the two differ the coordinator asks for the list of ids (at most once
//     per held_check_interval per worker); from the list it frees, in the
//     heartbeat's reply, every id no tensor version (nor an allocation in
//     flight) references, and takes the list less those ids as what the
//     worker holds. Frees are thus derived from the durable metadata and
//     retried until the worker's digest shows them done.
//
// Thread-safe. The reconciler takes no lock across the durable record; the
// tracker's lock is a leaf, never held across a worker call.
#ifndef TESSERA_COORDINATOR_WORKER_RECONCILER_H_
#define TESSERA_COORDINATOR_WORKER_RECONCILER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "coordinator/metadata_log.h"
#include "coordinator/tensor_table.h"
#include "coordinator/worker_control.h"
#include "coordinator/worker_registry.h"

namespace tessera {

struct RegisterResult {
  int32_t rank = 0;
  std::vector<uint64_t> free_shard_ids;  // held shards no tensor references
  // Held shards not what the coordinator placed under their ids.
  std::vector<uint64_t> set_aside_shard_ids;
  std::string cluster_id;  // the coordinator's cluster
};

// What a heartbeat says a worker holds (for the cluster it serves).
struct HeldReport {
  int64_t count = 0;
  uint64_t xor_ids = 0;  // XOR of every held shard id
  // Every held id, when the coordinator asked for them.
  std::optional<std::vector<uint64_t>> ids;
  // What the worker keeps for another cluster (left out of the above).
  int64_t quarantined_shards = 0;
  int64_t quarantined_bytes = 0;
  // A GPU worker's device memory.
  int64_t device_total_bytes = 0;
  int64_t device_free_bytes = 0;
};

struct HeartbeatResult {
  bool known = true;       // false: the worker must register (again)
  bool send_held = false;  // send the list of held ids with the next beat
  std::vector<uint64_t> free_shard_ids;  // held, unreferenced: free them
};

// A WorkerControl that passes every call on and keeps, per worker name, the
// digest (count and XOR of ids) of the shards the coordinator wants that
// worker to hold. Thread-safe.
class HeldShardTracker : public WorkerControl {
 public:
  // `inner` must outlive the tracker.
  explicit HeldShardTracker(WorkerControl* inner) : inner_(inner) {}

  absl::StatusOr<BytesUsedReading> Allocate(const WorkerRef& worker,
                                            const AllocateBatch& batch) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<BytesUsedReading> Free(
      const WorkerRef& worker, const std::vector<uint64_t>& shard_ids) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Seal(const WorkerRef& worker,
                    const std::vector<uint64_t>& shard_ids,
                    bool persist) override {
    return inner_->Seal(worker, shard_ids, persist);
  }
  void Reset(const std::string& address) override { inner_->Reset(address); }
  absl::Status Transfer(const TransferBatch& batch,
                        SentBytes* sent = nullptr) override {
    return inner_->Transfer(batch, sent);
  }
  absl::StatusOr<std::string> ExchangeId(const WorkerRef& worker) override {
    return inner_->ExchangeId(worker);
  }
  absl::StatusOr<int64_t> Exchange(const WorkerRef& worker,
                                   const ExchangePlan& plan,
                                   Cancellation* cancellation) override {
    return inner_->Exchange(worker, plan, cancellation);
  }
  absl::StatusOr<CheckpointListing> ListCheckpoint(
      const WorkerRef& worker, const std::string& dir) override {
    return inner_->ListCheckpoint(worker, dir);
  }
  absl::StatusOr<LoadedRuns> LoadShard(const WorkerRef& worker,
                                       const std::string& dir,
                                       const LoadOrder& order) override {
    return inner_->LoadShard(worker, dir, order);
  }
  absl::StatusOr<std::vector<SavedItem>> SaveShards(
      const WorkerRef& worker, const std::string& dir, const std::string& file,
      const std::vector<SaveItem>& items,
      const std::vector<std::pair<std::string, std::string>>& metadata)
      override {
    return inner_->SaveShards(worker, dir, file, items, metadata);
  }
  absl::Status WriteCheckpointFile(const WorkerRef& worker,
                                   const std::string& dir,
                                   const std::string& name,
                                   const std::string& content,
                                   int64_t size) override {
    return inner_->WriteCheckpointFile(worker, dir, name, content, size);
  }
  absl::StatusOr<int64_t> WriteShardRuns(
      const WorkerRef& worker, const std::string& dir, const std::string& file,
      const std::string& save_id, uint64_t shard_id, const std::string& tensor,
      uint64_t version, const std::vector<FileRun>& runs) override {
    return inner_->WriteShardRuns(worker, dir, file, save_id, shard_id, tensor,
                                  version, runs);
  }
  absl::Status PublishCheckpointFiles(
      const WorkerRef& worker, const std::string& dir,
      const std::string& save_id,
      const std::vector<std::pair<std::string, std::string>>& renames)
      override {
    return inner_->PublishCheckpointFiles(worker, dir, save_id, renames);
  }
  absl::Status RemoveCheckpointFiles(const WorkerRef& worker,
                                     const std::string& dir,
                                     const std::vector<std::string>& names,
                                     const std::string& save_id) override {
    return inner_->RemoveCheckpointFiles(worker, dir, names, save_id);
  }

  // The worker holds exactly `held` (a registration, or a list it sent).
  void Set(const std::string& worker, absl::Span<const uint64_t> held)
      ABSL_LOCKS_EXCLUDED(mu_);
  // True when `report` matches what `worker` should hold.
  bool Matches(const std::string& worker, const HeldReport& report) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Digest {
    int64_t count = 0;
    uint64_t xor_ids = 0;
  };
  WorkerControl* const inner_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Digest> expected_ ABSL_GUARDED_BY(mu_);
};

class WorkerReconciler {
 public:
  // Every pointer must outlive the reconciler. `held`, when given, is the
  // tracker every order to the workers goes through (heartbeats then
  // reconcile); without it heartbeats only renew leases.
  // `held_check_interval`: a worker whose digest differs is asked for its
  // list at most this often. `clock` times it.
  WorkerReconciler(WorkerRegistry* registry, TensorTable* table,
                   MetadataLog* log, WorkerControl* workers,
                   HeldShardTracker* held = nullptr,
                   absl::Duration held_check_interval = absl::Seconds(2),
                   std::function<absl::Time()> clock = absl::Now);

  // INVALID_ARGUMENT for a bad name, address or rank; the registry's
  // ALREADY_EXISTS for a clash; the log's error when the record fails (the
  // registry is then unchanged).
  absl::StatusOr<RegisterResult> Register(
      const WorkerRegistration& registration,
      const std::vector<uint64_t>& held_shard_ids) ABSL_LOCKS_EXCLUDED(mu_);

  // Renews the worker's lease and checks what it holds (see above).
  HeartbeatResult Heartbeat(const std::string& name,
                            BytesUsedReading bytes_used, const HeldReport& held)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  WorkerRegistry* const registry_;
  TensorTable* const table_;
  MetadataLog* const log_;
  WorkerControl* const workers_;
  HeldShardTracker* const held_;
  const absl::Duration held_check_interval_;
  const std::function<absl::Time()> clock_;

  // When each worker was last asked for its list of held ids.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, absl::Time> last_asked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_WORKER_RECONCILER_H_
