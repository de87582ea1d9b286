#include "coordinator/tensor_table.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/capability.h"
#include "core/errors.h"
#include "core/shard_record.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {

TensorTable::TensorTable(Options options, MetadataLog* log)
    : options_(std::move(options)), log_(log) {}

void TensorTable::Restore(const MetadataState& state) {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, meta] : state.tensors) {
    for (const ShardInfo& shard : meta->shards) {
      for (const Replica& replica : shard.replicas)
        referenced_.insert(replica.shard_id);
    }
    Entry& entry = tensors_[name];
    entry.state = State::kReady;
    entry.owner = meta->owner;
    entry.meta = meta;
  }
}

namespace {

// "by 'ann' " (nothing without tokens) "pending since 2026-11-26 10:00:00
// UTC (5m3s ago)".
std::string PendingSince(const std::string& owner, absl::Time since,
                         absl::Time now) {
  return absl::StrCat(
      owner.empty() ? "" : absl::StrCat("by '", owner, "' "), "pending since ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", since, absl::UTCTimeZone()),
      " (", absl::FormatDuration(absl::Trunc(now - since, absl::Seconds(1))),
      " ago)");
}

}  // namespace

absl::StatusOr<TensorMetadataPtr> TensorTable::Get(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it != tensors_.end() && it->second.state == State::kPending) {
    return absl::NotFoundError(absl::StrCat(
        "tensor '", name, "' not found: a put of it is ",
        PendingSince(it->second.owner, it->second.created, options_.clock()),
        ", not committed yet"));
  }
  if (it == tensors_.end() || it->second.state != State::kReady) {
    return NotFoundError("tensor", name);
  }
  return it->second.meta;
}

void TensorTable::AwaitAny(
    const std::vector<std::pair<std::string, uint64_t>>& targets,
    const std::atomic<uint64_t>* wake, uint64_t seen,
    absl::Time deadline) const {
  struct Args {
    const TensorTable* table;
    const std::vector<std::pair<std::string, uint64_t>>* targets;
    const std::atomic<uint64_t>* wake;
    uint64_t seen;
  } args{this, &targets, wake, seen};
  // Evaluated by the mutex, with it held, after every change.
  const absl::Condition met(
      +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (a->wake->load() != a->seen) return true;
        for (const auto& [name, least] : *a->targets) {
          auto it = a->table->tensors_.find(name);
          if (it == a->table->tensors_.end()) return true;
          const Entry& entry = it->second;
          if (entry.state == State::kReady && entry.meta != nullptr &&
              entry.meta->version >= least) {
            return true;
          }
        }
        return false;
      },
      &args);
  mu_.LockWhenWithDeadline(met, deadline);
  mu_.Unlock();
}

void TensorTable::Nudge() const { absl::MutexLock lock(&mu_); }

std::vector<TensorSummary> TensorTable::List(bool all) const {
  absl::MutexLock lock(&mu_);
  std::vector<TensorSummary> out;
  for (const auto& [name, entry] : tensors_) {
    const bool pending_put = entry.state == State::kPending;
    if (entry.state != State::kReady && !(all && pending_put)) continue;
    TensorSummary summary;
    summary.name = name;
    summary.shape = entry.meta->shape;
    summary.dtype = entry.meta->dtype;
    summary.version = entry.meta->version;
    summary.num_shards = static_cast<int64_t>(entry.meta->shards.size());
    summary.replicas = ReplicaCount(*entry.meta);
    summary.mirror = entry.meta->mirror;
    if (all && pending_put) {
      summary.pending = TensorSummary::Pending::kPut;
      summary.pending_version = entry.meta->version;
      summary.pending_owner = entry.owner;
      summary.pending_since = entry.created;
    } else if (all && entry.update != nullptr) {
      summary.pending = TensorSummary::Pending::kUpdate;
      summary.pending_version = entry.update->version;
      summary.pending_owner = entry.update_owner;
      summary.pending_since = entry.update_staged;
    }
    out.push_back(std::move(summary));
  }
  return out;
}

