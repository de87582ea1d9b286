// LayoutSpec: what a user asks for when creating or resharding a tensor —
// chunk sharding (torch.chunk along one dim, one shard per placement) or
// enumerable sharding (every box given) — with placements not yet resolved
// against the cluster. A plain value type.
#ifndef TESSERA_CORE_LAYOUT_SPEC_H_
#define TESSERA_CORE_LAYOUT_SPEC_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/box.h"
#include "core/box_index.h"
#include "core/placement.h"

namespace tessera {

// Upper bound on shards per tensor (metadata stays a few tens of MB).
inline constexpr int64_t kMaxShardsPerTensor = 1 << 20;

struct LayoutSpec {
  enum class Kind { kChunk, kEnumerable };
  Kind kind = Kind::kChunk;
  int64_t chunk_dim = 0;              // kChunk: may be negative
  std::vector<Placement> placements;  // one per shard
  std::vector<Box> boxes;  // kEnumerable: boxes[i] goes to placements[i]
  // Workers holding each shard (core/replica_placement.h): placements[i]
  // names the first. 0: the default (a create's 1, a reshard's current).
  int32_t replicas = 0;
  // The mirror group (CLI.md "Mirrors (v4)"): a LabelSelector's text;
  // "none" (a reshard) drops it; empty: a create's none, a reshard's
  // current.
  std::string mirror;

  static LayoutSpec Chunk(int64_t dim, std::vector<Placement> placements);
  static LayoutSpec Enumerable(std::vector<Box> boxes,
                               std::vector<Placement> placements);
};

// The shard boxes of `spec` on a tensor of `shape`, validated in the order
// the CLI contract gives: dims, chunk dim, bounds, overlap, cover.
// (Placements are checked against the cluster afterwards, by the caller.)
absl::StatusOr<std::vector<Box>> LayoutBoxes(const Shape& shape,
                                             const LayoutSpec& spec);
// The same, giving up with CANCELLED or DEADLINE_EXCEEDED when `stop` says
// so while validating (see ValidateLayout).
absl::StatusOr<std::vector<Box>> LayoutBoxes(const Shape& shape,
                                             const LayoutSpec& spec,
                                             const StopCondition& stop);

}  // namespace tessera

#endif  // TESSERA_CORE_LAYOUT_SPEC_H_
