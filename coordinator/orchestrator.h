// Orchestrator: carries out creates, puts, commits, updates, reshards
// and deletes — resolves placements, checks capacity, has the
// workers allocate and free shards (through WorkerControl, one request per
// worker, all in parallel) and move bytes (through its PieceMover), and
// records and publishes each change through the TensorTable and the
// MetadataLog. Checkpoints (checkpoints.h) and Repairs (repairs.h) build on
// it.
//
// All or nothing: a create that fails on any worker leaves nothing
// allocated; a reshard that fails leaves version N intact and frees every
// new shard; a change whose record fails is undone.
//
// Bounded: before anything is expanded, a layout's size is checked against
// TensorLimits (shards, metadata bytes in memory, the describe reply), and
// the layout's validation and the reshard's planning stop when the caller
// gives up (StopCondition: its deadline, its cancellation) or after
// plan_budget, whichever comes first.
//
// Thread-safe. It takes no lock of its own but its PieceMover's (per set of
// GPU workers, across their NCCL exchange) and the progress board's; the
// table's lock is taken in short sections, never across a worker call or a
// wait for the disk.
#ifndef TESSERA_COORDINATOR_ORCHESTRATOR_H_
#define TESSERA_COORDINATOR_ORCHESTRATOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/exchange_groups.h"
#include "coordinator/metadata_log.h"
#include "coordinator/move_progress.h"
#include "coordinator/piece_mover.h"
#include "coordinator/tensor_table.h"
#include "coordinator/worker_control.h"
#include "coordinator/worker_registry.h"
#include "core/box.h"
#include "core/box_index.h"
#include "core/dtype.h"
#include "core/init_fill.h"
#include "core/layout_spec.h"
#include "core/limits.h"
#include "core/replica_placement.h"
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
  // What a safetensors import records (checked: CheckFileOrigin).
  FileOrigin origin;
  // When the caller gives up (its deadline, its cancellation): validating
  // the layout stops then, and nothing is allocated after. Default: never.
  StopCondition stop;
};

struct UpdateArgs {
  std::string name;
  uint64_t expected_version = 0;  // 0: any
  // The region that changes (tensor coordinates); none: the whole tensor.
  std::optional<Box> region;
  // The principal updating (empty without tokens): only it may commit.
  std::string owner;
  StopCondition stop;
};

// Replicas [first, end) of each shard (Orchestrator::SealShards).
struct ReplicaRange {
  size_t first = 0;
  size_t end = SIZE_MAX;
};

// Version N+1 of an update, allocated and waiting for its caller's writes.
struct StagedUpdate {
  TensorMetadataPtr meta;
  int64_t shards_kept = 0;  // N's shards it takes over unchanged
};

// How large one tensor's layout may be and how long the coordinator works
// on one. CoordinatorOptions documents each (it sets them).
struct TensorLimits {
  int64_t max_shards = kMaxShardsPerTensor;
  int64_t max_metadata_bytes = int64_t{256} << 20;
  int64_t max_reply_bytes = kMaxMessageBytes;
  size_t max_workers = kDefaultMaxWorkers;
  absl::Duration plan_budget = absl::Seconds(30);
  ReplicaForward forward = ReplicaForward::kRelay;
};

// In-memory bytes the coordinator counts per shard of rank r:
// kShardMetadataBytes + r * kShardMetadataBytesPerDim (the ShardInfo with
// its one replica held inline, its box's two vectors and their
// allocations).
inline constexpr int64_t kShardMetadataBytes = 192;
inline constexpr int64_t kShardMetadataBytesPerDim = 16;
// With R > 1 replicas, each shard's replicas move out of line: R of these
// more (a Replica and its strings).
inline constexpr int64_t kReplicaMetadataBytes = 160;

// An upper bound on the bytes of a packed describe (or create) reply for a
// tensor of `shape` in `num_shards` shards on at most `max_workers` workers:
// the varints of every shard's box, id and worker, the workers, and one
// read capability per worker; with `replicas` > 1, every replica's id,
// worker and availability too. Computed from the sizes alone.
int64_t PackedDescribeBytesBound(const Shape& shape, int64_t num_shards,
                                 size_t max_workers, int64_t replicas = 1);

