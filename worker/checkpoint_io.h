// CheckpointIo: a worker's side of checkpoints (CLI.md "Checkpoints (v3)")
// under its --checkpoint_root: listing a directory, reading a load's file
// runs into a shard, writing sealed shards into one safetensors file, and
// the index files. The service bounds the requests' counts and sizes;
// everything that depends on the shards (runs inside them, shards sealed
// and of the version named) is checked here, before a byte moves.
#ifndef TESSERA_WORKER_CHECKPOINT_IO_H_
#define TESSERA_WORKER_CHECKPOINT_IO_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint_index.h"
#include "core/file_runs.h"
#include "core/load_plan.h"
#include "core/save_plan.h"
#include "core/stop.h"
#include "worker/checkpoint_files.h"
#include "worker/shard_store.h"

namespace tessera {

class CheckpointIo {
 public:
  // `store` must outlive it. `takes_writes(id)`: shard `id` is not sealed
  // yet (a save refuses it).
  CheckpointIo(ShardStore* store, std::string root,
               std::function<bool(uint64_t)> takes_writes)
      : store_(store),
        root_(std::move(root)),
        takes_writes_(std::move(takes_writes)) {}

  // What `dir` holds; its metadata within what a tensor keeps.
  absl::StatusOr<CheckpointListing> List(const std::string& dir) const;

  // Reads `runs` of `dir`/`file` (each inside shard `shard_id`, in file
  // order: INVALID_ARGUMENT otherwise) into the shard. With piece_bytes >
  // 0, every run lies in the piece of that many bytes at piece_offset, and
  // the reply carries the runs' part CRC-32 of it.
  absl::StatusOr<LoadedRuns> Load(const std::string& dir,
                                  const std::string& file, uint64_t shard_id,
                                  const std::vector<FileRun>& runs,
                                  int64_t piece_offset,
                                  int64_t piece_bytes) const;

  // Writes `items` (sealed shards held here, of the tensor version each
  // names) as one safetensors file `dir`/`file` with `metadata`, each
  // entry's CRC-32 computed as it is written; `stop` is checked between
  // shards. Returns where each item landed, in the order given, and the
  // file's size.
  struct SavedFile {
    std::vector<SavedItem> items;
    int64_t file_bytes = 0;
  };
  absl::StatusOr<SavedFile> Save(
      const std::string& dir, const std::string& file,
      const std::vector<SaveItem>& items,
      const std::vector<std::pair<std::string, std::string>>& metadata,
      const StopCondition& stop) const;

  // Writes index file `name` in `dir` whole (at most
  // kMaxCheckpointIndexBytes). With `size` larger than `content`, zeros
  // follow up to `size` bytes (a file whose data workers write next).
  absl::Status WriteIndex(const std::string& dir, const std::string& name,
                          const std::string& content, int64_t size = 0) const;

  // Writes `runs` (file order) of shard `shard_id` (sealed, held here, of
  // `tensor` at `version`) into `dir`/`file`, a file of save `save_id`
  // (CheckpointRoot::WriteRuns). Returns the bytes written.
  absl::StatusOr<int64_t> WriteRuns(const std::string& dir,
                                    const std::string& file,
                                    const std::string& save_id,
                                    uint64_t shard_id,
                                    const std::string& tensor, uint64_t version,
                                    const std::vector<FileRun>& runs) const;
  // Renames files of save `save_id` into place (CheckpointRoot::Publish).
  absl::Status Publish(
      const std::string& dir, const std::string& save_id,
      const std::vector<std::pair<std::string, std::string>>& renames) const;
  // Removes files of save `save_id` from `dir` (CheckpointRoot::RemoveFiles).
  absl::Status Remove(const std::string& dir,
                      const std::vector<std::string>& names,
                      const std::string& save_id) const;

 private:
  // Copies shard `id` (`bytes` of `desc`) into `fd`; returns its CRC-32.
  absl::StatusOr<uint32_t> WriteShard(int fd, uint64_t id,
                                      const ShardDesc& desc) const;

  ShardStore* const store_;
  const CheckpointRoot root_;
  const std::function<bool(uint64_t)> takes_writes_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CHECKPOINT_IO_H_
