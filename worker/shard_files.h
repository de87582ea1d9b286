// The files behind a worker's host shards with --store_dir (CLI.md
// "Restart-safe workers (v3)"): each shard's bytes live in their own file
// under DIR/shards, mapped shared into the worker, so that they outlive the
// process (a local disk, or a memory-backed volume that outlives the
// container). When the coordinator commits the change that wrote a shard,
// its bytes are synced and a record written beside them (core/
// shard_record.h: which shard, which cluster, the CRC-32 of its bytes),
// whole or not at all (temp, fsync, rename). A worker started again on the
// same DIR scans it: every shard with an intact record whose bytes still
// have their CRC is mapped again as it was, nothing copied; files without
// a record (shards never committed) are removed; shards that fail their
// check are moved aside into DIR/damaged (never deleted: two swapped files
// or one flipped bit may be all that is left of them) and reported. One worker
// per DIR: an flock on DIR/lock says so.
//
// Thread-safe: files are per shard; the directory is only scanned before
// the worker serves.
#ifndef TESSERA_WORKER_SHARD_FILES_H_
#define TESSERA_WORKER_SHARD_FILES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/shard_record.h"

namespace tessera {

// A shard's file mapped read-write; unmapped when the last holder lets go.
class MappedShardFile {
 public:
  MappedShardFile(char* data, int64_t bytes, int64_t mapped, std::string path)
      : data_(data), bytes_(bytes), mapped_(mapped), path_(std::move(path)) {}
  ~MappedShardFile();
  MappedShardFile(const MappedShardFile&) = delete;
  MappedShardFile& operator=(const MappedShardFile&) = delete;

  char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  // The file's absolute path: a same-host reader maps it read-only
  // (MapShardResponse.file).
  const std::string& path() const { return path_; }

 private:
  char* const data_;
  const int64_t bytes_;
  const int64_t mapped_;  // at least one page's worth: a 0-byte shard maps 1
  const std::string path_;
};

class ShardFiles {
 public:
  // Makes DIR (and DIR/shards) if missing and takes its lock: a second
  // worker on the same DIR is refused (FAILED_PRECONDITION, "store_dir").
  static absl::StatusOr<std::shared_ptr<ShardFiles>> Open(
      const std::string& dir);
  ~ShardFiles();

  const std::string& dir() const { return dir_; }

  // A new zeroed file for shard `id` (any earlier one of the id replaced),
  // its blocks reserved, mapped read-write. A file system without the room
  // is RESOURCE_EXHAUSTED, and nothing is left of the file.
  absl::StatusOr<std::shared_ptr<MappedShardFile>> Create(uint64_t id,
                                                          int64_t bytes);
  // Syncs the shard's bytes and writes its record. The shard then
  // survives a restart.
  absl::Status Seal(const ShardRecord& record, const MappedShardFile& file);
  // Removes shard `id`'s record, then its bytes (a mapping keeps them until
  // it goes).
  void Remove(uint64_t id);
  // Moves shard `id`'s bytes and record into DIR/damaged; returns that
  // directory, or empty when nothing moved.
  std::string SetAside(uint64_t id);

  struct Found {
    ShardRecord record;
    std::shared_ptr<MappedShardFile> file;
  };
  struct ScanResult {
    std::vector<Found> intact;  // checked against their CRC, mapped
    int64_t intact_bytes = 0;
    int64_t unsealed = 0;  // files without a record, removed
    int64_t damaged = 0;   // records or bytes that failed, moved aside
    std::vector<std::string> problems;  // one line per damaged shard
  };
  // What DIR holds (call before serving).
  ScanResult Scan();

 private:
  ShardFiles(std::string dir, std::string shards, int lock_fd, int shards_fd)
      : dir_(std::move(dir)),
        shards_(std::move(shards)),
        lock_fd_(lock_fd),
        shards_fd_(shards_fd) {}
  // Moves shard `base`'s record and bytes into DIR/damaged (renamed with
  // the time); returns that directory, or empty when nothing moved.
  std::string MoveAside(const std::string& base);

  const std::string dir_;
  const std::string shards_;  // DIR/shards, absolute, without symlinks
  const int lock_fd_;
  const int shards_fd_;  // DIR/shards, for *at calls and directory syncs
};

}  // namespace tessera

#endif  // TESSERA_WORKER_SHARD_FILES_H_
