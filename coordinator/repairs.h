// Repairs: keeps each tensor's copies where they belong (CLI.md "Replicas
// (v3)", "Mirrors (v4)"). A shard that lost a replica (its worker dead,
// forgotten, draining, or it lost the shard) gets a new one, copied from a
// survivor or taken over in place by a mirror; a mirror group's members
// that came get their copies, and those that left lose them. What is short
// and where new copies go is planned in core/ (core/repair_plan,
// core/replica_placement, core/mirror_plan); the copies are made with the
// Orchestrator's steps (FillNewCopies, RecordVersion) and moved by its
// PieceMover. The Coordinator's repair thread calls it.
//
// Thread-safe (it keeps no state of its own; a tensor's change is
// exclusive through the TensorTable).
#ifndef TESSERA_COORDINATOR_REPAIRS_H_
#define TESSERA_COORDINATOR_REPAIRS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/orchestrator.h"
#include "coordinator/tensor_table.h"
#include "coordinator/worker_registry.h"
#include "core/tensor_metadata.h"

namespace tessera {

// What one repair of one tensor did (Repairs::Repair).
struct RepairResult {
  int64_t replicas_made = 0;     // new replicas, each a copy of a survivor
  int64_t bytes_copied = 0;      // their bytes
  int64_t mirrors_promoted = 0;  // mirrors made replicas in place (no copy)
  // Shards still short of replicas: none survives to copy from, or no
  // ready worker has room for a new one yet.
  int64_t shards_short = 0;
};

// What one pass over a mirrored tensor's mirrors did (Repairs::SyncMirrors).
struct MirrorSyncResult {
  int64_t mirrors_made = 0;     // new mirror copies, each filled by a copy
  int64_t mirrors_dropped = 0;  // copies on workers that left the group
  int64_t bytes_copied = 0;
};

class Repairs {
 public:
  // Every pointer must outlive the object.
  Repairs(Orchestrator* orchestrator, WorkerRegistry* registry,
          TensorTable* table)
      : orchestrator_(orchestrator), registry_(registry), table_(table) {}

  // Gives each shard of `name`'s current version that lost a replica — its
  // worker is dead, forgotten or lost it — or has one on a draining worker
  // a new replica on a ready worker (core/replica_placement PlaceRepairs),
  // copied from a surviving replica, and records version N again with the
  // new replicas in place of those (which are retired as a reshard retires
  // N's shards: freed once N's current readers are done). Copies exactly
  // the lost shards' bytes. All or nothing, like a reshard: on failure the
  // tensor is as it was and the new replicas are freed. NOT_FOUND;
  // ABORTED while another change of the tensor runs (try again later).
  absl::StatusOr<RepairResult> Repair(const std::string& name);

  // Brings `name`'s mirrors (CLI.md "Mirrors (v4)") in line with its
  // mirror group now (core/mirror_plan): members that came (registered,
  // uncordoned) get a copy of each shard, filled from an available copy,
  // charged to the owner's quota; copies on workers that left (dead,
  // cordoned, draining, removed) or lost them are retired. Records version
  // N again, as a repair does; all or nothing. ABORTED while another
  // change of the tensor runs.
  absl::StatusOr<MirrorSyncResult> SyncMirrors(const std::string& name);
  // True when SyncMirrors(name) has something to do for `meta` (its worker
  // state filled in) now: a cheap check for the repair loop.
  bool MirrorsBehind(const TensorMetadata& meta) const;

 private:
  Orchestrator* const orchestrator_;
  WorkerRegistry* const registry_;
  TensorTable* const table_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_REPAIRS_H_
