// The --json printers of the `tessera` CLI, in exactly the shapes CLI.md
// gives. Each returns one line of JSON (no trailing newline), formatted as
// Python's json.dumps does: ", " between items and ": " after keys.
// Integers are JSON numbers; strings are escaped. Pure functions.
#ifndef TESSERA_CLIENT_JSON_OUTPUT_H_
#define TESSERA_CLIENT_JSON_OUTPUT_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/safetensors_io.h"
#include "client/tessera_client.h"
#include "core/json.h"
#include "core/tensor_metadata.h"

namespace tessera {

// `describe --json`: {"name", "shape", "dtype", "version", "shards": [
// {"offsets", "sizes", "placement", "worker", "handle", "available"}, ...]}.
std::string DescribeJson(const TensorMetadata& meta);

// `ls --json`: [{"name", "shape", "dtype", "version", "num_shards"}, ...].
std::string TensorListJson(const std::vector<TensorInfo>& tensors);
// `quota --json`: [{"principal", "bytes", "bytes_limit", "names",
// "names_limit"}], a limit null where there is none.
std::string QuotasJson(const std::vector<QuotaInfo>& quotas);

// `workers --json`: [{"name", "rank", "address", "device", "alive",
// "bytes_used"}, ...].
std::string CoordinatorsJson(const std::vector<CoordinatorStatus>& list);
std::string WorkersJson(const std::vector<WorkerInfo>& workers);

// `reshard --json`: {"version", "pieces_moved", "bytes_moved",
// "bytes_copied_locally", "shards_kept", "seconds", "sent"}. In every
// write's and reshard's JSON, "sent": {WORKER: BYTES} is what each worker
// sent to others to fill replicas and mirrors or move pieces (CLI.md
// "Relay"); {} when none did.
std::string ReshardJson(const ReshardStats& stats);

// `create --json`: {"name", "shape", "dtype", "version", "num_shards",
// "bytes", "seconds", "sent"}.
std::string TensorJson(const TensorMetadata& meta, int64_t bytes,
                       double seconds, const SentBytes& sent);

// `put --json`: TensorJson's and "relayed_bytes", what the commit's copies
// sent between workers in all (the total of "sent").
std::string PutJson(const TensorMetadata& meta, int64_t bytes, double seconds,
                    const SentBytes& sent);

// `put --update --json`: {"version", "bytes_written", "shards_kept",
// "seconds", "sent", "relayed_bytes"}.
std::string UpdateJson(const UpdateStats& stats, const SentBytes& sent);

// `rm --json`: {"name", "deleted": true}.
std::string RemoveJson(const std::string& name);

// `get --json`: {"name", "shape", "dtype", "version", "bytes", "seconds",
// "transport": {"shm": B, "ucx": B, "grpc": B}} (the output's shape and
// data bytes; bytes per transport as moved for this get, transports that
// moved nothing left out), and "fallbacks": {TRANSPORT: N} when a
// transport declined moves (could not start here, or reach a worker) and
// left them to the next. Bytes and transport differ for `--rows` with
// repeated indices: each distinct row moves once. "replicas": {WORKER: B}
// gives the bytes each worker served (CLI.md "Replicas (v3)").
std::string GetJson(const std::string& name, const Shape& shape, DType dtype,
                    uint64_t version, int64_t bytes, double seconds,
                    const DataPlaneStats& moved);

// `import --json`: {"file", "tensors": [{"name", "shape", "dtype",
// "version", "num_shards"}, ...], "bytes", "seconds", "sent"}.
// `load --json`: {"dir", "tensors", "bytes", "bytes_read", "seconds",
// "sent"}.
std::string LoadJson(const std::string& dir, const Client::LoadStats& stats,
                     const SentBytes& sent);
// save --json: {"dir", "tensors": [names], "bytes", "files", "seconds"}.
std::string SaveJson(const std::string& dir, const Client::SaveStats& stats);

std::string ImportJson(const std::string& file,
                       const SafetensorsImportResult& result,
                       const SentBytes& sent);

// `export --json`: {"file", "entries": [{"entry", "tensor", "shape",
// "dtype"}, ...], "bytes", "file_bytes", "seconds"} (bytes: the data).
std::string ExportJson(const std::string& file,
                       const SafetensorsExportResult& result);

}  // namespace tessera

#endif  // TESSERA_CLIENT_JSON_OUTPUT_H_
