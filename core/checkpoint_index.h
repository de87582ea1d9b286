// The two index files of a checkpoint directory (CLI.md "Checkpoints
// (v3)"), written and read in one place:
//
//  * model.safetensors.index.json, the Hugging Face index: {"metadata":
//    {"total_size": N}, "weight_map": {entry: file}}. Plain model
//    directories have it too.
//  * tessera.json, what `tessera save` adds: for each tensor its shape,
//    dtype and the pieces it was stored as (box, file, entry, byte offset,
//    bytes, CRC-32), so a load in any layout knows which bytes of which
//    file each destination shard needs.
//
// Every parser bounds and checks what it reads (the files come from
// outside): sizes, counts, names, that each tensor's pieces tile it. Pure
// functions; thread-safe.
#ifndef TESSERA_CORE_CHECKPOINT_INDEX_H_
#define TESSERA_CORE_CHECKPOINT_INDEX_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/crc32.h"  // IWYU pragma: export
#include "core/file_runs.h"

namespace tessera {

inline constexpr char kHfIndexName[] = "model.safetensors.index.json";
inline constexpr char kTesseraIndexName[] = "tessera.json";
// The "__metadata__" key of every file a save writes (its value: the save's
// id), so a lone file of a save that never wrote its index is not taken for
// a model.
inline constexpr char kSavePartKey[] = "tessera_save";

// Largest index file read or written (either kind): one message carries
// it between daemons.
inline constexpr int64_t kMaxCheckpointIndexBytes = int64_t{48} << 20;
// Most files a directory's index may name.
inline constexpr int64_t kMaxCheckpointFiles = 4096;
// Largest file an export makes (a petabyte: past any real tensor, within
// every file system's bound).
inline constexpr int64_t kMaxExportFileBytes = int64_t{1} << 50;
// Most pieces a tessera.json may list, all tensors together.
inline constexpr int64_t kMaxCheckpointPieces = int64_t{1} << 20;
// Longest "save_id" or "saved_by" (a principal's name) a tessera.json
// holds.
inline constexpr int64_t kMaxSavedByBytes = 256;
// The name of file `k` a save of id `save_id` writes for worker `worker`,
// and whether `file` is one of them (any worker, any k).
std::string SavedFileName(absl::string_view worker, absl::string_view save_id,
                          int64_t k);
bool IsSavedFileOf(absl::string_view file, absl::string_view save_id);
// Most dims a stored tensor has.
inline constexpr int64_t kMaxCheckpointRank = 64;

// INVALID_ARGUMENT "checkpoint: <what>".
absl::Status CheckpointError(absl::string_view what);

// INVALID_ARGUMENT "checkpoint_root: <what>": a DIR this worker cannot use
// (no --checkpoint_root, or DIR leaves it), as opposed to files in DIR.
absl::Status CheckpointRootError(absl::string_view what);
bool IsCheckpointRootError(const absl::Status& status);

// OK when `name` is a plain file name in the directory: 1 to 255 bytes, no
// '/', not "." or "..".
absl::Status CheckCheckpointFileName(absl::string_view name);

// The files model.safetensors.index.json names (its "weight_map" values),
// each once, sorted.
absl::StatusOr<std::vector<std::string>> ParseHfIndex(absl::string_view text);

// The Hugging Face index of a saved checkpoint: every piece's entry mapped
// to its file; "total_size" the tensors' bytes.
std::string HfIndexJson(const CheckpointListing& listing);

// tessera.json of `listing`, whose every entry has its pieces.
std::string TesseraIndexJson(const CheckpointListing& listing);

// A tessera.json read back: entries in the file's order, each with its
// pieces (which tile it: ValidateLayout), `file` and `data_offset` those
// of its first piece.
absl::StatusOr<CheckpointListing> ParseTesseraIndex(absl::string_view text);

}  // namespace tessera

#endif  // TESSERA_CORE_CHECKPOINT_INDEX_H_
