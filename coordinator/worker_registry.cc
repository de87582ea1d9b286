#include "coordinator/worker_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/errors.h"
#include "core/placement.h"
#include "core/replica_placement.h"

namespace tessera {

WorkerRegistry::WorkerRegistry(absl::Duration lease, Clock clock,
                               size_t max_workers)
    : lease_(lease),
      clock_(std::move(clock)),
      max_workers_(std::clamp<size_t>(max_workers, 1, kMaxWorkersCeiling)) {}

WorkerRecord WorkerRegistry::WithLiveness(const WorkerRecord& record) const {
  WorkerRecord out = record;
  out.alive = record.registered && clock_() - record.last_seen <= lease_;
  out.state = out.alive ? record.admin_state : WorkerState::kDead;
  return out;
}

namespace {

// The admin states a record keeps; anything else reads as ready.
WorkerState DurableAdminState(WorkerState state) {
  return state == WorkerState::kCordoned || state == WorkerState::kDraining
             ? state
             : WorkerState::kReady;
}

}  // namespace

absl::StatusOr<WorkerInfo> WorkerRegistry::Reserve(
    const WorkerRegistration& registration) {
  const std::string& name = registration.worker.name;
  if (absl::Status s = CheckWorkerName(name); !s.ok()) return s;
  if (absl::Status s =
          CheckDialAddress(registration.worker.address, "worker address");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckGpuUuid(registration.worker.gpu_uuid); !s.ok()) {
    return s;
  }
  if (!registration.worker.data_address.empty()) {
    if (absl::Status s = CheckDialAddress(registration.worker.data_address,
                                          "worker data address");
        !s.ok()) {
      return s;
    }
  }
  if (!registration.worker.zone.empty()) {
    if (absl::Status s = CheckZone(registration.worker.zone); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = CheckLabels(registration.worker.labels); !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  auto not_reserved = [this, &name]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !reserved_.contains(name);
  };
  mu_.Await(absl::Condition(&not_reserved));
  WorkerInfo out = registration.worker;
  out.alive = true;
  auto existing = workers_.find(name);
  if (existing != workers_.end()) {
    const WorkerRecord& record = existing->second;
    const bool alive =
        record.registered && clock_() - record.last_seen <= lease_;
    if (alive && record.address != registration.worker.address) {
      return absl::AlreadyExistsError(
          absl::StrCat("worker '", name, "' already exists at ", record.address,
                       " and is alive"));
    }
    if (registration.rank.has_value() && *registration.rank != record.rank) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker '", name, "' already exists with rank ", record.rank,
          "; it cannot come back as rank ", *registration.rank));
    }
    out.rank = record.rank;
    out.state = record.admin_state;  // a restart keeps what an admin set
    reserved_[name] = out.rank;
    return out;
  }
  // A new name: reservations of other new names count too.
  size_t known = workers_.size();
  for (const auto& [other, rank] : reserved_) {
    if (!workers_.contains(other)) ++known;
  }
  if (known >= max_workers_) {
    size_t dead = 0;
    for (const auto& [other, record] : workers_) {
      if (!record.registered || clock_() - record.last_seen > lease_) ++dead;
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot register worker '", name, "': the coordinator knows ", known,
        " workers already (", dead, " of them dead), its max_workers"));
  }
  auto rank_owner = [this](int32_t rank) -> const std::string* {
    mu_.AssertHeld();
    auto taken = rank_to_name_.find(rank);
    if (taken != rank_to_name_.end()) return &taken->second;
    for (const auto& [other, reserved_rank] : reserved_) {
      if (reserved_rank == rank) return &other;
    }
    return nullptr;
  };
  if (registration.rank.has_value()) {
    out.rank = *registration.rank;
    if (const std::string* owner = rank_owner(out.rank); owner != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("rank ", out.rank,
                       " already exists: it belongs to worker '", *owner, "'"));
    }
  } else {
    out.rank = 0;
    while (rank_owner(out.rank) != nullptr) ++out.rank;
  }
  out.state = WorkerState::kReady;
  reserved_[name] = out.rank;
  return out;
}

void WorkerRegistry::Complete(const WorkerInfo& worker) {
  absl::MutexLock lock(&mu_);
  reserved_.erase(worker.name);
  WorkerRecord& record = workers_[worker.name];
  static_cast<WorkerInfo&>(record) = worker;
  record.admin_state = DurableAdminState(worker.state);
  record.last_seen = clock_();
  record.registered = true;
  rank_to_name_[worker.rank] = worker.name;
}

void WorkerRegistry::Abort(const std::string& name) {
  absl::MutexLock lock(&mu_);
  reserved_.erase(name);
}

