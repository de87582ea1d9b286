// Reconciliation: what a registering worker's report of the shards it holds
// means against the shards the coordinator expects it to hold. A pure rule,
// applied by TensorTable::Reconcile under its lock.
#ifndef TESSERA_COORDINATOR_RECONCILIATION_H_
#define TESSERA_COORDINATOR_RECONCILIATION_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/types/span.h"

namespace tessera {

struct Reconciliation {
  // Held, but no tensor version references them: the worker frees them.
  std::vector<uint64_t> unreferenced;
  // Expected on the worker but not held: unavailable until it has them.
  std::vector<uint64_t> lost;
  // Expected and held: available again if they were lost.
  std::vector<uint64_t> found;
};

// `expected`: the shard ids the coordinator placed on the worker (every
// version still referenced); `held`: what the worker reports;
// `is_referenced`: whether any tensor version (or an allocation in progress)
// uses an id. Each list keeps the order of its input.
Reconciliation ReconcileShards(
    absl::Span<const uint64_t> expected, absl::Span<const uint64_t> held,
    const std::function<bool(uint64_t)>& is_referenced);

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_RECONCILIATION_H_