std::string TensorTable::PendingNote(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return "";
  const Entry& entry = it->second;
  const absl::Time now = options_.clock();
  if (entry.state == State::kPending) {
    return absl::StrCat("a put ",
                        PendingSince(entry.owner, entry.created, now));
  }
  if (entry.update != nullptr) {
    return absl::StrCat(
        "an update to version ", entry.update->version, " ",
        PendingSince(entry.update_owner, entry.update_staged, now));
  }
  return "";
}

absl::Status TensorTable::Busy(const std::string& name,
                               const Entry& entry) const {
  if (entry.update != nullptr) {
    return absl::AbortedError(absl::StrCat(
        "tensor '", name, "' has an update to version ", entry.update->version,
        " ",
        PendingSince(entry.update_owner, entry.update_staged, options_.clock()),
        ": its client commits or abandons it (else it is abandoned when "
        "its client stops keeping it, or ",
        absl::FormatDuration(options_.pending_timeout),
        " after it began, the coordinator's --pending_timeout)"));
  }
  return absl::AbortedError(
      absl::StrCat("a reshard of tensor '", name, "' is already in progress"));
}

void TensorTable::MarkLost(TensorMetadata* meta) const {
  absl::MutexLock lock(&mu_);
  if (lost_.empty()) return;
  for (ShardInfo& shard : meta->shards) {
    for (Replica& replica : shard.replicas) {
      if (lost_.contains(replica.shard_id)) replica.available = false;
    }
  }
}

void TensorTable::AddLost(absl::Span<const uint64_t> ids) {
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) lost_.insert(id);
}

TensorTable::Ticket TensorTable::ReserveIds(absl::Span<ShardInfo> shards) {
  // Random, so a caller cannot guess another tensor's shards (and an id
  // from before a crash is not handed out again); never one in use. Drawn
  // at once and outside the lock: readers never wait on the CSPRNG.
  // One id per replica: each worker holds its copy under its own id.
  size_t count = 0;
  for (const ShardInfo& shard : shards) count += shard.replicas.size();
  const std::vector<uint64_t> drawn = RandomIds(count);
  absl::MutexLock lock(&mu_);
  size_t next = 0;
  for (ShardInfo& shard : shards) {
    for (Replica& replica : shard.replicas) {
      replica.shard_id = drawn[next++];
      while (!referenced_.insert(replica.shard_id).second) {
        replica.shard_id = RandomId();
      }
    }
  }
  return 0;
}

void TensorTable::ReleaseIds(absl::Span<const ShardInfo> shards) {
  absl::MutexLock lock(&mu_);
  for (const ShardInfo& shard : shards) {
    for (const Replica& replica : shard.replicas)
      referenced_.erase(replica.shard_id);
  }
}

absl::Status TensorTable::ReserveName(const std::string& name,
                                      const std::string& owner, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (quotas_ != nullptr && tensors_.count(name) == 0) {
    TESSERA_RETURN_IF_ERROR(CheckQuota(owner, UseOf(owner), QuotaUse{bytes, 1},
                                       quotas_->For(owner),
                                       absl::StrCat("creating '", name, "'")));
  }
  auto [it, inserted] = tensors_.try_emplace(name);
  if (!inserted && it->second.state == State::kPending) {
    // Invisible to `ls`: say what holds the name, and until when.
    return absl::AlreadyExistsError(absl::StrCat(
        "tensor '", name, "' already exists as a put ",
        PendingSince(it->second.owner, it->second.created, options_.clock()),
        ", not committed yet (`ls --all` shows it; it ends when its client "
        "commits or abandons it, or stops keeping it",
        options_.pending_lease == absl::InfiniteDuration()
            ? std::string()
            : absl::StrCat(" for ",
                           absl::FormatDuration(options_.pending_lease)),
        ")"));
  }
  if (!inserted) return AlreadyExistsError("tensor", name);
  it->second.state = State::kCreating;
  it->second.created = options_.clock();
  it->second.kept = it->second.created;
  it->second.owner = owner;
  it->second.charged = bytes;
  return absl::OkStatus();
}

