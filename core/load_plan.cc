#include "core/load_plan.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "core/checkpoint_index.h"
#include "core/crc32.h"

namespace tessera {

LoadPlan PlanLoad(const std::vector<const TensorMetadata*>& made,
                  const std::vector<const CheckpointEntry*>& entries) {
  LoadPlan plan;
  std::map<std::string, LoadPlan::Worker> by_address;
  for (size_t k = 0; k < made.size(); ++k) {
    const TensorMetadata& meta = *made[k];
    const CheckpointEntry& entry = *entries[k];
    const int64_t item = static_cast<int64_t>(ItemSize(meta.dtype));
    for (const StoredPiece& piece : PiecesOf(entry)) {
      // Only tessera's own checkpoints store CRCs.
      size_t check = 0;
      if (!entry.pieces.empty() && piece.bytes > 0) {
        plan.checked.push_back(piece);
        check = plan.checked.size();
      }
      for (const ShardInfo& shard : meta.shards) {
        const Replica& first = shard.replicas.front();
        std::vector<FileRun> runs =
            PlanFileRuns(piece.box, piece.data_offset, shard.box, item);
        if (runs.empty()) continue;
        LoadPlan::Worker& worker = by_address[first.address];
        worker.worker = first.worker;
        worker.address = first.address;
        LoadPlan::Order& placed = worker.orders.emplace_back();
        for (const FileRun& run : runs) placed.bytes += run.length;
        placed.order.file = piece.file;
        placed.order.shard_id = first.shard_id;
        placed.order.runs = std::move(runs);
        if (check != 0) {
          placed.order.piece_offset = piece.data_offset;
          placed.order.piece_bytes = piece.bytes;
          placed.checked = check;
        }
      }
    }
  }
  for (auto& [address, worker] : by_address) {
    plan.workers.push_back(std::move(worker));
  }
  return plan;
}

absl::Status CheckLoadedPieces(const LoadPlan& plan,
                               const std::vector<std::vector<uint32_t>>& parts,
                               const std::string& dir) {
  for (size_t c = 0; c < plan.checked.size(); ++c) {
    const StoredPiece& piece = plan.checked[c];
    const uint32_t crc = CombinePartCrc32s(
        c < parts.size() ? parts[c] : std::vector<uint32_t>(), piece.bytes);
    if (crc != piece.crc32) {
      return CheckpointError(absl::StrCat(
          "'", dir, "/", piece.file, "' fails its checksum: entry '",
          piece.entry, "' (", piece.bytes, " bytes at ", piece.data_offset,
          ") was saved with CRC-32 ", piece.crc32, " and reads back as ", crc));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
