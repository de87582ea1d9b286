#include "coordinator/coordinator.h"

#include <algorithm>
#include <iterator>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {

Coordinator::Coordinator(CoordinatorOptions options,
                         std::unique_ptr<WorkerControl> workers,
                         std::unique_ptr<MetadataStore> store)
    : options_(std::move(options)),
      workers_(std::move(workers)),
      store_(std::move(store)),
      registry_(options_.lease, options_.clock) {
  retire_thread_ = std::thread([this] { RetireLoop(); });
}

Coordinator::~Coordinator() {
  stop_.Notify();
  retire_thread_.join();
}

void Coordinator::RetireLoop() {
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    std::vector<Retirement> due;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = options_.clock();
      auto first_due =
          std::partition(retirements_.begin(), retirements_.end(),
                         [&](const Retirement& r) { return r.due > now; });
      std::move(first_due, retirements_.end(), std::back_inserter(due));
      retirements_.erase(first_due, retirements_.end());
      for (const Retirement& r : due) {
        for (const ShardInfo& shard : r.shards.shards)
          referenced_shards_.erase(shard.shard_id);
      }
      // Puts whose client never committed are abandoned.
      for (auto it = tensors_.begin(); it != tensors_.end();) {
        if (it->second.state == State::kPending &&
            now - it->second.created > options_.pending_timeout) {
          spdlog::warn("removing tensor '{}': its put was never completed",
                       it->first);
          for (const ShardInfo& shard : it->second.meta->shards)
            referenced_shards_.erase(shard.shard_id);
          due.push_back({now, *it->second.meta});
          it = tensors_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const Retirement& r : due) {
      FreeShards(r.shards);
      spdlog::info("freed {} shard(s) of '{}' version {}",
                   r.shards.shards.size(), r.shards.name, r.shards.version);
    }
  }
}

absl::Status Coordinator::Recover() {
  TESSERA_ASSIGN_OR_RETURN(MetadataState state, store_->Load());
  absl::MutexLock lock(&mu_);
  for (const auto& [name, w] : state.workers) {
    registry_.Restore(w.name, w.rank, w.address, w.device, w.capacity_bytes);
  }
  for (auto& [name, tensor] : state.tensors) {
    for (const ShardInfo& shard : tensor.shards) {
      referenced_shards_.insert(shard.shard_id);
      next_shard_id_ = std::max(next_shard_id_, shard.shard_id + 1);
    }
    TensorEntry& entry = tensors_[name];
    entry.state = State::kReady;
    entry.meta = std::make_shared<const TensorMetadata>(std::move(tensor));
  }
  next_shard_id_ = std::max(next_shard_id_, state.shard_id_high_water);
  shard_id_high_water_ = next_shard_id_;
  recovered_.tensors = state.tensors.size();
  recovered_.workers = state.workers.size();
  // Start the log afresh from one snapshot of what was recovered.
  state.shard_id_high_water = shard_id_high_water_;
  return store_->Snapshot(state);
}

