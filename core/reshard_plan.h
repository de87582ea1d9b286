// Reshard planning: old layout x new layout -> the pieces to move. A piece is
// the non-empty intersection of one old shard with one new shard, for one
// replica of the new shard. A new shard identical to an old one (same box,
// same workers) is kept as it is; a piece whose new replica's worker holds a
// replica of the old shard is copied in memory there; only the other pieces
// cross the network. Pure functions; thread-safe.
#ifndef TESSERA_CORE_RESHARD_PLAN_H_
#define TESSERA_CORE_RESHARD_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/box_index.h"

namespace tessera {

// A shard as the planner sees it: its box and the workers holding its
// replicas, in replica order (never empty).
struct PlacedBox {
  Box box;
  absl::InlinedVector<std::string, 1> workers;
};

struct ReshardPiece {
  size_t src_shard = 0;    // index into the old layout
  size_t dst_shard = 0;    // index into the new layout
  size_t dst_replica = 0;  // the new shard's replica it fills
  // When `local`: the old shard's replica on the new replica's worker, the
  // one copied in memory. Otherwise 0, and which replica of the old shard
  // a remote piece is read from is the reader's choice (ReadLocations).
  size_t src_replica = 0;
  Box global;  // the piece in tensor coordinates
  int64_t bytes = 0;
  bool local = false;  // the old shard has a replica on the new replica's
                       // worker: an in-memory copy
};

struct ReshardPlan {
  // Per new shard: the index of the identical old shard it takes over, or -1.
  std::vector<int64_t> kept_from;
  // Pieces that fill the new shards that are not kept, grouped by new
  // shard, then by its replica.
  std::vector<ReshardPiece> pieces;
  int64_t shards_kept = 0;
  int64_t pieces_moved = 0;  // pieces with local == false
  int64_t bytes_moved = 0;  // their bytes: exactly the bytes that cross workers
  int64_t bytes_copied_locally = 0;
};

// Plans moving a tensor from `old_layout` to `new_layout`; both must tile the
// same tensor (validated beforehand). Each old shard is reused by at most one
// new shard. Pieces are grouped by new shard and its replica, and within one
// ordered by the old shard's start on dim 0 (then its index). One BoxIndex pair
// search finds them: O(N log^r N + pieces) for N shards of rank r in all,
// whatever the layouts.
ReshardPlan PlanReshard(absl::Span<const PlacedBox> old_layout,
                        absl::Span<const PlacedBox> new_layout,
                        size_t item_size);
// The same, giving up with CANCELLED or DEADLINE_EXCEEDED when `stop` says
// so during the pair search or while the pieces are cut.
absl::StatusOr<ReshardPlan> PlanReshard(absl::Span<const PlacedBox> old_layout,
                                        absl::Span<const PlacedBox> new_layout,
                                        size_t item_size,
                                        const StopCondition& stop);

}  // namespace tessera

#endif  // TESSERA_CORE_RESHARD_PLAN_H_
