// Validation of a shard layout against its tensor: ranks, bounds, overlap
// and coverage. Overlap is found by BoxIndex's pair search: O(n log^r n) for
// n boxes of rank r whatever their arrangement, stopping at the first
// overlapping pair. Pure functions; safe to call from any thread.
#ifndef TESSERA_CORE_SHARD_LAYOUT_H_
#define TESSERA_CORE_SHARD_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/box_index.h"

namespace tessera {

enum class LayoutKind {
  kChunk,       // from ChunkBoxes: empty shards may sit past the end
  kEnumerable,  // given box by box: every box within 0 <= a <= b <= n
};

// Checks, in this order over all boxes, reporting the first failure:
//  1. every box has the tensor's rank (DimsMismatchError naming "shard i");
//  2. bounds (OutOfBoundsError naming the shard and its box): for
//     kEnumerable every box, size-0 ones included; for kChunk only the
//     non-empty boxes;
//  3. no two non-empty boxes overlap (OverlapError naming both shards: the
//     first shard that overlaps an earlier one, and the first earlier one
//     it overlaps);
//  4. the non-empty boxes cover the tensor (NotCoveredError saying how many
//     elements are left uncovered).
absl::Status ValidateLayout(const Shape& shape, absl::Span<const Box> boxes,
                            LayoutKind kind);
// The same, giving up with CANCELLED or DEADLINE_EXCEEDED when `stop` says
// so during the overlap search (the only step that is not linear).
absl::Status ValidateLayout(const Shape& shape, absl::Span<const Box> boxes,
                            LayoutKind kind, const StopCondition& stop);

// The sum of the boxes' byte sizes (overflow-checked).
absl::StatusOr<int64_t> TotalShardBytes(absl::Span<const Box> boxes,
                                        size_t item_size);

}  // namespace tessera

#endif  // TESSERA_CORE_SHARD_LAYOUT_H_
