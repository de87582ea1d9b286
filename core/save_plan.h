// SavePlan: how a checkpoint save (CLI.md "Checkpoints (v3)") lays the
// tensors out, decided before any byte moves: each shard's first available
// replica writes it as one piece, an entry of that worker's files; a
// worker's pieces go in files of at most `file_bytes` and `file_items`, so
// that progress moves and no file grows without bound. Pure: the
// orchestrator carries the plan out and fills in where each piece landed.
#ifndef TESSERA_CORE_SAVE_PLAN_H_
#define TESSERA_CORE_SAVE_PLAN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_runs.h"
#include "core/tensor_metadata.h"

namespace tessera {

// A save's item: shard `shard_id` (of `tensor` at `version`) stored as
// entry `entry` of a file; 0-d when `scalar`.
struct SaveItem {
  std::string entry;
  uint64_t shard_id = 0;
  std::string tensor;
  uint64_t version = 0;
  bool scalar = false;
};
// Where an item landed.
struct SavedItem {
  int64_t data_offset = 0;
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct SavePlanItem {
  size_t tensor = 0;  // into the listing's entries
  size_t piece = 0;   // into that entry's pieces
  std::string entry;  // its name in the file
  uint64_t shard_id = 0;
  uint64_t version = 0;  // of the tensor, leased for the save
  bool scalar = false;   // stored 0-d
  int64_t bytes = 0;
};
struct SavePlanFile {
  std::string name;
  std::vector<SavePlanItem> items;  // in file order
};
struct SavePlanWorker {
  std::string worker;
  std::string address;
  std::vector<SavePlanFile> files;
};
struct SavePlan {
  // Entries and pieces; each piece's file, offset, bytes and CRC-32 are
  // the orchestrator's to fill in as the workers report them.
  CheckpointListing listing;
  // Every file's "__metadata__": the tensors' own, "format" for Hugging
  // Face's loaders, and kSavePartKey naming the save.
  std::vector<std::pair<std::string, std::string>> file_metadata;
  std::vector<SavePlanWorker> workers;  // by address
  int64_t bytes = 0;                    // the tensors' bytes
  int64_t files = 0;
};

struct SavePlanOptions {
  std::string save_id;    // names the files and marks them
  std::string principal;  // recorded as saved_by
  int64_t file_bytes = int64_t{1} << 30;
  int64_t file_items = 1024;
};

// `metas` with their workers' state filled in (a replica's availability).
// UNAVAILABLE naming the shard and worker when a shard has no live
// replica.
absl::StatusOr<SavePlan> PlanSave(const std::vector<TensorMetadata>& metas,
                                  const SavePlanOptions& options);

}  // namespace tessera

#endif  // TESSERA_CORE_SAVE_PLAN_H_