absl::Status Coordinator::Record(const MetadataChange& change) {
  TESSERA_RETURN_IF_ERROR(
      Annotate(store_->Append(change), "recording metadata"));
  if (++records_since_snapshot_ < options_.snapshot_every)
    return absl::OkStatus();
  MetadataState state;
  for (const WorkerRecord& w : registry_.List()) {
    state.workers[w.name] =
        KnownWorker{w.name, w.rank, w.address, w.device, w.capacity_bytes};
  }
  for (const auto& [name, entry] : tensors_) {
    if (entry.state == State::kReady) state.tensors[name] = *entry.meta;
  }
  state.shard_id_high_water = shard_id_high_water_;
  records_since_snapshot_ = 0;
  absl::Status status = store_->Snapshot(state);
  // The log still holds everything: a failed snapshot loses nothing.
  if (!status.ok())
    spdlog::warn("metadata snapshot failed: {}", std::string(status.message()));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Coordinator::TakeShardIds(size_t n) {
  const uint64_t first = next_shard_id_;
  if (first + n > shard_id_high_water_) {
    MetadataChange change;
    change.kind = MetadataChange::Kind::kShardIdHighWater;
    change.shard_id_high_water = first + n + (1 << 16);
    TESSERA_RETURN_IF_ERROR(Record(change));
    shard_id_high_water_ = change.shard_id_high_water;
  }
  next_shard_id_ += n;
  return first;
}

std::vector<uint64_t> Coordinator::Reconcile(
    const std::string& worker, const std::vector<uint64_t>& held) {
  absl::flat_hash_set<uint64_t> held_set(held.begin(), held.end());
  auto mark = [&](const TensorMetadata& meta) {
    for (const ShardInfo& shard : meta.shards) {
      if (shard.worker != worker) continue;
      if (held_set.contains(shard.shard_id)) {
        lost_.erase(shard.shard_id);
      } else {
        lost_.insert(shard.shard_id);
      }
    }
  };
  for (const auto& [name, entry] : tensors_) {
    if (entry.meta != nullptr) mark(*entry.meta);
  }
  for (const Retirement& r : retirements_) mark(r.shards);
  std::vector<uint64_t> unreferenced;
  for (uint64_t id : held) {
    if (!referenced_shards_.contains(id)) unreferenced.push_back(id);
  }
  return unreferenced;
}

absl::Status Coordinator::CheckCapacity(const TensorMetadata& shards) const {
  absl::flat_hash_map<std::string, int64_t> need;
  for (const ShardInfo& shard : shards.shards) {
    need[shard.worker] +=
        shard.box.NumElements() * static_cast<int64_t>(ItemSize(shards.dtype));
  }
  for (const auto& [name, bytes] : need) {
    std::optional<WorkerRecord> worker = registry_.Find(name);
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

absl::StatusOr<RegisterResult> Coordinator::RegisterWorker(
    const WorkerRegistration& registration,
    const std::vector<uint64_t>& held_shard_ids) {
  TESSERA_RETURN_IF_ERROR(CheckWorkerName(registration.name));
  if (registration.address.empty()) {
    return absl::InvalidArgumentError("worker registration without an address");
  }
  if (registration.rank.has_value() && *registration.rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank must be >= 0, got ", *registration.rank));
  }
  RegisterResult result;
  TESSERA_ASSIGN_OR_RETURN(result.rank, registry_.Register(registration));
  workers_->Reset(registration.address);
  absl::MutexLock lock(&mu_);
  MetadataChange change;
  change.kind = MetadataChange::Kind::kWorker;
  change.worker =
      KnownWorker{registration.name, result.rank, registration.address,
                  registration.device, registration.capacity_bytes};
  TESSERA_RETURN_IF_ERROR(Record(change));
  result.free_shard_ids = Reconcile(registration.name, held_shard_ids);
  if (!result.free_shard_ids.empty()) {
    spdlog::info(
        "worker '{}' holds {} shard(s) no tensor references; freeing them",
        registration.name, result.free_shard_ids.size());
  }
  spdlog::info("worker '{}' rank {} at {} ({}) registered", registration.name,
               result.rank, registration.address,
               registration.device.ToString());
  return result;
}

bool Coordinator::Heartbeat(const std::string& name, int64_t bytes_used) {
  return registry_.Heartbeat(name, bytes_used);
}

std::vector<WorkerRecord> Coordinator::ListWorkers() const {
  return registry_.List();
}

absl::Status Coordinator::PlaceShards(const LayoutSpec& spec,
                                      std::vector<Box> boxes,
                                      TensorMetadata* meta) {
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
                               registry_.Resolve(placement));
      if (resolved.size() == 16) resolved.erase(resolved.begin());
      resolved.emplace_back(&placement, std::move(record));
      known = std::prev(resolved.end());
    }
    const WorkerRecord& worker = known->second;
    if (!worker.alive) {
      return UnavailableError(absl::StrCat("worker '", worker.name, "' (rank ",
                                           worker.rank, ") for shard ", i));
    }
    ShardInfo& shard = meta->shards[i];
    shard.box = std::move(boxes[i]);
    shard.rank = worker.rank;
    shard.device = worker.device;
    shard.worker = worker.name;
    shard.address = worker.address;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const TensorMetadata>> Coordinator::CreateTensor(
    const CreateTensorArgs& args) {
  const absl::Time start = absl::Now();
  TESSERA_RETURN_IF_ERROR(CheckTensorName(args.name));
  TESSERA_RETURN_IF_ERROR(ByteSize(args.shape, ItemSize(args.dtype)).status());
  TESSERA_RETURN_IF_ERROR(CheckInitValue(args.init, args.dtype));
  TESSERA_ASSIGN_OR_RETURN(std::vector<Box> boxes,
                           LayoutBoxes(args.shape, args.spec));

  auto meta = std::make_shared<TensorMetadata>();
  meta->name = args.name;
  meta->shape = args.shape;
  meta->dtype = args.dtype;
  meta->requires_grad = args.requires_grad;
  meta->pin_memory = args.pin_memory;
  meta->version = 1;
  TESSERA_RETURN_IF_ERROR(PlaceShards(args.spec, std::move(boxes), meta.get()));
  TESSERA_RETURN_IF_ERROR(CheckCapacity(*meta));

  {
    absl::MutexLock lock(&mu_);
    if (tensors_.count(args.name) > 0)
      return AlreadyExistsError("tensor", args.name);
    TESSERA_ASSIGN_OR_RETURN(uint64_t first_id,
                             TakeShardIds(meta->shards.size()));
    for (ShardInfo& shard : meta->shards) {
      shard.shard_id = first_id++;
      referenced_shards_.insert(shard.shard_id);
    }
    tensors_[args.name].state = State::kCreating;
    tensors_[args.name].created = options_.clock();
  }

  const absl::Time allocate_start = absl::Now();
  absl::Status status = AllocateShards(*meta, args.init);
  const absl::Time allocate_end = absl::Now();
  const bool allocated = status.ok();
  if (allocated) {
    absl::MutexLock lock(&mu_);
    if (!args.pending) {
      MetadataChange change;
      change.kind = MetadataChange::Kind::kTensor;
      change.tensor = *meta;
      status = Record(change);
    }
    if (status.ok()) {
      TensorEntry& entry = tensors_[args.name];
      entry.state = args.pending ? State::kPending : State::kReady;
      entry.meta = meta;
      spdlog::info(
          "created tensor '{}' {} {} in {} shards{}, {:.3f} s (layout and "
          "placement {:.3f}, allocate {:.3f}, record {:.3f})",
          args.name, ShapeToString(args.shape),
          std::string(DTypeName(args.dtype)), meta->shards.size(),
          args.pending ? " (pending)" : "",
          absl::ToDoubleSeconds(absl::Now() - start),
          absl::ToDoubleSeconds(allocate_start - start),
          absl::ToDoubleSeconds(allocate_end - allocate_start),
          absl::ToDoubleSeconds(absl::Now() - allocate_end));
      return std::shared_ptr<const TensorMetadata>(meta);
    }
  }
  if (allocated) FreeShards(*meta);
  absl::MutexLock lock(&mu_);
  for (const ShardInfo& shard : meta->shards)
    referenced_shards_.erase(shard.shard_id);
  tensors_.erase(args.name);
  return status;
}

absl::Status Coordinator::AllocateShards(const TensorMetadata& meta,
                                         const InitSpec& init) {
  // One batch per worker, all batches in parallel.
  std::map<std::string, AllocateBatch> batches;  // by address
  std::map<std::string, std::string> names;      // address -> worker name
  for (const ShardInfo& shard : meta.shards) {
    AllocateBatch& batch = batches[shard.address];
    if (batch.shards.empty()) {
      batch.tensor = meta.name;
      batch.dtype = meta.dtype;
      batch.tensor_shape = meta.shape;
      batch.init = init;
      names[shard.address] = shard.worker;
    }
    batch.shards.emplace_back(shard.shard_id, shard.box);
  }
  std::vector<std::string> addresses;
  for (const auto& [address, batch] : batches) addresses.push_back(address);
  std::vector<absl::StatusOr<int64_t>> results(addresses.size(),
                                               absl::UnknownError(""));
  std::vector<std::thread> threads;
  threads.reserve(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = workers_->Allocate(addresses[i], batches[addresses[i]]);
    });
  }
  for (std::thread& t : threads) t.join();

  absl::Status first_error;
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (results[i].ok()) {
      registry_.SetBytesUsed(names[addresses[i]], *results[i]);
    } else if (first_error.ok()) {
      first_error = Annotate(
          results[i].status(),
          absl::StrCat("allocating ", batches[addresses[i]].shards.size(),
                       " shard(s) of '", meta.name, "' on worker '",
                       names[addresses[i]], "'"));
    }
  }
  if (first_error.ok()) return first_error;
  // Undo the batches that succeeded (a failed batch undid itself on its
  // worker).
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (!results[i].ok()) continue;
    std::vector<uint64_t> ids;
    for (const auto& [id, box] : batches[addresses[i]].shards)
      ids.push_back(id);
    absl::StatusOr<int64_t> freed = workers_->Free(addresses[i], ids);
    if (freed.ok()) registry_.SetBytesUsed(names[addresses[i]], *freed);
  }
  return first_error;
}