TensorTable::Ticket TensorTable::CommitCreate(TensorMetadataPtr meta,
                                              bool pending) {
  absl::MutexLock lock(&mu_);
  Entry& entry = tensors_.at(meta->name);
  entry.charged = 0;  // its shards are in `meta` now
  if (pending) {
    entry.state = State::kPending;
    // Its lease starts with the reply: allocating may have taken long.
    entry.kept = options_.clock();
    entry.meta = std::move(meta);
    return 0;
  }
  entry.state = State::kCommitting;
  entry.busy = true;
  entry.meta = meta;
  return log_->Enqueue(MetadataChange::Tensor(std::move(meta)));
}

void TensorTable::FinishCreate(const std::string& name) {
  absl::MutexLock lock(&mu_);
  Entry& entry = tensors_.at(name);
  entry.state = State::kReady;
  entry.busy = false;
}

void TensorTable::AbandonCreate(const TensorMetadata& meta) {
  absl::MutexLock lock(&mu_);
  Unreference(meta);
  tensors_.erase(meta.name);
}

absl::StatusOr<CommitStart> TensorTable::BeginCommit(
    const std::string& name, uint64_t version, const std::string& principal,
    uint64_t change) {
  absl::MutexLock lock(&mu_);
  TESSERA_ASSIGN_OR_RETURN(Entry* const entry, WaitIdleCreated(name));
  const auto replaced = [&] {
    return absl::AbortedError(absl::StrCat(
        "tensor '", name,
        "' has no put or update of this client pending at "
        "version ",
        version,
        ": it was replaced, abandoned, or given up after "
        "the coordinator's --pending_timeout (nothing was committed)"));
  };
  // Starts the commit of the change `owner` made (`doing`: "put" or
  // "updated"); only `owner` may commit it.
  const auto start =
      [&](const std::string& owner, absl::string_view doing,
          const TensorMetadataPtr& seal,
          const TensorMetadataPtr& before) -> absl::StatusOr<CommitStart> {
    if (owner != principal) {
      return absl::PermissionDeniedError(
          absl::StrCat("tensor '", name, "' is being ", doing,
                       " by another principal; only it may commit"));
    }
    entry->busy = true;
    return CommitStart{false, seal, before};
  };
  if (entry->state == State::kPending) {
    if (change == 0 || entry->meta->change != change ||
        entry->meta->version != version) {
      return replaced();
    }
    return start(entry->owner, "put", entry->meta, nullptr);
  }
  if (entry->update != nullptr && entry->update->version == version &&
      change != 0 && entry->update->change == change) {
    return start(entry->update_owner, "updated", entry->update_fresh,
                 entry->meta);
  }
  // Committed already: a commit tried again after its reply was lost.
  if (change != 0 && entry->meta->change == change &&
      entry->meta->version == version) {
    return CommitStart{true, nullptr};
  }
  return replaced();
}

TensorTable::Ticket TensorTable::RecordCommit(const std::string& name) {
  absl::MutexLock lock(&mu_);
  Entry& entry = tensors_.at(name);
  return log_->Enqueue(MetadataChange::Tensor(
      entry.state == State::kPending ? entry.meta : entry.update));
}

absl::StatusOr<TensorMetadataPtr> TensorTable::Abandon(
    const std::string& name, uint64_t version, const std::string& principal,
    uint64_t change) {
  absl::MutexLock lock(&mu_);
  TESSERA_ASSIGN_OR_RETURN(Entry* const entry, WaitIdleCreated(name));
  const TensorMetadataPtr& made =
      entry->state == State::kPending ? entry->meta : entry->update;
  if (made == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", name, "' has no put or update in progress"));
  }
  if (change == 0 || made->change != change || made->version != version) {
    return absl::AbortedError(absl::StrCat(
        "the put or update of tensor '", name, "' in progress is not this ",
        "client's (version ", made->version, "): it is left alone"));
  }
  const std::string& owner =
      entry->state == State::kPending ? entry->owner : entry->update_owner;
  if (owner != principal) {
    return absl::PermissionDeniedError(absl::StrCat(
        "tensor '", name, "' is being changed by another principal"));
  }
  TensorMetadataPtr shards;
  if (entry->state == State::kPending) {
    shards = entry->meta;
    tensors_.erase(name);
  } else {
    shards = DropUpdate(entry);
  }
  Unreference(*shards);
  Unlose(*shards);
  return shards;
}

