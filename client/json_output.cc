#include "client/json_output.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tessera {
namespace {

std::string JsonIntList(absl::Span<const int64_t> values) {
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

const char* JsonBool(bool value) { return value ? "true" : "false"; }

// A finite double as a JSON number (JSON has no NaN or infinity).
std::string JsonDouble(double value) {
  if (!std::isfinite(value)) return "0";
  return absl::StrFormat("%.6f", value);
}

// Appends `"key": value` with the separator json.dumps uses.
void Field(std::string* out, absl::string_view key, absl::string_view value) {
  if (out->back() != '{') out->append(", ");
  absl::StrAppend(out, JsonString(key), ": ", value);
}

}  // namespace

std::string DescribeJson(const TensorMetadata& meta) {
  std::string out = "{";
  Field(&out, "name", JsonString(meta.name));
  Field(&out, "shape", JsonIntList(meta.shape));
  Field(&out, "dtype", JsonString(DTypeName(meta.dtype)));
  Field(&out, "version", absl::StrCat(meta.version));
  std::vector<std::string> shards;
  shards.reserve(meta.shards.size());
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    const ShardInfo& shard = meta.shards[i];
    const Replica& shown = ShownReplica(shard);
    std::string s = "{";
    Field(&s, "offsets", JsonIntList(shard.box.offsets));
    Field(&s, "sizes", JsonIntList(shard.box.sizes));
    Field(&s, "placement", JsonString(shown.PlacementString()));
    Field(&s, "worker", JsonString(shown.worker));
    Field(&s, "handle", JsonString(meta.HandleString(i)));
    Field(&s, "available", JsonBool(shown.available));
    std::vector<std::string> replicas;
    for (const Replica& r : shard.replicas) {
      std::string item = "{";
      Field(&item, "worker", JsonString(r.worker));
      Field(&item, "placement", JsonString(r.PlacementString()));
      Field(&item, "available", JsonBool(r.available));
      replicas.push_back(item + "}");
    }
    Field(&s, "replicas",
          absl::StrCat("[", absl::StrJoin(replicas, ", "), "]"));
    s += "}";
    shards.push_back(std::move(s));
  }
  Field(&out, "shards", absl::StrCat("[", absl::StrJoin(shards, ", "), "]"));
  if (!meta.pending.empty()) Field(&out, "pending", JsonString(meta.pending));
  out += "}";
  return out;
}

std::string TensorListJson(const std::vector<TensorInfo>& tensors) {
  std::vector<std::string> items;
  items.reserve(tensors.size());
  for (const TensorInfo& t : tensors) {
    std::string s = "{";
    Field(&s, "name", JsonString(t.name));
    Field(&s, "shape", JsonIntList(t.shape));
    Field(&s, "dtype", JsonString(DTypeName(t.dtype)));
    Field(&s, "version", absl::StrCat(t.version));
    Field(&s, "num_shards", absl::StrCat(t.num_shards));
    Field(&s, "replicas", absl::StrCat(t.replicas));
    if (!t.pending.empty()) {
      std::string p = "{";
      Field(&p, "change", JsonString(t.pending));
      Field(&p, "version", absl::StrCat(t.pending_version));
      Field(&p, "owner", JsonString(t.pending_owner));
      Field(&p, "since",
            JsonString(absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t.pending_since,
                                        absl::UTCTimeZone())));
      p += "}";
      Field(&s, "pending", p);
    }
    s += "}";
    items.push_back(std::move(s));
  }
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

