// Coordinator: the logic behind the Coordinator service — worker membership
// and the global metadata of every sharded tensor. Core types in, StatusOr
// out; no gRPC here (workers are reached through WorkerControl).
//
// A thin facade over its parts, each with one job:
//   WorkerRegistry    membership and leases (worker_registry.h)
//   WorkerReconciler  registration: durable record, held vs expected shards
//   TensorTable       tensors, versions, shard ids, retirement (tensor_table.h)
//   Orchestrator      creates, puts, reshards, deletes on the workers
//   Repairs           replicas and mirrors back where they belong (repairs.h)
//   Checkpoints       loads and saves checkpoint directories (checkpoints.h)
//   MetadataLog       the durable record path, with group commit
//
// Thread-safe. No lock is held while talking to workers or while a record
// is written: a change is enqueued under the table's lock, made durable by
// the log's writer thread (one fsync per batch of callers), and only then
// published to readers. Reads (GetTensor, ListTensors, ListWorkers) never
// wait on the disk.
#ifndef TESSERA_COORDINATOR_COORDINATOR_H_
#define TESSERA_COORDINATOR_COORDINATOR_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/checkpoints.h"
#include "coordinator/metadata_log.h"
#include "coordinator/metadata_store.h"
#include "coordinator/orchestrator.h"
#include "coordinator/repairs.h"
#include "coordinator/tensor_table.h"
#include "coordinator/version_waiters.h"
#include "coordinator/worker_control.h"
#include "coordinator/worker_reconciler.h"
#include "coordinator/worker_registry.h"
#include "core/layout_spec.h"
#include "core/metrics.h"
#include "core/quota.h"
#include "core/tensor_metadata.h"
#include "core/transfer.h"

namespace tessera {

struct CoordinatorOptions {
  // A worker is dead when it has not heartbeated for this long.
  absl::Duration lease = absl::Seconds(5);
  // How often workers heartbeat (sent to them at registration).
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Snapshot the metadata after this many log records (on the log's writer
  // thread).
  int64_t snapshot_every = 1000;
  // Time source; tests inject a fake clock.
  Clock clock = [] { return absl::Now(); };
  // How long a read lease lasts. After a reshard or update commits version
  // N+1, version N's shards stay readable until the last reader that
  // fetched N's metadata releases its lease (at once when none did), at
  // most this long; then they are freed. A read still running after that
  // fails with ABORTED and the SDK reads the new version instead: a reader
  // never sees a mix of versions.
  absl::Duration retire_grace = absl::Seconds(5);
  // A tensor created pending (a put) and never committed is removed after
  // this long: its client died mid-put.
  absl::Duration pending_timeout = absl::Minutes(10);
  // A put or update whose client has not kept it (KeepPending, which the
  // SDK sends every third of this while it writes) for this long is given
  // up within seconds of its client's death, not pending_timeout.
  absl::Duration pending_lease = absl::Seconds(10);
  // A worker whose heartbeat digest of held shards differs from what the
  // coordinator wants it to hold is asked for its list of shard ids at most
  // this often (worker_reconciler.h); unreferenced ones are then freed.
  absl::Duration held_check_interval = absl::Seconds(2);
  // When set, the coordinator reports into it (metadata log latency; at
  // each scrape: workers alive, tensors, shards, retired versions waiting).
  // Not owned; outlives the coordinator.
  MetricsRegistry* metrics = nullptr;

  // Limits, so that no request exhausts the coordinator's memory or CPU and
  // every reply fits in one message:
  // The most workers known at once, dead ones included (clamped to
  // 1..kMaxWorkersCeiling); a new name beyond gets RESOURCE_EXHAUSTED.
  size_t max_workers = kDefaultMaxWorkers;
  // The most waits for a version held at once (`tessera wait`); more get
  // RESOURCE_EXHAUSTED ("waiters").
  int max_waiters = 10000;
  // The most shards one tensor version may have (at most 2^20).
  int64_t max_shards_per_tensor = kMaxShardsPerTensor;
  // The most coordinator memory the metadata of one tensor version may
  // take, counted before anything is built as shards x (192 + 16 x rank)
  // bytes; a bigger create or reshard gets RESOURCE_EXHAUSTED.
  int64_t max_tensor_metadata_bytes = int64_t{256} << 20;
  // The largest reply the coordinator sends (at most kMaxMessageBytes): a
  // layout whose packed describe could exceed it is refused at create and
  // reshard, and a reply that would exceed it fails with RESOURCE_EXHAUSTED.
  int64_t max_reply_bytes = kMaxMessageBytes;
  // The longest the coordinator validates one layout or plans one reshard,
  // even when its caller set no deadline (DEADLINE_EXCEEDED after).
  absl::Duration plan_budget = absl::Seconds(30);

  // Repair (CLI.md "Replicas (v3)"): how often the coordinator looks for
  // shards that lost a replica (a dead, forgotten or draining worker, or a
  // shard a worker lost) and copies them from a survivor; after a restart
  // it first waits one lease, so that live workers register again. A pass
  // costs next to nothing while every worker is good, so a short interval
  // starts a repair within 50 ms of a lease running out.
  absl::Duration repair_interval = absl::Milliseconds(50);
  // The most bytes per second repairs copy, on average (0: no limit).
  int64_t repair_bytes_per_second = 0;
  // false: never repair, only count the shards short of replicas (tests of
  // the unrepaired state).
  bool repair = true;
  // How a commit copies what a client wrote to a shard's first replica to
  // the others (bench/RESULTS.md compares the two).
  ReplicaForward replica_forward = ReplicaForward::kRelay;
};

// The TensorLimits `options` set (max_reply_bytes clamped to
// kMaxMessageBytes).
TensorLimits LimitsOf(const CoordinatorOptions& options);

class Coordinator {
 public:
  Coordinator(CoordinatorOptions options,
              std::unique_ptr<WorkerControl> workers,
              std::unique_ptr<MetadataStore> store =
                  std::make_unique<MemoryMetadataStore>());
  ~Coordinator();