absl::StatusOr<int32_t> WorkerRegistry::Register(
    const WorkerRegistration& registration) {
  absl::StatusOr<WorkerInfo> worker = Reserve(registration);
  if (!worker.ok()) return worker.status();
  Complete(*worker);
  return worker->rank;
}

absl::Status WorkerRegistry::Restore(const WorkerInfo& worker) {
  if (absl::Status s = CheckWorkerName(worker.name); !s.ok()) return s;
  if (absl::Status s = CheckDialAddress(worker.address, "worker address");
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  WorkerRecord record;
  static_cast<WorkerInfo&>(record) = worker;
  record.bytes_used = 0;
  record.bytes_used_seq = 0;
  record.alive = false;
  record.last_seen = absl::InfinitePast();
  record.registered = false;
  record.admin_state = DurableAdminState(worker.state);
  workers_[worker.name] = record;
  rank_to_name_[worker.rank] = worker.name;
  return absl::OkStatus();
}

absl::StatusOr<WorkerInfo> WorkerRegistry::SetAdminState(
    const std::string& name, WorkerState state, WorkerState* previous) {
  if (state == WorkerState::kDead) {
    return absl::InvalidArgumentError("a worker cannot be made dead");
  }
  absl::MutexLock lock(&mu_);
  // A registration in flight copied the state it records: wait for it, so
  // that its record never undoes this change.
  auto not_reserved = [this, &name]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !reserved_.contains(name);
  };
  mu_.Await(absl::Condition(&not_reserved));
  auto it = workers_.find(name);
  if (it == workers_.end()) return NotFoundError("worker", name);
  if (previous != nullptr) *previous = it->second.admin_state;
  it->second.admin_state = state;
  WorkerInfo out = WithLiveness(it->second);
  out.state = state;
  return out;
}

absl::Status WorkerRegistry::Forget(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it == workers_.end()) return NotFoundError("worker", name);
  rank_to_name_.erase(it->second.rank);
  workers_.erase(it);
  return absl::OkStatus();
}

bool WorkerRegistry::Heartbeat(const std::string& name,
                               BytesUsedReading bytes_used) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it == workers_.end() || !it->second.registered) return false;
  it->second.last_seen = clock_();
  TakeBytesUsed(bytes_used, it->second);
  return true;
}

void WorkerRegistry::SetBytesUsed(const std::string& name,
                                  BytesUsedReading bytes_used) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it != workers_.end()) TakeBytesUsed(bytes_used, it->second);
}

void WorkerRegistry::SetQuarantined(const std::string& name, int64_t shards,
                                    int64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it == workers_.end()) return;
  it->second.quarantined_shards = std::max<int64_t>(0, shards);
  it->second.quarantined_bytes = std::max<int64_t>(0, bytes);
}

void WorkerRegistry::SetDeviceMemory(const std::string& name,
                                     int64_t total_bytes, int64_t free_bytes) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it == workers_.end()) return;
  // A worker's word, kept within sense: 0 <= free <= total.
  it->second.device_total_bytes = std::max<int64_t>(0, total_bytes);
  it->second.device_free_bytes =
      std::clamp<int64_t>(free_bytes, 0, it->second.device_total_bytes);
}

std::vector<WorkerRecord> WorkerRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerRecord> out;
  out.reserve(workers_.size());
  for (const auto& [name, record] : workers_)
    out.push_back(WithLiveness(record));
  std::sort(out.begin(), out.end(),
            [](const WorkerRecord& a, const WorkerRecord& b) {
              return a.rank < b.rank;
            });
  return out;
}

size_t WorkerRegistry::NumWorkers() const {
  absl::MutexLock lock(&mu_);
  return workers_.size();
}

std::optional<WorkerRecord> WorkerRegistry::Find(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it == workers_.end()) return std::nullopt;
  return WithLiveness(it->second);
}

absl::StatusOr<WorkerRecord> WorkerRegistry::Resolve(
    const Placement& placement) const {
  absl::MutexLock lock(&mu_);
  const WorkerRecord* record = nullptr;
  if (placement.rank.has_value()) {
    auto it = rank_to_name_.find(*placement.rank);
    if (it != rank_to_name_.end()) record = &workers_.at(it->second);
  } else {
    auto it = workers_.find(placement.worker);
    if (it != workers_.end()) record = &it->second;
  }
  if (record == nullptr) {
    return DoesNotExistError(
        absl::StrCat("placement ", placement.ToString(), ": ",
                     placement.rank.has_value()
                         ? absl::StrCat("worker rank ", *placement.rank)
                         : absl::StrCat("worker '", placement.worker, "'")));
  }
  if (placement.device.has_value() && !(*placement.device == record->device)) {
    return DoesNotExistError(absl::StrCat(
        "placement ", placement.ToString(), ": device ",
        placement.device->ToString(), " of worker '", record->name, "'"));
  }
  return WithLiveness(*record);
}

}  // namespace tessera
