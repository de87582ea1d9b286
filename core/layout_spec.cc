#include "core/layout_spec.h"

#include "absl/strings/str_cat.h"
#include "core/shard_layout.h"
#include "core/sharding_spec.h"
#include "core/status_macros.h"

namespace tessera {

LayoutSpec LayoutSpec::Chunk(int64_t dim, std::vector<Placement> placements) {
  LayoutSpec spec;
  spec.kind = Kind::kChunk;
  spec.chunk_dim = dim;
  spec.placements = std::move(placements);
  return spec;
}

LayoutSpec LayoutSpec::Enumerable(std::vector<Box> boxes,
                                  std::vector<Placement> placements) {
  LayoutSpec spec;
  spec.kind = Kind::kEnumerable;
  spec.boxes = std::move(boxes);
  spec.placements = std::move(placements);
  return spec;
}

absl::StatusOr<std::vector<Box>> LayoutBoxes(const Shape& shape,
                                             const LayoutSpec& spec) {
  return LayoutBoxes(shape, spec, StopCondition());
}

absl::StatusOr<std::vector<Box>> LayoutBoxes(const Shape& shape,
                                             const LayoutSpec& spec,
                                             const StopCondition& stop) {
  if (spec.placements.empty()) {
    return absl::InvalidArgumentError(
        "a sharding spec needs at least one placement");
  }
  if (static_cast<int64_t>(spec.placements.size()) > kMaxShardsPerTensor) {
    return absl::InvalidArgumentError(
        absl::StrCat("too many shards: ", spec.placements.size(), " (at most ",
                     kMaxShardsPerTensor, ")"));
  }
  if (spec.kind == LayoutSpec::Kind::kChunk) {
    TESSERA_ASSIGN_OR_RETURN(
        std::vector<Box> boxes,
        ChunkBoxes(shape, spec.chunk_dim,
                   static_cast<int64_t>(spec.placements.size())));
    TESSERA_RETURN_IF_ERROR(
        ValidateLayout(shape, boxes, LayoutKind::kChunk, stop));
    return boxes;
  }
  if (spec.boxes.size() != spec.placements.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("enumerable spec has ", spec.boxes.size(), " boxes but ",
                     spec.placements.size(), " placements"));
  }
  TESSERA_RETURN_IF_ERROR(
      ValidateLayout(shape, spec.boxes, LayoutKind::kEnumerable, stop));
  return spec.boxes;
}

}  // namespace tessera
