// LoadPlan: how a checkpoint load (CLI.md "Checkpoints (v3)") fills new
// shards from stored pieces, decided before any byte moves: each shard's
// first replica reads, from each piece that overlaps it, the runs of the
// file that land in it (one order), a worker's orders in sequence and the
// workers in parallel. A tessera piece's readers each return the CRC-32 of
// their part of it; the first replicas tile the tensor, so every byte of
// the piece is in exactly one part, and the parts must combine into the
// CRC-32 the save stored. Pure: the orchestrator carries the plan out.
#ifndef TESSERA_CORE_LOAD_PLAN_H_
#define TESSERA_CORE_LOAD_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/file_runs.h"
#include "core/tensor_metadata.h"

namespace tessera {

// A load's order: runs of one file (in file order) into one shard, all of
// one stored piece when `piece_bytes` > 0 (file bytes [piece_offset,
// piece_offset + piece_bytes)), whose part CRC-32 the worker then returns.
struct LoadOrder {
  std::string file;
  uint64_t shard_id = 0;
  std::vector<FileRun> runs;
  int64_t piece_offset = 0;
  int64_t piece_bytes = 0;
};

// What a load's order read.
struct LoadedRuns {
  int64_t bytes_read = 0;   // from the file, gaps between runs included
  uint32_t part_crc32 = 0;  // of the order's piece (PartCrc32)
};

struct LoadPlan {
  struct Order {
    LoadOrder order;
    size_t checked = 0;  // 1 + index into `checked`; 0: not checked
    int64_t bytes = 0;   // landing in the shard (the runs' lengths)
  };
  struct Worker {
    std::string worker;
    std::string address;
    std::vector<Order> orders;
  };
  std::vector<Worker> workers;  // by address
  // The pieces whose parts' CRC-32s are checked (tessera's own).
  std::vector<StoredPiece> checked;
};

// `made[k]` is the new tensor entry `entries[k]` loads into.
LoadPlan PlanLoad(const std::vector<const TensorMetadata*>& made,
                  const std::vector<const CheckpointEntry*>& entries);

// `parts[c]`: the part CRC-32s the workers returned for plan.checked[c].
// A checkpoint error naming the file, entry and both CRCs when one piece's
// parts do not combine into its stored CRC-32.
absl::Status CheckLoadedPieces(const LoadPlan& plan,
                               const std::vector<std::vector<uint32_t>>& parts,
                               const std::string& dir);

}  // namespace tessera

#endif  // TESSERA_CORE_LOAD_PLAN_H_
