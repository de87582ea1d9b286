// WorkerControl: how the coordinator asks workers to allocate and free
// shards. An interface so the coordinator's logic has no gRPC in it; the
// implementation (grpc_worker_control.h) talks to real workers.
// Implementations are thread-safe.
#ifndef TESSERA_COORDINATOR_WORKER_CONTROL_H_
#define TESSERA_COORDINATOR_WORKER_CONTROL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/file_runs.h"
#include "core/init_fill.h"
#include "core/load_plan.h"
#include "core/save_plan.h"
#include "core/stop.h"
#include "core/transfer.h"
#include "core/worker_info.h"

namespace tessera {

// A worker as the coordinator orders it: its name (each order is signed for
// it) and the address it serves on.
struct WorkerRef {
  std::string name;
  std::string address;
};

// Shards of one tensor to allocate on one worker, all or none.
struct AllocateBatch {
  std::string tensor;
  uint64_t version = 0;      // the tensor version the shards belong to
  uint64_t incarnation = 0;  // the tensor's: grants must name it
  bool writable = false;     // a put's shards: clients write them once
  // The put or update writing them (writable only): write grants must name
  // it, and the commit seals them.
  uint64_t change = 0;
  // Every byte is copied in before the shards are named to anyone.
  bool filled_by_copies = false;
  DType dtype = DType::kFloat32;
  Shape tensor_shape;
  InitSpec init;
  std::vector<std::pair<uint64_t, Box>> shards;  // shard id, box in the tensor
};

class WorkerControl {
 public:
  virtual ~WorkerControl() = default;
  // Return the worker's bytes in use afterwards.
  virtual absl::StatusOr<BytesUsedReading> Allocate(
      const WorkerRef& worker, const AllocateBatch& batch) = 0;
  virtual absl::StatusOr<BytesUsedReading> Free(
      const WorkerRef& worker, const std::vector<uint64_t>& shard_ids) = 0;
  // Seals shards a change wrote (its commit): no write reaches them again;
  // with `persist`, a worker with --store_dir also records them (their
  // bytes must be final). NOT_FOUND when the worker does not hold one.
  virtual absl::Status Seal(const WorkerRef& worker,
                            const std::vector<uint64_t>& shard_ids,
                            bool persist) = 0;
  // The worker at `address` (re)started: forget any connection state.
  virtual void Reset(const std::string& address) = 0;
  // Moves every piece of `batch` from its source worker into shards of its
  // destination worker (one request for the pair); a relay hop's upstreams
  // get their read capabilities here. `sent` (optional) gets what each
  // source sent for it.
  virtual absl::Status Transfer(const TransferBatch& batch,
                                SentBytes* sent = nullptr) = 0;
  // NCCL between GPU workers (core/transfer.h Exchange): a communicator id
  // from `worker`, which hosts its bootstrap, then each member's share of
  // the exchange, all members at once. The defaults decline
  // (FAILED_PRECONDITION): the pieces are then pulled.
  virtual absl::StatusOr<std::string> ExchangeId(const WorkerRef& worker) {
    return absl::FailedPreconditionError("no NCCL exchanges here");
  }
  // Returns the bytes the member received. `cancellation` (not owned)
  // gives the member's call up (CANCELLED) when another member failed:
  // the member then aborts its communicator instead of waiting for the
  // failed one until its deadline.
  virtual absl::StatusOr<int64_t> Exchange(const WorkerRef& worker,
                                           const ExchangePlan& plan,
                                           Cancellation* cancellation) {
    return absl::FailedPreconditionError("no NCCL exchanges here");
  }
  // What checkpoint directory `dir` holds, as `worker` reads it under its
  // --checkpoint_root (a load's plan). The default declines.
  virtual absl::StatusOr<CheckpointListing> ListCheckpoint(
      const WorkerRef& worker, const std::string& dir) {
    return absl::FailedPreconditionError("no checkpoints here");
  }
  // Has `worker` read `order.runs` of `order.file` in `dir` into its shard
  // `order.shard_id`.
  virtual absl::StatusOr<LoadedRuns> LoadShard(const WorkerRef& worker,
                                               const std::string& dir,
                                               const LoadOrder& order) {
    return absl::FailedPreconditionError("no checkpoints here");
  }
  // Has `worker` write `items` (shards it holds) into file `file` of `dir`,
  // whole or not at all; returns where each landed, in order.
  virtual absl::StatusOr<std::vector<SavedItem>> SaveShards(
      const WorkerRef& worker, const std::string& dir, const std::string& file,
      const std::vector<SaveItem>& items,
      const std::vector<std::pair<std::string, std::string>>& metadata) {
    return absl::FailedPreconditionError("no checkpoints here");
  }
  // Has `worker` write file `name` of `dir` whole, or remove `names`. With
  // `size` larger than `content`, zeros follow up to `size` bytes.
  virtual absl::Status WriteCheckpointFile(const WorkerRef& worker,
                                           const std::string& dir,
                                           const std::string& name,
                                           const std::string& content,
                                           int64_t size) {
    return absl::FailedPreconditionError("no checkpoints here");
  }
  // Has `worker` write `runs` of its shard `shard_id` (of `tensor` at
  // `version`) into `file` of `dir`, a file of save `save_id`; returns the
  // bytes written.
  virtual absl::StatusOr<int64_t> WriteShardRuns(
      const WorkerRef& worker, const std::string& dir, const std::string& file,
      const std::string& save_id, uint64_t shard_id, const std::string& tensor,
      uint64_t version, const std::vector<FileRun>& runs) {
    return absl::FailedPreconditionError("no checkpoints here");
  }
  // Has `worker` rename files of save `save_id` in `dir` into place, the
  // directory's index files removed first.
  virtual absl::Status PublishCheckpointFiles(
      const WorkerRef& worker, const std::string& dir,
      const std::string& save_id,
      const std::vector<std::pair<std::string, std::string>>& renames) {
    return absl::FailedPreconditionError("no checkpoints here");
  }
  // Removes those of `names` in `dir` that the save `save_id` wrote (their
  // header says so); others are left alone.
  virtual absl::Status RemoveCheckpointFiles(
      const WorkerRef& worker, const std::string& dir,
      const std::vector<std::string>& names, const std::string& save_id) {
    return absl::FailedPreconditionError("no checkpoints here");
  }
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_WORKER_CONTROL_H_
