// WorkerReconciler: a worker registering (for the first time, after its own
// restart, or after the coordinator's). It checks the registration, records
// the worker durably before the registry shows it, and reconciles the shards
// the worker reports against the tensor table: held shards that nothing
// references are handed back to be freed, expected shards it does not hold
// are marked lost (unavailable to readers) until it has them again.
//
// Thread-safe; holds no lock of its own, and none across the durable record.
#ifndef TESSERA_COORDINATOR_WORKER_RECONCILER_H_
#define TESSERA_COORDINATOR_WORKER_RECONCILER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/metadata_log.h"
#include "coordinator/tensor_table.h"
#include "coordinator/worker_control.h"
#include "coordinator/worker_registry.h"

namespace tessera {

struct RegisterResult {
  int32_t rank = 0;
  std::vector<uint64_t> free_shard_ids;  // held shards no tensor references
};

class WorkerReconciler {
 public:
  // Every pointer must outlive the reconciler.
  WorkerReconciler(WorkerRegistry* registry, TensorTable* table,
                   MetadataLog* log, WorkerControl* workers);

  // INVALID_ARGUMENT for a bad name, address or rank; the registry's
  // ALREADY_EXISTS for a clash; the log's error when the record fails (the
  // registry is then unchanged).
  absl::StatusOr<RegisterResult> Register(
      const WorkerRegistration& registration,
      const std::vector<uint64_t>& held_shard_ids);

 private:
  WorkerRegistry* const registry_;
  TensorTable* const table_;
  MetadataLog* const log_;
  WorkerControl* const workers_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_WORKER_RECONCILER_H_
