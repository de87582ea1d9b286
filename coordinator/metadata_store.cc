#include "coordinator/metadata_store.h"

#include <algorithm>
#include <utility>

namespace tessera {

MetadataChange MetadataChange::Worker(WorkerInfo worker) {
  MetadataChange change;
  change.kind = Kind::kWorker;
  change.worker = std::move(worker);
  change.worker.bytes_used = 0;
  change.worker.alive = false;
  return change;
}

MetadataChange MetadataChange::Tensor(
    std::shared_ptr<const TensorMetadata> tensor) {
  MetadataChange change;
  change.kind = Kind::kTensor;
  change.tensor = std::move(tensor);
  return change;
}

MetadataChange MetadataChange::DeletedTensor(std::string name) {
  MetadataChange change;
  change.kind = Kind::kDeletedTensor;
  change.deleted_tensor = std::move(name);
  return change;
}

MetadataChange MetadataChange::ShardIdHighWater(uint64_t high_water) {
  MetadataChange change;
  change.kind = Kind::kShardIdHighWater;
  change.shard_id_high_water = high_water;
  return change;
}

void MetadataState::Apply(const MetadataChange& change) {
  switch (change.kind) {
    case MetadataChange::Kind::kWorker:
      workers[change.worker.name] = change.worker;
      return;
    case MetadataChange::Kind::kTensor:
      tensors[change.tensor->name] = change.tensor;
      return;
    case MetadataChange::Kind::kDeletedTensor:
      tensors.erase(change.deleted_tensor);
      return;
    case MetadataChange::Kind::kShardIdHighWater:
      shard_id_high_water =
          std::max(shard_id_high_water, change.shard_id_high_water);
      return;
  }
}

absl::StatusOr<MetadataState> MemoryMetadataStore::Load() {
  absl::MutexLock lock(&mu_);
  return state_;
}

absl::Status MemoryMetadataStore::Append(
    absl::Span<const MetadataChange> changes) {
  absl::MutexLock lock(&mu_);
  for (const MetadataChange& change : changes) state_.Apply(change);
  return absl::OkStatus();
}

absl::Status MemoryMetadataStore::Snapshot(const MetadataState& state) {
  absl::MutexLock lock(&mu_);
  state_ = state;
  return absl::OkStatus();
}

}  // namespace tessera
