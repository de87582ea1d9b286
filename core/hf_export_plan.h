// HfExportPlan: how `tessera export --hf` lays tensors out as a Hugging
// Face sharded directory (model-0000K-of-0000N.safetensors and
// model.safetensors.index.json), decided before any byte moves. Each
// tensor is one whole entry of one file; the files are cut as Hugging
// Face's own writers cut them (a file takes tensors until the next would
// pass max_file_bytes; a larger tensor has a file of its own). Each
// shard's first available replica writes its bytes into the file at their
// row-major place (core/file_runs), so several workers fill one file and
// no byte goes through the coordinator or the client. Files are filled
// under staging names and renamed into place once whole. Pure.
#ifndef TESSERA_CORE_HF_EXPORT_PLAN_H_
#define TESSERA_CORE_HF_EXPORT_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_runs.h"
#include "core/tensor_metadata.h"

namespace tessera {

// Hugging Face's default file bound ("5GB").
inline constexpr int64_t kHfDefaultFileBytes = int64_t{5} * 1000 * 1000 * 1000;

struct HfExportOptions {
  // Marks the files ("__metadata__" kSavePartKey) and names their staging
  // copies: a failed export's are found and removed by it.
  std::string export_id;
  // Dropped from every tensor's name; each name must start with it.
  std::string strip_prefix;
  int64_t max_file_bytes = kHfDefaultFileBytes;
};

// One shard's bytes into one file: `runs` (file order) of shard
// `shard_id`, which must be of `tensor` at `version`.
struct HfExportWrite {
  size_t file = 0;  // into the plan's files
  uint64_t shard_id = 0;
  std::string tensor;
  uint64_t version = 0;
  std::vector<FileRun> runs;
  int64_t bytes = 0;
};
struct HfExportWorker {
  std::string worker;
  std::string address;
  std::vector<HfExportWrite> writes;
};
struct HfExportFile {
  std::string name;     // model-0000K-of-0000N.safetensors
  std::string staging;  // where it is made and filled first
  std::string header;   // its first bytes (length prefix included)
  int64_t bytes = 0;    // its whole size
};
struct HfExportPlan {
  std::vector<HfExportFile> files;
  std::vector<HfExportWorker> workers;  // by address
  std::string index;                    // model.safetensors.index.json
  int64_t bytes = 0;                    // the tensors' bytes
};

// `metas` (in the order their entries go) with their workers' state filled
// in. INVALID_ARGUMENT for a name without the prefix, or two tensors of one
// entry name; UNAVAILABLE naming the shard when a shard has no live
// replica.
absl::StatusOr<HfExportPlan> PlanHfExport(
    const std::vector<TensorMetadata>& metas, const HfExportOptions& options);

// The name of file `k` (from 0) of `n`: "model-00001-of-00003.safetensors".
std::string HfShardFileName(int64_t k, int64_t n);

}  // namespace tessera

#endif  // TESSERA_CORE_HF_EXPORT_PLAN_H_