void TensorTable::FinishCommit(const std::string& name,
                               const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  Entry& entry = tensors_.at(name);
  entry.busy = false;
  if (!status.ok()) return;
  if (entry.state == State::kReady && entry.update != nullptr) {
    // N+1 is current; N's shards it does not keep wait out their grace.
    absl::flat_hash_set<uint64_t> kept;
    for (const ShardInfo& shard : entry.update->shards) {
      for (const Replica& replica : shard.replicas)
        kept.insert(replica.shard_id);
    }
    TensorMetadata retired = *entry.meta;
    retired.shards.clear();
    for (const ShardInfo& shard : entry.meta->shards) {
      ShardInfo gone;
      for (const Replica& replica : shard.replicas) {
        if (!kept.contains(replica.shard_id)) gone.replicas.push_back(replica);
      }
      if (gone.replicas.empty()) continue;
      gone.box = shard.box;
      retired.shards.push_back(std::move(gone));
    }
    const uint64_t old_version = entry.meta->version;
    entry.meta = entry.update;
    DropUpdate(&entry);
    Retire(name, old_version, std::move(retired));
    return;
  }
  entry.state = State::kReady;
}

absl::StatusOr<TensorMetadataPtr> TensorTable::GetLeased(
    const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end() || it->second.state != State::kReady) {
    return NotFoundError("tensor", name);
  }
  const TensorMetadataPtr& meta = it->second.meta;
  const absl::Time now = options_.clock();
  Leases& leases = leases_[{name, meta->version}];
  if (leases.expiry <= now) leases.count = 0;  // every earlier one expired
  ++leases.count;
  leases.expiry = now + options_.retire_grace;
  return meta;
}

void TensorTable::ReleaseRead(const std::string& name, uint64_t version) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find({name, version});
  if (it == leases_.end() || it->second.count == 0) return;
  if (--it->second.count > 0) return;
  it->second.expiry = absl::InfinitePast();
  // The last reader of a replaced version is done: free it now.
  const absl::Time now = options_.clock();
  for (Retirement& r : retirements_) {
    if (r.name == name && r.version == version) r.due = std::min(r.due, now);
  }
}

void TensorTable::Retire(const std::string& name, uint64_t version,
                         TensorMetadata shards) {
  const absl::Time now = options_.clock();
  absl::Time due = now;
  auto it = leases_.find({name, version});
  if (it != leases_.end() && it->second.count > 0 && it->second.expiry > now)
    due = it->second.expiry;
  auto current = tensors_.find(name);
  const bool replaced = current == tensors_.end() ||
                        current->second.meta == nullptr ||
                        current->second.meta->version != version;
  if (shards.shards.empty()) {
    if (replaced) leases_.erase({name, version});
    return;
  }
  retirements_.push_back(
      {due, name, version,
       std::make_shared<const TensorMetadata>(std::move(shards)), replaced});
}

void TensorTable::ForgetLeases(const std::string& name) {
  auto it = leases_.lower_bound({name, 0});
  while (it != leases_.end() && it->first.first == name) it = leases_.erase(it);
}

void TensorTable::StageUpdate(TensorMetadataPtr next, TensorMetadata fresh,
                              const std::string& owner) {
  absl::MutexLock lock(&mu_);
  // The resharding flag blocks other changes and deletes, so the entry is
  // still the one BeginReshard marked.
  Entry& entry = tensors_.at(next->name);
  entry.update = std::move(next);
  entry.update_fresh = std::make_shared<const TensorMetadata>(std::move(fresh));
  entry.update_owner = owner;
  entry.update_staged = options_.clock();
  entry.update_kept = entry.update_staged;
  entry.charged = 0;  // its new shards are in `update_fresh` now
}

TensorMetadataPtr TensorTable::DropUpdate(Entry* entry) {
  TensorMetadataPtr fresh = std::move(entry->update_fresh);
  entry->update = nullptr;
  entry->update_fresh = nullptr;
  entry->update_owner.clear();
  entry->resharding = false;
  return fresh;
}