// Checks a layout of `num_shards` shards on a tensor of `shape` against
// `limits` before anything of it is built: RESOURCE_EXHAUSTED naming the
// limit when it has too many shards, would take more than
// max_metadata_bytes of coordinator memory, or could not be described in
// one reply of max_reply_bytes. `spec_rank`: the most dims a box of the
// spec has, when it may exceed the tensor's (memory is counted for the
// larger). `replicas`: workers per shard (1 to kMaxReplicas; others count
// as 1, left to the replica check). REQUIRES: a validated shape.
absl::Status CheckLayoutSize(const Shape& shape, int64_t num_shards,
                             const TensorLimits& limits, int64_t spec_rank = 0,
                             int64_t replicas = 1);

// A replica of a shard on `worker` (its first copy, not a mirror).
Replica ReplicaOn(const WorkerRecord& worker);

// `meta` without its shards: what a set of some of them starts from.
TensorMetadata WithoutShards(const TensorMetadata& meta);

class Orchestrator {
 public:
  // Every pointer must outlive the orchestrator.
  Orchestrator(WorkerRegistry* registry, TensorTable* table, MetadataLog* log,
               WorkerControl* workers, TensorLimits limits = {});

  const TensorLimits& limits() const { return limits_; }
  // NCCL exchanges between GPU workers so far (metrics).
  ExchangeGroups::Stats exchange_stats() const {
    return mover_.exchange_stats();
  }
  // Worker `name` registered (again): its communicators are gone.
  void ForgetExchangesWith(const std::string& name) {
    mover_.ForgetExchangesWith(name);
  }

  // See Coordinator for each operation's contract.
  absl::StatusOr<TensorMetadataPtr> Create(const CreateTensorArgs& args);
  absl::Status Commit(const std::string& name, uint64_t version,
                      const std::string& principal, uint64_t change,
                      SentBytes* sent = nullptr);
  absl::Status Delete(const std::string& name,
                      const std::string& principal = "", bool admin = true,
                      uint64_t incarnation = 0);
  // `stop`: when the caller gives up (validation and planning stop then;
  // nothing is allocated after).
  absl::StatusOr<ReshardResult> Reshard(const std::string& name,
                                        const LayoutSpec& spec,
                                        uint64_t expected_version,
                                        const StopCondition& stop = {});
  // Starts an update (see Coordinator::UpdateTensor): allocates N+1's new
  // shards as writable, has the workers copy N's bytes into those only
  // partly inside the region, and stages N+1 for CommitTensor. On failure
  // nothing stays allocated and N is untouched.
  absl::StatusOr<StagedUpdate> BeginUpdate(const UpdateArgs& args);
  // Gives up a pending put or a staged update and frees its new shards.
  absl::Status Abandon(const std::string& name, uint64_t version,
                       const std::string& principal, uint64_t change);
  // Frees retired versions and abandoned puts that are due.
  void FreeDue();

  // Fills in each shard's worker address and availability (registry and
  // lost shards).
  void FillWorkerState(TensorMetadata* meta) const;
  // `meta` with its worker state filled in (FillWorkerState).
  TensorMetadata WithWorkerState(TensorMetadata meta) const;

  // How far each running move has got (reshards, repairs, and the loads and
  // saves of Checkpoints).
  MoveProgressBoard* progress() { return &progress_; }
  const MoveProgressBoard& progress() const { return progress_; }

  // The steps a change of a version is made of, for the parts of the
  // orchestrator that make such changes themselves (Repairs).
  //
  // The known workers as placement candidates (indices as in `workers`).
  static std::vector<ReplicaCandidate> Candidates(
      const std::vector<WorkerRecord>& workers,
      absl::flat_hash_map<std::string, int>* index);
  // The names of the workers mirror group `selector` (a LabelSelector's
  // text) takes now (core/mirror_plan MirrorGroup).
  std::vector<std::string> MirrorGroupNow(const std::string& selector) const;
  // limits_, with max_workers lowered to the workers known now (a layout
  // can only use those).
  TensorLimits CurrentLimits() const;
  // The shards of a new version that are not taken over from the old one
  // (a reshard's, an update's, a repair's), as MakeNewShards or
  // FillNewCopies made them. Until Keep(),
  // destroying it frees them on their workers (if allocated) and releases
  // their ids: a failed change leaves nothing behind.
  class NewShards {
   public:
    explicit NewShards(Orchestrator* orchestrator)
        : orchestrator_(orchestrator) {}
    NewShards(const NewShards&) = delete;
    NewShards& operator=(const NewShards&) = delete;
    ~NewShards();
    // The change is committed (or staged): they stay. Returns them.
    TensorMetadata Keep();

    TensorMetadata meta;  // only the new shards
    SentBytes sent;       // what each worker sent to fill them
    bool allocated = false;
    absl::Time allocate_start, move_start, move_end;

