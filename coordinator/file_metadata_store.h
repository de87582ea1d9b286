// FileMetadataStore: the coordinator's metadata in a directory, as a
// snapshot plus an append-only log of changes since it.
//
//   DIR/snapshot  "TSNP" | u32 crc32(payload) | u64 length | MetadataSnapshot
//   DIR/log       records: u32 length | u32 crc32(payload) | MetadataRecord
//   DIR/LOCK      flock'ed while a coordinator uses the directory
//
// Append writes a batch of records and fdatasync()s once before returning;
// a batch that cannot be written whole is cut off the log again, and after a
// failed fdatasync the store refuses further changes (what reached the disk
// is unknown). Load replays
// the snapshot and then the log; a record that is cut short or fails its
// checksum ends the log (a torn write from a crash): it and anything after
// it are truncated away, and everything before it is recovered. Records are
// "set" operations, so replaying a log over a snapshot that already holds
// its changes gives the same state (a crash between writing a snapshot and
// truncating the log is harmless). Thread-safe.
#ifndef TESSERA_COORDINATOR_FILE_METADATA_STORE_H_
#define TESSERA_COORDINATOR_FILE_METADATA_STORE_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/metadata_store.h"

namespace tessera {

class FileMetadataStore : public MetadataStore {
 public:
  explicit FileMetadataStore(std::string dir);
  ~FileMetadataStore() override;

  using MetadataStore::Append;
  absl::StatusOr<MetadataState> Load() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Append(absl::Span<const MetadataChange> changes) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Snapshot(const MetadataState& state) override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string Describe() const override;
  const std::string& dir() const { return dir_; }

  // What the last Load found (for the start-up log and tests).
  int64_t records_recovered() const { return records_recovered_; }
  int64_t torn_bytes_dropped() const { return torn_bytes_dropped_; }

 private:
  const std::string dir_;
  int lock_fd_ = -1;
  int64_t records_recovered_ = 0;
  int64_t torn_bytes_dropped_ = 0;
  // OK, or why the log takes no more changes.
  absl::Status CheckWritable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  int log_fd_ ABSL_GUARDED_BY(mu_) = -1;
  // Bytes of whole records in the log: where the next batch starts.
  uint64_t log_size_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_FILE_METADATA_STORE_H_
