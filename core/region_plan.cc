#include "core/region_plan.h"

#include <optional>

namespace tessera {

std::vector<RegionPiece> PlanRegion(absl::Span<const Box> shard_boxes,
                                    const Box& region) {
  std::vector<RegionPiece> pieces;
  if (region.IsEmpty()) return pieces;
  for (size_t i = 0; i < shard_boxes.size(); ++i) {
    std::optional<Box> common = Intersect(shard_boxes[i], region);
    if (!common.has_value()) continue;
    RegionPiece piece;
    piece.shard_index = i;
    piece.in_shard = Translate(*common, shard_boxes[i].offsets);
    piece.in_region = Translate(*common, region.offsets);
    piece.global = *std::move(common);
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

int64_t PiecesElements(absl::Span<const RegionPiece> pieces) {
  int64_t total = 0;
  for (const RegionPiece& piece : pieces) total += piece.global.NumElements();
  return total;
}

}  // namespace tessera