void Coordinator::FreeShards(const TensorMetadata& meta) {
  std::map<std::string, std::vector<uint64_t>> by_worker;  // worker name -> ids
  for (const ShardInfo& shard : meta.shards)
    by_worker[shard.worker].push_back(shard.shard_id);
  std::vector<std::thread> threads;
  for (const auto& [name, ids] : by_worker) {
    std::optional<WorkerRecord> worker = registry_.Find(name);
    if (!worker.has_value()) continue;
    threads.emplace_back([this, worker = *worker, &ids = ids, &meta] {
      absl::StatusOr<int64_t> freed = workers_->Free(worker.address, ids);
      if (freed.ok()) {
        registry_.SetBytesUsed(worker.name, *freed);
      } else {
        spdlog::warn("freeing {} shard(s) of '{}' on worker '{}' failed: {}",
                     ids.size(), meta.name, worker.name,
                     std::string(freed.status().message()));
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

absl::Status Coordinator::CommitTensor(const std::string& name,
                                       uint64_t version) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end() || it->second.state == State::kCreating) {
    return NotFoundError("tensor", name);
  }
  if (it->second.meta->version != version) {
    return absl::AbortedError(absl::StrCat("tensor '", name, "' is at version ",
                                           it->second.meta->version, ", not ",
                                           version));
  }
  if (it->second.state == State::kReady) return absl::OkStatus();
  MetadataChange change;
  change.kind = MetadataChange::Kind::kTensor;
  change.tensor = *it->second.meta;
  TESSERA_RETURN_IF_ERROR(Record(change));
  it->second.state = State::kReady;
  return absl::OkStatus();
}

void Coordinator::FillWorkerState(TensorMetadata* meta) const {
  absl::flat_hash_map<std::string, WorkerRecord> workers;
  for (WorkerRecord& w : registry_.List()) workers[w.name] = std::move(w);
  for (ShardInfo& shard : meta->shards) {
    auto it = workers.find(shard.worker);
    if (it == workers.end()) {
      shard.available = false;
      continue;
    }
    shard.address = it->second.address;
    shard.available = it->second.alive;
  }
  absl::MutexLock lock(&mu_);
  for (ShardInfo& shard : meta->shards) {
    if (lost_.contains(shard.shard_id)) shard.available = false;
  }
}

absl::StatusOr<TensorMetadata> Coordinator::GetTensor(
    const std::string& name) const {
  std::shared_ptr<const TensorMetadata> meta;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second.state != State::kReady) {
      return NotFoundError("tensor", name);
    }
    meta = it->second.meta;
  }
  TensorMetadata out = *meta;
  FillWorkerState(&out);
  return out;
}

std::vector<TensorSummary> Coordinator::ListTensors() const {
  absl::MutexLock lock(&mu_);
  std::vector<TensorSummary> out;
  for (const auto& [name, entry] : tensors_) {
    if (entry.state != State::kReady) continue;
    TensorSummary summary;
    summary.name = name;
    summary.shape = entry.meta->shape;
    summary.dtype = entry.meta->dtype;
    summary.version = entry.meta->version;
    summary.num_shards = static_cast<int64_t>(entry.meta->shards.size());
    out.push_back(std::move(summary));
  }
  return out;
}

absl::Status Coordinator::DeleteTensor(const std::string& name) {
  std::shared_ptr<const TensorMetadata> meta;
  std::vector<TensorMetadata> retired;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second.state == State::kCreating) {
      return NotFoundError("tensor", name);
    }
    if (it->second.resharding) {
      return absl::AbortedError(absl::StrCat(
          "tensor '", name,
          "' is being resharded; delete it once the reshard finishes"));
    }
    if (it->second.state == State::kReady) {
      MetadataChange change;
      change.kind = MetadataChange::Kind::kDeletedTensor;
      change.deleted_tensor = name;
      TESSERA_RETURN_IF_ERROR(Record(change));
    }
    meta = it->second.meta;
    tensors_.erase(it);
    for (const ShardInfo& shard : meta->shards) {
      referenced_shards_.erase(shard.shard_id);
      lost_.erase(shard.shard_id);
    }
    // Replaced versions waiting out their grace period go now too.
    auto first_retired = std::partition(
        retirements_.begin(), retirements_.end(),
        [&](const Retirement& r) { return r.shards.name != name; });
    for (auto r = first_retired; r != retirements_.end(); ++r) {
      for (const ShardInfo& shard : r->shards.shards)
        referenced_shards_.erase(shard.shard_id);
      retired.push_back(std::move(r->shards));
    }
    retirements_.erase(first_retired, retirements_.end());
  }
  FreeShards(*meta);
  for (const TensorMetadata& version : retired) FreeShards(version);
  spdlog::info("deleted tensor '{}'", name);
  return absl::OkStatus();
}

