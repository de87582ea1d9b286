// Where a shard's further replicas go (CLI.md "Replicas (v3)"): the spec
// names each shard's first replica; the others go to distinct ready workers,
// on zones the shard does not use yet while the cluster has such zones, then
// to the least used workers with room. Pure functions; not synchronized.
#ifndef TESSERA_CORE_REPLICA_PLACEMENT_H_
#define TESSERA_CORE_REPLICA_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/worker_info.h"

namespace tessera {

// Replicas per shard: 1 (the default) to kMaxReplicas.
inline constexpr int kMaxReplicas = 16;

// INVALID_ARGUMENT "--replicas=R: ..." unless 1 <= R <= kMaxReplicas.
absl::Status CheckReplicaCount(int64_t replicas);

// A zone: 1 to 64 characters of letters, digits, '_', '.', '-', ':' and
// '/' (Kubernetes' topology values fit). INVALID_ARGUMENT "--zone=...".
absl::Status CheckZone(absl::string_view zone);

struct ReplicaCandidate {
  std::string name;
  // The failure domain; an empty zone is a zone of its own.
  std::string zone;
  WorkerState state = WorkerState::kReady;
  int64_t capacity_bytes = 0;  // 0: unlimited
  int64_t bytes_used = 0;
};

// One shard to place: the worker (an index into the candidates) holding
// its first replica, and its size.
struct ShardToPlace {
  int first = 0;
  int64_t bytes = 0;
};

// For each shard, the indices of the `replicas` distinct workers that hold
// it, its first replica first. Shards are placed in order, each replica on
// the worker that is, in this order: on a zone the shard does not use yet,
// least used (its bytes plus what this placement gave it so far), first by
// name. Errors, with nothing placed: INVALID_ARGUMENT for a bad count or a
// first replica outside `workers`; FAILED_PRECONDITION "replicas: ..." when
// fewer than `replicas` workers could hold a shard (its first replica's
// and the ready ones); RESOURCE_EXHAUSTED "capacity: ..." when the ready
// workers lack the room.
absl::StatusOr<std::vector<std::vector<int>>> PlaceReplicas(
    const std::vector<ReplicaCandidate>& workers,
    const std::vector<ShardToPlace>& shards, int replicas);

// One shard that lost replicas (its worker died, lost it, or is draining):
// the workers (indices into the candidates) whose replicas it keeps, how
// many new ones it needs, and its size.
struct ShardToRepair {
  std::vector<int> kept;
  int missing = 0;
  int64_t bytes = 0;
};

// For each shard, the workers that get its new replicas, by PlaceReplicas'
// rule (a zone the shard does not use yet, then the least used ready worker
// with room; the kept replicas' bytes are in their workers' bytes_used
// already). A repair does what it can: a shard gets fewer than `missing`
// (possibly none) when too few ready workers could take it, and the
// caller tries again later. INVALID_ARGUMENT for a kept index outside
// `workers` or a negative count or size.
absl::StatusOr<std::vector<std::vector<int>>> PlaceRepairs(
    const std::vector<ReplicaCandidate>& workers,
    const std::vector<ShardToRepair>& shards);

}  // namespace tessera

#endif  // TESSERA_CORE_REPLICA_PLACEMENT_H_
