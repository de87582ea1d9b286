// The checkpoint files a worker reads (CLI.md "Checkpoints (v3)"): every
// path is opened beneath the worker's --checkpoint_root with openat2's
// RESOLVE_BENEATH, so a directory or file name that is absolute, climbs
// with "..", or follows a symlink out of the root is refused by the
// kernel, not by string checks alone. A directory is a Hugging Face model
// directory: one .safetensors file, or several named by
// model.safetensors.index.json, or a checkpoint `tessera save` wrote (its
// tessera.json says where each tensor's pieces lie). Files are written
// whole or not at all: to a temporary name, synced, then renamed.
//
// Errors say `checkpoint_root` (where the path goes) or `checkpoint` (what
// the files hold). Thread-safe: no state beyond the root's path.
#ifndef TESSERA_WORKER_CHECKPOINT_FILES_H_
#define TESSERA_WORKER_CHECKPOINT_FILES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/checkpoint_index.h"
#include "core/dtype.h"
#include "core/file_runs.h"

namespace tessera {

// How a load reads its runs (core/file_runs CoalesceRuns): gaps up to a
// page joined (within the over-read bound), reads of at most 8 MiB, so a
// worker's memory for a load stays within a read buffer per order.
inline constexpr int64_t kLoadMaxGapBytes = 4096;
inline constexpr int64_t kLoadSpanBytes = int64_t{8} << 20;

class CheckpointRoot {
 public:
  // An empty root: every call fails with `checkpoint_root`.
  explicit CheckpointRoot(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }

  // What directory `dir` (relative to the root) holds.
  absl::StatusOr<CheckpointListing> List(absl::string_view dir) const;

  // Reads `runs` (in file order) of file `file` in `dir` as few reads (at
  // most `max_gap` bytes read between two runs, reads of at most
  // `max_span`), handing each run's bytes, in file order, to
  // `land(run, bytes)` (a run longer than `max_span` comes in parts).
  // Returns the bytes read from the file. A run past the file's end is
  // `checkpoint` ("shorter than"), nothing more is read.
  absl::StatusOr<int64_t> ReadRuns(
      absl::string_view dir, absl::string_view file,
      absl::Span<const FileRun> runs, int64_t max_gap, int64_t max_span,
      const std::function<absl::Status(const FileRun& run,
                                       absl::string_view bytes)>& land) const;

  // Writes file `name` in `dir` (made, with its parents, when missing):
  // `fill(fd)` writes its bytes to `fd` from offset 0; the file is synced
  // and renamed into place, then the directory synced. A failure leaves
  // no trace (the temporary file is removed) and any earlier file of the
  // name as it was. Returns the file's size.
  absl::StatusOr<int64_t> WriteFile(
      absl::string_view dir, absl::string_view name,
      const std::function<absl::Status(int fd)>& fill) const;

  // Writes `runs` (in file order, each inside the data section) into file
  // `file` of `dir`, which save `save_id` made (its header's
  // "__metadata__" says so: no other file is ever written into), then syncs
  // it. `source(run, scratch)` gives each run's bytes (a run longer than
  // `max_span` comes in parts), either a view of memory it keeps or
  // `scratch` filled. The file is neither made nor cut here. Returns the
  // bytes written.
  absl::StatusOr<int64_t> WriteRuns(
      absl::string_view dir, absl::string_view file, absl::string_view save_id,
      absl::Span<const FileRun> runs, int64_t max_span,
      const std::function<absl::StatusOr<absl::string_view>(
          const FileRun& run, std::string* scratch)>& source) const;

  // Puts the files of save `save_id` in `dir` into place: the directory's
  // index files go first (so that no index names a mix of old and new
  // files), then each `from` (a file of that save) is renamed `to` (a
  // .safetensors name), then the directory is synced.
  absl::Status Publish(
      absl::string_view dir, absl::string_view save_id,
      absl::Span<const std::pair<std::string, std::string>> renames) const;

  // Removes the files `names` of `dir` that the save `save_id` wrote: a
  // safetensors file whose "__metadata__" says that id (plain names only;
  // missing ones are no error). A file not of that save is left alone and
  // logged: an index names what its author wants, not what tessera wrote.
  absl::Status RemoveFiles(absl::string_view dir,
                           absl::Span<const std::string> names,
                           absl::string_view save_id) const;

 private:
  std::string root_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CHECKPOINT_FILES_H_
