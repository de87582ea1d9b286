#include "core/reshard_plan.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "core/box_index.h"

namespace tessera {
namespace {

// New shards between two polls of the StopCondition while pieces are cut.
constexpr size_t kShardsPerCheck = 4096;

// A shard's box and workers, compared and hashed in place.
struct BoxKey {
  const PlacedBox* shard;
  bool operator==(const BoxKey& o) const {
    return shard->box == o.shard->box && shard->workers == o.shard->workers;
  }
  template <typename H>
  friend H AbslHashValue(H h, const BoxKey& k) {
    return H::combine(std::move(h), k.shard->box.offsets, k.shard->box.sizes,
                      k.shard->workers);
  }
};

// The replica of `shard` on `worker`, or -1.
int64_t ReplicaOn(const PlacedBox& shard, const std::string& worker) {
  for (size_t r = 0; r < shard.workers.size(); ++r) {
    if (shard.workers[r] == worker) return static_cast<int64_t>(r);
  }
  return -1;
}

}  // namespace

ReshardPlan PlanReshard(absl::Span<const PlacedBox> old_layout,
                        absl::Span<const PlacedBox> new_layout,
                        size_t item_size) {
  // Never stops, so never fails.
  return *PlanReshard(old_layout, new_layout, item_size, StopCondition());
}

absl::StatusOr<ReshardPlan> PlanReshard(absl::Span<const PlacedBox> old_layout,
                                        absl::Span<const PlacedBox> new_layout,
                                        size_t item_size,
                                        const StopCondition& stop) {
  if (absl::Status s = stop.Check(); !s.ok()) return s;
  ReshardPlan plan;
  plan.kept_from.assign(new_layout.size(), -1);

  // New shards identical to an old shard keep its memory.
  absl::flat_hash_map<BoxKey, size_t> old_by_key;
  old_by_key.reserve(old_layout.size());
  for (size_t i = 0; i < old_layout.size(); ++i) {
    old_by_key.emplace(BoxKey{&old_layout[i]}, i);
  }
  for (size_t j = 0; j < new_layout.size(); ++j) {
    auto it = old_by_key.find(BoxKey{&new_layout[j]});
    if (it == old_by_key.end()) continue;
    plan.kept_from[j] = static_cast<int64_t>(it->second);
    old_by_key.erase(it);  // one taker per old shard
    ++plan.shards_kept;
  }

  // Every (old, new) pair of boxes that meet, new shards that are kept
  // left out, found by one pair search over both layouts.
  const BoxIndex old_index(
      old_layout.size(),
      [&](size_t i) -> const Box& { return old_layout[i].box; },
      BoxIndex::Use::kPairsOnly);
  const Box nothing({0}, {0});  // stands for kept new shards: empty
  const BoxIndex new_index(
      new_layout.size(),
      [&](size_t j) -> const Box& {
        return plan.kept_from[j] >= 0 ? nothing : new_layout[j].box;
      },
      BoxIndex::Use::kPairsOnly);
  std::vector<std::pair<uint32_t, uint32_t>> pairs;  // (new, old)
  absl::Status searched = new_index.ForEachIntersectingPair(
      old_index,
      [&](size_t j, size_t i) {
        pairs.push_back({static_cast<uint32_t>(j), static_cast<uint32_t>(i)});
        return true;
      },
      stop);
  if (!searched.ok()) return searched;
  // Grouped by new shard (a counting sort); within one, old shards by their
  // start on dim 0, then index.
  std::vector<size_t> first(new_layout.size() + 1, 0);
  for (const auto& pair : pairs) ++first[pair.first + 1];
  for (size_t j = 0; j < new_layout.size(); ++j) first[j + 1] += first[j];
  std::vector<uint32_t> sources(pairs.size());
  {
    std::vector<size_t> next(first.begin(), first.end() - 1);
    for (const auto& [j, i] : pairs) sources[next[j]++] = i;
  }
  pairs.clear();
  pairs.shrink_to_fit();
  plan.pieces.reserve(sources.size());
  for (size_t j = 0; j < new_layout.size(); ++j) {
    if (j % kShardsPerCheck == kShardsPerCheck - 1) {
      if (absl::Status s = stop.Check(); !s.ok()) return s;
    }
    const auto begin = sources.begin() + first[j];
    const auto end = sources.begin() + first[j + 1];
    std::sort(begin, end, [&](uint32_t a, uint32_t b) {
      const int64_t sa = old_layout[a].box.offsets[0];
      const int64_t sb = old_layout[b].box.offsets[0];
      return sa != sb ? sa < sb : a < b;
    });
    const PlacedBox& dst = new_layout[j];
    for (size_t r = 0; r < dst.workers.size(); ++r) {
      for (auto it = begin; it != end; ++it) {
        const PlacedBox& src = old_layout[*it];
        std::optional<Box> piece = Intersect(src.box, dst.box);
        if (!piece.has_value()) continue;
        ReshardPiece p;
        p.src_shard = *it;
        p.dst_shard = j;
        p.dst_replica = r;
        p.bytes = piece->NumElements() * static_cast<int64_t>(item_size);
        p.global = *std::move(piece);
        const int64_t same_worker = ReplicaOn(src, dst.workers[r]);
        p.local = same_worker >= 0;
        if (p.local) {
          p.src_replica = static_cast<size_t>(same_worker);
          plan.bytes_copied_locally += p.bytes;
        } else {
          ++plan.pieces_moved;
          plan.bytes_moved += p.bytes;
        }
        plan.pieces.push_back(std::move(p));
      }
    }
  }
  return plan;
}

}  // namespace tessera
