// MetadataLog: the coordinator's durable record path, with group commit.
//
// Callers Enqueue a change and get a ticket; one writer thread takes every
// queued record (up to a batch limit), appends them to the MetadataStore in
// one call (one fsync for the file store) and wakes the callers whose
// records it held. Wait(ticket) returns once that record is durable, or with
// the error that kept it (and the rest of its batch) off the disk.
//
// Order: records reach the store in the order of their Enqueue calls. A
// caller that changes in-memory state enqueues the change's record under
// the lock that orders that state (TensorTable::mu_), so the log's order is
// the order of the changes; it publishes the change to readers only after
// Wait succeeds, and undoes it when Wait fails.
//
// Snapshots: the log keeps a mirror MetadataState of exactly what the store
// holds (every durable record applied, nothing else; tensors shared, not
// copied). Every `snapshot_every` records the writer thread writes the
// mirror as the store's snapshot, between batches: never on a caller's
// thread, never under a caller's lock, and always from a state that holds
// every record the store has.
//
// Thread-safe. Lock order: callers' locks -> mu_ (Enqueue takes only mu_,
// briefly, and never blocks on the disk); mirror_mu_ is a leaf.
#ifndef TESSERA_COORDINATOR_METADATA_LOG_H_
#define TESSERA_COORDINATOR_METADATA_LOG_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/metadata_store.h"
#include "core/metrics.h"

namespace tessera {

class MetadataLog {
 public:
  // Names one enqueued record; 0 names none (Wait(0) returns OK at once).
  using Ticket = uint64_t;

  struct Options {
    // Write the mirror as a snapshot after this many records.
    int64_t snapshot_every = 1000;
    // One batch holds at most this many records...
    size_t max_batch_records = 1024;
    // ...and, beyond its first record, at most this many shards in all (the
    // batch is serialized in memory before it is written).
    size_t max_batch_shards = 1 << 20;
    // When set, each batch append (one fsync for the file store) and each
    // snapshot is timed into it: tessera_metadata_append_seconds and
    // tessera_metadata_snapshot_seconds. Not owned.
    MetricsRegistry* metrics = nullptr;
    // Called (on the writer thread) when the store cannot tell whether a
    // batch is durable (DATA_LOSS from Append: a failed sync whose batch
    // could not be cut off the log). The callers cannot undo their changes
    // then, since the batch may replay at the next start; the default ends
    // the process at once, so that the next start recovers from what the
    // disk holds (crash-only, as databases do after a failed fsync).
    std::function<void(const absl::Status&)> on_unknown_outcome;
  };

  struct Stats {
    int64_t records = 0;         // durable records
    int64_t batches = 0;         // store appends (fsyncs for the file store)
    int64_t failed_batches = 0;  // appends that failed
    int64_t snapshots = 0;       // snapshots written by the writer thread
  };

  // `store` must outlive the log. Starts the writer thread.
  MetadataLog(MetadataStore* store, Options options);
  // Writes every record still queued, then stops the writer.
  ~MetadataLog();

  MetadataLog(const MetadataLog&) = delete;
  MetadataLog& operator=(const MetadataLog&) = delete;

  // Loads the store's state, makes it the mirror and, when the store
  // replayed records, writes it as one snapshot (the log starts afresh; a
  // snapshot that fails but leaves the store writable, e.g. on a full disk,
  // is logged, not an error). Its shard_id_high_water is raised past every
  // shard id it holds. Call once, before the first Enqueue.
  absl::StatusOr<MetadataState> Recover() ABSL_LOCKS_EXCLUDED(mu_, mirror_mu_);

  // Queues `change` behind every record queued before it. Never blocks on
  // the disk.
  Ticket Enqueue(MetadataChange change) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until the record is durable; its error if its batch failed.
  absl::Status Wait(Ticket ticket) const ABSL_LOCKS_EXCLUDED(mu_);
  // True once the record's batch is known to have failed (never blocks).
  bool Failed(Ticket ticket) const ABSL_LOCKS_EXCLUDED(mu_);
  // Enqueue and Wait.
  absl::Status Append(MetadataChange change) ABSL_LOCKS_EXCLUDED(mu_);

  // What the store holds now (shares the tensors).
  MetadataState DurableState() const ABSL_LOCKS_EXCLUDED(mirror_mu_);
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Failure {
    Ticket first = 0;
    Ticket last = 0;
    absl::Status status;
  };

  // The failure that covers a ticket whose outcome is known, or OK.
  absl::Status OutcomeOf(Ticket ticket) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_, mirror_mu_);
  // Writes the mirror as the store's snapshot (writer thread only).
  void WriteSnapshot() ABSL_LOCKS_EXCLUDED(mirror_mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || stopping_;
  }

  MetadataStore* const store_;
  const Options options_;

  // Invariants: queue_ holds the records of tickets
  // [next_to_write_, next_ticket_) in order; every ticket < next_to_write_
  // has been handed to the store, and every ticket <= done_through_ has its
  // outcome known (durable, or inside one of failures_, which are disjoint
  // and sorted). done_through_ < next_to_write_ <= next_ticket_.
  mutable absl::Mutex mu_;
  std::deque<MetadataChange> queue_ ABSL_GUARDED_BY(mu_);
  Ticket next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  Ticket next_to_write_ ABSL_GUARDED_BY(mu_) = 1;
  Ticket done_through_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Failure> failures_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);

  // The mirror changes only on the writer thread (and in Recover, before
  // it has work).
  mutable absl::Mutex mirror_mu_;
  MetadataState mirror_ ABSL_GUARDED_BY(mirror_mu_);

  int64_t records_since_snapshot_ = 0;  // writer thread only
  std::thread writer_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_METADATA_LOG_H_
