#include "coordinator/metadata_store.h"

#include <sys/random.h>

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"

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

MetadataChange MetadataChange::DeletedWorker(std::string name) {
  MetadataChange change;
  change.kind = Kind::kDeletedWorker;
  change.deleted_worker = std::move(name);
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
    case MetadataChange::Kind::kDeletedWorker:
      workers.erase(change.deleted_worker);
      return;
    case MetadataChange::Kind::kShardIdHighWater:
      shard_id_high_water =
          std::max(shard_id_high_water, change.shard_id_high_water);
      return;
  }
}

MemoryMetadataStore::MemoryMetadataStore() {
  char random[16] = {};
  size_t got = 0;
  while (got < sizeof(random)) {
    const ssize_t n = getrandom(random + got, sizeof(random) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  state_.cluster_id =
      absl::BytesToHexString(absl::string_view(random, sizeof(random)));
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
  const std::string cluster_id = std::move(state_.cluster_id);
  state_ = state;
  state_.cluster_id = cluster_id;
  return absl::OkStatus();
}

}  // namespace tessera
