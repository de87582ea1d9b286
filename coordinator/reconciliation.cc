#include "coordinator/reconciliation.h"

#include "absl/container/flat_hash_set.h"

namespace tessera {

Reconciliation ReconcileShards(
    absl::Span<const uint64_t> expected, absl::Span<const uint64_t> held,
    const std::function<bool(uint64_t)>& is_referenced) {
  Reconciliation out;
  const absl::flat_hash_set<uint64_t> held_set(held.begin(), held.end());
  for (uint64_t id : expected) {
    (held_set.contains(id) ? out.found : out.lost).push_back(id);
  }
  for (uint64_t id : held) {
    if (!is_referenced(id)) out.unreferenced.push_back(id);
  }
  return out;
}

}  // namespace tessera