absl::StatusOr<TensorTable::Ticket> TensorTable::BeginDelete(
    const std::string& name, const std::string& principal, bool admin,
    uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  TESSERA_ASSIGN_OR_RETURN(Entry* const entry, WaitIdleCreated(name));
  if (incarnation != 0 && entry->meta->incarnation != incarnation) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", name,
                     "' not found: it was replaced by another of its "
                     "name"));
  }
  // Another principal's put in progress is theirs to finish or abandon.
  if (entry->state == State::kPending && entry->owner != principal && !admin) {
    return absl::PermissionDeniedError(absl::StrCat(
        "permission denied: tensor '", name,
        "' is being put by another "
        "principal (",
        PendingSince(entry->owner, entry->created, options_.clock()), ")"));
  }
  // A staged update's caller may be gone: a delete takes it along.
  if (entry->resharding && entry->update == nullptr) {
    return absl::AbortedError(absl::StrCat(
        "tensor '", name,
        "' is being resharded; delete it once the reshard finishes"));
  }
  entry->busy = true;
  if (entry->state == State::kPending) return 0;  // a put has no record yet
  return log_->Enqueue(MetadataChange::DeletedTensor(name));
}

absl::StatusOr<std::vector<TensorMetadataPtr>> TensorTable::FinishDelete(
    const std::string& name, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  it->second.busy = false;
  if (!status.ok()) return status;
  std::vector<TensorMetadataPtr> out;
  out.push_back(it->second.meta);
  if (it->second.update != nullptr) out.push_back(DropUpdate(&it->second));
  tensors_.erase(it);
  // Replaced versions waiting out their grace period go now too.
  auto first_retired =
      std::partition(retirements_.begin(), retirements_.end(),
                     [&](const Retirement& r) { return r.name != name; });
  for (auto r = first_retired; r != retirements_.end(); ++r)
    out.push_back(std::move(r->shards));
  retirements_.erase(first_retired, retirements_.end());
  ForgetLeases(name);
  for (const TensorMetadataPtr& meta : out) {
    Unreference(*meta);
    Unlose(*meta);
  }
  return out;
}

absl::StatusOr<TensorMetadataPtr> TensorTable::BeginReshard(
    const std::string& name, uint64_t expected_version) {
  absl::MutexLock lock(&mu_);
  Entry* entry = WaitIdle(name);
  if (entry == nullptr || entry->state != State::kReady) {
    return NotFoundError("tensor", name);
  }
  if (entry->resharding) return Busy(name, *entry);
  if (expected_version != 0 && entry->meta->version != expected_version) {
    return absl::AbortedError(absl::StrCat("tensor '", name, "' is at version ",
                                           entry->meta->version, ", not ",
                                           expected_version));
  }
  entry->resharding = true;
  return entry->meta;
}

absl::StatusOr<TensorTable::Ticket> TensorTable::CommitReshard(
    const TensorMetadataPtr& old_meta, TensorMetadataPtr new_meta) {
  absl::MutexLock lock(&mu_);
  Entry* entry = WaitIdle(old_meta->name);
  // The resharding flag blocks deletes, so the entry is still ours.
  if (entry == nullptr || entry->meta != old_meta) {
    return absl::AbortedError(absl::StrCat("tensor '", old_meta->name,
                                           "' changed during the reshard"));
  }
  entry->busy = true;
  return log_->Enqueue(MetadataChange::Tensor(std::move(new_meta)));
}

void TensorTable::FinishReshard(const TensorMetadataPtr& new_meta,
                                TensorMetadata retired,
                                const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  Entry& entry = tensors_.at(new_meta->name);
  entry.busy = false;
  if (!status.ok()) return;
  entry.charged = 0;  // the new shards are in `meta` now
  const uint64_t old_version = entry.meta->version;
  entry.meta = new_meta;
  Retire(new_meta->name, old_version, std::move(retired));
}

void TensorTable::EndReshard(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return;
  it->second.resharding = false;
  it->second.charged = 0;  // committed, or its new shards are freed
}

void TensorTable::SetQuotas(std::shared_ptr<const QuotaTable> quotas) {
  absl::MutexLock lock(&mu_);
  quotas_ = std::move(quotas);
}

