#include "core/hf_export_plan.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checkpoint_index.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

using Json = nlohmann::ordered_json;

// A tensor's entry: its name, its 0-d shape when it came from a 0-d entry.
struct Entry {
  const TensorMetadata* meta = nullptr;
  std::string name;
  Shape shape;
  int64_t bytes = 0;
};

}  // namespace

std::string HfShardFileName(int64_t k, int64_t n) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, n);
}

absl::StatusOr<HfExportPlan> PlanHfExport(
    const std::vector<TensorMetadata>& metas, const HfExportOptions& options) {
  if (options.max_file_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("export: --max_shard_size must be more than 0 bytes, not ",
                     options.max_file_bytes));
  }
  std::vector<Entry> entries;
  absl::flat_hash_set<std::string> seen;
  for (const TensorMetadata& meta : metas) {
    if (!absl::StartsWith(meta.name, options.strip_prefix) ||
        meta.name.size() == options.strip_prefix.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "export: '", meta.name, "' does not start with '",
          options.strip_prefix, "' followed by a name (--strip_prefix)"));
    }
    Entry& e = entries.emplace_back();
    e.meta = &meta;
    e.name = meta.name.substr(options.strip_prefix.size());
    if (!seen.insert(e.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("export: two tensors are both entry '", e.name, "'"));
    }
    const bool scalar = meta.origin.scalar && meta.shape == Shape{1};
    e.shape = scalar ? Shape{} : meta.shape;
    e.bytes = meta.ByteSize();
  }
  // Files as Hugging Face cuts them: the next tensor opens a new file when
  // it would pass the bound.
  std::vector<std::vector<size_t>> groups;
  int64_t in_group = 0;
  for (size_t t = 0; t < entries.size(); ++t) {
    if (groups.empty() ||
        (!groups.back().empty() &&
         in_group + entries[t].bytes > options.max_file_bytes)) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(t);
    in_group += entries[t].bytes;
  }
  HfExportPlan plan;
  const int64_t n = static_cast<int64_t>(groups.size());
  if (n > kMaxCheckpointFiles) {
    return absl::InvalidArgumentError(absl::StrCat(
        "export: ", n, " files are more than a directory's index names (",
        kMaxCheckpointFiles, "): give a larger --max_shard_size"));
  }
  // Every file's "__metadata__": the tensors' own (as a save keeps them),
  // "format" for Hugging Face's loaders, and the export's mark.
  SafetensorsMetadata metadata;
  for (const TensorMetadata& meta : metas) {
    for (const auto& pair : meta.origin.metadata) {
      if (pair.first != kSavePartKey &&
          std::find(metadata.begin(), metadata.end(), pair) == metadata.end()) {
        metadata.push_back(pair);
      }
    }
  }
  if (std::none_of(metadata.begin(), metadata.end(),
                   [](const auto& p) { return p.first == "format"; })) {
    metadata.emplace_back("format", "pt");
  }
  metadata.emplace_back(kSavePartKey, options.export_id);
  std::map<std::string, HfExportWorker> by_address;
  Json weight_map = Json::object();
  for (int64_t k = 0; k < n; ++k) {
    std::vector<SafetensorsTensor> tensors;
    for (const size_t t : groups[k]) {
      tensors.push_back(
          {entries[t].name, entries[t].meta->dtype, entries[t].shape});
    }
    TESSERA_ASSIGN_OR_RETURN(SafetensorsLayout layout,
                             LayoutSafetensors(std::move(tensors), metadata));
    HfExportFile& file = plan.files.emplace_back();
    file.name = HfShardFileName(k, n);
    file.staging =
        absl::StrCat(".", file.name, ".", options.export_id, ".part");
    file.bytes = layout.file_bytes;
    const int64_t data_offset = static_cast<int64_t>(layout.header.size());
    file.header = std::move(layout.header);
    for (const SafetensorsEntry& placed : layout.entries) {
      weight_map[placed.name] = file.name;
      const size_t t = [&] {
        for (const size_t i : groups[k]) {
          if (entries[i].name == placed.name) return i;
        }
        return groups[k].front();  // unreachable: the layout's own names
      }();
      const TensorMetadata& meta = *entries[t].meta;
      plan.bytes += entries[t].bytes;
      const int64_t item = ItemSize(meta.dtype);
      // The whole tensor's box; a 0-d entry is a tensor of shape [1].
      const Box whole(Shape(meta.shape.size(), 0), meta.shape);
      for (size_t i = 0; i < meta.shards.size(); ++i) {
        if (meta.shards[i].box.NumElements() == 0) continue;
        const ShardLocation from = ReadLocations(meta, i).front();
        if (!from.available) {
          return absl::UnavailableError(
              absl::StrCat("export: shard ", i, " of '", meta.name,
                           "' is unavailable: no live replica (its worker '",
                           from.worker, "' is down)"));
        }
        HfExportWrite write;
        write.file = static_cast<size_t>(k);
        write.shard_id = from.shard_id;
        write.tensor = meta.name;
        write.version = meta.version;
        write.runs = PlanFileRuns(whole, data_offset + placed.begin,
                                  meta.shards[i].box, item);
        write.bytes = meta.shards[i].box.NumElements() * item;
        HfExportWorker& worker = by_address[from.address];
        worker.worker = from.worker;
        worker.address = from.address;
        worker.writes.push_back(std::move(write));
      }
    }
  }
  for (auto& [address, worker] : by_address) {
    plan.workers.push_back(std::move(worker));
  }
  Json index;
  index["metadata"] = {{"total_size", plan.bytes}};
  index["weight_map"] = std::move(weight_map);
  plan.index = index.dump(2) + "\n";
  return plan;
}

}  // namespace tessera
