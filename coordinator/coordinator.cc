#include "coordinator/coordinator.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

MetadataLog::Options LogOptions(const CoordinatorOptions& options) {
  MetadataLog::Options out;
  out.snapshot_every = options.snapshot_every;
  out.metrics = options.metrics;
  return out;
}

TensorTable::Options TableOptions(const CoordinatorOptions& options) {
  TensorTable::Options out;
  out.clock = options.clock;
  out.retire_grace = options.retire_grace;
  out.pending_timeout = options.pending_timeout;
  out.pending_lease = options.pending_lease;
  return out;
}

}  // namespace

TensorLimits LimitsOf(const CoordinatorOptions& options) {
  TensorLimits out;
  out.max_shards = options.max_shards_per_tensor;
  out.max_metadata_bytes = options.max_tensor_metadata_bytes;
  out.max_reply_bytes =
      std::min<int64_t>(options.max_reply_bytes, kMaxMessageBytes);
  out.max_workers = options.max_workers;
  out.plan_budget = options.plan_budget;
  out.forward = options.replica_forward;
  return out;
}

Coordinator::Coordinator(CoordinatorOptions options,
                         std::unique_ptr<WorkerControl> workers,
                         std::unique_ptr<MetadataStore> store)
    : options_(std::move(options)),
      workers_(std::move(workers)),
      held_(workers_.get()),
      store_(std::move(store)),
      log_(store_.get(), LogOptions(options_)),
      registry_(options_.lease, options_.clock, options_.max_workers),
      table_(TableOptions(options_), &log_),
      orchestrator_(&registry_, &table_, &log_, &held_, LimitsOf(options_)),
      checkpoints_(&registry_, &table_, &held_, &orchestrator_),
      repairs_(&orchestrator_, &registry_, &table_),
      reconciler_(&registry_, &table_, &log_, &held_, &held_,
                  options_.held_check_interval, options_.clock),
      waiters_(&table_, std::max(1, options_.max_waiters)) {
  retire_thread_ = std::thread([this] { RetireLoop(); });
  if (options_.metrics != nullptr) {
    options_.metrics->AddCollector([this](MetricsRegistry& metrics) {
      int64_t alive = 0;
      std::map<WorkerState, int64_t> by_state = {{WorkerState::kReady, 0},
                                                 {WorkerState::kCordoned, 0},
                                                 {WorkerState::kDraining, 0},
                                                 {WorkerState::kDead, 0}};
      for (const WorkerRecord& w : registry_.List()) {
        alive += w.alive ? 1 : 0;
        ++by_state[w.state];
      }
      metrics.Gauge("tessera_workers_alive", "Workers whose lease is current.")
          ->Set(static_cast<double>(alive));
      // Every state always present, so that an alert on draining or dead
      // workers sees 0 rather than no series.
      for (const auto& [state, count] : by_state) {
        metrics
            .Gauge("tessera_worker_state",
                   "Workers known to the coordinator, by state (ready, "
                   "cordoned, draining, dead).",
                   {{"state", std::string(WorkerStateName(state))}})
            ->Set(static_cast<double>(count));
      }
      int64_t shards = 0;
      const std::vector<TensorSummary> tensors = table_.List();
      for (const TensorSummary& t : tensors) shards += t.num_shards;
      metrics.Gauge("tessera_tensors", "Tensors listed.")
          ->Set(static_cast<double>(tensors.size()));
      metrics
          .Gauge("tessera_tensor_shards",
                 "Shards of the current versions of all tensors.")
          ->Set(static_cast<double>(shards));
      metrics
          .Gauge("tessera_retired_versions",
                 "Replaced tensor versions waiting to be freed.")
          ->Set(static_cast<double>(table_.NumRetired()));
      for (const QuotaReport& q : Quotas()) {
        const std::string principal = PrincipalLabel(q.principal);
        metrics
            .Gauge("tessera_quota_bytes",
                   "Bytes a principal's tensors hold: every replica and "
                   "mirror, and new shards of changes not committed yet.",
                   {{"principal", principal}})
            ->Set(static_cast<double>(q.use.bytes));
        if (q.limit.bytes >= 0) {
          metrics
              .Gauge("tessera_quota_limit_bytes",
                     "A principal's byte quota (--quotas); absent where "
                     "unlimited.",
                     {{"principal", principal}})
              ->Set(static_cast<double>(q.limit.bytes));
        }
      }
      const ExchangeGroups::Stats nccl = orchestrator_.exchange_stats();
      for (const auto& [outcome, count] :
           {std::pair<const char*, int64_t>{"ok", nccl.exchanges},
            {"failed", nccl.failures}}) {
        metrics
            .Counter("tessera_nccl_exchanges_total",
                     "Reshards whose pieces moved between GPU workers by one "
                     "NCCL exchange, by outcome (failed ones were pulled).",
                     {{"outcome", outcome}})
            ->Set(static_cast<double>(count));
      }
      metrics
          .Counter("tessera_nccl_exchanged_bytes_total",
                   "Bytes moved between GPU workers by NCCL exchanges.")
          ->Set(static_cast<double>(nccl.bytes));
      metrics
          .Gauge("tessera_under_replicated_shards",
                 "Shards of current tensor versions with fewer good replicas "
                 "(available, on a worker not draining) than their R.")
          ->Set(static_cast<double>(under_replicated_.load()));
      metrics
          .Counter("tessera_repair_bytes_total",
                   "Bytes copied from surviving replicas to new ones.")
          ->Set(static_cast<double>(repair_bytes_.load()));
    });
  }
}

