// TensorTable: every tensor the coordinator knows, by name — its state, its
// current (published) version, the shard ids handed out and still
// referenced, shards their worker lost, replaced versions waiting out their
// grace period, and puts never committed. In memory only; no worker calls
// and no disk I/O.
//
// Durability: a change that must be recorded is made in two steps. The
// Begin*/Commit* call checks it and enqueues its record on the MetadataLog
// under mu_ (so the log's order is the table's order) and marks the tensor
// busy; the caller waits for the record without any lock, then calls the
// Finish* step, which publishes the change (or undoes it when the record
// failed). Readers see only published changes: a create in flight is
// invisible, a reshard in flight shows version N, a delete in flight still
// shows the tensor. A second change of a busy tensor waits until the first
// is finished (not the readers: they never wait on the disk).
//
// Shard ids only grow and are never reused. Ids below the recorded high-water
// mark may be in use after a restart, so ids reach workers only once the
// high-water record that covers them is durable (Reserve* return its
// ticket).
//
// Thread-safe. Lock order: mu_ -> MetadataLog's lock (Enqueue only).
#ifndef TESSERA_COORDINATOR_TENSOR_TABLE_H_
#define TESSERA_COORDINATOR_TENSOR_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "coordinator/metadata_log.h"
#include "coordinator/reconciliation.h"
#include "core/quota.h"
#include "core/tensor_metadata.h"

namespace tessera {

using Clock = std::function<absl::Time()>;
using TensorMetadataPtr = std::shared_ptr<const TensorMetadata>;

// One line of ListTensors.
struct TensorSummary {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  uint64_t version = 0;  // the current one (a pending put's: 1)
  int64_t num_shards = 0;
  int64_t replicas = 1;  // workers holding each shard
  std::string mirror;    // its mirror group (CLI.md "Mirrors (v4)")
  // A change not committed yet (listed with `all`): a put (the tensor is
  // not visible yet) or an update to `pending_version`, by `pending_owner`
  // (empty without tokens), begun at `pending_since`.
  enum class Pending { kNone, kPut, kUpdate };
  Pending pending = Pending::kNone;
  uint64_t pending_version = 0;
  std::string pending_owner;
  absl::Time pending_since;
};

// A commit under way (TensorTable::BeginCommit).
struct CommitStart {
  // The change is committed already (a retried commit of it): nothing to do.
  bool done = false;
  // The shards the change wrote, to seal on their workers before its record
  // is written (null when done).
  TensorMetadataPtr seal;
  // An update's: the version it replaces, whose copies the relay sends
  // only the changes to (null for a put).
  TensorMetadataPtr before;
};

class TensorTable {
 public:
  using Ticket = MetadataLog::Ticket;

  struct Options {
    Clock clock = [] { return absl::Now(); };
    // How long a read lease lasts (TakeReadLease): a replaced version is
    // freed once its last lease is released or expires, so at most this
    // long after it is replaced, and at once when nobody reads it.
    absl::Duration retire_grace = absl::Seconds(5);
    // A put never committed for this long is removed.
    absl::Duration pending_timeout = absl::Minutes(10);
    // A put or update its client has not kept (KeepPending) for this long
    // is given up: its client died. Infinite: kept until pending_timeout.
    absl::Duration pending_lease = absl::InfiniteDuration();
  };

  // `log` must outlive the table.
  TensorTable(Options options, MetadataLog* log);

  // Every tensor of a recovered state becomes ready. Call before serving.
  void Restore(const MetadataState& state) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Reads: never wait on the disk. ---

