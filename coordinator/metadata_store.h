// MetadataStore: where the coordinator keeps its metadata so that it survives
// a restart. Changes are appended as records, in batches that are durable
// when Append returns; Snapshot replaces the history with one state. Two
// implementations: in memory (no --data_dir; survives only within the
// process) and a checksummed append-only log with snapshots in a directory.
// Every implementation passes metadata_store_contract_test.h.
//
// Implementations are thread-safe, but the coordinator calls Append and
// Snapshot from one thread at a time (its record writer, metadata_log.h).
#ifndef TESSERA_COORDINATOR_METADATA_STORE_H_
#define TESSERA_COORDINATOR_METADATA_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/tensor_metadata.h"
#include "core/worker_info.h"

namespace tessera {

// One change. Tensors are shared, immutable metadata: a record of a
// 100k-shard tensor does not copy its shards.
struct MetadataChange {
  enum class Kind {
    kWorker,
    kTensor,
    kDeletedTensor,
    kShardIdHighWater,
    kDeletedWorker
  };
  Kind kind = Kind::kTensor;
  // kWorker: a worker as remembered across restarts (name, rank, address,
  // device, capacity_bytes, and `state` when an admin cordoned or drained
  // it; bytes_used and alive are not durable).
  WorkerInfo worker;
  // kTensor: the tensor's new current version (never null for kTensor).
  std::shared_ptr<const TensorMetadata> tensor;
  std::string deleted_tensor;        // kDeletedTensor
  std::string deleted_worker;        // kDeletedWorker
  uint64_t shard_id_high_water = 0;  // kShardIdHighWater

  static MetadataChange Worker(WorkerInfo worker);
  static MetadataChange Tensor(std::shared_ptr<const TensorMetadata> tensor);
  static MetadataChange DeletedTensor(std::string name);
  static MetadataChange DeletedWorker(std::string name);
  static MetadataChange ShardIdHighWater(uint64_t high_water);
};

// The whole metadata at one point. Copies share the tensors.
struct MetadataState {
  std::map<std::string, WorkerInfo> workers;  // by name
  std::map<std::string, std::shared_ptr<const TensorMetadata>> tensors;
  uint64_t shard_id_high_water = 0;
  // The cluster this metadata belongs to: drawn at random when the store is
  // new, the same at every Load after (not changed by records or
  // snapshots). Workers never free shards on the word of a coordinator
  // whose cluster id differs from the one they serve.
  std::string cluster_id;

  // Applies one change (the log's replay rule, in one place).
  void Apply(const MetadataChange& change);
};

class MetadataStore {
 public:
  virtual ~MetadataStore() = default;
  // The state recovered at start-up (empty for a new store). Call once,
  // before anything else.
  virtual absl::StatusOr<MetadataState> Load() = 0;
  // Durably records `changes`, in order, all or none: on error none of them
  // counts as recorded. A store that cannot tell what reached the disk (a
  // failed fsync) refuses every later Append and Snapshot.
  virtual absl::Status Append(absl::Span<const MetadataChange> changes) = 0;
  absl::Status Append(const MetadataChange& change) {
    return Append(absl::MakeConstSpan(&change, 1));
  }
  // Durably replaces the history with `state`, which must hold every change
  // appended so far. Not to be called while an Append runs. On failure the
  // history is as it was (Load gives the same state) and Append goes on,
  // unless the error is FAILED_PRECONDITION or DATA_LOSS: the store then
  // refuses every later change.
  virtual absl::Status Snapshot(const MetadataState& state) = 0;
  // Whether Load replays changes on top of a snapshot (so that a Snapshot
  // would shorten the history), rather than reading one snapshot that a
  // Snapshot of the same state would only write again.
  virtual bool ReplaysRecords() const { return true; }
  // For the start-up log: "in memory only" or "log and snapshot in DIR".
  virtual std::string Describe() const = 0;
};

// Keeps the state in memory: it lives and dies with the process. Load gives
// back what was appended to this object (same process only; a new
// MemoryMetadataStore starts empty).
class MemoryMetadataStore : public MetadataStore {
 public:
  // Draws this object's cluster id.
  MemoryMetadataStore();
  using MetadataStore::Append;
  absl::StatusOr<MetadataState> Load() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Append(absl::Span<const MetadataChange> changes) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Snapshot(const MetadataState& state) override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string Describe() const override {
    return "in memory only (lost on restart)";
  }

 private:
  absl::Mutex mu_;
  MetadataState state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_METADATA_STORE_H_