Coordinator::~Coordinator() {
  stop_.Notify();
  retire_thread_.join();
  if (repair_thread_.joinable()) repair_thread_.join();
}

void Coordinator::RetireLoop() {
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    orchestrator_.FreeDue();
  }
}

absl::Status Coordinator::Recover() {
  TESSERA_ASSIGN_OR_RETURN(MetadataState state, log_.Recover());
  for (const auto& [name, worker] : state.workers) {
    // Records written before names and addresses were checked.
    if (absl::Status s = registry_.Restore(worker); !s.ok()) {
      spdlog::warn("forgetting a recorded worker: {}",
                   std::string(s.message()));
    }
  }
  table_.Restore(state);
  recovered_.tensors = state.tensors.size();
  recovered_.workers = state.workers.size();
  cluster_id_ = state.cluster_id;
  started_ = options_.clock();
  // Without repair the thread still counts the shards short of replicas.
  if (!repair_thread_.joinable()) {
    repair_thread_ = std::thread([this] { RepairLoop(); });
  }
  return absl::OkStatus();
}

namespace {

// Workers whose replicas are good: alive and not draining.
absl::flat_hash_set<std::string> GoodWorkers(
    const std::vector<WorkerRecord>& workers) {
  absl::flat_hash_set<std::string> good;
  for (const WorkerRecord& w : workers) {
    if (w.state == WorkerState::kReady || w.state == WorkerState::kCordoned)
      good.insert(w.name);
  }
  return good;
}

// Shards of `meta` (its worker state filled in) with fewer good replicas
// than the tensor's R.
int64_t ShortShards(const TensorMetadata& meta,
                    const absl::flat_hash_set<std::string>& good) {
  const size_t want = static_cast<size_t>(ReplicaCount(meta));
  int64_t short_shards = 0;
  for (const ShardInfo& shard : meta.shards) {
    size_t ok = 0;
    for (const Replica& replica : shard.replicas) {
      ok +=
          !replica.mirror && replica.available && good.contains(replica.worker)
              ? 1
              : 0;
    }
    short_shards += ok < want ? 1 : 0;
  }
  return short_shards;
}

}  // namespace