std::shared_ptr<const QuotaTable> TensorTable::quotas() const {
  absl::MutexLock lock(&mu_);
  return quotas_;
}

int64_t TensorTable::EntryBytes(const Entry& entry) {
  int64_t bytes = entry.charged;
  if (entry.meta != nullptr) bytes += HeldBytes(*entry.meta);
  if (entry.update_fresh != nullptr) bytes += HeldBytes(*entry.update_fresh);
  return bytes;
}

std::map<std::string, QuotaUse> TensorTable::UsageOf(
    const std::string* only) const {
  std::map<std::string, QuotaUse> out;
  for (const auto& [name, entry] : tensors_) {
    if (only != nullptr && entry.owner != *only) continue;
    QuotaUse& use = out[entry.owner];
    use.bytes += EntryBytes(entry);
    ++use.names;
  }
  for (const Retirement& r : retirements_) {
    auto it = tensors_.find(r.name);
    if (it == tensors_.end()) continue;
    if (only != nullptr && it->second.owner != *only) continue;
    out[it->second.owner].bytes += HeldBytes(*r.shards);
  }
  return out;
}

QuotaUse TensorTable::UseOf(const std::string& owner) const {
  std::map<std::string, QuotaUse> use = UsageOf(&owner);
  return use.empty() ? QuotaUse{} : use.begin()->second;
}

std::map<std::string, QuotaUse> TensorTable::Usage() const {
  absl::MutexLock lock(&mu_);
  return UsageOf(nullptr);
}

absl::Status TensorTable::Charge(const std::string& name, int64_t bytes,
                                 absl::string_view what) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return NotFoundError("tensor", name);
  Entry& entry = it->second;
  if (quotas_ != nullptr) {
    TESSERA_RETURN_IF_ERROR(CheckQuota(entry.owner, UseOf(entry.owner),
                                       QuotaUse{bytes, 0},
                                       quotas_->For(entry.owner), what));
  }
  entry.charged += bytes;
  return absl::OkStatus();
}

absl::Status TensorTable::KeepPending(const std::string& name, uint64_t version,
                                      uint64_t change,
                                      const std::string& principal) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  Entry* entry = it == tensors_.end() ? nullptr : &it->second;
  if (entry != nullptr && entry->state == State::kPending &&
      entry->meta->version == version && entry->meta->change == change) {
    if (entry->owner != principal) {
      return absl::PermissionDeniedError(absl::StrCat(
          "tensor '", name, "' is being put by another principal"));
    }
    entry->kept = options_.clock();
    return absl::OkStatus();
  }
  if (entry != nullptr && entry->update != nullptr &&
      entry->update->version == version && entry->update->change == change) {
    if (entry->update_owner != principal) {
      return absl::PermissionDeniedError(absl::StrCat(
          "tensor '", name, "' is being updated by another principal"));
    }
    entry->update_kept = options_.clock();
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat(
      "tensor '", name, "' has no put or update pending at version ", version,
      " of that change: it was committed, abandoned or given up"));
}

std::vector<TensorMetadataPtr> TensorTable::TakeDue() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  std::vector<TensorMetadataPtr> due;
  auto first_due =
      std::partition(retirements_.begin(), retirements_.end(),
                     [&](const Retirement& r) { return r.due > now; });
  for (auto r = first_due; r != retirements_.end(); ++r) {
    if (r->version_replaced) leases_.erase({r->name, r->version});
    due.push_back(std::move(r->shards));
  }
  retirements_.erase(first_due, retirements_.end());
  // Puts and updates whose client never committed are abandoned.
  for (auto it = tensors_.begin(); it != tensors_.end();) {
    Entry& entry = it->second;
    if (entry.update != nullptr && !entry.busy &&
        (now - entry.update_staged > options_.pending_timeout ||
         now - entry.update_kept > options_.pending_lease)) {
      spdlog::warn(
          "abandoning the update of tensor '{}' to version {}: it "
          "was never committed ({})",
          it->first, entry.update->version,
          now - entry.update_kept > options_.pending_lease
              ? "its client stopped keeping it"
              : "--pending_timeout");
      due.push_back(DropUpdate(&entry));
    }
    if (entry.state == State::kPending && !entry.busy &&
        (now - entry.created > options_.pending_timeout ||
         now - entry.kept > options_.pending_lease)) {
      spdlog::warn("removing tensor '{}': its put was never completed ({})",
                   it->first,
                   now - entry.kept > options_.pending_lease
                       ? "its client stopped keeping it"
                       : "--pending_timeout");
      due.push_back(entry.meta);
      it = tensors_.erase(it);
    } else {
      ++it;
    }
  }
  for (const TensorMetadataPtr& meta : due) {
    Unreference(*meta);
    Unlose(*meta);
  }
  return due;
}