std::string WorkersJson(const std::vector<WorkerInfo>& workers) {
  std::vector<std::string> items;
  items.reserve(workers.size());
  for (const WorkerInfo& w : workers) {
    std::string s = "{";
    Field(&s, "name", JsonString(w.name));
    Field(&s, "rank", absl::StrCat(w.rank));
    Field(&s, "address", JsonString(w.address));
    Field(&s, "device", JsonString(w.device.ToString()));
    Field(&s, "alive", JsonBool(w.alive));
    Field(&s, "bytes_used", absl::StrCat(w.bytes_used));
    Field(&s, "zone", JsonString(w.zone));
    Field(&s, "state", JsonString(WorkerStateName(w.state)));
    s += "}";
    items.push_back(std::move(s));
  }
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

std::string ReshardJson(const ReshardStats& stats) {
  std::string out = "{";
  Field(&out, "version", absl::StrCat(stats.version));
  Field(&out, "pieces_moved", absl::StrCat(stats.pieces_moved));
  Field(&out, "bytes_moved", absl::StrCat(stats.bytes_moved));
  Field(&out, "bytes_copied_locally", absl::StrCat(stats.bytes_copied_locally));
  Field(&out, "shards_kept", absl::StrCat(stats.shards_kept));
  Field(&out, "seconds", JsonDouble(stats.seconds));
  out += "}";
  return out;
}

std::string TensorJson(const TensorMetadata& meta, int64_t bytes,
                       double seconds) {
  std::string out = "{";
  Field(&out, "name", JsonString(meta.name));
  Field(&out, "shape", JsonIntList(meta.shape));
  Field(&out, "dtype", JsonString(DTypeName(meta.dtype)));
  Field(&out, "version", absl::StrCat(meta.version));
  Field(&out, "num_shards", absl::StrCat(meta.shards.size()));
  Field(&out, "bytes", absl::StrCat(bytes));
  Field(&out, "seconds", JsonDouble(seconds));
  out += "}";
  return out;
}

std::string UpdateJson(const UpdateStats& stats) {
  std::string out = "{";
  Field(&out, "version", absl::StrCat(stats.version));
  Field(&out, "bytes_written", absl::StrCat(stats.bytes_written));
  Field(&out, "shards_kept", absl::StrCat(stats.shards_kept));
  Field(&out, "seconds", JsonDouble(stats.seconds));
  out += "}";
  return out;
}

std::string RemoveJson(const std::string& name) {
  std::string out = "{";
  Field(&out, "name", JsonString(name));
  Field(&out, "deleted", "true");
  out += "}";
  return out;
}

std::string GetJson(const std::string& name, const Shape& shape, DType dtype,
                    uint64_t version, int64_t bytes, double seconds,
                    const DataPlaneStats& moved) {
  // The transports in the order CLI.md lists them, then any other.
  std::string transport = "{";
  auto add = [&](const std::string& key, int64_t value) {
    if (value > 0) Field(&transport, key, absl::StrCat(value));
  };
  for (const char* key : {"shm", "ucx", "grpc"}) {
    auto it = moved.bytes.find(key);
    if (it != moved.bytes.end()) add(key, it->second);
  }
  for (const auto& [key, value] : moved.bytes) {
    if (key != "shm" && key != "ucx" && key != "grpc") add(key, value);
  }
  transport += "}";
  // Moves a transport declined (it could not start, or reach a worker),
  // left to the next.
  std::string fallbacks = "{";
  for (const auto& [key, value] : moved.fallbacks) {
    if (value > 0) Field(&fallbacks, key, absl::StrCat(value));
  }
  fallbacks += "}";
  // The bytes each worker served (which replicas the reads used).
  std::string replicas = "{";
  for (const auto& [worker, served] : moved.served) {
    if (served > 0) Field(&replicas, worker, absl::StrCat(served));
  }
  replicas += "}";
  std::string out = "{";
  Field(&out, "name", JsonString(name));
  Field(&out, "shape", JsonIntList(shape));
  Field(&out, "dtype", JsonString(DTypeName(dtype)));
  Field(&out, "version", absl::StrCat(version));
  Field(&out, "bytes", absl::StrCat(bytes));
  Field(&out, "seconds", JsonDouble(seconds));
  Field(&out, "transport", transport);
  if (fallbacks != "{}") Field(&out, "fallbacks", fallbacks);
  Field(&out, "replicas", replicas);
  out += "}";
  return out;
}

std::string ImportJson(const std::string& file,
                       const SafetensorsImportResult& result) {
  std::vector<std::string> items;
  items.reserve(result.tensors.size());
  for (const TensorMetadata& t : result.tensors) {
    std::string s = "{";
    Field(&s, "name", JsonString(t.name));
    Field(&s, "shape", JsonIntList(t.shape));
    Field(&s, "dtype", JsonString(DTypeName(t.dtype)));
    Field(&s, "version", absl::StrCat(t.version));
    Field(&s, "num_shards", absl::StrCat(t.shards.size()));
    s += "}";
    items.push_back(std::move(s));
  }
  std::string out = "{";
  Field(&out, "file", JsonString(file));
  Field(&out, "tensors", absl::StrCat("[", absl::StrJoin(items, ", "), "]"));
  Field(&out, "bytes", absl::StrCat(result.bytes));
  Field(&out, "seconds", JsonDouble(result.seconds));
  out += "}";
  return out;
}

std::string ExportJson(const std::string& file,
                       const SafetensorsExportResult& result) {
  std::vector<std::string> items;
  items.reserve(result.entries.size());
  for (const SafetensorsExportedEntry& e : result.entries) {
    std::string s = "{";
    Field(&s, "entry", JsonString(e.entry));
    Field(&s, "tensor", JsonString(e.tensor));
    Field(&s, "shape", JsonIntList(e.shape));
    Field(&s, "dtype", JsonString(DTypeName(e.dtype)));
    s += "}";
    items.push_back(std::move(s));
  }
  std::string out = "{";
  Field(&out, "file", JsonString(file));
  Field(&out, "entries", absl::StrCat("[", absl::StrJoin(items, ", "), "]"));
  Field(&out, "bytes", absl::StrCat(result.bytes));
  Field(&out, "file_bytes", absl::StrCat(result.file_bytes));
  Field(&out, "seconds", JsonDouble(result.seconds));
  out += "}";
  return out;
}

}  // namespace tessera
