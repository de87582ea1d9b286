#include "client/safetensors_io.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/errors.h"
#include "core/fan_out.h"
#include "core/json.h"
#include "core/placement.h"
#include "core/status_macros.h"

namespace tessera {
namespace {

std::string EntryContext(const std::string& path, const SafetensorsEntry& e) {
  return absl::StrCat("safetensors file '", path, "', entry ",
                      JsonString(e.name));
}

// Runs fn(0..n-1) on up to kSafetensorsParallelEntries threads (this one
// included). After a failure no new index starts.
absl::Status ForEachEntry(size_t n,
                          const std::function<absl::Status(size_t)>& fn) {
  return FanOut(n, kSafetensorsParallelEntries, fn);
}

// An entry as tessera keeps it: a 0-d entry as shape [1].
SafetensorsEntry AsKept(const SafetensorsEntry& entry) {
  SafetensorsEntry kept = entry;
  if (kept.shape.empty()) kept.shape = {1};
  return kept;
}

}  // namespace

absl::StatusOr<SafetensorsImportResult> ImportSafetensors(
    Client& client, const std::string& path, const LayoutSpec& spec,
    const std::string& prefix) {
  return ImportSafetensors(
      client, path,
      [&spec](const SafetensorsEntry&) -> absl::StatusOr<LayoutSpec> {
        return spec;
      },
      prefix);
}

absl::StatusOr<SafetensorsImportResult> ImportSafetensors(
    Client& client, const std::string& path, const SafetensorsSpecFn& spec_for,
    const std::string& prefix) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> file,
                           SafetensorsReader::Open(path));
  return ImportSafetensors(client, *file, spec_for, prefix);
}