void Coordinator::RepairLoop() {
  absl::Time last_mirror_sync = absl::InfinitePast();
  while (!stop_.WaitForNotificationWithTimeout(options_.repair_interval)) {
    // After a restart, live workers register again within a lease: until
    // then they look dead, and their shards must not be copied.
    if (options_.clock() - started_ < options_.lease) continue;
    RepairNow();
    // Mirrors follow their groups less often: each pass walks the tensors.
    constexpr absl::Duration kMirrorSyncInterval = absl::Milliseconds(500);
    if (absl::Now() - last_mirror_sync >= kMirrorSyncInterval) {
      SyncMirrorsNow();
      last_mirror_sync = absl::Now();
    }
  }
}

int64_t Coordinator::SyncMirrorsNow() {
  int64_t behind = 0;
  const std::vector<TensorSummary> tensors = table_.List();
  // Refusals of tensors gone since are forgotten.
  if (!mirror_warned_.empty()) {
    absl::flat_hash_set<std::string> names;
    for (const TensorSummary& t : tensors) names.insert(t.name);
    for (auto it = mirror_warned_.begin(); it != mirror_warned_.end();) {
      if (names.contains(it->first)) {
        ++it;
      } else {
        mirror_warned_.erase(it++);
      }
    }
  }
  for (const TensorSummary& summary : tensors) {
    if (stop_.HasBeenNotified()) break;
    absl::StatusOr<TensorMetadataPtr> current = table_.Get(summary.name);
    if (!current.ok()) continue;
    const TensorMetadata& meta = **current;
    if (!HasMirrors(meta)) continue;
    TensorMetadata filled = orchestrator_.WithWorkerState(meta);
    if (!repairs_.MirrorsBehind(filled)) continue;
    absl::StatusOr<MirrorSyncResult> synced =
        repairs_.SyncMirrors(summary.name);
    if (!synced.ok()) {
      // ABORTED: another change of it runs; the next pass tries again. A
      // lasting refusal (a quota, a full worker) is logged once, not every
      // pass.
      const std::string why(synced.status().message());
      if (!absl::IsAborted(synced.status()) &&
          !absl::IsNotFound(synced.status()) &&
          mirror_warned_[summary.name] != why) {
        spdlog::warn("mirrors: {}", why);
        mirror_warned_[summary.name] = why;
      }
      ++behind;
    } else {
      mirror_warned_.erase(summary.name);
    }
  }
  return behind;
}

int64_t Coordinator::RepairNow() {
  const std::vector<WorkerRecord> workers = registry_.List();
  const absl::flat_hash_set<std::string> good = GoodWorkers(workers);
  const bool any_lost = table_.HasLost();
  // Every known worker good, no shard lost, and no worker forgotten since
  // the last pass that found nothing short: no replica can be bad, so the
  // metadata is not scanned (a healthy cluster costs this pass nothing).
  if (good.size() == workers.size() && !any_lost &&
      !scan_all_.exchange(false)) {
    under_replicated_ = 0;
    return 0;
  }
  int64_t still_short = 0;
  for (const TensorSummary& summary : table_.List()) {
    if (stop_.HasBeenNotified()) break;
    absl::StatusOr<TensorMetadataPtr> current = table_.Get(summary.name);
    if (!current.ok()) continue;
    // Cheap first: every replica on a good worker and no shard lost.
    bool suspect = any_lost;
    for (size_t i = 0; i < (*current)->shards.size() && !suspect; ++i) {
      for (const Replica& replica : (*current)->shards[i].replicas)
        suspect = suspect || !good.contains(replica.worker);
    }
    if (!suspect) continue;
    TensorMetadata filled = orchestrator_.WithWorkerState(**current);
    const int64_t short_shards = ShortShards(filled, good);
    if (short_shards == 0) continue;
    if (!options_.repair) {
      still_short += short_shards;
      continue;
    }

    const absl::Time start = absl::Now();
    absl::StatusOr<RepairResult> repaired = repairs_.Repair(summary.name);
    if (!repaired.ok()) {
      // ABORTED: another change of it runs; the next pass tries again.
      if (!absl::IsAborted(repaired.status()) &&
          !absl::IsNotFound(repaired.status())) {
        spdlog::warn("repair: {}", std::string(repaired.status().message()));
      }
      still_short += short_shards;
      continue;
    }
    repair_bytes_ += repaired->bytes_copied;
    still_short += repaired->shards_short;
    // Pacing: on average at most repair_bytes_per_second.
    if (options_.repair_bytes_per_second > 0 && repaired->bytes_copied > 0) {
      const absl::Time due =
          start +
          absl::Seconds(static_cast<double>(repaired->bytes_copied) /
                        static_cast<double>(options_.repair_bytes_per_second));
      stop_.WaitForNotificationWithDeadline(due);
    }
  }
  under_replicated_ = still_short;
  if (still_short > 0) scan_all_ = true;  // until a pass finds none
  return still_short;
}

