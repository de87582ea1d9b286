// safetensors files in and out of a cluster (CLI.md "Serving (v2)"):
//
//   ImportSafetensors(client, "model.safetensors", spec, "m/")
//       one tensor per entry, named "m/" + the entry's name, each laid out by
//       `spec`; all or nothing.
//   ExportSafetensors(client, "out.safetensors",
//   SafetensorsSelection::Prefix("m/"))
//       the selected tensors gathered straight into a mapping of the new
//       file (no copy through host buffers); a failed export leaves no file.
//
// dtypes map one to one: F32 F64 F16 BF16 I8 U8 I16 I32 I64 BOOL (bfloat16
// as its raw 16-bit words on both sides). A malformed file, or a file this
// import cannot take, fails with a message containing "safetensors".
//
// Free functions over a caller's Client; safe to call from several threads
// at once (the Client is thread-safe), on different files.
#ifndef TESSERA_CLIENT_SAFETENSORS_IO_H_
#define TESSERA_CLIENT_SAFETENSORS_IO_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/safetensors_file.h"
#include "client/tessera_client.h"
#include "core/dtype.h"
#include "core/layout_spec.h"
#include "core/tensor_metadata.h"

namespace tessera {

// How many entries an import puts, or an export gathers, at once (each
// one's shards move in parallel too, up to
// ClientOptions::max_parallel_streams).
inline constexpr size_t kSafetensorsParallelEntries = 8;

// The layout of the tensor made from `entry` (e.g. enumerable boxes
// resolved against the entry's shape).
using SafetensorsSpecFn =
    std::function<absl::StatusOr<LayoutSpec>(const SafetensorsEntry& entry)>;

struct SafetensorsImportResult {
  std::vector<TensorMetadata> tensors;  // in the file's data order
  int64_t bytes = 0;                    // data bytes written to the workers
  double seconds = 0;
};

// Creates one tensor per entry of the file at `path`, named prefix + entry
// name; a 0-d entry becomes a tensor of shape [1] (tessera tensors have at
// least one dim) that an export writes back as 0-d, and every tensor keeps
// the file's metadata and its entry's place (FileOrigin). Everything is checked
// before anything is created: the file, each name (CheckTensorName), each
// entry's layout (LayoutBoxes: dims, "invalid sharding dim", bounds, overlap,
// cover) and that no name is taken
// ("already exists"). Then the entries are put straight from the mapped
// file, several at once; if any put fails, no further one starts and every
// tensor this import created is deleted.
absl::StatusOr<SafetensorsImportResult> ImportSafetensors(
    Client& client, const std::string& path, const LayoutSpec& spec,
    const std::string& prefix = "");
absl::StatusOr<SafetensorsImportResult> ImportSafetensors(
    Client& client, const std::string& path, const SafetensorsSpecFn& spec_for,
    const std::string& prefix = "");
// The same from a file already opened (and so validated), e.g. before a
// connection was made.
absl::StatusOr<SafetensorsImportResult> ImportSafetensors(
    Client& client, const SafetensorsReader& file,
    const SafetensorsSpecFn& spec_for, const std::string& prefix = "");

// Loads checkpoint directory `dir` (relative to the workers'
// --checkpoint_root; CLI.md "Checkpoints (v3)"): one tensor per entry, named
// prefix + entry name, laid out by `spec_for` of the entry's shape as kept
// (a 0-d entry as [1]). Names and layouts are checked before anything is
// made; the workers read the bytes; all or nothing.
// `planned` (optional) is told the entries before the load starts (what a
// progress display asks about: Client::ReshardProgress of any of them).
absl::StatusOr<Client::LoadStats> LoadCheckpoint(
    Client& client, const std::string& dir,
    const std::function<absl::StatusOr<LayoutSpec>(const Shape& shape)>&
        spec_for,
    const std::string& prefix = "",
    const std::function<void(const std::vector<Client::LoadEntry>&)>& planned =
        nullptr);

// Which tensors an export writes: the named ones (entry name = tensor
// name), or every tensor whose name starts with a prefix (entry name = the
// rest of the name; the prefix must select at least one tensor, and none
// equal to the prefix itself).
struct SafetensorsSelection {
  std::vector<std::string> names;
  std::string prefix;
  bool by_prefix = false;

  static SafetensorsSelection Names(std::vector<std::string> names) {
    return {std::move(names), "", false};
  }
  static SafetensorsSelection Prefix(std::string prefix) {
    return {{}, std::move(prefix), true};
  }
};

struct SafetensorsExportedEntry {
  std::string tensor;  // the tensor's name in the cluster
  std::string entry;   // its name in the file
  DType dtype = DType::kFloat32;
  Shape shape;
};

struct SafetensorsExportResult {
  std::vector<SafetensorsExportedEntry> entries;  // in the file's data order
  int64_t bytes = 0;                              // data bytes
  int64_t file_bytes = 0;                         // header included
  double seconds = 0;
};

// Writes the selected tensors into a new safetensors file at `path`
// (replacing one that exists, atomically), with `metadata` as its
// "__metadata__". Entries are laid out deterministically (see
// LayoutSafetensors) and each tensor is gathered with Client::GetInto
// straight into the file's mapping.
absl::StatusOr<SafetensorsExportResult> ExportSafetensors(
    Client& client, const std::string& path,
    const SafetensorsSelection& selection,
    const SafetensorsMetadata& metadata = {});

}  // namespace tessera

#endif  // TESSERA_CLIENT_SAFETENSORS_IO_H_
