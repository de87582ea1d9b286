#include "core/region_plan.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/errors.h"

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

std::vector<RegionPiece> PlanRegion(
    const BoxIndex* index, size_t count,
    const std::function<const Box&(size_t)>& box_of, const Box& region) {
  return index != nullptr && index->size() == count
             ? PlanRegion(*index, box_of, region)
             : PlanRegion(count, box_of, region);
}

int64_t PiecesElements(absl::Span<const RegionPiece> pieces) {
  int64_t total = 0;
  for (const RegionPiece& piece : pieces) total += piece.global.NumElements();
  return total;
}

std::pair<size_t, size_t> RowPlan::Within(int64_t begin, int64_t end) const {
  const auto lo = std::lower_bound(rows.begin(), rows.end(), begin);
  const auto hi = std::lower_bound(lo, rows.end(), end);
  return {static_cast<size_t>(lo - rows.begin()),
          static_cast<size_t>(hi - rows.begin())};
}

absl::StatusOr<RowPlan> PlanRows(absl::Span<const int64_t> indices,
                                 int64_t num_rows) {
  // (row, output position), sorted by row: duplicates become neighbours.
  std::vector<std::pair<int64_t, int64_t>> wanted;
  wanted.reserve(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    int64_t row = indices[i];
    if (row < 0 && row >= -num_rows) row += num_rows;
    if (row < 0 || row >= num_rows) {
      return OutOfBoundsError(
          absl::StrCat("row index ", indices[i], " (at position ", i, ")"),
          absl::StrCat("dim 0 has ", num_rows, " rows"));
    }
    wanted.emplace_back(row, static_cast<int64_t>(i));
  }
  std::sort(wanted.begin(), wanted.end());
  RowPlan plan;
  plan.positions.reserve(wanted.size());
  for (const auto& [row, position] : wanted) {
    if (plan.rows.empty() || plan.rows.back() != row) {
      plan.rows.push_back(row);
      plan.first.push_back(static_cast<int64_t>(plan.positions.size()));
    }
    plan.positions.push_back(position);
  }
  plan.first.push_back(static_cast<int64_t>(plan.positions.size()));
  return plan;
}

UpdateAction ClassifyForUpdate(const Box& shard,
                               const std::optional<Box>& region,
                               Box* in_shard) {
  if (!region.has_value()) {
    *in_shard = WholeBox(shard.sizes);
    return UpdateAction::kRewrite;
  }
  const std::optional<Box> inside = Intersect(shard, *region);
  if (!inside.has_value()) return UpdateAction::kKeep;
  *in_shard = Translate(*inside, shard.offsets);
  return *inside == shard ? UpdateAction::kRewrite : UpdateAction::kPatch;
}

}  // namespace tessera
