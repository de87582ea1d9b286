// Orchestrator: carries out creates, puts, commits, reshards and deletes —
// resolves placements, checks capacity, has the workers allocate, move and
// free shards (through WorkerControl, one request per worker or per pair of
// workers, all in parallel), and records and publishes each change through
// the TensorTable and the MetadataLog.
//
// All or nothing: a create that fails on any worker leaves nothing
// allocated; a reshard that fails leaves version N intact and frees every
// new shard; a change whose record fails is undone.
//
// Thread-safe, and holds no lock of its own: the table's lock is taken in
// short sections, never across a worker call or a wait for the disk.
#ifndef TESSERA_COORDINATOR_ORCHESTRATOR_H_
#define TESSERA_COORDINATOR_ORCHESTRATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/metadata_log.h"
#include "coordinator/tensor_table.h"
#include "coordinator/worker_control.h"
#include "coordinator/worker_registry.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/init_fill.h"
#include "core/layout_spec.h"
#include "core/reshard_plan.h"
#include "core/tensor_metadata.h"
#include "core/transfer.h"

namespace tessera {

struct CreateTensorArgs {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  bool requires_grad = false;
  bool pin_memory = false;
  LayoutSpec spec;
  InitSpec init;
  // Invisible to list/get until CommitTensor (a put writes the shards first).
  bool pending = false;
  // The principal creating it (empty without tokens): only it may commit a
  // pending tensor.
  std::string owner;
};

class Orchestrator {
 public:
  // Every pointer must outlive the orchestrator.
  Orchestrator(WorkerRegistry* registry, TensorTable* table, MetadataLog* log,
               WorkerControl* workers);

  // See Coordinator for each operation's contract.
  absl::StatusOr<TensorMetadataPtr> Create(const CreateTensorArgs& args);
  absl::Status Commit(const std::string& name, uint64_t version,
                      const std::string& principal = "");
  absl::Status Delete(const std::string& name);
  absl::StatusOr<ReshardResult> Reshard(const std::string& name,
                                        const LayoutSpec& spec,
                                        uint64_t expected_version);
  // Frees retired versions and abandoned puts that are due.
  void FreeDue();

  // Fills in each shard's worker address and availability (registry and
  // lost shards).
  void FillWorkerState(TensorMetadata* meta) const;

 private:
  // Resolves spec.placements[i] for every box into `meta->shards`.
  absl::Status PlaceShards(const LayoutSpec& spec, std::vector<Box> boxes,
                           TensorMetadata* meta) const;
  // Refuses shards that would not fit in their workers' capacity.
  absl::Status CheckCapacity(const TensorMetadata& shards) const;
  // Allocates `meta`'s shards, one batch per worker in parallel; on failure
  // frees whatever was allocated.
  // `writable`: a put's shards, which its client writes once.
  absl::Status AllocateShards(const TensorMetadata& meta, const InitSpec& init,
                              bool writable);
  // Frees shards on their workers (best effort; failures are logged).
  void FreeShards(const TensorMetadata& meta);
  // Runs the pieces of a reshard: one Transfer per pair of workers, all in
  // parallel.
  absl::Status MovePieces(const TensorMetadata& old_meta,
                          const TensorMetadata& new_meta,
                          const ReshardPlan& plan);

  WorkerRegistry* const registry_;
  TensorTable* const table_;
  MetadataLog* const log_;
  WorkerControl* const workers_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_ORCHESTRATOR_H_