absl::StatusOr<ReshardResult> Coordinator::ReshardTensor(
    const std::string& name, const LayoutSpec& spec,
    uint64_t expected_version) {
  const absl::Time start = absl::Now();
  std::shared_ptr<const TensorMetadata> old_meta;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second.state != State::kReady) {
      return NotFoundError("tensor", name);
    }
    if (it->second.resharding) {
      return absl::AbortedError(absl::StrCat("a reshard of tensor '", name,
                                             "' is already in progress"));
    }
    if (expected_version != 0 && it->second.meta->version != expected_version) {
      return absl::AbortedError(
          absl::StrCat("tensor '", name, "' is at version ",
                       it->second.meta->version, ", not ", expected_version));
    }
    it->second.resharding = true;
    old_meta = it->second.meta;
  }
  auto done = absl::MakeCleanup([&] {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it != tensors_.end()) it->second.resharding = false;
  });

  TESSERA_ASSIGN_OR_RETURN(std::vector<Box> boxes,
                           LayoutBoxes(old_meta->shape, spec));
  auto new_meta = std::make_shared<TensorMetadata>();
  new_meta->name = old_meta->name;
  new_meta->shape = old_meta->shape;
  new_meta->dtype = old_meta->dtype;
  new_meta->requires_grad = old_meta->requires_grad;
  new_meta->pin_memory = old_meta->pin_memory;
  new_meta->version = old_meta->version + 1;
  TESSERA_RETURN_IF_ERROR(PlaceShards(spec, std::move(boxes), new_meta.get()));

  // Sources must be readable before anything is allocated.
  TensorMetadata sources = *old_meta;
  FillWorkerState(&sources);
  std::vector<PlacedBox> old_layout, new_layout;
  for (const ShardInfo& s : sources.shards)
    old_layout.push_back({s.box, s.worker});
  for (const ShardInfo& s : new_meta->shards)
    new_layout.push_back({s.box, s.worker});
  const ReshardPlan plan =
      PlanReshard(old_layout, new_layout, ItemSize(old_meta->dtype));
  for (const ReshardPiece& piece : plan.pieces) {
    const ShardInfo& src = sources.shards[piece.src_shard];
    if (!src.available) {
      return UnavailableError(
          absl::StrCat("cannot reshard '", name, "': worker '", src.worker,
                       "' holding shard ", piece.src_shard));
    }
  }

  // New shards: kept ones take over the old memory; the rest are allocated.
  TensorMetadata fresh = *new_meta;
  fresh.shards.clear();
  {
    absl::MutexLock lock(&mu_);
    const size_t num_fresh = static_cast<size_t>(
        std::count(plan.kept_from.begin(), plan.kept_from.end(), int64_t{-1}));
    TESSERA_ASSIGN_OR_RETURN(uint64_t next_id, TakeShardIds(num_fresh));
    for (size_t j = 0; j < new_meta->shards.size(); ++j) {
      ShardInfo& shard = new_meta->shards[j];
      if (plan.kept_from[j] >= 0) {
        shard.shard_id = old_meta->shards[plan.kept_from[j]].shard_id;
        continue;
      }
      shard.shard_id = next_id++;
      referenced_shards_.insert(shard.shard_id);
      fresh.shards.push_back(shard);
    }
  }
  if (absl::Status status = CheckCapacity(fresh); !status.ok()) {
    absl::MutexLock lock(&mu_);
    for (const ShardInfo& shard : fresh.shards)
      referenced_shards_.erase(shard.shard_id);
    return status;
  }
  auto forget_fresh = [&] {
    absl::MutexLock lock(&mu_);
    for (const ShardInfo& shard : fresh.shards)
      referenced_shards_.erase(shard.shard_id);
  };
  const absl::Time allocate_start = absl::Now();
  absl::Status status = AllocateShards(fresh, InitSpec{});
  if (!status.ok()) {
    forget_fresh();
    return Annotate(status, absl::StrCat("resharding '", name, "'"));
  }
  const absl::Time move_start = absl::Now();
  status = MovePieces(sources, *new_meta, plan);
  const absl::Time move_end = absl::Now();
  if (!status.ok()) {
    FreeShards(fresh);
    forget_fresh();
    return Annotate(status, absl::StrCat("resharding '", name, "' (version ",
                                         old_meta->version, " is unchanged)"));
  }

  // Commit N+1; retire N's shards that N+1 does not keep.
  TensorMetadata retired = *old_meta;
  retired.shards.clear();
  std::vector<bool> kept(old_meta->shards.size(), false);
  for (int64_t k : plan.kept_from) {
    if (k >= 0) kept[k] = true;
  }
  for (size_t i = 0; i < old_meta->shards.size(); ++i) {
    if (!kept[i]) retired.shards.push_back(old_meta->shards[i]);
  }
  bool committed = false;
  absl::Status commit_status = absl::AbortedError(
      absl::StrCat("tensor '", name, "' changed during the reshard"));
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    // The resharding flag blocks deletes, so the entry is still ours.
    if (it != tensors_.end() && it->second.meta == old_meta) {
      MetadataChange change;
      change.kind = MetadataChange::Kind::kTensor;
      change.tensor = *new_meta;
      commit_status = Record(change);
      if (commit_status.ok()) {
        it->second.meta = new_meta;
        retirements_.push_back(
            {options_.clock() + options_.retire_grace, std::move(retired)});
        committed = true;
      }
    }
  }
  if (!committed) {
    FreeShards(fresh);
    forget_fresh();
    return commit_status;
  }
  ReshardResult result;
  result.version = new_meta->version;
  result.pieces_moved = plan.pieces_moved;
  result.bytes_moved = plan.bytes_moved;
  result.bytes_copied_locally = plan.bytes_copied_locally;
  result.shards_kept = plan.shards_kept;
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  spdlog::info(
      "resharded '{}' to version {}: {} piece(s) moved ({} bytes), {} bytes "
      "copied "
      "locally, {} shard(s) kept, {:.3f} s (plan {:.3f}, allocate {:.3f}, move "
      "{:.3f})",
      name, result.version, result.pieces_moved, result.bytes_moved,
      result.bytes_copied_locally, result.shards_kept, result.seconds,
      absl::ToDoubleSeconds(allocate_start - start),
      absl::ToDoubleSeconds(move_start - allocate_start),
      absl::ToDoubleSeconds(move_end - move_start));
  return result;
}

