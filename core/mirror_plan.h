// Which copies a mirrored tensor's shards should have (CLI.md "Mirrors
// (v4)"), decided from its metadata and the cluster's workers alone: the
// mirror group is every alive, ready worker whose labels match the
// tensor's selector; each shard keeps a mirror on each member that holds no
// other copy of it, and drops the mirrors on workers that left the group
// or lost their copy. Pure functions; the orchestrator carries the plan
// out (Orchestrator::Create, Reshard and SyncMirrors).
#ifndef TESSERA_CORE_MIRROR_PLAN_H_
#define TESSERA_CORE_MIRROR_PLAN_H_

#include <cstddef>
#include <string>
#include <vector>

#include "core/labels.h"
#include "core/tensor_metadata.h"
#include "core/worker_info.h"

namespace tessera {

// A worker as the mirror group sees it.
struct MirrorCandidate {
  std::string name;
  Labels labels;
  bool alive = false;
  WorkerState state = WorkerState::kReady;
};

// The names of the workers `selector` takes now, in the order given: alive,
// ready (not cordoned, not draining) and matching.
std::vector<std::string> MirrorGroup(const LabelSelector& selector,
                                     const std::vector<MirrorCandidate>& all);

// What one shard's mirrors need.
struct ShardMirrors {
  size_t shard = 0;
  std::vector<size_t> dropped;     // its mirror replicas that go
  std::vector<std::string> added;  // workers that get a mirror of it
  size_t source = 0;               // the copy the new ones are filled from
};

// For `meta` (worker availability filled in) and its mirror group now:
// mirrors that are unavailable are dropped, and so are those on workers
// outside the group while the shard has an available replica (without one,
// they may hold its last bytes: they stay for the repair to copy); each
// member holding no available copy of a shard gets a mirror of it, filled
// from an available copy (a replica first, then a mirror). A shard with no
// available copy gets no new mirror. Only shards that change are listed.
std::vector<ShardMirrors> PlanMirrors(const TensorMetadata& meta,
                                      const std::vector<std::string>& group);

}  // namespace tessera

#endif  // TESSERA_CORE_MIRROR_PLAN_H_
