// FileMetadataStore: the coordinator's metadata in a directory, as a
// snapshot plus an append-only log of changes since it.
//
//   DIR/snapshot  "TSNP" | u32 crc32(payload) | u64 length | MetadataSnapshot
//   DIR/log       records: u32 length | u32 crc32(payload) | MetadataRecord
//   DIR/LOCK      flock'ed while a coordinator uses the directory
//   DIR/cluster_id  32 hex digits, drawn at random when the directory is
//                 first used (a new cluster) and never changed after
//
// The directory is private to the coordinator's user: Load (and
// PrepareDataDir) create it 0700, tighten an existing one with looser
// permissions to 0700 and every file in it to 0600 (logging what changed),
// and refuse one that belongs to another user. Every file is created 0600.
//
// Append writes a batch of records and fdatasync()s once before returning.
// A batch that cannot be written whole or synced (ENOSPC, EIO) is cut off
// the log again and the cut is synced, so it never replays after a restart
// and later batches follow the last acknowledged one. If even that fails,
// the batch's fate is unknown: Append returns DATA_LOSS and the store
// refuses every later change. Load replays the snapshot and then the log.
// A record that is cut short or fails its checksum with no valid record
// after it is a torn tail (the last write, cut by a crash): it is
// truncated away, and everything before it is recovered. A damaged record
// with valid records after it is damage in the middle (a bad block, a
// stray write), not a crash: Load fails with DATA_LOSS naming its byte
// offset and changes nothing, since dropping the records after it would
// lose acknowledged changes; RecoveryOptions says how the operator may
// proceed. Records are
// "set" operations, so replaying a log over a snapshot that already holds
// its changes gives the same state (a crash between writing a snapshot and
// truncating the log is harmless). Thread-safe.
#ifndef TESSERA_COORDINATOR_FILE_METADATA_STORE_H_
#define TESSERA_COORDINATOR_FILE_METADATA_STORE_H_

#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/metadata_store.h"

namespace tessera {

// The system calls the store writes its files through. Tests inject faults
// here (a short write then ENOSPC, EIO from a sync); the defaults are the
// real calls.
struct FileOps {
  std::function<ssize_t(int fd, const void* data, size_t size)> write =
      [](int fd, const void* data, size_t size) {
        return ::write(fd, data, size);
      };
  std::function<int(int fd)> sync = [](int fd) { return ::fdatasync(fd); };
};

// Makes `dir` fit to hold the metadata: creates it (mode 0700; its parent
// must exist), or tightens it to 0700 and each file in it to 0600.
// FAILED_PRECONDITION when it is not a directory or belongs to another user.
absl::Status PrepareDataDir(const std::string& dir);

// The cluster id kept in `dir`/cluster_id; when there is none, a new random
// one, written atomically (`*created` then true). DATA_LOSS for a file that
// holds no id.
absl::StatusOr<std::string> LoadOrMakeClusterId(const std::string& dir,
                                                bool* created);

// What Load may do to a damaged log, on the operator's word.
struct RecoveryOptions {
  // When Load finds a damaged record at exactly this byte offset of the
  // log with valid records after it (which it refuses by default), it
  // keeps a copy of the whole log as DIR/log.damaged-OFFSET and truncates
  // the log there, dropping the damaged record and everything after it.
  // Negative: never (damage in the middle of the log fails Load).
  int64_t truncate_log_at = -1;
};

class FileMetadataStore : public MetadataStore {
 public:
  explicit FileMetadataStore(std::string dir, FileOps ops = FileOps(),
                             RecoveryOptions recovery = {});
  ~FileMetadataStore() override;

  using MetadataStore::Append;
  absl::StatusOr<MetadataState> Load() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Append(absl::Span<const MetadataChange> changes) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Snapshot(const MetadataState& state) override
      ABSL_LOCKS_EXCLUDED(mu_);
  bool ReplaysRecords() const override ABSL_LOCKS_EXCLUDED(mu_);
  std::string Describe() const override;
  const std::string& dir() const { return dir_; }
  const FileOps& ops() const { return ops_; }

  // What the last Load found (for the start-up log and tests).
  int64_t records_recovered() const { return records_recovered_; }
  int64_t torn_bytes_dropped() const { return torn_bytes_dropped_; }
  // Valid records dropped after a damaged one, by
  // RecoveryOptions::truncate_log_at (0 after a plain torn tail).
  int64_t damaged_records_dropped() const { return damaged_records_dropped_; }
  // True when the last Load drew a new cluster id (a new cluster).
  bool cluster_id_created() const { return cluster_id_created_; }

 private:
  const std::string dir_;
  const FileOps ops_;
  const RecoveryOptions recovery_;
  int lock_fd_ = -1;
  int64_t records_recovered_ = 0;
  int64_t torn_bytes_dropped_ = 0;
  int64_t damaged_records_dropped_ = 0;
  bool cluster_id_created_ = false;
  // OK, or why the log takes no more changes.
  absl::Status CheckWritable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  int log_fd_ ABSL_GUARDED_BY(mu_) = -1;
  // The log holds records (after the snapshot).
  bool replays_records_ ABSL_GUARDED_BY(mu_) = false;
  // Bytes of whole records in the log: where the next batch starts.
  uint64_t log_size_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_FILE_METADATA_STORE_H_
