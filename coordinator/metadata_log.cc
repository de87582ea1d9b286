#include "coordinator/metadata_log.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {

MetadataLog::MetadataLog(MetadataStore* store, Options options)
    : store_(store), options_(options) {
  writer_ = std::thread([this] { WriterLoop(); });
}

MetadataLog::~MetadataLog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  writer_.join();
}

absl::StatusOr<MetadataState> MetadataLog::Recover() {
  TESSERA_ASSIGN_OR_RETURN(MetadataState state, store_->Load());
  for (const auto& [name, tensor] : state.tensors) {
    for (const ShardInfo& shard : tensor->shards) {
      for (const Replica& replica : shard.replicas) {
        state.shard_id_high_water =
            std::max(state.shard_id_high_water, replica.shard_id + 1);
      }
    }
  }
  state.shard_id_high_water = std::max<uint64_t>(state.shard_id_high_water, 1);
  {
    absl::MutexLock lock(&mirror_mu_);
    mirror_ = state;
  }
  // Start the log afresh from one snapshot of what was recovered; but not
  // when the snapshot alone holds it (a start that changes nothing writes
  // nothing), and not at the price of the start: the log still holds every
  // record when the snapshot fails (a full disk), and the writer tries
  // again after `snapshot_every` records.
  if (!store_->ReplaysRecords()) return state;
  absl::Status status = store_->Snapshot(state);
  if (absl::IsFailedPrecondition(status) || absl::IsDataLoss(status)) {
    return Annotate(status, "writing the recovered metadata");
  }
  if (!status.ok()) {
    spdlog::warn(
        "metadata snapshot at start failed, going on from the log, which "
        "holds every record: {}",
        std::string(status.message()));
  }
  return state;
}

MetadataLog::Ticket MetadataLog::Enqueue(MetadataChange change) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(change));
  return next_ticket_++;
}

absl::Status MetadataLog::Wait(Ticket ticket) const {
  if (ticket == 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto done = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done_through_ >= ticket;
  };
  mu_.Await(absl::Condition(&done));
  return OutcomeOf(ticket);
}

bool MetadataLog::Failed(Ticket ticket) const {
  if (ticket == 0) return false;
  absl::MutexLock lock(&mu_);
  return done_through_ >= ticket && !OutcomeOf(ticket).ok();
}

absl::Status MetadataLog::OutcomeOf(Ticket ticket) const {
  // The first failure that ends at or after `ticket`.
  auto it =
      std::lower_bound(failures_.begin(), failures_.end(), ticket,
                       [](const Failure& f, Ticket t) { return f.last < t; });
  if (it != failures_.end() && it->first <= ticket) return it->status;
  return absl::OkStatus();
}

absl::Status MetadataLog::Append(MetadataChange change) {
  return Wait(Enqueue(std::move(change)));
}

MetadataState MetadataLog::DurableState() const {
  absl::MutexLock lock(&mirror_mu_);
  return mirror_;
}

MetadataLog::Stats MetadataLog::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void MetadataLog::WriterLoop() {
  while (true) {
    std::vector<MetadataChange> batch;
    Ticket first = 0;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &MetadataLog::HasWork));
      if (queue_.empty()) return;  // stopping, and everything is written
      size_t shards = 0;
      while (!queue_.empty() && batch.size() < options_.max_batch_records) {
        const MetadataChange& next = queue_.front();
        const size_t weight = next.kind == MetadataChange::Kind::kTensor
                                  ? next.tensor->shards.size()
                                  : 0;
        if (!batch.empty() && shards + weight > options_.max_batch_shards)
          break;
        shards += weight;
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      first = next_to_write_;
      next_to_write_ += batch.size();
    }
    const Ticket last = first + batch.size() - 1;

    const absl::Time append_start = absl::Now();
    absl::Status status = store_->Append(batch);
    if (options_.metrics != nullptr) {
      options_.metrics
          ->Histogram("tessera_metadata_append_seconds",
                      "Time to append one batch of metadata records and make "
                      "it durable (one fsync for the file store).")
          ->Observe(absl::ToDoubleSeconds(absl::Now() - append_start));
    }
    if (status.ok()) {
      absl::MutexLock lock(&mirror_mu_);
      for (const MetadataChange& change : batch) mirror_.Apply(change);
    } else {
      spdlog::error("writing {} metadata record(s) failed: {}", batch.size(),
                    std::string(status.message()));
      if (absl::IsDataLoss(status)) {
        if (options_.on_unknown_outcome) {
          options_.on_unknown_outcome(status);
        } else {
          spdlog::critical(
              "stopping: whether {} metadata record(s) are durable is "
              "unknown, so their changes can be neither kept nor undone; "
              "the next start recovers from --data_dir",
              batch.size());
          spdlog::shutdown();
          std::abort();
        }
      }
    }
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok()) {
        status = Annotate(status, "recording metadata");
        if (!failures_.empty() && failures_.back().last + 1 == first &&
            failures_.back().status == status) {
          failures_.back().last = last;
        } else {
          failures_.push_back({first, last, status});
        }
        ++stats_.failed_batches;
      } else {
        stats_.records += static_cast<int64_t>(batch.size());
      }
      ++stats_.batches;
      done_through_ = last;  // wakes the batch's callers
    }
    batch.clear();  // the tensors are the mirror's (or freed) from here on

    if (status.ok()) {
      records_since_snapshot_ += static_cast<int64_t>(last - first + 1);
      if (records_since_snapshot_ >= options_.snapshot_every) WriteSnapshot();
    }
  }
}

void MetadataLog::WriteSnapshot() {
  records_since_snapshot_ = 0;
  MetadataState state = DurableState();  // shares the tensors
  const absl::Time start = absl::Now();
  absl::Status status = store_->Snapshot(state);
  if (options_.metrics != nullptr) {
    options_.metrics
        ->Histogram("tessera_metadata_snapshot_seconds",
                    "Time to write one metadata snapshot.")
        ->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  // The log still holds everything: a failed snapshot loses nothing.
  if (!status.ok()) {
    spdlog::warn("metadata snapshot failed: {}", std::string(status.message()));
    return;
  }
  absl::MutexLock lock(&mu_);
  ++stats_.snapshots;
}

}  // namespace tessera
