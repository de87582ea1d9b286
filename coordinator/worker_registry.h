// WorkerRegistry: the membership of workers — name, rank, address, device,
// memory use — and their leases on an injected clock. Thread-safe.
#ifndef TESSERA_COORDINATOR_WORKER_REGISTRY_H_
#define TESSERA_COORDINATOR_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/placement.h"

namespace tessera {

using Clock = std::function<absl::Time()>;

struct WorkerRegistration {
  std::string name;
  std::optional<int32_t> rank;  // none: lowest free rank
  std::string address;
  Device device;
  int64_t capacity_bytes = 0;
  int64_t bytes_used = 0;
};

struct WorkerRecord {
  std::string name;
  int32_t rank = 0;
  std::string address;
  Device device;
  int64_t capacity_bytes = 0;
  int64_t bytes_used = 0;
  absl::Time last_seen;
  bool alive = false;  // computed from the lease when read
  // False for a worker remembered from before a coordinator restart that has
  // not registered since: it must register (and report its shards) again.
  bool registered = true;
};

class WorkerRegistry {
 public:
  WorkerRegistry(absl::Duration lease, Clock clock);

  // Adds a worker or takes back a known name (a restarted worker keeps its
  // rank). ALREADY_EXISTS when the requested rank belongs to another worker,
  // or the name belongs to a live worker at another address.
  absl::StatusOr<int32_t> Register(const WorkerRegistration& registration)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Remembers a worker from before a restart, dead until it registers again.
  void Restore(const std::string& name, int32_t rank,
               const std::string& address, const Device& device,
               int64_t capacity_bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Renews the lease; false when the worker must register (again) first.
  bool Heartbeat(const std::string& name, int64_t bytes_used)
      ABSL_LOCKS_EXCLUDED(mu_);

  void SetBytesUsed(const std::string& name, int64_t bytes_used)
      ABSL_LOCKS_EXCLUDED(mu_);

  // All workers ordered by rank.
  std::vector<WorkerRecord> List() const ABSL_LOCKS_EXCLUDED(mu_);

  std::optional<WorkerRecord> Find(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The worker a placement names; DoesNotExist when no such worker is
  // registered or it has no such device.
  absl::StatusOr<WorkerRecord> Resolve(const Placement& placement) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  WorkerRecord WithLiveness(const WorkerRecord& record) const;

  const absl::Duration lease_;
  const Clock clock_;
  // Invariants: names and ranks are unique; rank_to_name_ mirrors workers_.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int32_t, std::string> rank_to_name_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_WORKER_REGISTRY_H_