absl::StatusOr<SafetensorsImportResult> ImportSafetensors(
    Client& client, const SafetensorsReader& reader,
    const SafetensorsSpecFn& spec_for, const std::string& prefix) {
  const absl::Time start = absl::Now();
  const std::string& path = reader.path();
  const std::vector<SafetensorsEntry>& entries = reader.entries();

  // Everything that can be checked before a tensor exists.
  // Each tensor keeps the file's metadata and its entry's place, so that an
  // export gives the file back as it was.
  FileOrigin origin;
  origin.metadata = reader.header().metadata;
  if (absl::Status s = CheckFileOrigin(origin); !s.ok()) {
    return Annotate(s, absl::StrCat("safetensors file '", path,
                                    "': its __metadata__ is more than "
                                    "tessera keeps with each tensor"));
  }
  std::vector<LayoutSpec> specs;
  specs.reserve(entries.size());
  absl::flat_hash_set<std::string> names;
  for (const SafetensorsEntry& e : entries) {
    const std::string context = EntryContext(path, e);
    const std::string name = prefix + e.name;
    if (absl::Status s = CheckTensorName(name); !s.ok()) {
      return Annotate(s,
                      absl::StrCat(context, " as tensor ", JsonString(name)));
    }
    // A 0-d entry is kept as shape [1] (tessera tensors have at least one
    // dim) and laid out as one.
    const SafetensorsEntry as_kept = AsKept(e);
    absl::StatusOr<LayoutSpec> spec = spec_for(as_kept);
    if (!spec.ok()) return Annotate(spec.status(), context);
    if (absl::Status s = LayoutBoxes(as_kept.shape, *spec).status(); !s.ok()) {
      return Annotate(s, context);
    }
    specs.push_back(*std::move(spec));
    names.insert(name);
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<TensorInfo> existing, client.List());
  for (const TensorInfo& t : existing) {
    if (names.contains(t.name)) {
      return Annotate(AlreadyExistsError("tensor", t.name),
                      absl::StrCat("importing safetensors file '", path, "'"));
    }
  }

  // All or nothing: what was made is deleted unless every entry went in.
  std::vector<std::optional<TensorMetadata>> made(entries.size());
  absl::Status status = ForEachEntry(entries.size(), [&](size_t i) {
    const SafetensorsEntry& e = entries[i];
    FileOrigin mine = origin;
    mine.entry = static_cast<int64_t>(i) + 1;
    mine.scalar = e.shape.empty();
    absl::StatusOr<TensorMetadata> meta =
        client.Put(prefix + e.name, AsKept(e).shape, e.dtype, reader.data(e),
                   specs[i], mine);
    if (!meta.ok()) return Annotate(meta.status(), EntryContext(path, e));
    made[i] = *std::move(meta);
    return absl::OkStatus();
  });
  if (!status.ok()) {
    for (const std::optional<TensorMetadata>& meta : made) {
      // This import's tensors only, never later ones of their names.
      if (meta.has_value()) {
        client.Delete(meta->name, meta->incarnation).IgnoreError();
      }
    }
    return status;
  }
  SafetensorsImportResult result;
  for (size_t i = 0; i < entries.size(); ++i) {
    result.tensors.push_back(*std::move(made[i]));
    result.bytes += entries[i].num_bytes();
  }
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

absl::StatusOr<Client::LoadStats> LoadCheckpoint(
    Client& client, const std::string& dir,
    const std::function<absl::StatusOr<LayoutSpec>(const Shape& shape)>&
        spec_for,
    const std::string& prefix,
    const std::function<void(const std::vector<Client::LoadEntry>&)>& planned) {
  TESSERA_ASSIGN_OR_RETURN(const CheckpointListing listing,
                           client.DescribeCheckpoint(dir));
  std::vector<Client::LoadEntry> entries;
  entries.reserve(listing.entries.size());
  for (const CheckpointEntry& e : listing.entries) {
    const std::string name = prefix + e.name;
    const std::string context =
        absl::StrCat("checkpoint '", dir, "' entry ", JsonString(e.name));
    if (absl::Status s = CheckTensorName(name); !s.ok()) {
      return Annotate(s,
                      absl::StrCat(context, " as tensor ", JsonString(name)));
    }
    const Shape kept = e.shape.empty() ? Shape{1} : e.shape;
    absl::StatusOr<LayoutSpec> spec = spec_for(kept);
    if (!spec.ok()) return Annotate(spec.status(), context);
    if (absl::Status s = LayoutBoxes(kept, *spec).status(); !s.ok()) {
      return Annotate(s, context);
    }
    entries.push_back({e.name, name, *std::move(spec)});
  }
  if (planned) planned(entries);
  return client.LoadCheckpoint(dir, entries);
}

absl::StatusOr<SafetensorsExportResult> ExportSafetensors(
    Client& client, const std::string& path,
    const SafetensorsSelection& selection,
    const SafetensorsMetadata& metadata) {
  const absl::Time start = absl::Now();
  SafetensorsExportResult result;
  // Tensor name by entry name, and the entries to lay out.
  std::vector<SafetensorsTensor> tensors;
  std::vector<std::string> tensor_names;
  std::vector<FileOrigin> origins;
  if (selection.by_prefix) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<TensorInfo> all, client.List());
    std::sort(all.begin(), all.end(),
              [](const TensorInfo& a, const TensorInfo& b) {
                return a.name < b.name;
              });
    for (const TensorInfo& t : all) {
      if (!absl::StartsWith(t.name, selection.prefix)) continue;
      if (t.name.size() == selection.prefix.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "safetensors export: tensor ", JsonString(t.name),
            " equals the prefix, so its entry name would be empty"));
      }
      tensors.push_back(
          {t.name.substr(selection.prefix.size()), t.dtype, t.shape});
      tensor_names.push_back(t.name);
    }
    if (tensors.empty()) {
      return absl::NotFoundError(
          absl::StrCat("safetensors export: no tensor name starts with prefix ",
                       JsonString(selection.prefix), " (tensors not found)"));
    }
    // Where each came from (the describe also primes the metadata the
    // gathers below use).
    origins.resize(tensors.size());
    TESSERA_RETURN_IF_ERROR(
        ForEachEntry(tensors.size(), [&](size_t i) -> absl::Status {
          TESSERA_ASSIGN_OR_RETURN(TensorMetadata meta,
                                   client.Describe(tensor_names[i]));
          origins[i] = std::move(meta.origin);
          return absl::OkStatus();
        }));
  } else {
    if (selection.names.empty()) {
      return absl::InvalidArgumentError(
          "safetensors export: no tensor named (give names or a prefix)");
    }
    absl::flat_hash_set<std::string> seen;
    for (const std::string& name : selection.names) {
      if (!seen.insert(name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors export: tensor ", JsonString(name),
                         " is named twice"));
      }
      TESSERA_ASSIGN_OR_RETURN(TensorMetadata meta, client.Describe(name));
      tensors.push_back({name, meta.dtype, meta.shape});
      tensor_names.push_back(name);
      origins.push_back(std::move(meta.origin));
    }
  }
  absl::flat_hash_map<std::string, std::string> tensor_of;
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensor_of[tensors[i].name] = tensor_names[i];
  }

  // Tensors imported from a file go first, in the file's order, with its
  // metadata (the first tensor's value of a key wins; `metadata` overrides
  // or adds); the others follow in LayoutSafetensors' aligned order.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int64_t ea = origins[a].entry, eb = origins[b].entry;
    if ((ea == 0) != (eb == 0)) return ea != 0;
    if (ea != 0 && ea != eb) return ea < eb;
    if (ea == 0) {
      const size_t ia = ItemSize(tensors[a].dtype);
      const size_t ib = ItemSize(tensors[b].dtype);
      if (ia != ib) return ia > ib;
    }
    return tensors[a].name < tensors[b].name;
  });
  const bool from_files =
      origins.empty() ? false : origins[order.front()].entry != 0;
  SafetensorsMetadata merged;
  absl::flat_hash_map<std::string, size_t> key_at;
  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(tensors.size());
  for (size_t i : order) {
    for (const auto& [key, value] : origins[i].metadata) {
      if (key_at.emplace(key, merged.size()).second) {
        merged.emplace_back(key, value);
      }
    }
    // A 0-d entry goes back as 0-d.
    if (origins[i].scalar && tensors[i].shape == Shape{1}) {
      tensors[i].shape.clear();
    }
    ordered.push_back(std::move(tensors[i]));
  }
  for (const auto& [key, value] : metadata) {
    auto [it, added] = key_at.emplace(key, merged.size());
    if (added) {
      merged.emplace_back(key, value);
    } else {
      merged[it->second].second = value;
    }
  }
  TESSERA_ASSIGN_OR_RETURN(SafetensorsLayout layout,
                           LayoutSafetensors(std::move(ordered), merged,
                                             /*keep_order=*/from_files));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                           SafetensorsWriter::Create(path, std::move(layout)));
  // Entries fill disjoint ranges of the mapping, several at a time.
  TESSERA_RETURN_IF_ERROR(
      ForEachEntry(writer->entries().size(), [&](size_t i) -> absl::Status {
        const SafetensorsEntry& e = writer->entries()[i];
        const std::string& tensor = tensor_of.at(e.name);
        if (e.num_bytes() == 0) return absl::OkStatus();
        // The whole tensor; GetInto refuses a size other than the one laid
        // out.
        return Annotate(client.GetInto(tensor, std::nullopt, writer->data(i),
                                       e.num_bytes()),
                        absl::StrCat("exporting tensor ", JsonString(tensor),
                                     " to safetensors file '", path, "'"));
      }));
  for (const SafetensorsEntry& e : writer->entries()) {
    result.entries.push_back({tensor_of.at(e.name), e.name, e.dtype, e.shape});
    result.bytes += e.num_bytes();
  }
  result.file_bytes = writer->file_bytes();
  TESSERA_RETURN_IF_ERROR(writer->Commit());
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace tessera
