#include "core/save_plan.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/checkpoint_index.h"

namespace tessera {
namespace {

// The shards of `meta` a save stores: empty ones store nothing (a tensor
// of no elements keeps one).
std::vector<size_t> StoredShards(const TensorMetadata& meta) {
  std::vector<size_t> kept;
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    if (meta.shards[i].box.NumElements() > 0) kept.push_back(i);
  }
  if (kept.empty()) kept.push_back(0);
  return kept;
}

void AddMetadata(const TensorMetadata& meta, CheckpointListing* listing) {
  for (const auto& pair : meta.origin.metadata) {
    if (std::find(listing->metadata.begin(), listing->metadata.end(), pair) ==
        listing->metadata.end()) {
      listing->metadata.push_back(pair);
    }
  }
}

// A worker's pieces into files of at most `file_bytes` and `file_items`.
std::vector<SavePlanFile> CutIntoFiles(const std::string& worker,
                                       std::vector<SavePlanItem> items,
                                       const SavePlanOptions& options) {
  std::vector<SavePlanFile> files;
  int64_t bytes = 0;
  for (SavePlanItem& item : items) {
    if (files.empty() || bytes + item.bytes > options.file_bytes ||
        static_cast<int64_t>(files.back().items.size()) >= options.file_items) {
      files.push_back({SavedFileName(worker, options.save_id,
                                     static_cast<int64_t>(files.size())),
                       {}});
      bytes = 0;
    }
    bytes += item.bytes;
    files.back().items.push_back(std::move(item));
  }
  return files;
}

}  // namespace

absl::StatusOr<SavePlan> PlanSave(const std::vector<TensorMetadata>& metas,
                                  const SavePlanOptions& options) {
  SavePlan plan;
  std::map<std::string, std::vector<SavePlanItem>> by_address;
  std::map<std::string, std::string> worker_names;  // address -> worker
  for (size_t t = 0; t < metas.size(); ++t) {
    const TensorMetadata& meta = metas[t];
    const bool scalar = meta.origin.scalar && meta.shape == Shape{1};
    CheckpointEntry& entry = plan.listing.entries.emplace_back();
    entry.name = meta.name;
    entry.dtype = meta.dtype;
    entry.shape = scalar ? Shape{} : meta.shape;
    entry.bytes = meta.ByteSize();
    plan.bytes += entry.bytes;
    AddMetadata(meta, &plan.listing);
    const std::vector<size_t> kept = StoredShards(meta);
    for (size_t k = 0; k < kept.size(); ++k) {
      const size_t i = kept[k];
      const ShardLocation from = ReadLocations(meta, i).front();
      if (!from.available) {
        return absl::UnavailableError(
            absl::StrCat("save: shard ", i, " of '", meta.name,
                         "' is unavailable: no live replica (its worker '",
                         from.worker, "' is down)"));
      }
      StoredPiece& piece = entry.pieces.emplace_back();
      piece.box = scalar ? Box() : meta.shards[i].box;
      // ':' is in no tensor name: a piece's entry never meets a tensor's.
      piece.entry =
          kept.size() == 1 ? meta.name : absl::StrCat(meta.name, ":", k);
      by_address[from.address].push_back(
          {t, k, piece.entry, from.shard_id, meta.version, scalar,
           meta.shards[i].box.NumElements() *
               static_cast<int64_t>(ItemSize(meta.dtype))});
      worker_names[from.address] = from.worker;
    }
  }
  plan.file_metadata = plan.listing.metadata;
  if (std::none_of(plan.file_metadata.begin(), plan.file_metadata.end(),
                   [](const auto& p) { return p.first == "format"; })) {
    // What Hugging Face's loaders look for.
    plan.file_metadata.emplace_back("format", "pt");
  }
  // This save's files: names no earlier save used, marked as its parts.
  plan.file_metadata.emplace_back(kSavePartKey, options.save_id);
  plan.listing.save_id = options.save_id;
  plan.listing.saved_by = options.principal;
  for (auto& [address, items] : by_address) {
    SavePlanWorker& worker = plan.workers.emplace_back();
    worker.worker = worker_names[address];
    worker.address = address;
    worker.files = CutIntoFiles(worker.worker, std::move(items), options);
    plan.files += static_cast<int64_t>(worker.files.size());
  }
  return plan;
}

}  // namespace tessera