  // Loads the metadata the store kept (call once, before serving) and
  // starts the log afresh from one snapshot of it. Known workers come back
  // dead until they register again and report the shards they still hold.
  absl::Status Recover();
  // Counts of what Recover found, for the start-up log.
  struct Recovered {
    size_t tensors = 0;
    size_t workers = 0;
  };
  Recovered recovered() const { return recovered_; }
  // The cluster the recovered metadata belongs to (empty before Recover).
  // Sent to workers at registration: they free shards only on the word of
  // their own cluster's coordinator.
  const std::string& cluster_id() const { return cluster_id_; }

  const CoordinatorOptions& options() const { return options_; }

  absl::StatusOr<RegisterResult> RegisterWorker(
      const WorkerRegistration& registration,
      const std::vector<uint64_t>& held_shard_ids);
  // False when the worker is unknown and must register again.
  bool Heartbeat(const std::string& name, BytesUsedReading bytes_used);
  // Renews the lease and checks the digest of what the worker holds: asks
  // for its list on a mismatch and frees what no tensor references.
  HeartbeatResult Heartbeat(const std::string& name,
                            BytesUsedReading bytes_used,
                            const HeldReport& held);
  std::vector<WorkerRecord> ListWorkers() const;

  // --- Quotas (CLI.md "Quotas (v4)") ---
  // The limits every admission is checked against from now on (null:
  // none, use is still counted).
  void SetQuotas(std::shared_ptr<const QuotaTable> quotas);
  // One principal's use and limits.
  struct QuotaReport {
    std::string principal;  // empty: anonymous
    QuotaUse use;
    QuotaLimit limit;
  };
  // Every principal that owns something or is listed in the quotas, by
  // name; with `only`, that principal alone (listed even when it holds
  // nothing).
  std::vector<QuotaReport> Quotas(
      std::optional<std::string> only = std::nullopt) const;

  // Worker management (CLI.md "Replicas (v3)", the admin role): `state` is
  // kCordoned (no new shards), kReady (uncordon) or kDraining (no new
  // shards, and repair moves every shard it holds elsewhere). Durable.
  // NOT_FOUND for an unknown worker.
  absl::Status SetWorkerState(const std::string& name, WorkerState state);
  // Forgets a dead or drained worker. NOT_FOUND; FAILED_PRECONDITION
  // "holds" while some shard has no available replica but its own, or
  // while it is alive and not drained.
  absl::Status RemoveWorker(const std::string& name);
  // Shards of current versions with fewer good replicas (available, on a
  // worker not draining) than their tensor's R, as of the last repair pass.
  int64_t UnderReplicatedShards() const { return under_replicated_.load(); }
  int64_t RepairBytes() const { return repair_bytes_.load(); }
  // Runs one repair pass now (what the repair thread does every
  // repair_interval): repairs what it can, returns the shards still short.
  int64_t RepairNow();
  // Brings every mirrored tensor's mirrors in line with its mirror group
  // (Repairs::SyncMirrors): what the repair thread does at most every
  // kMirrorSyncInterval. Returns the tensors still behind.
  int64_t SyncMirrorsNow();

  // Validates, resolves placements, allocates every shard (all or nothing)
  // and commits version 1, returning once its record is durable (a put's
  // pending tensor needs no record until CommitTensor). Returns the committed
  // (immutable) metadata itself, not a copy: it can hold very many shards.
  absl::StatusOr<std::shared_ptr<const TensorMetadata>> CreateTensor(
      const CreateTensorArgs& args);
  // Commits the put (or update) `change` of `name` at `version`: seals
  // the shards it wrote on their workers, then makes it visible once its
  // record is durable. Only the principal that began it may (empty: no
  // tokens); `change` must be the one its reply named (TensorTable
  // BeginCommit). `sent` (optional) gets what each worker sent to fill the
  // replicas and mirrors.
  absl::Status CommitTensor(const std::string& name, uint64_t version,
                            const std::string& principal, uint64_t change,
                            SentBytes* sent = nullptr);
  // Current metadata, with each shard's worker address and availability.
  absl::StatusOr<TensorMetadata> GetTensor(const std::string& name) const;
  // The same, leasing the version for a read (TensorTable "Read leases"):
  // it stays until ReleaseRead or retire_grace, even once replaced.
  absl::StatusOr<TensorMetadata> GetTensorForRead(const std::string& name);
  void ReleaseRead(const std::string& name, uint64_t version);
  // The ready tensors; with `all`, pending puts too and what is pending.
  std::vector<TensorSummary> ListTensors(bool all = false) const;
  // What change of `name` is pending, in words ("" when none).
  std::string PendingNote(const std::string& name) const;
  // Removes the tensor (visible or pending) and frees its shards. Not
  // another principal's pending put unless `admin`; not a later tensor of
  // the name when `incarnation` (0: any) is not its.
  absl::Status DeleteTensor(const std::string& name,
                            const std::string& principal = "",
                            bool admin = true, uint64_t incarnation = 0);

