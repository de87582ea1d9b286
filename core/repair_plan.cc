#include "core/repair_plan.h"

#include <cstdint>
#include <utility>

namespace tessera {

RepairNeeds FindRepairs(
    const TensorMetadata& meta,
    const std::function<int(const std::string& worker)>& candidate_of,
    const std::function<bool(const std::string& worker)>& draining) {
  RepairNeeds out;
  const int64_t item = static_cast<int64_t>(ItemSize(meta.dtype));
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    const Replicas& replicas = meta.shards[i].replicas;
    ShardRepair repair;
    repair.shard = i;
    size_t from = SIZE_MAX;
    for (size_t r = 0; r < replicas.size(); ++r) {
      const Replica& replica = replicas[r];
      if (replica.mirror) {
        // Mirrors are never repaired elsewhere (SyncMirrors drops them).
        // One available holds the bytes: a source (one on a worker that
        // stays first), even on a draining worker, where it may be the
        // shard's last copy. Only one that stays is kept: its worker takes
        // no replica.
        if (!replica.available) continue;
        const bool drains = draining(replica.worker);
        if (from == SIZE_MAX || (replicas[from].mirror && !drains &&
                                 draining(replicas[from].worker))) {
          from = r;
        }
        if (drains) continue;
        repair.need.kept.push_back(candidate_of(replica.worker));
        continue;
      }
      const bool leaves = !replica.available || draining(replica.worker);
      if (leaves) {
        repair.leaving.push_back(r);
      } else {
        repair.need.kept.push_back(candidate_of(replica.worker));
      }
      if (replica.available &&
          (from == SIZE_MAX || replicas[from].mirror || !leaves)) {
        from = r;
      }
    }
    // Mirrors that stay take the leaving replicas' places first.
    for (size_t r = replicas.size(); r-- > 0 && !repair.leaving.empty();) {
      const Replica& mirror = replicas[r];
      if (!mirror.mirror || !mirror.available || draining(mirror.worker)) {
        continue;
      }
      repair.promoted.emplace_back(repair.leaving.back(), r);
      repair.leaving.pop_back();
    }
    if (repair.leaving.empty()) {
      if (!repair.promoted.empty()) out.shards.push_back(std::move(repair));
      continue;
    }
    if (from == SIZE_MAX) {  // nothing left to copy from
      ++out.shards_short;
      continue;
    }
    repair.source = from;
    repair.need.missing = static_cast<int>(repair.leaving.size());
    repair.need.bytes = meta.shards[i].box.NumElements() * item;
    out.shards.push_back(std::move(repair));
  }
  return out;
}

}  // namespace tessera
