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
#include <vector>

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

// The number of elements in `pieces`.
int64_t PiecesElements(absl::Span<const RegionPiece> pieces);

}  // namespace tessera

#endif  // TESSERA_CORE_REGION_PLAN_H_
