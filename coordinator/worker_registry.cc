#include "coordinator/worker_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/errors.h"

namespace tessera {

WorkerRegistry::WorkerRegistry(absl::Duration lease, Clock clock)
    : lease_(lease), clock_(std::move(clock)) {}

WorkerRecord WorkerRegistry::WithLiveness(const WorkerRecord& record) const {
  WorkerRecord out = record;
  out.alive = record.registered && clock_() - record.last_seen <= lease_;
  return out;
}

absl::StatusOr<int32_t> WorkerRegistry::Register(
    const WorkerRegistration& registration) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  auto existing = workers_.find(registration.name);
  if (existing != workers_.end()) {
    WorkerRecord& record = existing->second;
    const bool alive = record.registered && now - record.last_seen <= lease_;
    if (alive && record.address != registration.address) {
      return absl::AlreadyExistsError(
          absl::StrCat("worker '", registration.name, "' already exists at ",
                       record.address, " and is alive"));
    }
    if (registration.rank.has_value() && *registration.rank != record.rank) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker '", registration.name, "' already exists with rank ",
          record.rank, "; it cannot come back as rank ", *registration.rank));
    }
    record.address = registration.address;
    record.device = registration.device;
    record.capacity_bytes = registration.capacity_bytes;
    record.bytes_used = registration.bytes_used;
    record.last_seen = now;
    record.registered = true;
    return record.rank;
  }
  int32_t rank = 0;
  if (registration.rank.has_value()) {
    rank = *registration.rank;
    auto taken = rank_to_name_.find(rank);
    if (taken != rank_to_name_.end()) {
      return absl::AlreadyExistsError(
          absl::StrCat("rank ", rank, " already exists: it belongs to worker '",
                       taken->second, "'"));
    }
  } else {
    while (rank_to_name_.contains(rank)) ++rank;
  }
  WorkerRecord record;
  record.name = registration.name;
  record.rank = rank;
  record.address = registration.address;
  record.device = registration.device;
  record.capacity_bytes = registration.capacity_bytes;
  record.bytes_used = registration.bytes_used;
  record.last_seen = now;
  workers_[record.name] = record;
  rank_to_name_[rank] = record.name;
  return rank;
}

void WorkerRegistry::Restore(const std::string& name, int32_t rank,
                             const std::string& address, const Device& device,
                             int64_t capacity_bytes) {
  absl::MutexLock lock(&mu_);
  WorkerRecord record;
  record.name = name;
  record.rank = rank;
  record.address = address;
  record.device = device;
  record.capacity_bytes = capacity_bytes;
  record.last_seen = absl::InfinitePast();
  record.registered = false;
  workers_[name] = record;
  rank_to_name_[rank] = name;
}

bool WorkerRegistry::Heartbeat(const std::string& name, int64_t bytes_used) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it == workers_.end() || !it->second.registered) return false;
  it->second.last_seen = clock_();
  it->second.bytes_used = bytes_used;
  return true;
}

void WorkerRegistry::SetBytesUsed(const std::string& name, int64_t bytes_used) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it != workers_.end()) it->second.bytes_used = bytes_used;
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