std::vector<uint64_t> TensorTable::Misidentified(
    const std::string& worker, absl::Span<const uint64_t> held,
    absl::Span<const uint64_t> identities) const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<uint64_t, uint64_t> placed;
  auto collect = [&](const TensorMetadata& meta) {
    for (const ShardInfo& shard : meta.shards) {
      for (const Replica& replica : shard.replicas) {
        if (replica.worker == worker) {
          placed[replica.shard_id] =
              ShardIdentity(meta.name, meta.incarnation, shard.box);
        }
      }
    }
  };
  for (const auto& [name, entry] : tensors_) {
    if (entry.meta != nullptr) collect(*entry.meta);
    if (entry.update_fresh != nullptr) collect(*entry.update_fresh);
  }
  std::vector<uint64_t> out;
  for (size_t i = 0; i < held.size() && i < identities.size(); ++i) {
    auto it = placed.find(held[i]);
    if (it != placed.end() && it->second != identities[i]) {
      out.push_back(held[i]);
    }
  }
  return out;
}

Reconciliation TensorTable::Reconcile(const std::string& worker,
                                      absl::Span<const uint64_t> held) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> expected;
  auto collect = [&](const TensorMetadata& meta) {
    for (const ShardInfo& shard : meta.shards) {
      for (const Replica& replica : shard.replicas) {
        if (replica.worker == worker) expected.push_back(replica.shard_id);
      }
    }
  };
  for (const auto& [name, entry] : tensors_) {
    if (entry.meta != nullptr) collect(*entry.meta);
    if (entry.update_fresh != nullptr) collect(*entry.update_fresh);
  }
  for (const Retirement& r : retirements_) collect(*r.shards);
  Reconciliation result = ReconcileShards(expected, held, [this](uint64_t id) {
    mu_.AssertHeld();
    return referenced_.contains(id);
  });
  for (uint64_t id : result.lost) lost_.insert(id);
  for (uint64_t id : result.found) lost_.erase(id);
  return result;
}

bool TensorTable::IsReferenced(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  return referenced_.contains(id);
}

bool TensorTable::HasLost() const {
  absl::MutexLock lock(&mu_);
  return !lost_.empty();
}

bool TensorTable::IsLost(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  return lost_.contains(id);
}

size_t TensorTable::NumRetired() const {
  absl::MutexLock lock(&mu_);
  return retirements_.size();
}

TensorTable::Entry* TensorTable::WaitIdle(const std::string& name) {
  auto idle = [this, &name]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = tensors_.find(name);
    return it == tensors_.end() || !it->second.busy;
  };
  mu_.Await(absl::Condition(&idle));
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<TensorTable::Entry*> TensorTable::WaitIdleCreated(
    const std::string& name) {
  Entry* entry = WaitIdle(name);
  if (entry == nullptr || entry->state == State::kCreating) {
    return NotFoundError("tensor", name);
  }
  return entry;
}

void TensorTable::Unreference(const TensorMetadata& meta) {
  for (const ShardInfo& shard : meta.shards) {
    for (const Replica& replica : shard.replicas)
      referenced_.erase(replica.shard_id);
  }
}

void TensorTable::Unlose(const TensorMetadata& meta) {
  if (lost_.empty()) return;
  for (const ShardInfo& shard : meta.shards) {
    for (const Replica& replica : shard.replicas) lost_.erase(replica.shard_id);
  }
}

}  // namespace tessera
