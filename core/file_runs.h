// Reading a shard's bytes straight from a file that stores a row-major
// array of the tensor (a safetensors entry, a piece a checkpoint saved):
// which byte runs of the file land where in the shard, and how a reader
// groups them into few reads without reading much it does not need. The
// planner (the coordinator) and the reader (a worker) share these rules.
// Pure functions; thread-safe.
#ifndef TESSERA_CORE_FILE_RUNS_H_
#define TESSERA_CORE_FILE_RUNS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "core/box.h"
#include "core/dtype.h"

namespace tessera {

// A piece of a tensor as a checkpoint stored it: the row-major bytes of
// `box` (tensor coordinates) at `data_offset` of `file`, entry `entry` of
// that safetensors file, with their CRC-32.
struct StoredPiece {
  Box box;
  std::string file;
  std::string entry;
  int64_t data_offset = 0;
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

// One tensor of a checkpoint directory: where its row-major bytes lie.
struct CheckpointEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;              // may be empty (0-d)
  std::string file;         // a plain name in the directory
  int64_t data_offset = 0;  // of its first byte in the file
  int64_t bytes = 0;
  // A tessera checkpoint's tensor: the pieces that tile it (file and
  // data_offset above are the first's). Empty: the whole tensor lies at
  // `data_offset` of `file`, unchecked (a Hugging Face file).
  std::vector<StoredPiece> pieces;
};

// The pieces of `entry`: its own, or one of the whole tensor (a box of
// `shape`'s rank, or [1] for a 0-d entry: how a load keeps it) without a
// checksum.
std::vector<StoredPiece> PiecesOf(const CheckpointEntry& entry);

// Most tensors a checkpoint directory may hold (what one listing carries).
inline constexpr int64_t kMaxCheckpointEntries = int64_t{1} << 17;

// What a checkpoint directory holds.
struct CheckpointListing {
  std::vector<CheckpointEntry> entries;  // by file, each file in data order
  // The first file's "__metadata__", in its order.
  std::vector<std::pair<std::string, std::string>> metadata;
  // A tessera.json's: the save that wrote it (its files carry the id as
  // "__metadata__" kSavePartKey) and the principal that asked for it.
  // Empty for other checkpoints (and saves before these were kept).
  std::string save_id;
  std::string saved_by;
};

// `length` bytes at `file_offset` in the file land at byte `shard_offset`
// of the destination shard (row-major).
struct FileRun {
  int64_t file_offset = 0;
  int64_t length = 0;
  int64_t shard_offset = 0;

  bool operator==(const FileRun& o) const {
    return file_offset == o.file_offset && length == o.length &&
           shard_offset == o.shard_offset;
  }
};

// The runs the shard of box `shard` needs from an array of box `stored`
// (both in tensor coordinates, of one rank; rank 0 is one element) whose
// bytes start at `file_offset`: in file order, each contiguous in the file
// and in the shard, as long as both allow. None when the boxes do not meet.
std::vector<FileRun> PlanFileRuns(const Box& stored, int64_t file_offset,
                                  const Box& shard, int64_t item_bytes);

// One read: [file_offset, file_offset + length) of the file, which holds
// runs [first_run, first_run + num_runs) of the list it was made from.
struct ReadSpan {
  int64_t file_offset = 0;
  int64_t length = 0;
  size_t first_run = 0;
  size_t num_runs = 0;
};

// `runs` (in file order) as reads: neighbours join while the gap between
// them is at most `max_gap` bytes, the read stays within `max_span` bytes
// (a run longer than max_span is a read of its own), and the gaps a read
// covers stay within `max_over_read` of the runs' bytes in it: what is read
// and not needed is bounded, whatever the layout.
std::vector<ReadSpan> CoalesceRuns(absl::Span<const FileRun> runs,
                                   int64_t max_gap, int64_t max_span,
                                   double max_over_read = 0.25);

}  // namespace tessera

#endif  // TESSERA_CORE_FILE_RUNS_H_
