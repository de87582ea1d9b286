// Region planning: which pieces of which shards make up a region of the
// tensor, and where each piece sits in the shard, in the region and in the
// tensor. Pure functions; safe to call from any thread.
//
// The overloads without a BoxIndex look at every shard (O(n) per region).
// A caller that plans many regions of one tensor version builds a BoxIndex
// of its shard boxes once (O(n log n)) and passes it: each region then
// costs about O(log n + pieces).
#ifndef TESSERA_CORE_REGION_PLAN_H_
#define TESSERA_CORE_REGION_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/box_index.h"

namespace tessera {

// The non-empty intersection of one shard with the region.
struct RegionPiece {
  size_t shard_index;
  Box in_shard;   // offsets relative to the shard's origin
  Box in_region;  // offsets relative to the region's origin
  Box global;     // tensor coordinates
};

// Every non-empty intersection of `region` with a shard, in shard order. An
// empty region (or one meeting no shard) gives no pieces.
std::vector<RegionPiece> PlanRegion(absl::Span<const Box> shard_boxes,
                                    const Box& region);

// The same for `count` shards whose boxes `box_of(i)` returns, so callers
// that keep boxes inside larger records need not copy them per request.
std::vector<RegionPiece> PlanRegion(
    size_t count, const std::function<const Box&(size_t)>& box_of,
    const Box& region);

// The same answers, found through `index`, a BoxIndex built from exactly
// these shard boxes (`shard_boxes` or `box_of`, in the same order).
std::vector<RegionPiece> PlanRegion(const BoxIndex& index,
                                    absl::Span<const Box> shard_boxes,
                                    const Box& region);
std::vector<RegionPiece> PlanRegion(
    const BoxIndex& index, const std::function<const Box&(size_t)>& box_of,
    const Box& region);

// Through `index` when it is not null and holds `count` boxes (a BoxIndex
// built from these `box_of` boxes), else looking at every one of them.
std::vector<RegionPiece> PlanRegion(
    const BoxIndex* index, size_t count,
    const std::function<const Box&(size_t)>& box_of, const Box& region);

// The number of elements in `pieces`.
int64_t PiecesElements(absl::Span<const RegionPiece> pieces);

// --- Row gathers ---

// What a gather of rows (dim 0) reads: each distinct row once, and the
// output positions each one fills.
struct RowPlan {
  std::vector<int64_t> rows;  // distinct tensor rows, ascending
  // rows[i] fills output positions positions[first[i] .. first[i + 1]).
  std::vector<int64_t> first;
  std::vector<int64_t> positions;

  // The slice of `rows` inside [begin, end) (a shard's rows), as indices.
  std::pair<size_t, size_t> Within(int64_t begin, int64_t end) const;
};

// Plans rows `indices` of a dim 0 of `num_rows` (negatives count from the
// end, as in NumPy). OUT_OF_RANGE "out of bounds" naming the first index
// outside.
absl::StatusOr<RowPlan> PlanRows(absl::Span<const int64_t> indices,
                                 int64_t num_rows);

// --- Updates ---

// What version N+1 of an update does with each shard of the (unchanged)
// layout, given the region that changes (none: the whole tensor).
enum class UpdateAction {
  kKeep,     // outside the region: N's shard is taken over, no copy
  kRewrite,  // inside it: a new shard, written whole
  kPatch,    // partly inside: a new shard holding N's bytes, then the
             // region's part (`in_shard`) written over them
};
// `in_shard` receives the part of the shard inside the region, in shard
// coordinates (for kRewrite the whole shard).
UpdateAction ClassifyForUpdate(const Box& shard,
                               const std::optional<Box>& region, Box* in_shard);

}  // namespace tessera

#endif  // TESSERA_CORE_REGION_PLAN_H_
