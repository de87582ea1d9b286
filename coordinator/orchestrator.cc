#include "coordinator/orchestrator.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/capability.h"
#include "core/checked_math.h"
#include "core/errors.h"
#include "core/fan_out.h"
#include "core/labels.h"
#include "core/mirror_plan.h"
#include "core/region_plan.h"
#include "core/repair_plan.h"
#include "core/replica_placement.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

// Bytes of one read capability in a reply (worker name, signed token),
// at most: the token names the worker, the tensor and its version.
constexpr int64_t kCapabilityBytesBound = 1024;
// A reply's tensor name, shape, properties, version and field tags, at most.
constexpr int64_t kReplyHeaderBytes = 1024;

int64_t VarintBytes(uint64_t v) {
  int64_t n = 1;
  while (v >= 128) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Says what stopped a layout's validation or a reshard's planning: the
// caller, or the coordinator's own budget.
absl::Status GaveUp(const absl::Status& status, absl::string_view what,
                    const StopCondition& caller, const TensorLimits& limits) {
  if (!absl::IsCancelled(status) && !absl::IsDeadlineExceeded(status)) {
    return status;
  }
  const bool budget = absl::IsDeadlineExceeded(status) &&
                      caller.deadline == absl::InfiniteFuture();
  return Annotate(
      status,
      absl::StrCat("gave up ", what,
                   budget
                       ? absl::StrCat(" after ",
                                      absl::FormatDuration(limits.plan_budget),
                                      " (the coordinator's plan_budget)")
                       : std::string()));
}

// A shard as the reshard planner sees it: its box and its replicas'
// workers.
PlacedBox Placed(const ShardInfo& shard) {
  PlacedBox out;
  out.box = shard.box;
  out.workers.reserve(shard.replicas.size());
  for (const Replica& replica : shard.replicas)
    out.workers.push_back(replica.worker);
  return out;
}

// Fills in the replica each piece of `plan` that crosses workers is read
// from: the first of the old shard's ReadLocations. (Pieces copied in
// memory come from the old replica on their own worker, as planned.)
void ChooseSources(const TensorMetadata& old_meta, ReshardPlan* plan) {
  size_t last = SIZE_MAX, replica = 0;
  for (ReshardPiece& piece : plan->pieces) {
    if (piece.local) continue;
    if (piece.src_shard != last) {
      last = piece.src_shard;
      replica = ReadLocations(old_meta, last).front().replica;
    }
    piece.src_replica = replica;
  }
}

}  // namespace

Replica ReplicaOn(const WorkerRecord& worker) {
  Replica replica;
  replica.rank = worker.rank;
  replica.device = worker.device;
  replica.worker = worker.name;
  replica.address = worker.address;
  return replica;
}

TensorMetadata WithoutShards(const TensorMetadata& meta) {
  TensorMetadata out = meta;
  out.shards.clear();
  return out;
}

int64_t PackedDescribeBytesBound(const Shape& shape, int64_t num_shards,
                                 size_t max_workers, int64_t replicas) {
  num_shards = std::max<int64_t>(num_shards, 0);
  // Copies of each shard: its replicas, and a mirror on at most every
  // worker.
  replicas = std::clamp<int64_t>(
      replicas, 1, kMaxReplicas + static_cast<int64_t>(max_workers));
  // Per shard: its id (a uint64), its worker's index and, when unavailable,
  // its index; per dim its offset (below the dim + the number of shards:
  // chunks past the end included) and its size (at most the dim).
  int64_t per_shard = 10 + 5 + 5;
  for (int64_t n : shape) {
    const uint64_t dim = static_cast<uint64_t>(std::max<int64_t>(n, 0));
    per_shard +=
        VarintBytes(dim + static_cast<uint64_t>(num_shards)) + VarintBytes(dim);
  }
  // Several replicas: a count per shard, and per replica its id, its
  // worker's index and, when unavailable, its position.
  if (replicas > 1) per_shard += 5 + replicas * (10 + 5 + 5);
  const int64_t workers = std::min<int64_t>(num_shards * replicas,
                                            static_cast<int64_t>(max_workers));
  return kReplyHeaderBytes + num_shards * per_shard +
         workers * static_cast<int64_t>(kWorkerInfoBytesBound +
                                        kCapabilityBytesBound);
}

absl::Status CheckLayoutSize(const Shape& shape, int64_t num_shards,
                             const TensorLimits& limits, int64_t spec_rank,
                             int64_t replicas) {
  // Copies of each shard: its replicas, and a mirror on at most every
  // worker.
  replicas = std::clamp<int64_t>(
      replicas, 1, kMaxReplicas + static_cast<int64_t>(limits.max_workers));
  const int64_t max_shards = std::min(limits.max_shards, kMaxShardsPerTensor);
  if (num_shards > max_shards) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many shards: ", num_shards, " (at most ", max_shards,
                     " per tensor)"));
  }
  const int64_t rank = std::max(static_cast<int64_t>(shape.size()), spec_rank);
  const int64_t memory =
      num_shards * (kShardMetadataBytes + rank * kShardMetadataBytesPerDim +
                    (replicas > 1 ? replicas * kReplicaMetadataBytes : 0));
  const std::string replicated =
      replicas > 1 ? absl::StrCat(" (", replicas, " replicas each)") : "";
  if (memory > limits.max_metadata_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the metadata of ", num_shards, " shards", replicated, " of rank ",
        rank, " would take about ", memory >> 20,
        " MiB of coordinator memory, more than its max_tensor_metadata_bytes (",
        limits.max_metadata_bytes >> 20, " MiB); use fewer shards"));
  }
  const int64_t reply =
      PackedDescribeBytesBound(shape, num_shards, limits.max_workers, replicas);
  if (reply > limits.max_reply_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the metadata of ", num_shards, " shards", replicated,
                     " of rank ", rank, " could take up to ", reply,
                     " bytes to describe, more than one reply "
                     "may carry (",
                     limits.max_reply_bytes, " bytes); use fewer shards"));
  }
  return absl::OkStatus();
}

