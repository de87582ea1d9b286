#include "coordinator/worker_reconciler.h"

#include "absl/strings/str_cat.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {

WorkerReconciler::WorkerReconciler(WorkerRegistry* registry,
                                   TensorTable* table, MetadataLog* log,
                                   WorkerControl* workers)
    : registry_(registry), table_(table), log_(log), workers_(workers) {}

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
  // Lost shards are marked before the worker shows as alive.
  Reconciliation reconciled = table_->Reconcile(worker.name, held_shard_ids);
  registry_->Complete(worker);

  RegisterResult result;
  result.rank = worker.rank;
  result.free_shard_ids = std::move(reconciled.unreferenced);
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

}  // namespace tessera
