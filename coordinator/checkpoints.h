// Checkpoints: lists, loads and saves checkpoint directories
// (CLI.md "Checkpoints (v3)"), which every worker sees under its
// --checkpoint_root. A load makes its tensors through the Orchestrator (a
// pending create each, committed once every byte is read and checked); a
// save has the workers write the pieces they hold; what goes where is
// planned in core/ (core/load_plan, core/save_plan). Their progress is on
// the orchestrator's MoveProgressBoard, beside reshards' and repairs'.
//
// Thread-safe (it keeps no state of its own).
#ifndef TESSERA_COORDINATOR_CHECKPOINTS_H_
#define TESSERA_COORDINATOR_CHECKPOINTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "coordinator/move_progress.h"
#include "coordinator/orchestrator.h"
#include "coordinator/tensor_table.h"
#include "coordinator/worker_control.h"
#include "coordinator/worker_registry.h"
#include "core/checkpoint_index.h"
#include "core/hf_export_plan.h"
#include "core/layout_spec.h"
#include "core/load_plan.h"
#include "core/save_plan.h"
#include "core/stop.h"
#include "core/tensor_metadata.h"

namespace tessera {

// A load (CLI.md "Checkpoints (v3)"): tensors made from entries of a
// checkpoint directory the workers see under their --checkpoint_root.
struct LoadArgs {
  struct Entry {
    std::string entry;   // its name in the directory
    std::string tensor;  // the tensor to make
    LayoutSpec spec;
  };
  std::string dir;
  std::vector<Entry> entries;
  std::string owner;  // as CreateTensorArgs::owner
  StopCondition stop;
};
// A save (CLI.md "Checkpoints (v3)"): the tensors `names`, or (none
// named) those whose names start with `prefix`.
struct SaveArgs {
  std::string dir;
  std::vector<std::string> names;
  std::string prefix;
  StopCondition stop;
  // Who asks (recorded in tessera.json); a checkpoint in `dir` saved by
  // another principal, or not by tessera, is replaced only with
  // `overwrite`.
  std::string principal;
  bool overwrite = false;
  // export --hf: a Hugging Face sharded directory (core/hf_export_plan)
  // instead of a checkpoint of pieces.
  bool hf = false;
  std::string strip_prefix;
  int64_t max_file_bytes = kHfDefaultFileBytes;
};
struct SaveResult {
  std::vector<std::string> tensors;  // in the order asked (else the table's)
  int64_t bytes = 0;                 // their bytes
  int64_t files = 0;                 // .safetensors files written
  double seconds = 0;
};
// How a save cuts a worker's pieces into files (one order each).
inline constexpr int64_t kSaveFileBytes = int64_t{1} << 30;
inline constexpr int64_t kSaveFileItems = 1024;

struct LoadResult {
  std::vector<TensorMetadataPtr> tensors;  // in the order asked
  int64_t bytes = 0;                       // the tensors' bytes
  int64_t bytes_read = 0;  // what the workers read from the files
  double seconds = 0;
  SentBytes sent;  // what each worker sent to fill replicas and mirrors
};

class Checkpoints {
 public:
  // Every pointer must outlive it.
  Checkpoints(WorkerRegistry* registry, TensorTable* table,
              WorkerControl* workers, Orchestrator* orchestrator)
      : registry_(registry),
        table_(table),
        workers_(workers),
        orchestrator_(orchestrator),
        progress_(orchestrator->progress()) {}

  // What checkpoint directory `dir` holds, as a ready worker reads it.
  absl::StatusOr<CheckpointListing> List(const std::string& dir);
  // Creates each entry's tensor (a 0-d entry as shape [1], FileOrigin
  // recording the file's metadata and the entry's place), has each worker
  // holding a shard's first replica read exactly that shard's bytes from
  // the files (core/file_runs), and commits them, the other replicas filled
  // as a put's are. All or nothing: on any failure every tensor it made is
  // deleted. NOT_FOUND for an entry the directory lacks.
  absl::StatusOr<LoadResult> Load(const LoadArgs& args);
  // Writes the tensors into `dir`: every worker holding a shard's first
  // available replica writes its pieces into its own files (in parallel),
  // each piece's CRC-32 computed as it is written; then tessera.json and
  // the Hugging Face index go in, each whole, and the files of an earlier
  // checkpoint in `dir` are removed. A failure leaves no file of this save
  // that an index names, and an earlier checkpoint as it was.
  // With `args.hf`, writes them as a Hugging Face sharded directory
  // instead: every file made under a staging name, filled by the workers
  // holding the shards (each shard's runs at their row-major place), then
  // renamed into place (the directory's old index files removed first) and
  // the index written last. A failure before the renames leaves `dir` as
  // it was; one after, files no index names.
  absl::StatusOr<SaveResult> Save(const SaveArgs& args);

 private:
  // The worker that reads and writes a checkpoint directory's own files
  // (listing, index files): every worker sees the directory.
  absl::StatusOr<WorkerRef> DirectoryWorker() const;
  // The parts of Load.
  absl::Status CreateLoadTargets(const LoadArgs& args,
                                 const CheckpointListing& listing,
                                 const std::vector<size_t>& found,
                                 std::vector<TensorMetadataPtr>* made);
  absl::StatusOr<int64_t> ReadLoadOrders(
      const LoadArgs& args, const LoadPlan& plan, MoveTally* tally,
      std::vector<std::vector<uint32_t>>* parts);
  // The parts of Save.
  struct EarlierSave {
    std::string save_id;
    absl::flat_hash_set<std::string> files;  // its own, to remove
  };
  absl::StatusOr<std::vector<std::string>> SaveNames(
      const SaveArgs& args) const;
  absl::StatusOr<EarlierSave> FindEarlierSave(const SaveArgs& args);
  absl::Status WriteSaveFiles(const SaveArgs& args, SavePlan* plan,
                              MoveTally* tally,
                              std::vector<std::vector<std::string>>* written);
  absl::Status WriteSaveIndex(const SaveArgs& args,
                              const CheckpointListing& listing);
  absl::StatusOr<SaveResult> ExportHf(const SaveArgs& args,
                                      const std::vector<TensorMetadata>& metas,
                                      EarlierSave earlier, MoveTally* tally);
  absl::Status FinishSave(const SaveArgs& args,
                          const CheckpointListing& listing,
                          EarlierSave earlier);

  WorkerRegistry* const registry_;
  TensorTable* const table_;
  WorkerControl* const workers_;
  Orchestrator* const orchestrator_;
  MoveProgressBoard* const progress_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_CHECKPOINTS_H_
