#include "coordinator/coordinator.h"

#include <algorithm>
#include <utility>

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
      reconciler_(&registry_, &table_, &log_, &held_, &held_,
                  options_.held_check_interval, options_.clock) {
  retire_thread_ = std::thread([this] { RetireLoop(); });
  if (options_.metrics != nullptr) {
    options_.metrics->AddCollector([this](MetricsRegistry& metrics) {
      int64_t alive = 0;
      for (const WorkerRecord& w : registry_.List()) alive += w.alive ? 1 : 0;
      metrics.Gauge("tessera_workers_alive", "Workers whose lease is current.")
          ->Set(static_cast<double>(alive));
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
    });
  }
}

Coordinator::~Coordinator() {
  stop_.Notify();
  retire_thread_.join();
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

bool Coordinator::Heartbeat(const std::string& name, int64_t bytes_used) {
  return registry_.Heartbeat(name, bytes_used);
}

HeartbeatResult Coordinator::Heartbeat(const std::string& name,
                                       int64_t bytes_used,
                                       const HeldReport& held) {
  return reconciler_.Heartbeat(name, bytes_used, held);
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
                                       uint64_t change) {
  return orchestrator_.Commit(name, version, principal, change);
}

absl::StatusOr<TensorMetadata> Coordinator::GetTensor(
    const std::string& name) const {
  TESSERA_ASSIGN_OR_RETURN(TensorMetadataPtr meta, table_.Get(name));
  TensorMetadata out = *meta;
  orchestrator_.FillWorkerState(&out);
  return out;
}

absl::StatusOr<TensorMetadata> Coordinator::GetTensorForRead(
    const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(TensorMetadataPtr meta, table_.GetLeased(name));
  TensorMetadata out = *meta;
  orchestrator_.FillWorkerState(&out);
  return out;
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
                                       const std::string& principal,
                                       bool admin, uint64_t incarnation) {
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
