#include "core/region_plan.h"

#include <optional>

namespace tessera {

std::vector<RegionPiece> PlanRegion(absl::Span<const Box> shard_boxes,
                                    const Box& region) {
  return PlanRegion(
      shard_boxes.size(),
      [&](size_t i) -> const Box& { return shard_boxes[i]; }, region);
}

std::vector<RegionPiece> PlanRegion(
    size_t count, const std::function<const Box&(size_t)>& box_of,
    const Box& region) {
  std::vector<RegionPiece> pieces;
  if (region.IsEmpty()) return pieces;
  for (size_t i = 0; i < count; ++i) {
    const Box& shard = box_of(i);
    std::optional<Box> common = Intersect(shard, region);
    if (!common.has_value()) continue;
    RegionPiece piece;
    piece.shard_index = i;
    piece.in_shard = Translate(*common, shard.offsets);
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
