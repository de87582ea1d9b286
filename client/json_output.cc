#include "client/json_output.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

// Objects keep their keys in insertion order: the order CLI.md lists them.
using Json = nlohmann::ordered_json;

// A real number as the CLI prints it: six decimals (seconds).
struct Seconds {
  double value;
};
void to_json(Json& j, const Seconds& s) {
  // JSON has no NaN or infinity.
  j = std::isfinite(s.value) ? s.value : 0.0;
}

// A scalar's text; bytes that are not UTF-8 (a file name) become U+FFFD
// rather than an exception.
std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Renders `j` on one line with the separators Python's json.dumps uses
// (", " and ": "), reals with six decimals. Strings and keys are escaped
// by nlohmann.
void Render(const Json& j, std::string* out) {
  switch (j.type()) {
    case Json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, value] : j.items()) {
        if (!first) out->append(", ");
        first = false;
        absl::StrAppend(out, Dump(Json(key)), ": ");
        Render(value, out);
      }
      out->push_back('}');
      return;
    }
    case Json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const Json& value : j) {
        if (!first) out->append(", ");
        first = false;
        Render(value, out);
      }
      out->push_back(']');
      return;
    }
    case Json::value_t::number_float:
      absl::StrAppend(out, absl::StrFormat("%.6f", j.get<double>()));
      return;
    default:
      out->append(Dump(j));
  }
}

std::string Dumps(const Json& j) {
  std::string out;
  Render(j, &out);
  return out;
}

Json Ints(absl::Span<const int64_t> values) {
  return Json(std::vector<int64_t>(values.begin(), values.end()));
}

}  // namespace

std::string DescribeJson(const TensorMetadata& meta) {
  Json shards = Json::array();
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    const ShardInfo& shard = meta.shards[i];
    const Replica& shown = ShownReplica(shard);
    Json replicas = Json::array();
    for (const Replica& r : shard.replicas) {
      Json replica = {{"worker", r.worker},
                      {"placement", r.PlacementString()},
                      {"available", r.available}};
      if (r.mirror) replica["mirror"] = true;
      replicas.push_back(std::move(replica));
    }
    shards.push_back({{"offsets", Ints(shard.box.offsets)},
                      {"sizes", Ints(shard.box.sizes)},
                      {"placement", shown.PlacementString()},
                      {"worker", shown.worker},
                      {"handle", meta.HandleString(i)},
                      {"available", shown.available},
                      {"replicas", std::move(replicas)}});
  }
  Json out = {{"name", meta.name},
              {"shape", Ints(meta.shape)},
              {"dtype", std::string(DTypeName(meta.dtype))},
              {"version", meta.version},
              {"owner", meta.owner.empty() ? Json(nullptr) : Json(meta.owner)},
              {"shards", std::move(shards)}};
  if (!meta.mirror.empty()) out["mirror"] = meta.mirror;
  if (!meta.pending.empty()) out["pending"] = meta.pending;
  return Dumps(out);
}

std::string QuotasJson(const std::vector<QuotaInfo>& quotas) {
  Json items = Json::array();
  // null: unlimited.
  auto limit = [](int64_t value) {
    return value < 0 ? Json(nullptr) : Json(value);
  };
  for (const QuotaInfo& q : quotas) {
    items.push_back({{"principal", q.principal},
                     {"bytes", q.bytes},
                     {"bytes_limit", limit(q.bytes_limit)},
                     {"names", q.names},
                     {"names_limit", limit(q.names_limit)}});
  }
  return Dumps(items);
}

std::string TensorListJson(const std::vector<TensorInfo>& tensors) {
  Json items = Json::array();
  for (const TensorInfo& t : tensors) {
    Json item = {{"name", t.name},
                 {"shape", Ints(t.shape)},
                 {"dtype", std::string(DTypeName(t.dtype))},
                 {"version", t.version},
                 {"num_shards", t.num_shards},
                 {"replicas", t.replicas}};
    if (!t.mirror.empty()) item["mirror"] = t.mirror;
    if (!t.pending.empty()) {
      item["pending"] = {
          {"change", t.pending},
          {"version", t.pending_version},
          {"owner", t.pending_owner},
          {"since", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t.pending_since,
                                     absl::UTCTimeZone())}};
    }
    items.push_back(std::move(item));
  }
  return Dumps(items);
}

std::string WorkersJson(const std::vector<WorkerInfo>& workers) {
  Json items = Json::array();
  for (const WorkerInfo& w : workers) {
    items.push_back({{"name", w.name},
                     {"rank", w.rank},
                     {"address", w.address},
                     {"device", w.device.ToString()},
                     {"alive", w.alive},
                     {"bytes_used", w.bytes_used},
                     {"zone", w.zone},
                     {"data_address", w.data_address},
                     {"labels", Json(w.labels)},
                     {"state", std::string(WorkerStateName(w.state))}});
  }
  return Dumps(items);
}

std::string CoordinatorsJson(const std::vector<CoordinatorStatus>& list) {
  Json items = Json::array();
  for (const CoordinatorStatus& c : list) {
    items.push_back(
        {{"address", c.address}, {"role", c.role}, {"alive", c.alive}});
  }
  return Dumps(items);
}

