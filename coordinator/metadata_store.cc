#include "coordinator/metadata_store.h"

#include <algorithm>

namespace tessera {

void MetadataState::Apply(const MetadataChange& change) {
  switch (change.kind) {
    case MetadataChange::Kind::kWorker:
      workers[change.worker.name] = change.worker;
      return;
    case MetadataChange::Kind::kTensor:
      tensors[change.tensor.name] = change.tensor;
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

}  // namespace tessera
