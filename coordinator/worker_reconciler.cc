#include "coordinator/worker_reconciler.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {

absl::StatusOr<BytesUsedReading> HeldShardTracker::Allocate(
    const WorkerRef& worker, const AllocateBatch& batch) {
  absl::StatusOr<BytesUsedReading> result = inner_->Allocate(worker, batch);
  // A failed batch is not wanted: if the worker made it anyway (its answer
  // was lost), its digest differs and heartbeats free it.
  if (result.ok()) {
    absl::MutexLock lock(&mu_);
    Digest& digest = expected_[worker.name];
    for (const auto& [id, box] : batch.shards) digest.xor_ids ^= id;
    digest.count += static_cast<int64_t>(batch.shards.size());
  }
  return result;
}

absl::StatusOr<BytesUsedReading> HeldShardTracker::Free(
    const WorkerRef& worker, const std::vector<uint64_t>& shard_ids) {
  {
    // Unwanted from now on, whether or not this order reaches the worker.
    absl::MutexLock lock(&mu_);
    Digest& digest = expected_[worker.name];
    for (uint64_t id : shard_ids) digest.xor_ids ^= id;
    digest.count -= static_cast<int64_t>(shard_ids.size());
  }
  return inner_->Free(worker, shard_ids);
}

void HeldShardTracker::Set(const std::string& worker,
                           absl::Span<const uint64_t> held) {
  Digest digest;
  for (uint64_t id : held) digest.xor_ids ^= id;
  digest.count = static_cast<int64_t>(held.size());
  absl::MutexLock lock(&mu_);
  expected_[worker] = digest;
}

bool HeldShardTracker::Matches(const std::string& worker,
                               const HeldReport& report) const {
  absl::MutexLock lock(&mu_);
  auto it = expected_.find(worker);
  return it != expected_.end() && it->second.count == report.count &&
         it->second.xor_ids == report.xor_ids;
}

WorkerReconciler::WorkerReconciler(WorkerRegistry* registry, TensorTable* table,
                                   MetadataLog* log, WorkerControl* workers,
                                   HeldShardTracker* held,
                                   absl::Duration held_check_interval,
                                   std::function<absl::Time()> clock)
    : registry_(registry),
      table_(table),
      log_(log),
      workers_(workers),
      held_(held),
      held_check_interval_(held_check_interval),
      clock_(std::move(clock)) {}

absl::StatusOr<RegisterResult> WorkerReconciler::Register(
    const WorkerRegistration& registration,
    const std::vector<uint64_t>& held_shard_ids) {
  const WorkerInfo& claimed = registration.worker;
  TESSERA_RETURN_IF_ERROR(CheckWorkerName(claimed.name));
  TESSERA_RETURN_IF_ERROR(CheckDialAddress(claimed.address, "worker address"));
  if (registration.rank.has_value() && *registration.rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank must be >= 0, got ", *registration.rank));
  }
  TESSERA_ASSIGN_OR_RETURN(WorkerInfo worker, registry_->Reserve(registration));
  workers_->Reset(worker.address);
  if (absl::Status status = log_->Append(MetadataChange::Worker(worker));
      !status.ok()) {
    registry_->Abort(worker.name);
    return status;
  }
  // A shard held under an id the coordinator placed something else under
  // is not held: set aside by the worker, lost here, repaired.
  std::vector<uint64_t> set_aside;
  std::vector<uint64_t> held = held_shard_ids;
  if (!registration.held_identities.empty()) {
    set_aside = table_->Misidentified(worker.name, held_shard_ids,
                                      registration.held_identities);
    const absl::flat_hash_set<uint64_t> aside(set_aside.begin(),
                                              set_aside.end());
    held.erase(std::remove_if(held.begin(), held.end(),
                              [&](uint64_t id) { return aside.contains(id); }),
               held.end());
  }
  // Lost shards are marked before the worker shows as alive.
  Reconciliation reconciled = table_->Reconcile(worker.name, held);
  if (held_ != nullptr) {
    // What it holds less what it is told to free; a worker that keeps some
    // of them (quarantined for another cluster) leaves them out of its
    // digest.
    const absl::flat_hash_set<uint64_t> freed(reconciled.unreferenced.begin(),
                                              reconciled.unreferenced.end());
    std::vector<uint64_t> kept;
    kept.reserve(held.size());
    for (uint64_t id : held) {
      if (!freed.contains(id)) kept.push_back(id);
    }
    held_->Set(worker.name, kept);
  }
  {
    absl::MutexLock lock(&mu_);
    last_asked_.erase(worker.name);
  }
  registry_->Complete(worker);

  RegisterResult result;
  result.rank = worker.rank;
  result.free_shard_ids = std::move(reconciled.unreferenced);
  if (!set_aside.empty()) {
    spdlog::error(
        "worker '{}' holds {} shard(s) that are not what was placed under "
        "their ids (another tensor, incarnation or box in its records): they "
        "are set aside and repaired from their replicas",
        worker.name, set_aside.size());
  }
  result.set_aside_shard_ids = std::move(set_aside);
  if (!result.free_shard_ids.empty()) {
    spdlog::info(
        "worker '{}' holds {} shard(s) no tensor references; freeing them",
        worker.name, result.free_shard_ids.size());
  }
  if (!reconciled.lost.empty()) {
    spdlog::warn("worker '{}' lacks {} shard(s) it should hold; they are lost",
                 worker.name, reconciled.lost.size());
  }
  spdlog::info("worker '{}' rank {} at {} ({}) registered", worker.name,
               worker.rank, worker.address, worker.device.ToString());
  return result;
}

HeartbeatResult WorkerReconciler::Heartbeat(const std::string& name,
                                            BytesUsedReading bytes_used,
                                            const HeldReport& held) {
  HeartbeatResult result;
  result.known = registry_->Heartbeat(name, bytes_used);
  if (result.known) {
    registry_->SetQuarantined(name, held.quarantined_shards,
                              held.quarantined_bytes);
    registry_->SetDeviceMemory(name, held.device_total_bytes,
                               held.device_free_bytes);
  }
  if (!result.known || held_ == nullptr) return result;
  if (held.ids.has_value()) {
    std::vector<uint64_t> kept;
    kept.reserve(held.ids->size());
    for (uint64_t id : *held.ids) {
      (table_->IsReferenced(id) ? kept : result.free_shard_ids).push_back(id);
    }
    held_->Set(name, kept);
    if (!result.free_shard_ids.empty()) {
      spdlog::info(
          "worker '{}' still holds {} shard(s) no tensor references; freeing "
          "them",
          name, result.free_shard_ids.size());
    }
    return result;
  }
  if (held_->Matches(name, held)) return result;
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  auto [it, first] = last_asked_.try_emplace(name, now);
  if (first || now - it->second >= held_check_interval_) {
    it->second = now;
    result.send_held = true;
  }
  return result;
}

}  // namespace tessera
