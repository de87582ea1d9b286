#include "core/region_plan.h"

#include <optional>
#include <utility>

namespace tessera {

std::vector<RegionPiece> PlanRegion(absl::Span<const Box> shard_boxes,
                                    const Box& region) {
  return PlanRegion(
      shard_boxes.size(),
      [&](size_t i) -> const Box& { return shard_boxes[i]; }, region);
}

namespace {

// Appends the piece of shard `i` in `region`, if they meet.
void AddPiece(size_t i, const Box& shard, const Box& region,
              std::vector<RegionPiece>* pieces) {
  std::optional<Box> common = Intersect(shard, region);
  if (!common.has_value()) return;
  RegionPiece piece;
  piece.shard_index = i;
  piece.in_shard = Translate(*common, shard.offsets);
  piece.in_region = Translate(*common, region.offsets);
  piece.global = *std::move(common);
  pieces->push_back(std::move(piece));
}

}  // namespace

std::vector<RegionPiece> PlanRegion(
    size_t count, const std::function<const Box&(size_t)>& box_of,
    const Box& region) {
  std::vector<RegionPiece> pieces;
  if (region.IsEmpty()) return pieces;
  for (size_t i = 0; i < count; ++i) AddPiece(i, box_of(i), region, &pieces);
  return pieces;
}

std::vector<RegionPiece> PlanRegion(const BoxIndex& index,
                                    absl::Span<const Box> shard_boxes,
                                    const Box& region) {
  return PlanRegion(
      index, [&](size_t i) -> const Box& { return shard_boxes[i]; }, region);
}

std::vector<RegionPiece> PlanRegion(
    const BoxIndex& index, const std::function<const Box&(size_t)>& box_of,
    const Box& region) {
  std::vector<RegionPiece> pieces;
  if (region.IsEmpty()) return pieces;
  for (size_t i : index.Intersecting(region)) {
    AddPiece(i, box_of(i), region, &pieces);
  }
  return pieces;
}

int64_t PiecesElements(absl::Span<const RegionPiece> pieces) {
  int64_t total = 0;
  for (const RegionPiece& piece : pieces) total += piece.global.NumElements();
  return total;
}

}  // namespace tessera
