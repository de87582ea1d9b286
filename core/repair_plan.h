// What a repair of one tensor must do (Repairs::Repair), decided from
// its metadata alone: which replicas leave (their worker is dead, lost them,
// or drains), which stay, and which replica each shard is copied from.
#ifndef TESSERA_CORE_REPAIR_PLAN_H_
#define TESSERA_CORE_REPAIR_PLAN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/replica_placement.h"
#include "core/tensor_metadata.h"

namespace tessera {

// One shard short of replicas.
struct ShardRepair {
  size_t shard = 0;    // index in the tensor's shards
  ShardToRepair need;  // for PlaceRepairs: kept workers, missing, bytes
  std::vector<size_t> leaving;  // replica indices that leave, copied anew
  size_t source = 0;            // the replica it is copied from
  // Replicas that leave whose place an available mirror takes, made a
  // replica where it is (no copy): (leaving replica, mirror) indices.
  std::vector<std::pair<size_t, size_t>> promoted;
};

struct RepairNeeds {
  std::vector<ShardRepair> shards;
  // Shards with replicas that leave but none available to copy from.
  int64_t shards_short = 0;
};

// For every shard of `meta` (worker availability filled in): a replica
// leaves when it is unavailable or `draining(worker)`; those that stay are
// kept as `candidate_of(worker)` (the placement candidate index; REQUIRES:
// one for every worker of a copy that stays). A shard is copied from an
// available replica, one that stays first, else an available mirror (one
// that stays first: a mirror on a draining worker may hold the last bytes).
// Mirror copies never leave here (Repairs::SyncMirrors drops them);
// their workers are kept, so no replica goes where a mirror is. Instead a
// replica that leaves is replaced by an available mirror on a worker that
// stays, when the shard has one: it becomes a replica in place, nothing
// copied (without it a drain of a worker in a mirror group that spans
// every worker could never finish).
RepairNeeds FindRepairs(
    const TensorMetadata& meta,
    const std::function<int(const std::string& worker)>& candidate_of,
    const std::function<bool(const std::string& worker)>& draining);

}  // namespace tessera

#endif  // TESSERA_CORE_REPAIR_PLAN_H_
