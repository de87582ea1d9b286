#include "core/shard_layout.h"

#include <algorithm>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

bool Overlaps(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.rank(); ++d) {
    if (a.offsets[d] >= b.offsets[d] + b.sizes[d] ||
        b.offsets[d] >= a.offsets[d] + a.sizes[d]) {
      return false;
    }
  }
  return true;
}

// Rank 1: sorted by start, a box overlaps an earlier one iff it starts
// before the furthest end seen so far.
absl::Status FindOverlap1D(absl::Span<const Box> boxes,
                           std::vector<size_t> order) {
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return boxes[a].offsets[0] < boxes[b].offsets[0];
  });
  bool have = false;
  int64_t max_end = 0;
  size_t max_end_index = 0;
  for (size_t i : order) {
    const int64_t start = boxes[i].offsets[0];
    const int64_t end = start + boxes[i].sizes[0];
    if (have && start < max_end) {
      return OverlapBetween(boxes, max_end_index, i);
    }
    if (!have || end > max_end) {
      max_end = end;
      max_end_index = i;
      have = true;
    }
  }
  return absl::OkStatus();
}

// The number of distinct offsets on dim `d` among the boxes in `order`.
size_t DistinctOffsets(absl::Span<const Box> boxes,
                       const std::vector<size_t>& order, size_t d) {
  std::vector<int64_t> starts;
  starts.reserve(order.size());  // compact copy: sorts fast
  for (size_t i : order) starts.push_back(boxes[i].offsets[d]);
  std::sort(starts.begin(), starts.end());
  return std::unique(starts.begin(), starts.end()) - starts.begin();
}

// Rank >= 2: a sweep along the dim `s` with the most distinct offsets
// (dim 0 for a row grid), keyed on the dim `k` with the next most (dim 1).
// The active boxes (whose interval on `s` holds the sweep position) all meet
// each other on `s`, so while no overlap has been found they are pairwise
// disjoint in the remaining dims. For rank 2 their intervals on `k` are
// disjoint, so a new box need only be checked against its two neighbours
// in `k` order. For rank >= 3 the candidates are the active boxes whose
// interval on `k` can reach the new box's (a range query bounded by the
// longest extent on `k`), each then tested in full. Choosing `s` and `k`
// by distinct offsets keeps the active set and the candidates small for
// chunked and grid layouts along any dims.
absl::Status FindOverlapSweep(absl::Span<const Box> boxes,
                              std::vector<size_t> order) {
  const size_t rank = boxes[order[0]].rank();
  // (boxes - distinct offsets, dim): the most distinct offsets sort first.
  std::vector<std::pair<size_t, size_t>> dims;
  for (size_t d = 0; d < rank; ++d) {
    dims.push_back({order.size() - DistinctOffsets(boxes, order, d), d});
  }
  std::sort(dims.begin(), dims.end());
  const size_t s = dims[0].second;
  const size_t k = dims[1].second;
  // Compact copies of the two dims, sorted by offset on `s` (then on `k`).
  struct Span2 {
    int64_t s_lo, s_hi, k_lo, k_hi;
    size_t index;
  };
  std::vector<Span2> spans;
  spans.reserve(order.size());
  for (size_t i : order) {
    const Box& b = boxes[i];
    spans.push_back({b.offsets[s], b.offsets[s] + b.sizes[s], b.offsets[k],
                     b.offsets[k] + b.sizes[k], i});
  }
  std::sort(spans.begin(), spans.end(), [](const Span2& a, const Span2& b) {
    return a.s_lo != b.s_lo ? a.s_lo < b.s_lo : a.k_lo < b.k_lo;
  });
  // Active boxes by their offset on `k`: (k_lo, k_hi, shard index).
  struct Active {
    int64_t k_lo, k_hi;
    size_t index;
    bool operator<(const Active& o) const {
      return k_lo != o.k_lo ? k_lo < o.k_lo : index < o.index;
    }
  };
  std::set<Active> active;
  // Active boxes by their end on `s`, earliest first, for removal.
  using End = std::pair<int64_t, const Span2*>;
  auto later = [](const End& a, const End& b) { return a.first > b.first; };
  std::priority_queue<End, std::vector<End>, decltype(later)> ends(later);
  int64_t max_len = 0;  // the longest extent on `k` inserted so far
  for (const Span2& span : spans) {
    while (!ends.empty() && ends.top().first <= span.s_lo) {
      const Span2* gone = ends.top().second;
      active.erase({gone->k_lo, gone->k_hi, gone->index});
      ends.pop();
    }
    const int64_t lo = span.k_lo;
    const int64_t hi = span.k_hi;
    auto next = active.lower_bound({lo, 0, 0});
    if (rank == 2) {
      if (next != active.end() && next->k_lo < hi) {
        return OverlapBetween(boxes, next->index, span.index);
      }
      if (next != active.begin() && std::prev(next)->k_hi > lo) {
        return OverlapBetween(boxes, std::prev(next)->index, span.index);
      }
    } else {
      for (auto it = active.lower_bound({lo - max_len, 0, 0});
           it != active.end() && it->k_lo < hi; ++it) {
        if (it->k_hi > lo && Overlaps(boxes[it->index], boxes[span.index])) {
          return OverlapBetween(boxes, it->index, span.index);
        }
      }
    }
    max_len = std::max(max_len, hi - lo);
    active.insert(next, {lo, hi, span.index});
    ends.push({span.s_hi, &span});
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateLayout(const Shape& shape, absl::Span<const Box> boxes,
                            LayoutKind kind) {
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
  } else if (!non_empty.empty()) {
    if (shape.size() == 1) {
      TESSERA_RETURN_IF_ERROR(FindOverlap1D(boxes, non_empty));
    } else {
      TESSERA_RETURN_IF_ERROR(FindOverlapSweep(boxes, non_empty));
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