absl::Status Coordinator::SetWorkerState(const std::string& name,
                                         WorkerState state) {
  if (state == WorkerState::kDead) {
    return absl::InvalidArgumentError("a worker cannot be made dead");
  }
  // In memory first (after any registration in flight, whose record then
  // cannot undo it), then durable; a record that fails undoes it.
  WorkerState previous = WorkerState::kReady;
  TESSERA_ASSIGN_OR_RETURN(WorkerInfo record,
                           registry_.SetAdminState(name, state, &previous));
  if (absl::Status logged = log_.Append(MetadataChange::Worker(record));
      !logged.ok()) {
    registry_.SetAdminState(name, previous).IgnoreError();
    return logged;
  }
  spdlog::info("worker '{}' is now {}", name,
               std::string(WorkerStateName(state)));
  return absl::OkStatus();
}

absl::Status Coordinator::RemoveWorker(const std::string& name) {
  std::optional<WorkerRecord> worker = registry_.Find(name);
  if (!worker.has_value()) return NotFoundError("worker", name);
  // What it still holds, and what only it holds.
  int64_t held = 0, only = 0;
  std::string example;
  for (const TensorSummary& summary : table_.List(/*all=*/true)) {
    absl::StatusOr<TensorMetadataPtr> current = table_.Get(summary.name);
    if (!current.ok()) continue;
    TensorMetadata filled = orchestrator_.WithWorkerState(**current);
    for (size_t i = 0; i < filled.shards.size(); ++i) {
      bool here = false, elsewhere = false;
      for (const Replica& replica : filled.shards[i].replicas) {
        if (replica.worker == name) {
          here = true;
        } else if (replica.available) {
          elsewhere = true;
        }
      }
      held += here ? 1 : 0;
      if (here && !elsewhere && only++ == 0) {
        example = absl::StrCat("shard ", i, " of tensor '", summary.name, "'");
      }
    }
  }
  if (only > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", name, "' holds the only replica of ", example,
        only > 1 ? absl::StrCat(" and of ", only - 1, " more shard(s)") : "",
        ": drain it first (tessera worker drain ", name,
        "), or delete those tensors"));
  }
  if (worker->alive && (worker->state != WorkerState::kDraining || held > 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", name, "' is alive and ",
                     worker->state == WorkerState::kDraining
                         ? absl::StrCat("still holds ", held,
                                        " replica(s) while its drain runs")
                         : "not drained",
                     ": drain it first (tessera worker drain ", name, ")"));
  }
  TESSERA_RETURN_IF_ERROR(log_.Append(MetadataChange::DeletedWorker(name)));
  TESSERA_RETURN_IF_ERROR(registry_.Forget(name));
  scan_all_ = true;  // replicas may name it: the next pass looks at all
  workers_->Reset(worker->address);
  spdlog::info("forgot worker '{}'", name);
  return absl::OkStatus();
}