   private:
    Orchestrator* const orchestrator_;
    bool kept_ = false;
  };
  // Records `new_meta` (a reshard's N+1, or a repair's N again) in place
  // of `old_meta` once its record is durable, retiring `retired` until N's
  // readers are done, and keeps `fresh`; on failure nothing changes (and
  // `fresh` frees its shards when it goes).
  absl::Status RecordVersion(const TensorMetadataPtr& old_meta,
                             const TensorMetadataPtr& new_meta,
                             TensorMetadata retired, NewShards* fresh);
  // Where a new copy of a version (a repair's replica, a mirror) goes in
  // its new metadata.
  struct CopySlot {
    size_t shard;
    size_t replica;
  };
  // Gives `fresh`'s copies ids (written into `new_meta` at `slots`, in
  // their order), checks capacity, allocates them and has the workers copy
  // `plan`'s pieces from `sources` into them. `what` prefixes errors.
  absl::Status FillNewCopies(const TensorMetadata& sources,
                             const ReshardPlan& plan,
                             const std::vector<CopySlot>& slots,
                             const std::string& what, TensorMetadata* new_meta,
                             NewShards* fresh);

 private:
  // Resolves spec.placements[i] for every box into `meta->shards` (each
  // shard's first replica) and places `replicas - 1` more of each
  // (core/replica_placement.h) on the ready workers.
  absl::Status PlaceShards(const LayoutSpec& spec, std::vector<Box> boxes,
                           int replicas, TensorMetadata* meta) const;
  // Places the further replicas of `meta`'s shards, which hold one each.
  absl::Status PlaceFurtherReplicas(int replicas, TensorMetadata* meta) const;
  // Sets `meta`'s mirror group to `selector` (a LabelSelector's text, or
  // empty) and gives each shard, placed and not yet allocated, a mirror on
  // each member of the group holding no copy of it.
  absl::Status PlaceMirrors(const std::string& selector,
                            TensorMetadata* meta) const;
  // Refuses shards that would not fit in their workers' capacity.
  absl::Status CheckCapacity(const TensorMetadata& shards) const;
  // Allocates `meta`'s shards, one batch per worker in parallel; on failure
  // frees whatever was allocated.
  // `writable`: a put's shards, which its client writes once.
  // `filled_by_copies`: a reshard's, every byte copied in before they are
  // named to anyone (the workers may hand out reused memory uncleared).
  absl::Status AllocateShards(const TensorMetadata& meta, const InitSpec& init,
                              bool writable, bool filled_by_copies = false);
  // Frees shards on their workers (best effort; failures are logged).
  void FreeShards(const TensorMetadata& meta);
  // Copies each shard of a written change from its first replica (the one
  // its client wrote) to the others and its mirrors
  // (PieceMover::ForwardReplicas; mirrors that fail go to `failed_mirrors`
  // when given; `sent`, when given, adds what each worker sent; `before`,
  // an update's version before, lets copies take only the changes).
  absl::Status ForwardReplicas(
      const TensorMetadata& written,
      std::vector<std::pair<size_t, size_t>>* failed_mirrors = nullptr,
      SentBytes* sent = nullptr, const TensorMetadata* before = nullptr);
  // Seals shards (their replicas in `replicas`) on their workers, all in
  // parallel: the first failure. `persist`: their bytes are final, and a
  // worker with --store_dir records them.
  // With `failed_workers`, a worker that fails is added there instead
  // (and the rest still sealed).
  absl::Status SealShards(const TensorMetadata& meta,
                          ReplicaRange replicas = {}, bool persist = true,
                          std::set<std::string>* failed_workers = nullptr);
  // Gives the shards of `next` at `fresh_index` new ids (written back into
  // `next`), checks capacity and the caller, allocates them (`writable`: an
  // update's, which its caller writes) and has the workers move `plan`'s
  // pieces from `sources` into them. `what` ("resharding 'x'") prefixes
  // errors.
  absl::Status MakeNewShards(TensorMetadata* next,
                             absl::Span<const size_t> fresh_index,
                             bool writable, const TensorMetadata& sources,
                             const ReshardPlan& plan,
                             const StopCondition& caller,
                             const std::string& what, uint64_t old_version,
                             NewShards* out);
  // `stop`, also stopping once plan_budget has passed from now.
  StopCondition WithBudget(const StopCondition& stop) const;

  WorkerRegistry* const registry_;
  TensorTable* const table_;
  MetadataLog* const log_;
  WorkerControl* const workers_;
  const TensorLimits limits_;
  MoveProgressBoard progress_;
  PieceMover mover_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_ORCHESTRATOR_H_
