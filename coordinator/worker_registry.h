// WorkerRegistry: the membership of workers — name, rank, address, device,
// memory use — and their leases on an injected clock.
//
// A registration whose record must be durable before the worker shows is
// made in two steps: Reserve checks it and sets its name and rank aside
// (invisible to List, Find and Resolve; a second registration of the same
// name waits until the first is completed or aborted), then Complete
// publishes it or Abort drops it. Register does both at once.
//
// Bounded: names and addresses are checked (core/placement.h: a name of at
// most 64 characters, a HOST:PORT address of at most kMaxAddressBytes), and
// at most `max_workers` workers are known at once, so the listing of all
// workers stays far below one message (kWorkerInfoBytesBound).
//
// Thread-safe; mu_ is a leaf lock (nothing is called while it is held).
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
#include "core/worker_info.h"

namespace tessera {

using Clock = std::function<absl::Time()>;

// Default for the most workers one coordinator knows (alive or dead).
inline constexpr size_t kDefaultMaxWorkers = 4096;
// The most workers any coordinator knows, whatever it is configured with:
// their listing stays within 25 MiB (kWorkerInfoBytesBound each).
inline constexpr size_t kMaxWorkersCeiling = 65536;
// An upper bound on the bytes one registered worker takes in a listing
// (ListWorkers) or in a tensor's packed describe: a name of at most 64
// bytes, an address of at most kMaxAddressBytes, a rank, a device and two
// byte counts, with their field tags and lengths.
inline constexpr size_t kWorkerInfoBytesBound = 400;

// A worker asking to join.
struct WorkerRegistration {
  // What the worker says of itself: name, address, device, capacity_bytes,
  // bytes_used. Its rank and liveness are the registry's to set.
  WorkerInfo worker;
  std::optional<int32_t> rank;  // the rank asked for; none: lowest free
  // For each held shard id given with it, in order, the worker's
  // ShardIdentity of it; empty: not checked (a worker from before).
  std::vector<uint64_t> held_identities;
};

// A registered (or remembered) worker: its WorkerInfo, with `alive` computed
// from the lease when read.
struct WorkerRecord : WorkerInfo {
  absl::Time last_seen;
  // False for a worker remembered from before a coordinator restart that has
  // not registered since: it must register (and report its shards) again.
  bool registered = true;
  // What an admin made it (durable): kReady, kCordoned or kDraining. Its
  // `state` is this while it is alive, kDead otherwise.
  WorkerState admin_state = WorkerState::kReady;
};

class WorkerRegistry {
 public:
  // `max_workers` (clamped to 1..kMaxWorkersCeiling): how many distinct
  // workers may be known at once, dead ones included.
  WorkerRegistry(absl::Duration lease, Clock clock,
                 size_t max_workers = kDefaultMaxWorkers);

  size_t max_workers() const { return max_workers_; }

  // Checks a registration and reserves its name and rank: a new worker gets
  // the requested or lowest free rank, a known name keeps its rank (a
  // restarted worker). INVALID_ARGUMENT for a bad name or address;
  // RESOURCE_EXHAUSTED for a new name when max_workers are known already;
  // ALREADY_EXISTS when the requested rank belongs to another worker, or the
  // name belongs to a live worker at another address. Returns the worker as
  // it will be registered.
  absl::StatusOr<WorkerInfo> Reserve(const WorkerRegistration& registration)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Publishes a reservation: the worker is listed, alive from now.
  void Complete(const WorkerInfo& worker) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops a reservation; a known worker stays as it was.
  void Abort(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // Reserve and Complete; returns the rank.
  absl::StatusOr<int32_t> Register(const WorkerRegistration& registration)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Remembers a worker from before a restart, dead until it registers again
  // (`worker.state`: its durable admin state; any other counts as ready).
  // A record with a bad name or address (written before they were checked)
  // is not remembered: its status says why, and the worker must register
  // again under valid ones.
  absl::Status Restore(const WorkerInfo& worker) ABSL_LOCKS_EXCLUDED(mu_);

  // Cordons, uncordons (kReady) or drains a known worker, after any
  // registration of it in flight; returns it as it is now, its `state` the
  // durable one (for its record), and the state it had in `previous`.
  // NOT_FOUND for an unknown name; INVALID_ARGUMENT for kDead.
  absl::StatusOr<WorkerInfo> SetAdminState(const std::string& name,
                                           WorkerState state,
                                           WorkerState* previous = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets a worker: its name and rank are free again. NOT_FOUND for an
  // unknown name.
  absl::Status Forget(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // Renews the lease; false when the worker must register (again) first.
  // Both keep the newest of the worker's bytes_used readings
  // (core/worker_info.h TakeBytesUsed).
  bool Heartbeat(const std::string& name, BytesUsedReading bytes_used)
      ABSL_LOCKS_EXCLUDED(mu_);
  void SetBytesUsed(const std::string& name, BytesUsedReading bytes_used)
      ABSL_LOCKS_EXCLUDED(mu_);
  // What the worker keeps quarantined for another cluster (its heartbeat).
  void SetQuarantined(const std::string& name, int64_t shards, int64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A GPU worker's device memory (its heartbeat).
  void SetDeviceMemory(const std::string& name, int64_t total_bytes,
                       int64_t free_bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // All workers ordered by rank.
  std::vector<WorkerRecord> List() const ABSL_LOCKS_EXCLUDED(mu_);
  // How many workers List would return.
  size_t NumWorkers() const ABSL_LOCKS_EXCLUDED(mu_);

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
  const size_t max_workers_;
  // Invariants: names and ranks are unique across workers_ and reserved_;
  // rank_to_name_ mirrors workers_; a reserved name that is in workers_
  // keeps its rank.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int32_t, std::string> rank_to_name_ ABSL_GUARDED_BY(mu_);
  // Registrations whose record is being written: name -> rank.
  absl::flat_hash_map<std::string, int32_t> reserved_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_WORKER_REGISTRY_H_
