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

// Some pair of boxes among boxes[0, end) that share an element, if any.
absl::StatusOr<std::optional<std::pair<size_t, size_t>>> AnyOverlap(
    absl::Span<const Box> boxes, size_t end, const StopCondition& stop) {
  std::optional<std::pair<size_t, size_t>> pair;
  const BoxIndex index(boxes.subspan(0, end), BoxIndex::Use::kPairsOnly);
  TESSERA_RETURN_IF_ERROR(index.ForEachIntersectingPair(
      [&](size_t i, size_t j) {
        pair.emplace(i, j);
        return false;
      },
      stop));
  return pair;
}

// The first box that shares an element with an earlier one, if any: the
// last box of the shortest prefix that holds an overlap. One pair search
// when there is no overlap, two when the first pair found ends that
// prefix (one overlap alone, say), and O(log n) in general.
absl::StatusOr<std::optional<size_t>> FirstOverlapping(
    absl::Span<const Box> boxes, const StopCondition& stop) {
  TESSERA_ASSIGN_OR_RETURN(auto pair, AnyOverlap(boxes, boxes.size(), stop));
  if (!pair.has_value()) return std::nullopt;
  // Prefixes of length `without` hold no overlap, of length `with` one.
  size_t without = 1;
  size_t with = pair->second + 1;
  bool first_probe = true;
  while (with - without > 1) {
    // Try the prefix just short of `with` first: often the answer.
    const size_t mid = first_probe ? with - 1 : without + (with - without) / 2;
    first_probe = false;
    TESSERA_ASSIGN_OR_RETURN(pair, AnyOverlap(boxes, mid, stop));
    if (pair.has_value()) {
      with = std::min(mid, pair->second + 1);
    } else {
      without = mid;
    }
  }
  return with - 1;
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
    if ((kind == LayoutKind::kEnumerable || !empty) && !IsWithin(box, shape)) {
      // Named only when it fails: 100k names cost a sixth of validating.
      return CheckWithin(box, shape, ShardName(i, box));
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
    // Only non-empty boxes can overlap, and only they were checked against
    // the shape (an empty chunk shard may name any offsets): search those,
    // in their order.
    std::vector<Box> compact;
    absl::Span<const Box> candidates = boxes;
    if (non_empty.size() < boxes.size()) {
      compact.reserve(non_empty.size());
      for (size_t i : non_empty) compact.push_back(boxes[i]);
      candidates = compact;
    }
    auto original = [&](size_t k) {
      return candidates.data() == boxes.data() ? k : non_empty[k];
    };
    TESSERA_ASSIGN_OR_RETURN(const std::optional<size_t> j,
                             FirstOverlapping(candidates, stop));
    if (j.has_value()) {
      for (size_t i = 0; i < *j; ++i) {
        if (Intersect(candidates[i], candidates[*j]).has_value()) {
          return OverlapBetween(boxes, original(i), original(*j));
        }
      }
    }
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