Orchestrator::Orchestrator(WorkerRegistry* registry, TensorTable* table,
                           MetadataLog* log, WorkerControl* workers,
                           TensorLimits limits)
    : registry_(registry),
      table_(table),
      log_(log),
      workers_(workers),
      limits_(limits),
      mover_(registry, workers, &progress_, limits.forward) {}

TensorLimits Orchestrator::CurrentLimits() const {
  TensorLimits out = limits_;
  out.max_workers = std::min(out.max_workers, registry_->NumWorkers());
  return out;
}

StopCondition Orchestrator::WithBudget(const StopCondition& stop) const {
  StopCondition out = stop;
  if (limits_.plan_budget != absl::InfiniteDuration()) {
    out.deadline = std::min(out.deadline, absl::Now() + limits_.plan_budget);
  }
  return out;
}

absl::Status Orchestrator::PlaceShards(const LayoutSpec& spec,
                                       std::vector<Box> boxes, int replicas,
                                       TensorMetadata* meta) const {
  meta->shards.resize(boxes.size());
  // Specs name few distinct placements (one per worker or device), so each
  // is resolved once rather than once per shard.
  std::vector<std::pair<const Placement*, WorkerRecord>> resolved;
  for (size_t i = 0; i < boxes.size(); ++i) {
    const Placement& placement = spec.placements[i];
    auto known =
        std::find_if(resolved.begin(), resolved.end(),
                     [&](const auto& r) { return *r.first == placement; });
    if (known == resolved.end()) {
      TESSERA_ASSIGN_OR_RETURN(WorkerRecord record,
                               registry_->Resolve(placement));
      if (resolved.size() == 16) resolved.erase(resolved.begin());
      resolved.emplace_back(&placement, std::move(record));
      known = std::prev(resolved.end());
    }
    const WorkerRecord& worker = known->second;
    if (!worker.alive) {
      return UnavailableError(absl::StrCat("worker '", worker.name, "' (rank ",
                                           worker.rank, ") for shard ", i));
    }
    // A placement by rank or name obeys cordon and drain as a chosen one
    // does: a drain under a job with fixed placements must end.
    if (worker.state != WorkerState::kReady) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker '", worker.name, "' (rank ", worker.rank, ") for shard ", i,
          " is ", WorkerStateName(worker.state),
          ": it takes no new shards (uncordon it, or place them elsewhere)"));
    }
    // The spec's placement names the shard's first (today: only) replica.
    ShardInfo& shard = meta->shards[i];
    shard.box = std::move(boxes[i]);
    shard.replicas.clear();
    shard.replicas.push_back(ReplicaOn(worker));
  }
  if (replicas == 1) return absl::OkStatus();
  return PlaceFurtherReplicas(replicas, meta);
}

std::vector<ReplicaCandidate> Orchestrator::Candidates(
    const std::vector<WorkerRecord>& workers,
    absl::flat_hash_map<std::string, int>* index) {
  std::vector<ReplicaCandidate> candidates(workers.size());
  for (size_t w = 0; w < workers.size(); ++w) {
    ReplicaCandidate& c = candidates[w];
    c.name = workers[w].name;
    c.zone = workers[w].zone;
    c.state = workers[w].state;
    c.capacity_bytes = workers[w].capacity_bytes;
    c.bytes_used = workers[w].bytes_used;
    (*index)[c.name] = static_cast<int>(w);
  }
  return candidates;
}