  // Moves a tensor to a new layout as version N+1: allocates the new shards,
  // has destination workers pull their pieces from the source workers (in
  // parallel), then commits atomically. On any failure version N stays
  // intact and every new shard is freed. One reshard per tensor at a time:
  // a second one fails with ABORTED. expected_version 0 means any.
  // `stop`: when the caller gives up (its deadline or cancellation).
  absl::StatusOr<ReshardResult> ReshardTensor(const std::string& name,
                                              const LayoutSpec& spec,
                                              uint64_t expected_version,
                                              const StopCondition& stop = {});
  // How far the move of `name`'s bytes running now (a reshard, a repair)
  // has got.
  MoveProgress MoveProgressOf(const std::string& name) const {
    return orchestrator_.progress().Progress(name);
  }
  // Callers waiting for tensors' next versions, answered at the commit.
  VersionWaiters& waiters() { return waiters_; }
  // `name`'s committed version; NOT_FOUND unless it is ready.
  absl::StatusOr<uint64_t> CommittedVersion(const std::string& name) const {
    absl::StatusOr<TensorMetadataPtr> meta = table_.Get(name);
    if (!meta.ok()) return meta.status();
    return (*meta)->version;
  }

  // Checkpoints (Checkpoints::List, Load and Save).
  absl::StatusOr<CheckpointListing> DescribeCheckpoint(const std::string& dir) {
    return checkpoints_.List(dir);
  }
  absl::StatusOr<LoadResult> LoadCheckpoint(const LoadArgs& args) {
    return checkpoints_.Load(args);
  }
  absl::StatusOr<SaveResult> SaveCheckpoint(const SaveArgs& args) {
    return checkpoints_.Save(args);
  }

  // Starts version N+1 of a tensor with N's layout for the caller to write
  // (CLI.md "Updates"): shards the region meets (all, without one) are new
  // and writable, those it meets in part already hold N's bytes, the rest
  // are N's own. Readers see N until CommitTensor(N+1); AbandonUpdate (or
  // pending_timeout, or a delete) gives it up. One change of a tensor at a
  // time: ABORTED while another runs or when expected_version is not
  // current. The reply's shards carry today's worker addresses.
  absl::StatusOr<StagedUpdate> UpdateTensor(const UpdateArgs& args);
  // Gives up the pending put or staged update `change` of `name` at
  // `version` and frees its new shards.
  absl::Status Abandon(const std::string& name, uint64_t version,
                       const std::string& principal, uint64_t change);
  // Its client keeps the pending put or update `change` (TensorTable).
  absl::Status KeepPending(const std::string& name, uint64_t version,
                           uint64_t change, const std::string& principal) {
    return table_.KeepPending(name, version, change, principal);
  }

 private:
  // Frees retired versions and abandoned puts; runs on retire_thread_.
  void RetireLoop();
  // Repairs every repair_interval; runs on repair_thread_.
  void RepairLoop();
  // The last refusal logged for each tensor's mirrors (repair thread only).
  absl::flat_hash_map<std::string, std::string> mirror_warned_;

  const CoordinatorOptions options_;
  // Destroyed in reverse: the retire thread stops first, the log drains its
  // queue before the store goes.
  const std::unique_ptr<WorkerControl> workers_;
  // Every order goes through it: what each worker should hold.
  HeldShardTracker held_;
  const std::unique_ptr<MetadataStore> store_;
  MetadataLog log_;
  WorkerRegistry registry_;
  TensorTable table_;
  Orchestrator orchestrator_;
  Checkpoints checkpoints_;
  Repairs repairs_;
  WorkerReconciler reconciler_;
  Recovered recovered_;
  std::string cluster_id_;

  absl::Notification stop_;
  std::thread retire_thread_;
  std::thread repair_thread_;
  absl::Time started_;  // when Recover ran: repairs wait a lease after it
  std::atomic<int64_t> under_replicated_{0};
  // The next repair pass scans every tensor even when every known worker
  // is good: after a start (records of bad workers are dropped), a worker
  // forgotten, or a pass that left shards short.
  std::atomic<bool> scan_all_{true};
  std::atomic<int64_t> repair_bytes_{0};
  // Last, so that every wait ends (UNAVAILABLE) before anything it reads
  // goes.
  VersionWaiters waiters_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_COORDINATOR_H_