  // The published metadata; NOT_FOUND unless the tensor is ready (saying
  // so when a put of it is pending).
  absl::StatusOr<TensorMetadataPtr> Get(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The ready tensors; with `all`, pending puts too, and each entry says
  // what change of it is pending.
  std::vector<TensorSummary> List(bool all = false) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // What is pending of `name`, in words ("an update to version 3 by 'ann'
  // pending since ..."), empty when nothing is.
  std::string PendingNote(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Marks shards whose worker lost them as unavailable.
  void MarkLost(TensorMetadata* meta) const ABSL_LOCKS_EXCLUDED(mu_);
  // Counts the copies `ids` lost (a mirror a commit could not fill): reads
  // pass them over until they are replaced.
  void AddLost(absl::Span<const uint64_t> ids) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Waits for versions (coordinator/version_waiters.h) ---

  // Blocks until one of `targets` (a name, a least version) is met (the
  // tensor's committed version reaches it, or the tensor is gone), or
  // `*wake` differs from `seen`, or `deadline` passes. The condition is
  // checked again at every change of the table, so a wait sees each
  // commit as it happens, with no polling.
  void AwaitAny(const std::vector<std::pair<std::string, uint64_t>>& targets,
                const std::atomic<uint64_t>* wake, uint64_t seen,
                absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);
  // Has AwaitAny check its condition now (after `*wake` changed).
  void Nudge() const ABSL_LOCKS_EXCLUDED(mu_);

  // --- Read leases ---
  //
  // A reader that fetched version N's metadata (GetLeased) holds a lease on
  // N until it releases it or retire_grace passes. A replaced version is
  // freed when its last lease ends (at once when it has none); a reader
  // still on it then gets ABORTED and re-reads the new version. Per version the
  // table keeps a count and the latest expiry only: O(1) memory per version
  // however many readers, and a lease never released just expires.

  // Get, with a lease on the version returned for retire_grace.
  absl::StatusOr<TensorMetadataPtr> GetLeased(const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends one lease on `version` of `name` (none held: no effect). The last
  // one on a replaced version makes it due now.
  void ReleaseRead(const std::string& name, uint64_t version)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- Shard ids ---

  // Gives each shard a fresh random id and counts it as referenced. Returns
  // the ticket of a record to Wait for before the ids reach a worker (0:
  // none; random ids need none).
  Ticket ReserveIds(absl::Span<ShardInfo> shards) ABSL_LOCKS_EXCLUDED(mu_);
  // Ids reserved for shards that will not be used after all.
  void ReleaseIds(absl::Span<const ShardInfo> shards) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Create (and put) ---

  // Sets the name aside (ALREADY_EXISTS when taken); the tensor is
  // invisible until FinishCreate.
  // `owner` is the principal creating it: only it may commit a put, and
  // its quota is charged `bytes` (the new shards, every replica) and one
  // name, in the same step: RESOURCE_EXHAUSTED "quota" when over, with
  // nothing reserved.
  absl::Status ReserveName(const std::string& name,
                           const std::string& owner = "", int64_t bytes = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The shards are allocated: a put (`pending`) becomes pending at once and
  // needs no record (returns 0); otherwise the tensor's record is enqueued.
  Ticket CommitCreate(TensorMetadataPtr meta, bool pending)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The record is durable: the tensor becomes ready.
  void FinishCreate(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // The create failed (its shards are freed or were never allocated): the
  // name and the ids of `meta` are forgotten.
  void AbandonCreate(const TensorMetadata& meta) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Commit of a put or update ---
  //
  // Three steps: BeginCommit checks the change and marks the tensor busy;
  // the caller seals the change's shards on their workers (its write grants
  // die there); RecordCommit enqueues the record; FinishCommit publishes.

  // `change` must be the pending put's of `name` (or its staged update's)
  // at `version`: NOT_FOUND, or ABORTED for another change or version (the
  // name was replaced, or another change runs). PERMISSION_DENIED when
  // `principal` is not the change's owner. A change committed already is
  // `done`.
  absl::StatusOr<CommitStart> BeginCommit(const std::string& name,
                                          uint64_t version,
                                          const std::string& principal,
                                          uint64_t change)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The shards are sealed: enqueues the record of the commit BeginCommit
  // started.
  Ticket RecordCommit(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // Ready (an update: published, N's unkept shards retired) when `status`
  // is OK; pending (staged) again otherwise.
  void FinishCommit(const std::string& name, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Gives up the pending put (or staged update) `change` of `name` at
  // `version` and returns the shards it made, now the caller's to free.
  // NOT_FOUND when there is none, ABORTED for another change or version,
  // PERMISSION_DENIED for another principal.
  absl::StatusOr<TensorMetadataPtr> Abandon(const std::string& name,
                                            uint64_t version,
                                            const std::string& principal,
                                            uint64_t change)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- Delete ---

  // Starts deleting a tensor: enqueues its record (0 for a pending tensor,
  // which has none). NOT_FOUND (also when `incarnation`, unless 0, is not
  // the tensor's: it was replaced); ABORTED while a reshard of it runs;
  // PERMISSION_DENIED for a pending put of another principal, unless
  // `admin`.
  absl::StatusOr<Ticket> BeginDelete(const std::string& name,
                                     const std::string& principal = "",
                                     bool admin = true,
                                     uint64_t incarnation = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // When `status` is OK, removes the tensor and returns every version whose
  // shards are now to be freed (current and retired); otherwise the tensor
  // stays and `status` is returned.
  absl::StatusOr<std::vector<TensorMetadataPtr>> FinishDelete(
      const std::string& name, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- Reshard ---

  // Marks a ready tensor as being resharded and returns its current version.
  // NOT_FOUND; ABORTED when a reshard already runs or `expected_version`
  // (0: any) is not current.
  absl::StatusOr<TensorMetadataPtr> BeginReshard(const std::string& name,
                                                 uint64_t expected_version)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Enqueues the record of version N+1; ABORTED when `old_meta` is no longer
  // current.
  absl::StatusOr<Ticket> CommitReshard(const TensorMetadataPtr& old_meta,
                                       TensorMetadataPtr new_meta)
      ABSL_LOCKS_EXCLUDED(mu_);
  // When `status` is OK, publishes `new_meta` and retires `retired` (version
  // N's shards that N+1 does not keep) until N's read leases end. A repair
  // publishes version N again, with new replicas in place of `retired`.
  void FinishReshard(const TensorMetadataPtr& new_meta, TensorMetadata retired,
                     const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // The reshard is over (committed or not).
  void EndReshard(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Update: version N+1 with N's layout, written by its caller ---
  //
  // Begun with BeginReshard (one change of a tensor at a time). Once N+1's
  // new shards are allocated, StageUpdate holds it until its caller's
  // CommitTensor(N+1) (BeginCommit/FinishCommit, which publish it and
  // retire N's shards it does not keep), AbandonUpdate, a delete, or
  // pending_timeout (TakeDue). Readers see N meanwhile.

  // `next` is version N+1; `fresh` holds its shards not taken over from N.
  // `owner`: the principal updating (only it may commit or abandon).
  void StageUpdate(TensorMetadataPtr next, TensorMetadata fresh,
                   const std::string& owner) ABSL_LOCKS_EXCLUDED(mu_);

  // The client of the pending put of `name` (or its staged update) at
  // `version`, change `change`, is alive: the change's pending_lease starts
  // again. NOT_FOUND when no such change is pending (committed, abandoned,
  // given up); PERMISSION_DENIED for another principal's.
  absl::Status KeepPending(const std::string& name, uint64_t version,
                           uint64_t change, const std::string& principal)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- Quotas (core/quota.h) ---
  //
  // A tensor's bytes count against its owner: every replica of its current
  // version, a staged update's new shards, the replaced shards not freed
  // yet, and what a change in progress was admitted for (ReserveName,
  // Charge) until its shards are in the table. Use is always summed from
  // the table itself, so it cannot drift from the metadata (after a
  // recovery or a promotion too).

  // The limits admissions are checked against from now on (null: none).
  void SetQuotas(std::shared_ptr<const QuotaTable> quotas)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<const QuotaTable> quotas() const ABSL_LOCKS_EXCLUDED(mu_);
  // What every owner holds now (owners of nothing are absent).
  std::map<std::string, QuotaUse> Usage() const ABSL_LOCKS_EXCLUDED(mu_);
  // Admits `bytes` of new shards for the change of `name` begun with
  // BeginReshard (a new layout, more replicas, an update), counted against
  // the tensor's owner until the change ends. RESOURCE_EXHAUSTED "quota"
  // (`what` names the change) when that would pass its limit.
  absl::Status Charge(const std::string& name, int64_t bytes,
                      absl::string_view what) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Background ---

  // Takes the retired versions whose grace is over and the puts abandoned
  // for longer than pending_timeout; their shards are unreferenced now and
  // are the caller's to free.
  std::vector<TensorMetadataPtr> TakeDue() ABSL_LOCKS_EXCLUDED(mu_);

  // --- Workers ---

  // A worker registered holding `held`: marks the shards of every tensor
  // version placed on it as lost or found, and returns what it holds that
  // nothing references.
  // The ids among `held` (with the worker's ShardIdentity of each, in
  // order) that a tensor places on `worker` as something else: another
  // tensor, incarnation or box (core/shard_record.h).
  std::vector<uint64_t> Misidentified(
      const std::string& worker, absl::Span<const uint64_t> held,
      absl::Span<const uint64_t> identities) const ABSL_LOCKS_EXCLUDED(mu_);
  Reconciliation Reconcile(const std::string& worker,
                           absl::Span<const uint64_t> held)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whether any shard is marked lost (a worker came back without it).
  bool HasLost() const ABSL_LOCKS_EXCLUDED(mu_);

  // For tests: is `id` counted as referenced / lost?
  bool IsReferenced(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  bool IsLost(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  size_t NumRetired() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class State {
    kCreating,    // name reserved, shards being allocated; invisible
    kCommitting,  // create's record in flight; invisible
    kPending,     // a put: shards allocated, waiting for CommitTensor
    kReady,       // visible
  };
  struct Entry {
    State state = State::kCreating;
    // A record of this tensor is in flight (or a delete is finishing):
    // other changes wait.
    bool busy = false;
    bool resharding = false;
    absl::Time created;  // for reaping abandoned puts
    absl::Time kept;     // a put's last sign of its client (KeepPending)
    std::string owner;   // the principal that created it
    // Null while kCreating; immutable once set.
    TensorMetadataPtr meta;
    // An update staged for its caller's commit (null: none), its shards
    // not taken over from `meta`, its owner and when it was staged.
    TensorMetadataPtr update;
    TensorMetadataPtr update_fresh;
    std::string update_owner;
    absl::Time update_staged;
    absl::Time update_kept;
    // Bytes admitted for shards being allocated that are not in `meta` or
    // `update_fresh` yet (ReserveName, Charge).
    int64_t charged = 0;
  };
  struct Retirement {
    absl::Time due;
    std::string name;
    uint64_t version = 0;
    TensorMetadataPtr shards;  // only the shards to free
    // The version was replaced (a reshard, an update): its leases go with
    // it. A repair retires replicas of the current version, whose leases
    // stay.
    bool version_replaced = true;
  };
  // The read leases on one version of one tensor.
  struct Leases {
    int64_t count = 0;
    absl::Time expiry = absl::InfinitePast();  // of the latest one
  };
  using VersionKey = std::pair<std::string, uint64_t>;

  // ABORTED: `name` has a change in progress, saying which.
  absl::Status Busy(const std::string& name, const Entry& entry) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (releasing mu_) until `name` is absent or not busy; returns it or
  // null.
  Entry* WaitIdle(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // WaitIdle for a tensor whose creation is done: NotFoundError("tensor",
  // name) when it is absent or still being created.
  absl::StatusOr<Entry*> WaitIdleCreated(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ids of every replica of `meta` are no longer referenced, or lost.
  void Unreference(const TensorMetadata& meta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unlose(const TensorMetadata& meta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Retires `shards` of version `version` of `name`: due when its read
  // leases end (now when none is live).
  void Retire(const std::string& name, uint64_t version, TensorMetadata shards)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the leases of every version of `name`.
  void ForgetLeases(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes `entry` holds for its owner (see Quotas), retirements aside.
  static int64_t EntryBytes(const Entry& entry);
  // What each owner holds (`only`: that owner alone): its entries and
  // their retirements. The one sum behind UseOf and Usage.
  std::map<std::string, QuotaUse> UsageOf(const std::string* only) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  QuotaUse UseOf(const std::string& owner) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `entry`'s staged update, returning its new shards (still
  // referenced) and ending the change.
  static TensorMetadataPtr DropUpdate(Entry* entry);

  const Options options_;
  MetadataLog* const log_;

  // Invariants: a kCommitting/kPending/kReady entry has meta != nullptr and
  // its name is meta->name; a kCommitting entry is busy; every shard id of
  // every entry, staged update and retirement is in referenced_ (plus ids
  // reserved for allocations in progress).
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> tensors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> referenced_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> lost_ ABSL_GUARDED_BY(mu_);
  std::vector<Retirement> retirements_ ABSL_GUARDED_BY(mu_);
  std::map<VersionKey, Leases> leases_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const QuotaTable> quotas_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_TENSOR_TABLE_H_
