#include "core/shard_layout.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/box_index.h"
#include "core/checked_math.h"
#include "core/errors.h"
#include "core/status_macros.h"

namespace tessera {
namespace {

std::string ShardName(size_t i, const Box& box) {
  return absl::StrCat("shard ", i, " (", box.ToString(), ")");
}

absl::Status OverlapBetween(absl::Span<const Box> boxes, size_t i, size_t j) {
  if (j < i) std::swap(i, j);
  std::optional<Box> common = Intersect(boxes[i], boxes[j]);
  return OverlapError(absl::StrCat(
      ShardName(i, boxes[i]), " and ", ShardName(j, boxes[j]), " both hold ",
      common.has_value() ? common->ToString() : "elements"));
}

}  // namespace

absl::Status ValidateLayout(const Shape& shape, absl::Span<const Box> boxes,
                            LayoutKind kind) {
  return ValidateLayout(shape, boxes, kind, StopCondition());
}

absl::Status ValidateLayout(const Shape& shape, absl::Span<const Box> boxes,
                            LayoutKind kind, const StopCondition& stop) {
  for (size_t i = 0; i < boxes.size(); ++i) {
    const Box& box = boxes[i];
    if (box.offsets.size() != shape.size()) {
      return DimsMismatchError(absl::StrCat("shard ", i), box.offsets.size(),
                               shape.size());
    }
    if (box.sizes.size() != shape.size()) {
      return DimsMismatchError(absl::StrCat("shard ", i), box.sizes.size(),
                               shape.size());
    }
  }
  std::vector<size_t> non_empty;
  non_empty.reserve(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    const Box& box = boxes[i];
    const bool empty = box.IsEmpty();
    if (kind == LayoutKind::kEnumerable || !empty) {
      TESSERA_RETURN_IF_ERROR(CheckWithin(box, shape, ShardName(i, box)));
    }
    if (!empty) non_empty.push_back(i);
  }
  TESSERA_ASSIGN_OR_RETURN(const int64_t total, NumElements(shape));
  if (shape.empty()) {
    // A 0-d tensor has one element; two boxes of it always overlap.
    if (non_empty.size() > 1) {
      return OverlapBetween(boxes, non_empty[0], non_empty[1]);
    }
  } else if (non_empty.size() > 1) {
    // The first pair of non-empty boxes that share an element, if any.
    std::optional<std::pair<size_t, size_t>> pair;
    const BoxIndex index(boxes);
    TESSERA_RETURN_IF_ERROR(index.ForEachIntersectingPair(
        [&](size_t i, size_t j) {
          pair.emplace(i, j);
          return false;
        },
        stop));
    if (pair.has_value())
      return OverlapBetween(boxes, pair->first, pair->second);
  }
  // In bounds and disjoint: the sum of volumes is at most `total`.
  int64_t covered = 0;
  for (size_t i : non_empty) covered += boxes[i].NumElements();
  if (covered != total) {
    return NotCoveredError(absl::StrCat(total - covered, " of the ", total,
                                        " elements of ", ShapeToString(shape),
                                        " are in no shard"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TotalShardBytes(absl::Span<const Box> boxes,
                                        size_t item_size) {
  int64_t total = 0;
  for (const Box& box : boxes) {
    int64_t bytes = 0;
    if (!box.IsEmpty()) {
      TESSERA_ASSIGN_OR_RETURN(bytes, ByteSize(box.sizes, item_size));
    }
    TESSERA_ASSIGN_OR_RETURN(total, CheckedAdd(total, bytes));
  }
  return total;
}

}  // namespace tessera
