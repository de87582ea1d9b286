#include "core/replica_placement.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace tessera {

namespace {

int64_t SaturatingAdd(int64_t a, int64_t b) {
  if (b > 0 && a > std::numeric_limits<int64_t>::max() - b) {
    return std::numeric_limits<int64_t>::max();
  }
  return a + b;
}

bool IsZoneChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
         c == '.' || c == '-' || c == ':' || c == '/';
}

// Zones as numbers; a worker without one is a zone of its own.
std::vector<int> ZoneIds(const std::vector<ReplicaCandidate>& workers) {
  const int n = static_cast<int>(workers.size());
  std::vector<int> zone(n);
  absl::flat_hash_map<std::string, int> zone_ids;
  for (int w = 0; w < n; ++w) {
    zone[w] = workers[w].zone.empty()
                  ? -1 - w
                  : zone_ids.try_emplace(workers[w].zone, zone_ids.size())
                        .first->second;
  }
  return zone;
}

// The ready workers, in name order (the last tie-break).
std::vector<int> ReadyByName(const std::vector<ReplicaCandidate>& workers) {
  std::vector<int> ready;
  for (int w = 0; w < static_cast<int>(workers.size()); ++w) {
    if (workers[w].state == WorkerState::kReady) ready.push_back(w);
  }
  std::sort(ready.begin(), ready.end(),
            [&](int a, int b) { return workers[a].name < workers[b].name; });
  return ready;
}

// The rule both placements share: among the ready workers not in
// `holders` with room for `bytes`, the first on a zone not in `zones_used`,
// then the least loaded; -1 when none has room (`any_candidate`: whether
// any ready worker was not a holder at all).
int PickWorker(const std::vector<ReplicaCandidate>& workers,
               const std::vector<int>& ready, const std::vector<int>& zone,
               const std::vector<int64_t>& load, absl::Span<const int> holders,
               absl::Span<const int> zones_used, int64_t bytes,
               bool* any_candidate) {
  int best = -1;
  bool best_new_zone = false;
  *any_candidate = false;
  for (int w : ready) {
    if (std::find(holders.begin(), holders.end(), w) != holders.end()) {
      continue;
    }
    *any_candidate = true;
    const int64_t capacity = workers[w].capacity_bytes;
    if (capacity > 0 && bytes > capacity - load[w]) continue;
    const bool new_zone = std::find(zones_used.begin(), zones_used.end(),
                                    zone[w]) == zones_used.end();
    if (best < 0 || (new_zone && !best_new_zone) ||
        (new_zone == best_new_zone && load[w] < load[best])) {
      best = w;
      best_new_zone = new_zone;
    }
  }
  return best;
}

}  // namespace

absl::Status CheckReplicaCount(int64_t replicas) {
  if (replicas >= 1 && replicas <= kMaxReplicas) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--replicas=", replicas, ": replicas must be 1 to ", kMaxReplicas));
}

absl::Status CheckZone(absl::string_view zone) {
  if (!zone.empty() && zone.size() <= 64 &&
      std::all_of(zone.begin(), zone.end(), IsZoneChar)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--zone=", zone.substr(0, 64), zone.size() > 64 ? "...: " : ": ",
      "a zone is 1 to 64 letters, digits and '_', '.', '-', ':', '/'"));
}

absl::StatusOr<std::vector<std::vector<int>>> PlaceReplicas(
    const std::vector<ReplicaCandidate>& workers,
    const std::vector<ShardToPlace>& shards, int replicas) {
  if (absl::Status count = CheckReplicaCount(replicas); !count.ok()) {
    return count;
  }
  const int n = static_cast<int>(workers.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].first < 0 || shards[i].first >= n || shards[i].bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", i, ": its first replica is on no known worker"));
    }
  }
  const std::vector<int> zone = ZoneIds(workers);
  const std::vector<int> ready = ReadyByName(workers);
  std::vector<int64_t> load(n);
  for (int w = 0; w < n; ++w)
    load[w] = std::max<int64_t>(workers[w].bytes_used, 0);
  for (const ShardToPlace& shard : shards) {
    load[shard.first] = SaturatingAdd(load[shard.first], shard.bytes);
  }

  std::vector<std::vector<int>> placed(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardToPlace& shard = shards[i];
    std::vector<int>& holders = placed[i];
    holders.reserve(replicas);
    holders.push_back(shard.first);
    absl::InlinedVector<int, 4> zones_used = {zone[shard.first]};
    while (static_cast<int>(holders.size()) < replicas) {
      bool any_candidate = false;
      const int best = PickWorker(workers, ready, zone, load, holders,
                                  zones_used, shard.bytes, &any_candidate);
      if (best < 0) {
        if (!any_candidate) {
          return absl::FailedPreconditionError(absl::StrCat(
              "replicas: --replicas=", replicas, " needs ", replicas,
              " distinct workers that take new shards, and shard ", i, " has ",
              holders.size(),
              " (its first replica's and the ready "
              "ones)"));
        }
        return absl::ResourceExhaustedError(absl::StrCat(
            "capacity: no ready worker has room for replica ",
            holders.size() + 1, " of shard ", i, " (", shard.bytes, " bytes)"));
      }
      holders.push_back(best);
      zones_used.push_back(zone[best]);
      load[best] = SaturatingAdd(load[best], shard.bytes);
    }
  }
  return placed;
}

absl::StatusOr<std::vector<std::vector<int>>> PlaceRepairs(
    const std::vector<ReplicaCandidate>& workers,
    const std::vector<ShardToRepair>& shards) {
  const int n = static_cast<int>(workers.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardToRepair& shard = shards[i];
    if (shard.missing < 0 || shard.bytes < 0 ||
        std::any_of(shard.kept.begin(), shard.kept.end(),
                    [n](int w) { return w < 0 || w >= n; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", i,
                       " to repair: a kept replica on no known "
                       "worker, or a negative count or size"));
    }
  }
  const std::vector<int> zone = ZoneIds(workers);
  const std::vector<int> ready = ReadyByName(workers);
  std::vector<int64_t> load(n);
  for (int w = 0; w < n; ++w)
    load[w] = std::max<int64_t>(workers[w].bytes_used, 0);

  std::vector<std::vector<int>> placed(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardToRepair& shard = shards[i];
    std::vector<int> holders = shard.kept;
    std::vector<int> zones_used;
    for (int w : holders) zones_used.push_back(zone[w]);
    for (int k = 0; k < shard.missing; ++k) {
      bool any_candidate = false;
      const int best = PickWorker(workers, ready, zone, load, holders,
                                  zones_used, shard.bytes, &any_candidate);
      if (best < 0) break;  // the rest waits for workers with room
      placed[i].push_back(best);
      holders.push_back(best);
      zones_used.push_back(zone[best]);
      load[best] = SaturatingAdd(load[best], shard.bytes);
    }
  }
  return placed;
}

}  // namespace tessera