absl::Status Coordinator::MovePieces(const TensorMetadata& old_meta,
                                     const TensorMetadata& new_meta,
                                     const ReshardPlan& plan) {
  // One batch per (source, destination) pair of workers; all batches run in
  // parallel.
  std::map<std::pair<std::string, std::string>, TransferBatch> batches;
  for (const ReshardPiece& piece : plan.pieces) {
    const ShardInfo& src = old_meta.shards[piece.src_shard];
    const ShardInfo& dst = new_meta.shards[piece.dst_shard];
    TransferBatch& batch = batches[{src.worker, dst.worker}];
    if (batch.pieces.empty()) {
      batch.src_worker = src.worker;
      batch.src_address = src.address;
      batch.dst_worker = dst.worker;
      batch.dst_address = dst.address;
    }
    TransferPiece& move = batch.pieces.emplace_back();
    move.src_shard_id = src.shard_id;
    move.dst_shard_id = dst.shard_id;
    move.sizes = ToShape(piece.global.sizes);
    for (size_t d = 0; d < piece.global.rank(); ++d) {
      move.dst_offsets.push_back(piece.global.offsets[d] - dst.box.offsets[d]);
      move.src_offsets.push_back(piece.global.offsets[d] - src.box.offsets[d]);
    }
  }
  std::vector<absl::Status> results(batches.size());
  std::vector<std::thread> threads;
  size_t slot = 0;
  for (const auto& [pair, batch] : batches) {
    threads.emplace_back([&, slot, &batch = batch] {
      absl::Status status = workers_->Transfer(batch);
      if (!status.ok()) {
        results[slot] = Annotate(
            status, absl::StrCat("moving ", batch.pieces.size(),
                                 " piece(s) from worker '", batch.src_worker,
                                 "' to worker '", batch.dst_worker, "'"));
      }
    });
    ++slot;
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& status : results) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace tessera
