#include "core/mirror_plan.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"

namespace tessera {

std::vector<std::string> MirrorGroup(const LabelSelector& selector,
                                     const std::vector<MirrorCandidate>& all) {
  std::vector<std::string> group;
  for (const MirrorCandidate& w : all) {
    if (w.alive && w.state == WorkerState::kReady &&
        selector.Matches(w.labels)) {
      group.push_back(w.name);
    }
  }
  return group;
}

std::vector<ShardMirrors> PlanMirrors(const TensorMetadata& meta,
                                      const std::vector<std::string>& group) {
  const absl::flat_hash_set<std::string> members(group.begin(), group.end());
  std::vector<ShardMirrors> out;
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    const Replicas& copies = meta.shards[i].replicas;
    ShardMirrors shard;
    shard.shard = i;
    // While no replica of the shard is available, its available mirrors
    // stay wherever they are: they may hold its last bytes, which a repair
    // copies into a new replica before they go.
    const bool replica_available =
        std::any_of(copies.begin(), copies.end(),
                    [](const Replica& c) { return !c.mirror && c.available; });
    // Workers that keep an available copy of the shard.
    absl::flat_hash_set<std::string> holding;
    size_t source = SIZE_MAX;
    for (size_t r = 0; r < copies.size(); ++r) {
      const Replica& c = copies[r];
      const bool stays = c.available && (!c.mirror || !replica_available ||
                                         members.contains(c.worker));
      if (c.mirror && !stays) shard.dropped.push_back(r);
      if (!stays) continue;
      holding.insert(c.worker);
      if (source == SIZE_MAX || (copies[source].mirror && !c.mirror)) {
        source = r;
      }
    }
    if (source != SIZE_MAX) {
      for (const std::string& w : group) {
        if (!holding.contains(w)) shard.added.push_back(w);
      }
      shard.source = source;
    }
    if (!shard.dropped.empty() || !shard.added.empty()) {
      out.push_back(std::move(shard));
    }
  }
  return out;
}

}  // namespace tessera
