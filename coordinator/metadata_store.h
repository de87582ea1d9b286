// MetadataStore: where the coordinator keeps its metadata so that it survives
// a restart. Every change is appended as a record and is durable when
// Append returns; Snapshot replaces the history with one state. Two
// implementations: in memory (no --data_dir; nothing survives) and a
// checksummed append-only log with snapshots in a directory.
// Implementations are thread-safe.
#ifndef TESSERA_COORDINATOR_METADATA_STORE_H_
#define TESSERA_COORDINATOR_METADATA_STORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/placement.h"
#include "core/tensor_metadata.h"

namespace tessera {

// A worker as remembered across restarts (liveness is not remembered).
struct KnownWorker {
  std::string name;
  int32_t rank = 0;
  std::string address;
  Device device;
  int64_t capacity_bytes = 0;
};

struct MetadataChange {
  enum class Kind { kWorker, kTensor, kDeletedTensor, kShardIdHighWater };
  Kind kind = Kind::kTensor;
  KnownWorker worker;          // kWorker
  TensorMetadata tensor;       // kTensor: the tensor's new current version
  std::string deleted_tensor;  // kDeletedTensor
  uint64_t shard_id_high_water = 0;  // kShardIdHighWater
};

struct MetadataState {
  std::map<std::string, KnownWorker> workers;     // by name
  std::map<std::string, TensorMetadata> tensors;  // by name
  uint64_t shard_id_high_water = 0;

  // Applies one change (the log's replay rule, in one place).
  void Apply(const MetadataChange& change);
};

class MetadataStore {
 public:
  virtual ~MetadataStore() = default;
  // The state recovered at start-up (empty for a new store).
  virtual absl::StatusOr<MetadataState> Load() = 0;
  // Durably records one change.
  virtual absl::Status Append(const MetadataChange& change) = 0;
  // Durably replaces the history with `state`.
  virtual absl::Status Snapshot(const MetadataState& state) = 0;
  // For the start-up log: "in memory only" or "log and snapshot in DIR".
  virtual std::string Describe() const = 0;
};

// Keeps nothing: the coordinator's state lives and dies with the process.
class MemoryMetadataStore : public MetadataStore {
 public:
  absl::StatusOr<MetadataState> Load() override { return MetadataState{}; }
  absl::Status Append(const MetadataChange&) override {
    return absl::OkStatus();
  }
  absl::Status Snapshot(const MetadataState&) override {
    return absl::OkStatus();
  }
  std::string Describe() const override {
    return "in memory only (lost on restart)";
  }
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_METADATA_STORE_H_