std::string ReshardJson(const ReshardStats& stats) {
  return Dumps({{"version", stats.version},
                {"pieces_moved", stats.pieces_moved},
                {"bytes_moved", stats.bytes_moved},
                {"bytes_copied_locally", stats.bytes_copied_locally},
                {"shards_kept", stats.shards_kept},
                {"seconds", Seconds{stats.seconds}},
                {"sent", Json(stats.sent)}});
}

namespace {

Json TensorObject(const TensorMetadata& meta, int64_t bytes, double seconds,
                  const SentBytes& sent) {
  return {{"name", meta.name},
          {"shape", Ints(meta.shape)},
          {"dtype", std::string(DTypeName(meta.dtype))},
          {"version", meta.version},
          {"num_shards", meta.shards.size()},
          {"bytes", bytes},
          {"seconds", Seconds{seconds}},
          {"sent", Json(sent)}};
}

}  // namespace

std::string TensorJson(const TensorMetadata& meta, int64_t bytes,
                       double seconds, const SentBytes& sent) {
  return Dumps(TensorObject(meta, bytes, seconds, sent));
}

std::string PutJson(const TensorMetadata& meta, int64_t bytes, double seconds,
                    const SentBytes& sent) {
  Json out = TensorObject(meta, bytes, seconds, sent);
  out["relayed_bytes"] = TotalSent(sent);
  return Dumps(out);
}

std::string UpdateJson(const UpdateStats& stats, const SentBytes& sent) {
  return Dumps({{"version", stats.version},
                {"bytes_written", stats.bytes_written},
                {"shards_kept", stats.shards_kept},
                {"seconds", Seconds{stats.seconds}},
                {"sent", Json(sent)},
                {"relayed_bytes", TotalSent(sent)}});
}

std::string RemoveJson(const std::string& name) {
  return Dumps({{"name", name}, {"deleted", true}});
}

std::string GetJson(const std::string& name, const Shape& shape, DType dtype,
                    uint64_t version, int64_t bytes, double seconds,
                    const DataPlaneStats& moved) {
  // The transports in the order CLI.md lists them, then any other.
  Json transport = Json::object();
  for (const char* key : {"shm", "ucx", "grpc"}) {
    auto it = moved.bytes.find(key);
    if (it != moved.bytes.end() && it->second > 0) transport[key] = it->second;
  }
  for (const auto& [key, value] : moved.bytes) {
    if (key != "shm" && key != "ucx" && key != "grpc" && value > 0)
      transport[key] = value;
  }
  // Moves a transport declined (it could not start, or reach a worker),
  // left to the next.
  Json fallbacks = Json::object();
  for (const auto& [key, value] : moved.fallbacks) {
    if (value > 0) fallbacks[key] = value;
  }
  // The bytes each worker served (which replicas the reads used).
  Json replicas = Json::object();
  for (const auto& [worker, served] : moved.served) {
    if (served > 0) replicas[worker] = served;
  }
  Json out = {{"name", name},
              {"shape", Ints(shape)},
              {"dtype", std::string(DTypeName(dtype))},
              {"version", version},
              {"bytes", bytes},
              {"seconds", Seconds{seconds}},
              {"transport", std::move(transport)}};
  if (!fallbacks.empty()) out["fallbacks"] = std::move(fallbacks);
  out["replicas"] = std::move(replicas);
  return Dumps(out);
}

std::string ImportJson(const std::string& file,
                       const SafetensorsImportResult& result,
                       const SentBytes& sent) {
  Json tensors = Json::array();
  for (const TensorMetadata& t : result.tensors) {
    tensors.push_back({{"name", t.name},
                       {"shape", Ints(t.shape)},
                       {"dtype", std::string(DTypeName(t.dtype))},
                       {"version", t.version},
                       {"num_shards", t.shards.size()}});
  }
  return Dumps({{"file", file},
                {"tensors", std::move(tensors)},
                {"bytes", result.bytes},
                {"seconds", Seconds{result.seconds}},
                {"sent", Json(sent)}});
}

std::string LoadJson(const std::string& dir, const Client::LoadStats& stats,
                     const SentBytes& sent) {
  Json tensors = Json::array();
  for (const TensorInfo& t : stats.tensors) {
    tensors.push_back({{"name", t.name},
                       {"shape", Ints(t.shape)},
                       {"dtype", std::string(DTypeName(t.dtype))},
                       {"version", t.version},
                       {"num_shards", t.num_shards}});
  }
  return Dumps({{"dir", dir},
                {"tensors", std::move(tensors)},
                {"bytes", stats.bytes},
                {"bytes_read", stats.bytes_read},
                {"seconds", Seconds{stats.seconds}},
                {"sent", Json(sent)}});
}

std::string SaveJson(const std::string& dir, const Client::SaveStats& stats) {
  return Dumps({{"dir", dir},
                {"tensors", stats.tensors},
                {"bytes", stats.bytes},
                {"files", stats.files},
                {"seconds", Seconds{stats.seconds}}});
}

std::string ExportJson(const std::string& file,
                       const SafetensorsExportResult& result) {
  Json entries = Json::array();
  for (const SafetensorsExportedEntry& e : result.entries) {
    entries.push_back({{"entry", e.entry},
                       {"tensor", e.tensor},
                       {"shape", Ints(e.shape)},
                       {"dtype", std::string(DTypeName(e.dtype))}});
  }
  return Dumps({{"file", file},
                {"entries", std::move(entries)},
                {"bytes", result.bytes},
                {"file_bytes", result.file_bytes},
                {"seconds", Seconds{result.seconds}}});
}

}  // namespace tessera