absl::StatusOr<RegisterResult> Coordinator::RegisterWorker(
    const WorkerRegistration& registration,
    const std::vector<uint64_t>& held_shard_ids) {
  TESSERA_ASSIGN_OR_RETURN(RegisterResult result,
                           reconciler_.Register(registration, held_shard_ids));
  // A worker that (re)starts has no NCCL communicator yet.
  orchestrator_.ForgetExchangesWith(registration.worker.name);
  result.cluster_id = cluster_id_;
  return result;
}

bool Coordinator::Heartbeat(const std::string& name,
                            BytesUsedReading bytes_used) {
  return registry_.Heartbeat(name, bytes_used);
}

HeartbeatResult Coordinator::Heartbeat(const std::string& name,
                                       BytesUsedReading bytes_used,
                                       const HeldReport& held) {
  return reconciler_.Heartbeat(name, bytes_used, held);
}

void Coordinator::SetQuotas(std::shared_ptr<const QuotaTable> quotas) {
  table_.SetQuotas(std::move(quotas));
}

std::vector<Coordinator::QuotaReport> Coordinator::Quotas(
    std::optional<std::string> only) const {
  const std::shared_ptr<const QuotaTable> quotas = table_.quotas();
  std::map<std::string, QuotaUse> usage = table_.Usage();
  if (quotas != nullptr && !only.has_value()) {
    for (const std::string& name : quotas->Listed()) usage.try_emplace(name);
  }
  if (only.has_value()) {
    const QuotaUse use = usage[*only];
    usage = {{*only, use}};
  }
  std::vector<QuotaReport> out;
  for (const auto& [principal, use] : usage) {
    QuotaReport& report = out.emplace_back();
    report.principal = principal;
    report.use = use;
    if (quotas != nullptr) report.limit = quotas->For(principal);
  }
  return out;
}

std::vector<WorkerRecord> Coordinator::ListWorkers() const {
  return registry_.List();
}

absl::StatusOr<std::shared_ptr<const TensorMetadata>> Coordinator::CreateTensor(
    const CreateTensorArgs& args) {
  return orchestrator_.Create(args);
}

absl::Status Coordinator::CommitTensor(const std::string& name,
                                       uint64_t version,
                                       const std::string& principal,
                                       uint64_t change, SentBytes* sent) {
  return orchestrator_.Commit(name, version, principal, change, sent);
}

absl::StatusOr<TensorMetadata> Coordinator::GetTensor(
    const std::string& name) const {
  TESSERA_ASSIGN_OR_RETURN(TensorMetadataPtr meta, table_.Get(name));
  return orchestrator_.WithWorkerState(*meta);
}

absl::StatusOr<TensorMetadata> Coordinator::GetTensorForRead(
    const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(TensorMetadataPtr meta, table_.GetLeased(name));
  return orchestrator_.WithWorkerState(*meta);
}

void Coordinator::ReleaseRead(const std::string& name, uint64_t version) {
  table_.ReleaseRead(name, version);
}

std::vector<TensorSummary> Coordinator::ListTensors(bool all) const {
  return table_.List(all);
}

std::string Coordinator::PendingNote(const std::string& name) const {
  return table_.PendingNote(name);
}

absl::Status Coordinator::DeleteTensor(const std::string& name,
                                       const std::string& principal, bool admin,
                                       uint64_t incarnation) {
  return orchestrator_.Delete(name, principal, admin, incarnation);
}

absl::StatusOr<ReshardResult> Coordinator::ReshardTensor(
    const std::string& name, const LayoutSpec& spec, uint64_t expected_version,
    const StopCondition& stop) {
  return orchestrator_.Reshard(name, spec, expected_version, stop);
}

absl::StatusOr<StagedUpdate> Coordinator::UpdateTensor(const UpdateArgs& args) {
  return orchestrator_.BeginUpdate(args);
}

absl::Status Coordinator::Abandon(const std::string& name, uint64_t version,
                                  const std::string& principal,
                                  uint64_t change) {
  return orchestrator_.Abandon(name, version, principal, change);
}

}  // namespace tessera
