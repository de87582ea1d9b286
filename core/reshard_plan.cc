#include "core/reshard_plan.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"

namespace tessera {
namespace {

struct BoxKey {
  const Box* box;
  const std::string* worker;
  bool operator==(const BoxKey& o) const {
    return *box == *o.box && *worker == *o.worker;
  }
  template <typename H>
  friend H AbslHashValue(H h, const BoxKey& k) {
    return H::combine(std::move(h), k.box->offsets, k.box->sizes, *k.worker);
  }
};

}  // namespace

ReshardPlan PlanReshard(absl::Span<const PlacedBox> old_layout,
                        absl::Span<const PlacedBox> new_layout,
                        size_t item_size) {
  ReshardPlan plan;
  plan.kept_from.assign(new_layout.size(), -1);

  // New shards identical to an old shard keep its memory.
  absl::flat_hash_map<BoxKey, size_t> old_by_key;
  for (size_t i = 0; i < old_layout.size(); ++i) {
    old_by_key.emplace(BoxKey{&old_layout[i].box, &old_layout[i].worker}, i);
  }
  for (size_t j = 0; j < new_layout.size(); ++j) {
    auto it =
        old_by_key.find(BoxKey{&new_layout[j].box, &new_layout[j].worker});
    if (it == old_by_key.end()) continue;
    plan.kept_from[j] = static_cast<int64_t>(it->second);
    old_by_key.erase(it);  // one taker per old shard
    ++plan.shards_kept;
  }

  // Old non-empty shards sorted by their start on dim 0, for range lookups.
  std::vector<size_t> order;
  int64_t max_extent0 = 0;
  for (size_t i = 0; i < old_layout.size(); ++i) {
    if (old_layout[i].box.NumElements() == 0) continue;
    order.push_back(i);
    max_extent0 = std::max(max_extent0, old_layout[i].box.sizes[0]);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return old_layout[a].box.offsets[0] < old_layout[b].box.offsets[0];
  });

  for (size_t j = 0; j < new_layout.size(); ++j) {
    const PlacedBox& dst = new_layout[j];
    if (plan.kept_from[j] >= 0 || dst.box.NumElements() == 0) continue;
    const int64_t lo = dst.box.offsets[0] - max_extent0;
    const int64_t hi = dst.box.offsets[0] + dst.box.sizes[0];
    auto first = std::lower_bound(
        order.begin(), order.end(), lo,
        [&](size_t i, int64_t v) { return old_layout[i].box.offsets[0] < v; });
    for (auto it = first;
         it != order.end() && old_layout[*it].box.offsets[0] < hi; ++it) {
      const PlacedBox& src = old_layout[*it];
      std::optional<Box> piece = Intersect(src.box, dst.box);
      if (!piece.has_value()) continue;
      ReshardPiece p;
      p.src_shard = *it;
      p.dst_shard = j;
      p.bytes = piece->NumElements() * static_cast<int64_t>(item_size);
      p.global = *std::move(piece);
      p.local = src.worker == dst.worker;
      if (p.local) {
        plan.bytes_copied_locally += p.bytes;
      } else {
        ++plan.pieces_moved;
        plan.bytes_moved += p.bytes;
      }
      plan.pieces.push_back(std::move(p));
    }
  }
  return plan;
}

}  // namespace tessera