absl::Status Orchestrator::PlaceFurtherReplicas(int replicas,
                                                TensorMetadata* meta) const {
  const std::vector<WorkerRecord> workers = registry_->List();
  absl::flat_hash_map<std::string, int> index;
  const std::vector<ReplicaCandidate> candidates = Candidates(workers, &index);
  const int64_t item = static_cast<int64_t>(ItemSize(meta->dtype));
  std::vector<ShardToPlace> shards(meta->shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    auto first = index.find(meta->shards[i].replicas.front().worker);
    if (first == index.end()) {
      return UnavailableError(
          absl::StrCat("worker '", meta->shards[i].replicas.front().worker,
                       "' for shard ", i));
    }
    shards[i].first = first->second;
    shards[i].bytes = meta->shards[i].box.NumElements() * item;
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::vector<int>> placed,
                           PlaceReplicas(candidates, shards, replicas));
  for (size_t i = 0; i < placed.size(); ++i) {
    Replicas& holders = meta->shards[i].replicas;
    for (size_t r = 1; r < placed[i].size(); ++r) {
      holders.push_back(ReplicaOn(workers[placed[i][r]]));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> Orchestrator::MirrorGroupNow(
    const std::string& selector) const {
  // No selector (or none valid: checked where it came in): no group.
  absl::StatusOr<LabelSelector> parsed = ParseLabelSelector(selector);
  if (!parsed.ok()) return {};
  std::vector<MirrorCandidate> all;
  for (const WorkerRecord& w : registry_->List()) {
    all.push_back({w.name, w.labels, w.alive, w.state});
  }
  return MirrorGroup(*parsed, all);
}

absl::Status Orchestrator::PlaceMirrors(const std::string& selector,
                                        TensorMetadata* meta) const {
  meta->mirror.clear();
  if (selector.empty() || selector == "none") return absl::OkStatus();
  absl::StatusOr<LabelSelector> parsed = ParseLabelSelector(selector);
  if (!parsed.ok()) return Annotate(parsed.status(), "--mirror");
  meta->mirror = parsed->ToString();
  const std::vector<std::string> group = MirrorGroupNow(meta->mirror);
  // Every copy is metadata: the layout's bounds hold with the mirrors in.
  TESSERA_RETURN_IF_ERROR(Annotate(
      CheckLayoutSize(meta->shape, static_cast<int64_t>(meta->shards.size()),
                      CurrentLimits(), 0,
                      ReplicaCount(*meta) + static_cast<int64_t>(group.size())),
      absl::StrCat("--mirror=", meta->mirror, " (", group.size(),
                   " workers)")));
  for (const ShardMirrors& shard : PlanMirrors(*meta, group)) {
    for (const std::string& name : shard.added) {
      std::optional<WorkerRecord> worker = registry_->Find(name);
      if (!worker.has_value()) continue;  // gone meanwhile: a later sync
      Replica& replica =
          meta->shards[shard.shard].replicas.emplace_back(ReplicaOn(*worker));
      replica.mirror = true;
    }
  }
  return absl::OkStatus();
}

absl::Status Orchestrator::CheckCapacity(const TensorMetadata& shards) const {
  absl::flat_hash_map<std::string, int64_t> need;
  for (const ShardInfo& shard : shards.shards) {
    const int64_t bytes =
        shard.box.NumElements() * static_cast<int64_t>(ItemSize(shards.dtype));
    for (const Replica& replica : shard.replicas) need[replica.worker] += bytes;
  }
  for (const auto& [name, bytes] : need) {
    std::optional<WorkerRecord> worker = registry_->Find(name);
    if (!worker.has_value() || worker->capacity_bytes <= 0) continue;
    if (worker->bytes_used + bytes > worker->capacity_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "worker '", name, "' has ",
          worker->capacity_bytes - worker->bytes_used, " bytes free of its ",
          worker->capacity_bytes, "-byte capacity; the shards of '",
          shards.name, "' placed on it need ", bytes));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorMetadataPtr> Orchestrator::Create(
    const CreateTensorArgs& args) {
  const absl::Time start = absl::Now();
  TESSERA_RETURN_IF_ERROR(CheckTensorName(args.name));
  TESSERA_RETURN_IF_ERROR(ByteSize(args.shape, ItemSize(args.dtype)).status());
  // Sizes first: nothing of the layout is built before they pass.
  const int64_t num_shards = static_cast<int64_t>(
      std::max(args.spec.placements.size(), args.spec.boxes.size()));
  const int replicas = args.spec.replicas == 0 ? 1 : args.spec.replicas;
  TESSERA_RETURN_IF_ERROR(CheckReplicaCount(replicas));
  TESSERA_RETURN_IF_ERROR(
      CheckLayoutSize(args.shape, num_shards, CurrentLimits(), 0, replicas));
  TESSERA_RETURN_IF_ERROR(CheckInitValue(args.init, args.dtype));
  const StopCondition stop = WithBudget(args.stop);
  absl::Status early = stop.Check();
  absl::StatusOr<std::vector<Box>> laid_out =
      early.ok() ? LayoutBoxes(args.shape, args.spec, stop)
                 : absl::StatusOr<std::vector<Box>>(early);
  if (!laid_out.ok()) {
    return GaveUp(laid_out.status(),
                  absl::StrCat("validating the layout of '", args.name, "' (",
                               num_shards, " shards)"),
                  args.stop, limits_);
  }
  std::vector<Box> boxes = *std::move(laid_out);

  auto meta = std::make_shared<TensorMetadata>();
  meta->name = args.name;
  meta->shape = args.shape;
  meta->dtype = args.dtype;
  meta->requires_grad = args.requires_grad;
  meta->pin_memory = args.pin_memory;
  meta->origin = args.origin;
  meta->owner = args.owner;
  meta->version = 1;
  meta->incarnation = RandomId();
  // A put's own id: its write grants, commit and abandon name it.
  meta->change = args.pending ? RandomId() : 0;
  TESSERA_RETURN_IF_ERROR(
      PlaceShards(args.spec, std::move(boxes), replicas, meta.get()));
  TESSERA_RETURN_IF_ERROR(PlaceMirrors(args.spec.mirror, meta.get()));
  TESSERA_RETURN_IF_ERROR(CheckCapacity(*meta));
  // A caller that gave up gets nothing allocated.
  TESSERA_RETURN_IF_ERROR(GaveUp(args.stop.Check(),
                                 absl::StrCat("creating '", args.name, "'"),
                                 args.stop, limits_));

  // The owner's quota is charged here, with the name: nothing is allocated
  // past it.
  TESSERA_RETURN_IF_ERROR(
      table_->ReserveName(args.name, args.owner, HeldBytes(*meta)));
  const MetadataLog::Ticket ids =
      table_->ReserveIds(absl::MakeSpan(meta->shards));
  bool allocated = false;
  auto undo = absl::MakeCleanup([&] {
    if (allocated) FreeShards(*meta);
    table_->AbandonCreate(*meta);
  });
  // The ids reach the workers only once their high-water mark is durable.
  TESSERA_RETURN_IF_ERROR(log_->Wait(ids));
  // Checked again at the last moment before anything is allocated: a
  // caller that gave up meanwhile (placing many shards takes a while) gets
  // nothing.
  TESSERA_RETURN_IF_ERROR(GaveUp(args.stop.Check(),
                                 absl::StrCat("creating '", args.name, "'"),
                                 args.stop, limits_));

  const absl::Time allocate_start = absl::Now();
  TESSERA_RETURN_IF_ERROR(AllocateShards(*meta, args.init, args.pending));
  allocated = true;
  // A create's shards hold their bytes once allocated (filled by `init`):
  // sealed now (a worker with --store_dir persists them); a put's at its
  // commit.
  if (!args.pending) TESSERA_RETURN_IF_ERROR(SealShards(*meta));
  const absl::Time allocate_end = absl::Now();

  // A put's tensor stays pending (no record) until CommitTensor.
  TESSERA_RETURN_IF_ERROR(log_->Wait(table_->CommitCreate(meta, args.pending)));
  if (!args.pending) table_->FinishCreate(args.name);
  std::move(undo).Cancel();
  spdlog::info(
      "created tensor '{}' {} {} in {} shards{}, {:.3f} s (layout and "
      "placement {:.3f}, allocate {:.3f}, record {:.3f})",
      args.name, ShapeToString(args.shape), std::string(DTypeName(args.dtype)),
      meta->shards.size(), args.pending ? " (pending)" : "",
      absl::ToDoubleSeconds(absl::Now() - start),
      absl::ToDoubleSeconds(allocate_start - start),
      absl::ToDoubleSeconds(allocate_end - allocate_start),
      absl::ToDoubleSeconds(absl::Now() - allocate_end));
  return TensorMetadataPtr(std::move(meta));
}

absl::Status Orchestrator::AllocateShards(const TensorMetadata& meta,
                                          const InitSpec& init, bool writable,
                                          bool filled_by_copies) {
  // One batch per worker (every replica of every shard), all batches in
  // parallel. A written change's clients write only each shard's first
  // replica; the others are filled by the commit's copies (ForwardReplicas),
  // so they go in a batch of their own.
  using Key = std::pair<std::string, bool>;  // address, a forwarded copy
  std::map<Key, AllocateBatch> batches;
  std::map<std::string, std::string> names;  // address -> worker name
  for (const ShardInfo& shard : meta.shards) {
    for (size_t r = 0; r < shard.replicas.size(); ++r) {
      const Replica& replica = shard.replicas[r];
      const bool copy = writable && r > 0;
      AllocateBatch& batch = batches[{replica.address, copy}];
      if (batch.shards.empty()) {
        batch.tensor = meta.name;
        batch.version = meta.version;
        batch.incarnation = meta.incarnation;
        batch.writable = writable && !copy;
        batch.change = batch.writable ? meta.change : 0;
        batch.filled_by_copies = filled_by_copies || copy;
        batch.dtype = meta.dtype;
        batch.tensor_shape = meta.shape;
        batch.init = copy ? InitSpec{} : init;
        names[replica.address] = replica.worker;
      }
      batch.shards.emplace_back(replica.shard_id, shard.box);
    }
  }
  std::vector<Key> keys;
  for (const auto& [key, batch] : batches) keys.push_back(key);
  std::vector<absl::StatusOr<BytesUsedReading>> results(keys.size(),
                                                        absl::UnknownError(""));
  // Every batch runs: those that succeed are undone when one fails.
  FanOut(keys.size(), kDefaultFanOut, [&](size_t i) {
    results[i] = workers_->Allocate(
        WorkerRef{names[keys[i].first], keys[i].first}, batches[keys[i]]);
    return absl::OkStatus();
  }).IgnoreError();

  absl::Status first_error;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (results[i].ok()) {
      registry_->SetBytesUsed(names[keys[i].first], *results[i]);
    } else if (first_error.ok()) {
      first_error =
          Annotate(results[i].status(),
                   absl::StrCat("allocating ", batches[keys[i]].shards.size(),
                                " shard(s) of '", meta.name, "' on worker '",
                                names[keys[i].first], "'"));
    }
  }
  if (first_error.ok()) return first_error;
  // Undo the batches that succeeded (a failed batch undid itself on its
  // worker).
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!results[i].ok()) continue;
    std::vector<uint64_t> ids;
    for (const auto& [id, box] : batches[keys[i]].shards) ids.push_back(id);
    absl::StatusOr<BytesUsedReading> freed =
        workers_->Free(WorkerRef{names[keys[i].first], keys[i].first}, ids);
    if (freed.ok()) registry_->SetBytesUsed(names[keys[i].first], *freed);
  }
  return first_error;
}

void Orchestrator::FreeShards(const TensorMetadata& meta) {
  std::map<std::string, std::vector<uint64_t>> by_worker;  // worker name -> ids
  for (const ShardInfo& shard : meta.shards) {
    for (const Replica& replica : shard.replicas)
      by_worker[replica.worker].push_back(replica.shard_id);
  }
  std::vector<std::pair<WorkerRecord, const std::vector<uint64_t>*>> frees;
  for (const auto& [name, ids] : by_worker) {
    std::optional<WorkerRecord> worker = registry_->Find(name);
    if (worker.has_value()) frees.emplace_back(*std::move(worker), &ids);
  }
  FanOut(frees.size(), kDefaultFanOut, [&](size_t i) {
    const auto& [worker, ids] = frees[i];
    absl::StatusOr<BytesUsedReading> freed =
        workers_->Free(WorkerRef{worker.name, worker.address}, *ids);
    if (freed.ok()) {
      registry_->SetBytesUsed(worker.name, *freed);
    } else {
      spdlog::warn("freeing {} shard(s) of '{}' on worker '{}' failed: {}",
                   ids->size(), meta.name, worker.name,
                   std::string(freed.status().message()));
    }
    return absl::OkStatus();
  }).IgnoreError();
}

absl::Status Orchestrator::SealShards(const TensorMetadata& meta,
                                      ReplicaRange replicas, bool persist,
                                      std::set<std::string>* failed_workers) {
  std::map<std::string, std::vector<uint64_t>> by_worker;  // worker name -> ids
  for (const ShardInfo& shard : meta.shards) {
    for (size_t r = replicas.first;
         r < std::min(replicas.end, shard.replicas.size()); ++r) {
      const Replica& replica = shard.replicas[r];
      by_worker[replica.worker].push_back(replica.shard_id);
    }
  }
  if (by_worker.empty()) return absl::OkStatus();
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> seals(
      by_worker.begin(), by_worker.end());
  absl::Mutex failed_mu;
  return FanOut(seals.size(), kDefaultFanOut, [&](size_t i) {
    const auto& [name, ids] = seals[i];
    std::optional<WorkerRecord> worker = registry_->Find(name);
    const absl::Status sealed =
        worker.has_value()
            ? workers_->Seal(WorkerRef{worker->name, worker->address}, ids,
                             persist)
            : UnavailableError(absl::StrCat("worker '", name, "'"));
    if (!sealed.ok() && failed_workers != nullptr) {
      absl::MutexLock lock(&failed_mu);
      failed_workers->insert(name);
      return absl::OkStatus();
    }
    return Annotate(
        sealed, absl::StrCat("sealing the shards of '", meta.name, "' version ",
                             meta.version, " on worker '", name, "'"));
  });
}

absl::Status Orchestrator::Commit(const std::string& name, uint64_t version,
                                  const std::string& principal, uint64_t change,
                                  SentBytes* sent) {
  TESSERA_ASSIGN_OR_RETURN(
      CommitStart start, table_->BeginCommit(name, version, principal, change));
  if (start.done) return absl::OkStatus();  // committed already
  // Every replica holds the bytes before the change commits; a replica
  // that fails fails the commit (the client then abandons the change). A
  // mirror that fails (sealed, filled or persisted) does not: its copy is
  // freed and counted lost (reads pass it over), and SyncMirrors fills
  // another.
  TensorMetadata filled = *start.seal;
  const size_t replicas = static_cast<size_t>(ReplicaCount(filled));
  std::vector<uint64_t> lost;
  TensorMetadata dropped = WithoutShards(filled);
  // Takes the mirror copies `failed(i, r)` names out of `filled`.
  auto drop_mirrors = [&](const std::function<bool(size_t, size_t)>& failed) {
    for (size_t i = 0; i < filled.shards.size(); ++i) {
      Replicas& copies = filled.shards[i].replicas;
      for (size_t r = copies.size(); r-- > replicas;) {
        if (!copies[r].mirror || !failed(i, r)) continue;
        ShardInfo& gone = dropped.shards.emplace_back();
        gone.box = filled.shards[i].box;
        gone.replicas.push_back(copies[r]);
        lost.push_back(copies[r].shard_id);
        copies.erase(copies.begin() + static_cast<std::ptrdiff_t>(r));
      }
    }
  };
  auto drop_on = [&](const std::set<std::string>& workers) {
    if (workers.empty()) return;
    drop_mirrors([&](size_t i, size_t r) {
      return workers.count(filled.shards[i].replicas[r].worker) > 0;
    });
  };
  // The change's write grants die here: no write reaches its shards after
  // the commit, through any transport. A shard no longer held fails it.
  // The first replicas hold their final bytes: sealed and persisted. The
  // other copies are sealed too (no client write reaches them), but
  // persisted only once the forward below has filled them.
  absl::Status status = SealShards(filled, {0, 1}, /*persist=*/true);
  if (status.ok()) {
    status = SealShards(filled, {1, replicas}, /*persist=*/false);
  }
  std::set<std::string> failed_workers;
  if (status.ok()) {
    SealShards(filled, {replicas, SIZE_MAX}, /*persist=*/false, &failed_workers)
        .IgnoreError();
    drop_on(failed_workers);
  }
  std::vector<std::pair<size_t, size_t>> failed_mirrors;
  if (status.ok()) {
    status = ForwardReplicas(filled, &failed_mirrors, sent, start.before.get());
  }
  if (status.ok() && !failed_mirrors.empty()) {
    drop_mirrors([&](size_t i, size_t r) {
      return std::find(failed_mirrors.begin(), failed_mirrors.end(),
                       std::make_pair(i, r)) != failed_mirrors.end();
    });
  }
  if (status.ok()) {
    status = SealShards(filled, {1, replicas}, /*persist=*/true);
  }
  if (status.ok()) {
    failed_workers.clear();
    SealShards(filled, {replicas, SIZE_MAX}, /*persist=*/true, &failed_workers)
        .IgnoreError();
    drop_on(failed_workers);
  }
  if (status.ok() && !lost.empty()) {
    table_->AddLost(lost);
    FreeShards(dropped);
    spdlog::warn(
        "commit of '{}' version {}: {} mirror copies could not be filled; "
        "they are filled again",
        name, version, lost.size());
  }
  if (status.ok()) status = log_->Wait(table_->RecordCommit(name));
  table_->FinishCommit(name, status);
  return status;
}

absl::Status Orchestrator::ForwardReplicas(
    const TensorMetadata& written,
    std::vector<std::pair<size_t, size_t>>* failed_mirrors, SentBytes* sent,
    const TensorMetadata* before) {
  bool one_copy = true;
  for (const ShardInfo& shard : written.shards)
    one_copy &= shard.replicas.size() < 2;
  if (one_copy) return absl::OkStatus();
  TensorMetadata at = WithWorkerState(written);
  return mover_.ForwardReplicas(at, failed_mirrors, sent, before);
}

absl::Status Orchestrator::RecordVersion(const TensorMetadataPtr& old_meta,
                                         const TensorMetadataPtr& new_meta,
                                         TensorMetadata retired,
                                         NewShards* fresh) {
  // The new shards' bytes are all in: their workers seal them (and a
  // worker with --store_dir persists them), as a put's at its commit.
  if (!fresh->meta.shards.empty()) {
    TESSERA_RETURN_IF_ERROR(SealShards(fresh->meta));
  }
  TESSERA_ASSIGN_OR_RETURN(MetadataLog::Ticket ticket,
                           table_->CommitReshard(old_meta, new_meta));
  const absl::Status recorded = log_->Wait(ticket);
  table_->FinishReshard(new_meta, std::move(retired), recorded);
  TESSERA_RETURN_IF_ERROR(recorded);
  fresh->Keep();
  return absl::OkStatus();
}

absl::Status Orchestrator::Abandon(const std::string& name, uint64_t version,
                                   const std::string& principal,
                                   uint64_t change) {
  TESSERA_ASSIGN_OR_RETURN(TensorMetadataPtr shards,
                           table_->Abandon(name, version, principal, change));
  FreeShards(*shards);
  spdlog::info("abandoned the change of '{}' to version {}", name, version);
  return absl::OkStatus();
}

absl::Status Orchestrator::Delete(const std::string& name,
                                  const std::string& principal, bool admin,
                                  uint64_t incarnation) {
  TESSERA_ASSIGN_OR_RETURN(
      MetadataLog::Ticket ticket,
      table_->BeginDelete(name, principal, admin, incarnation));
  TESSERA_ASSIGN_OR_RETURN(std::vector<TensorMetadataPtr> versions,
                           table_->FinishDelete(name, log_->Wait(ticket)));
  for (const TensorMetadataPtr& version : versions) FreeShards(*version);
  spdlog::info("deleted tensor '{}'", name);
  return absl::OkStatus();
}

void Orchestrator::FreeDue() {
  for (const TensorMetadataPtr& shards : table_->TakeDue()) {
    FreeShards(*shards);
    spdlog::info("freed {} shard(s) of '{}' version {}", shards->shards.size(),
                 shards->name, shards->version);
  }
}

void Orchestrator::FillWorkerState(TensorMetadata* meta) const {
  absl::flat_hash_map<std::string, WorkerRecord> workers;
  for (WorkerRecord& w : registry_->List()) workers[w.name] = std::move(w);
  for (ShardInfo& shard : meta->shards) {
    for (Replica& replica : shard.replicas) {
      auto it = workers.find(replica.worker);
      if (it == workers.end()) {
        replica.available = false;
        continue;
      }
      replica.address = it->second.address;
      replica.available = it->second.alive;
    }
  }
  table_->MarkLost(meta);
}

TensorMetadata Orchestrator::WithWorkerState(TensorMetadata meta) const {
  FillWorkerState(&meta);
  return meta;
}

Orchestrator::NewShards::~NewShards() {
  if (kept_) return;
  if (allocated) orchestrator_->FreeShards(meta);
  orchestrator_->table_->ReleaseIds(meta.shards);
}

TensorMetadata Orchestrator::NewShards::Keep() {
  kept_ = true;
  return std::move(meta);
}

absl::Status Orchestrator::MakeNewShards(
    TensorMetadata* next, absl::Span<const size_t> fresh_index, bool writable,
    const TensorMetadata& sources, const ReshardPlan& plan,
    const StopCondition& caller, const std::string& what, uint64_t old_version,
    NewShards* out) {
  out->meta = WithoutShards(*next);
  for (size_t j : fresh_index) out->meta.shards.push_back(next->shards[j]);
  const MetadataLog::Ticket ids =
      table_->ReserveIds(absl::MakeSpan(out->meta.shards));
  for (size_t k = 0; k < fresh_index.size(); ++k)
    next->shards[fresh_index[k]].replicas = out->meta.shards[k].replicas;
  TESSERA_RETURN_IF_ERROR(CheckCapacity(out->meta));
  // A caller that gave up gets nothing allocated.
  TESSERA_RETURN_IF_ERROR(GaveUp(caller.Check(), what, caller, limits_));
  // The owner's quota takes the new shards until the change ends.
  TESSERA_RETURN_IF_ERROR(
      table_->Charge(next->name, HeldBytes(out->meta), what));
  TESSERA_RETURN_IF_ERROR(log_->Wait(ids));
  out->allocate_start = absl::Now();
  TESSERA_RETURN_IF_ERROR(
      Annotate(AllocateShards(out->meta, InitSpec{}, writable,
                              /*filled_by_copies=*/!writable),
               what));
  out->allocated = true;
  out->move_start = absl::Now();
  if (!plan.pieces.empty()) {
    TESSERA_RETURN_IF_ERROR(Annotate(
        mover_.MoveFromAnyReplica(sources, *next, plan, &out->sent),
        absl::StrCat(what, " (version ", old_version, " is unchanged)")));
  }
  out->move_end = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<ReshardResult> Orchestrator::Reshard(
    const std::string& name, const LayoutSpec& spec, uint64_t expected_version,
    const StopCondition& caller) {
  const absl::Time start = absl::Now();
  TESSERA_ASSIGN_OR_RETURN(TensorMetadataPtr old_meta,
                           table_->BeginReshard(name, expected_version));
  auto done = absl::MakeCleanup([&] { table_->EndReshard(name); });

  const int64_t num_shards =
      static_cast<int64_t>(std::max(spec.placements.size(), spec.boxes.size()));
  // Without a count, the tensor keeps the replicas it has.
  const int replicas = spec.replicas != 0
                           ? spec.replicas
                           : static_cast<int>(ReplicaCount(*old_meta));
  TESSERA_RETURN_IF_ERROR(CheckReplicaCount(replicas));
  TESSERA_RETURN_IF_ERROR(CheckLayoutSize(old_meta->shape, num_shards,
                                          CurrentLimits(), 0, replicas));
  const StopCondition stop = WithBudget(caller);
  absl::Status early = stop.Check();
  absl::StatusOr<std::vector<Box>> laid_out =
      early.ok() ? LayoutBoxes(old_meta->shape, spec, stop)
                 : absl::StatusOr<std::vector<Box>>(early);
  if (!laid_out.ok()) {
    return GaveUp(laid_out.status(),
                  absl::StrCat("validating the new layout of '", name, "' (",
                               num_shards, " shards)"),
                  caller, limits_);
  }
  std::vector<Box> boxes = *std::move(laid_out);
  auto new_meta = std::make_shared<TensorMetadata>();
  new_meta->name = old_meta->name;
  new_meta->shape = old_meta->shape;
  new_meta->dtype = old_meta->dtype;
  new_meta->requires_grad = old_meta->requires_grad;
  new_meta->pin_memory = old_meta->pin_memory;
  new_meta->origin = old_meta->origin;
  new_meta->owner = old_meta->owner;
  new_meta->version = old_meta->version + 1;
  new_meta->incarnation = old_meta->incarnation;
  TESSERA_RETURN_IF_ERROR(
      PlaceShards(spec, std::move(boxes), replicas, new_meta.get()));
  // Without --mirror, the tensor keeps its mirror group; "none" drops it.
  TESSERA_RETURN_IF_ERROR(PlaceMirrors(
      spec.mirror.empty() ? old_meta->mirror : spec.mirror, new_meta.get()));

  // Sources must be readable before anything is allocated.
  TensorMetadata sources = WithWorkerState(*old_meta);
  std::vector<PlacedBox> old_layout(sources.shards.size());
  std::vector<PlacedBox> new_layout(new_meta->shards.size());
  for (size_t i = 0; i < old_layout.size(); ++i)
    old_layout[i] = Placed(sources.shards[i]);
  for (size_t j = 0; j < new_layout.size(); ++j)
    new_layout[j] = Placed(new_meta->shards[j]);
  absl::StatusOr<ReshardPlan> planned =
      PlanReshard(old_layout, new_layout, ItemSize(old_meta->dtype), stop);
  if (!planned.ok()) {
    return GaveUp(planned.status(),
                  absl::StrCat("planning the reshard of '", name, "'"), caller,
                  limits_);
  }
  ReshardPlan plan = *std::move(planned);
  ChooseSources(sources, &plan);
  for (const ReshardPiece& piece : plan.pieces) {
    const Replica& src =
        sources.shards[piece.src_shard].replicas[piece.src_replica];
    if (!src.available) {
      return UnavailableError(
          absl::StrCat("cannot reshard '", name, "': worker '", src.worker,
                       "' holding shard ", piece.src_shard));
    }
  }

  // New shards: kept ones take over the old memory (replica by replica:
  // the planner keeps only a shard on the same workers); the rest are
  // allocated.
  std::vector<size_t> fresh_index;
  for (size_t j = 0; j < new_meta->shards.size(); ++j) {
    if (plan.kept_from[j] >= 0) {
      Replicas& replicas = new_meta->shards[j].replicas;
      const Replicas& old = old_meta->shards[plan.kept_from[j]].replicas;
      for (size_t r = 0; r < replicas.size(); ++r)
        replicas[r].shard_id = old[r].shard_id;
    } else {
      fresh_index.push_back(j);
    }
  }
  NewShards fresh(this);
  TESSERA_RETURN_IF_ERROR(MakeNewShards(
      new_meta.get(), fresh_index, /*writable=*/false, sources, plan, caller,
      absl::StrCat("resharding '", name, "'"), old_meta->version, &fresh));

  // Commit N+1; retire N's shards that N+1 does not keep.
  TensorMetadata retired = WithoutShards(*old_meta);
  std::vector<bool> kept(old_meta->shards.size(), false);
  for (int64_t k : plan.kept_from) {
    if (k >= 0) kept[k] = true;
  }
  for (size_t i = 0; i < old_meta->shards.size(); ++i) {
    if (!kept[i]) retired.shards.push_back(old_meta->shards[i]);
  }
  TESSERA_RETURN_IF_ERROR(
      RecordVersion(old_meta, new_meta, std::move(retired), &fresh));

  ReshardResult result;
  result.version = new_meta->version;
  result.pieces_moved = plan.pieces_moved;
  result.bytes_moved = plan.bytes_moved;
  result.bytes_copied_locally = plan.bytes_copied_locally;
  result.shards_kept = plan.shards_kept;
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  result.sent = fresh.sent;
  spdlog::info(
      "resharded '{}' to version {}: {} piece(s) moved ({} bytes), {} bytes "
      "copied locally, {} shard(s) kept, {:.3f} s (plan {:.3f}, allocate "
      "{:.3f}, move {:.3f})",
      name, result.version, result.pieces_moved, result.bytes_moved,
      result.bytes_copied_locally, result.shards_kept, result.seconds,
      absl::ToDoubleSeconds(fresh.allocate_start - start),
      absl::ToDoubleSeconds(fresh.move_start - fresh.allocate_start),
      absl::ToDoubleSeconds(fresh.move_end - fresh.move_start));
  return result;
}

absl::Status Orchestrator::FillNewCopies(const TensorMetadata& sources,
                                         const ReshardPlan& plan,
                                         const std::vector<CopySlot>& slots,
                                         const std::string& what,
                                         TensorMetadata* new_meta,
                                         NewShards* fresh) {
  const MetadataLog::Ticket ids =
      table_->ReserveIds(absl::MakeSpan(fresh->meta.shards));
  size_t slot = 0;
  for (const ShardInfo& shard : fresh->meta.shards) {
    for (const Replica& replica : shard.replicas) {
      new_meta->shards[slots[slot].shard].replicas[slots[slot].replica] =
          replica;
      ++slot;
    }
  }
  TESSERA_RETURN_IF_ERROR(Annotate(CheckCapacity(fresh->meta), what));
  TESSERA_RETURN_IF_ERROR(log_->Wait(ids));
  fresh->allocate_start = absl::Now();
  TESSERA_RETURN_IF_ERROR(
      Annotate(AllocateShards(fresh->meta, InitSpec{}, /*writable=*/false,
                              /*filled_by_copies=*/true),
               what));
  fresh->allocated = true;
  fresh->move_start = absl::Now();
  TESSERA_RETURN_IF_ERROR(Annotate(
      mover_.FillCopies(sources, *new_meta, plan, &fresh->sent), what));
  fresh->move_end = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<StagedUpdate> Orchestrator::BeginUpdate(const UpdateArgs& args) {
  const absl::Time start = absl::Now();
  TESSERA_ASSIGN_OR_RETURN(
      TensorMetadataPtr old_meta,
      table_->BeginReshard(args.name, args.expected_version));
  bool staged = false;
  auto done = absl::MakeCleanup([&] {
    if (!staged) table_->EndReshard(args.name);
  });
  if (args.region.has_value()) {
    TESSERA_RETURN_IF_ERROR(
        CheckWithin(*args.region, old_meta->shape, "region"));
  }
  // N+1: N's layout on today's addresses; every shard the region meets is
  // new, those it meets in part start as copies of N's.
  TensorMetadata sources = WithWorkerState(*old_meta);
  auto new_meta = std::make_shared<TensorMetadata>(sources);
  new_meta->version = old_meta->version + 1;
  new_meta->change = RandomId();  // the update's own id
  std::vector<size_t> fresh_index;
  ReshardPlan patches;
  int64_t kept = 0;
  const int64_t item = static_cast<int64_t>(ItemSize(old_meta->dtype));
  for (size_t j = 0; j < new_meta->shards.size(); ++j) {
    ShardInfo& shard = new_meta->shards[j];
    for (Replica& replica : shard.replicas) replica.available = true;
    Box in_shard;
    const UpdateAction action =
        ClassifyForUpdate(shard.box, args.region, &in_shard);
    if (action == UpdateAction::kKeep) {
      ++kept;
      continue;
    }
    if (action == UpdateAction::kPatch) {
      // The first replica (the one its caller writes) starts as a copy of
      // N's on its own worker; the commit forwards it to the others.
      for (size_t r = 0; r < 1; ++r) {
        const Replica& source = sources.shards[j].replicas[r];
        if (!source.available) {
          return UnavailableError(absl::StrCat("cannot update '", args.name,
                                               "': worker '", source.worker,
                                               "' holding shard ", j));
        }
        ReshardPiece& piece = patches.pieces.emplace_back();
        piece.src_shard = j;
        piece.dst_shard = j;
        piece.src_replica = r;
        piece.dst_replica = r;
        piece.global = shard.box;
        piece.bytes = shard.box.NumElements() * item;
        piece.local = true;
      }
    }
    fresh_index.push_back(j);
  }
  NewShards fresh(this);
  TESSERA_RETURN_IF_ERROR(MakeNewShards(
      new_meta.get(), fresh_index, /*writable=*/true, sources, patches,
      args.stop, absl::StrCat("updating '", args.name, "'"), old_meta->version,
      &fresh));
  table_->StageUpdate(new_meta, fresh.Keep(), args.owner);
  staged = true;
  spdlog::info(
      "update of '{}' to version {} staged: {} new shard(s) ({} patched), {} "
      "kept, {:.3f} s",
      args.name, new_meta->version, new_meta->shards.size() - kept,
      patches.pieces.size(), kept, absl::ToDoubleSeconds(absl::Now() - start));
  return StagedUpdate{std::move(new_meta), kept};
}

}  // namespace tessera
