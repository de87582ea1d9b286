#include "worker/registration.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/capability.h"
#include "core/shard_record.h"
#include "proto/coordinator.grpc.pb.h"
#include "rpc/call.h"
#include "rpc/channel.h"
#include "rpc/convert.h"
#include "rpc/coordinator_channel.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

// Errors that retrying cannot fix.
bool IsFatal(const absl::Status& status) {
  return absl::IsAlreadyExists(status) || absl::IsInvalidArgument(status) ||
         absl::IsFailedPrecondition(status) ||
         absl::IsUnauthenticated(status) || absl::IsPermissionDenied(status);
}

}  // namespace

Registration::Registration(RegistrationOptions options, ShardStore* store,
                           std::function<void(const absl::Status&)> on_fatal)
    : options_(std::move(options)),
      store_(store),
      on_fatal_(std::move(on_fatal)) {}

Registration::~Registration() { Stop(); }

void Registration::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Registration::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

int32_t Registration::rank() const {
  absl::MutexLock lock(&mu_);
  return rank_;
}

bool Registration::WaitRegistered(absl::Duration timeout) {
  return registered_.WaitForNotificationWithTimeout(timeout);
}

std::string Registration::cluster_id() const {
  absl::MutexLock lock(&mu_);
  return cluster_id_.value_or("");
}

int64_t Registration::quarantined() const {
  absl::MutexLock lock(&mu_);
  if (!cluster_id_.has_value()) return 0;
  int64_t count = 0;
  for (const auto& [id, owner] : owner_) count += owner != *cluster_id_;
  return count;
}

std::vector<uint64_t> Registration::QuarantinedShards() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  if (!cluster_id_.has_value()) return ids;
  for (const auto& [id, owner] : owner_) {
    if (owner != *cluster_id_) ids.push_back(id);
  }
  return ids;
}

void Registration::ExpireQuarantine() {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    if (!quarantined_since_.has_value() ||
        absl::Now() - *quarantined_since_ < options_.quarantine_grace) {
      return;
    }
    for (const auto& [id, owner] : owner_) {
      if (cluster_id_.has_value() && owner != *cluster_id_) ids.push_back(id);
    }
    quarantined_since_.reset();
  }
  spdlog::error(
      "freeing {} shard(s) quarantined for another cluster for longer than "
      "--quarantine_grace ({}): their cluster's coordinator never came back",
      ids.size(), absl::FormatDuration(options_.quarantine_grace));
  for (uint64_t id : ids) store_->Free(id).IgnoreError();
  Attribute();
}

std::vector<uint64_t> Registration::Attribute() {
  std::vector<uint64_t> held = store_->ShardIds();
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<uint64_t, std::string> owner;
  owner.reserve(held.size());
  for (uint64_t id : held) {
    auto it = owner_.find(id);
    if (it != owner_.end()) {
      owner.emplace(id, std::move(it->second));
    } else {
      owner.emplace(id, cluster_id_.value_or(""));
    }
  }
  owner_ = std::move(owner);
  return held;
}

void Registration::Adopt(
    const absl::flat_hash_map<uint64_t, std::string>& owners) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, cluster] : owners) owner_[id] = cluster;
}

void Registration::Serve(const std::string& cluster_id) {
  absl::MutexLock lock(&mu_);
  if (!cluster_id_.has_value()) {
    spdlog::info("serving cluster {}", cluster_id);
  } else if (*cluster_id_ != cluster_id) {
    spdlog::warn(
        "the coordinator at {} now serves cluster {}, not cluster {} as "
        "before (a coordinator started on another --data_dir?)",
        options_.coordinator, cluster_id, *cluster_id_);
  }
  cluster_id_ = cluster_id;
  int64_t quarantined = 0;
  for (const auto& [id, owner] : owner_) quarantined += owner != cluster_id;
  if (quarantined > 0) {
    spdlog::error(
        "{} shard(s) held here belong to another cluster than {}: they stay "
        "quarantined (kept, never freed on this coordinator's word) until "
        "their own cluster's coordinator is back at {}",
        quarantined, cluster_id, options_.coordinator);
  } else if (quarantined_logged_ > 0) {
    spdlog::info("rejoined cluster {}: no shard is quarantined any more",
                 cluster_id);
  }
  quarantined_logged_ = quarantined;
  if (quarantined == 0) {
    quarantined_since_.reset();
  } else if (!quarantined_since_.has_value()) {
    quarantined_since_ = absl::Now();
  }
}

int64_t Registration::FreeOwn(const std::vector<uint64_t>& ids,
                              bool set_aside) {
  std::vector<uint64_t> own;
  int64_t kept = 0;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : ids) {
      auto it = owner_.find(id);
      if (it == owner_.end()) continue;  // not held (freed already)
      if (cluster_id_.has_value() && it->second == *cluster_id_) {
        own.push_back(id);
      } else {
        ++kept;
      }
    }
  }
  for (uint64_t id : own) {
    (set_aside ? store_->SetAside(id) : store_->Free(id)).IgnoreError();
  }
  return kept;
}

std::vector<uint64_t> Registration::OwnShards() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> own;
  if (!cluster_id_.has_value()) return own;
  for (const auto& [id, owner] : owner_) {
    if (owner == *cluster_id_) own.push_back(id);
  }
  return own;
}

CallOptions Registration::CoordinatorCall(LeaderChannels* leaders) const {
  CallOptions call;
  call.timeout = options_.rpc_timeout;
  if (leaders != nullptr) {
    // Several coordinators, one leading: a heartbeat takes milliseconds,
    // and a leader that hangs costs this long before the next is tried.
    call.leaders = leaders;
    call.timeout = std::min(call.timeout, absl::Milliseconds(300));
    call.connect_wait = absl::Milliseconds(100);
  }
  call.peer = absl::StrCat("coordinator at ", options_.coordinator);
  return call;
}

void Registration::Run() {
  // Several coordinators (one leads): calls go to the leader, passing over
  // those that cannot be reached and following a standby's word
  // (rpc/coordinator_channel.h).
  absl::StatusOr<std::unique_ptr<CoordinatorChannel>> made =
      CoordinatorChannel::Make(options_.coordinator, options_.channel);
  if (!made.ok()) {
    on_fatal_(made.status());
    return;
  }
  Loop loop{**made};
  while (!stop_.HasBeenNotified()) {
    if (!loop.registered) {
      if (!Register(loop)) return;
      continue;
    }
    // A list the coordinator asked for goes at once, and so does the next
    // try after a coordinator that could not be reached (another leads).
    if (!loop.send_held && !loop.try_next &&
        stop_.WaitForNotificationWithTimeout(loop.heartbeat_interval))
      break;
    if (stop_.HasBeenNotified()) break;
    loop.try_next = false;
    Heartbeat(loop);
  }
}

bool Registration::Register(Loop& loop) {
  v1::RegisterWorkerRequest request;
  request.set_name(options_.name);
  if (options_.rank.has_value()) request.set_rank(*options_.rank);
  request.set_address(options_.address);
  *request.mutable_device() = DeviceToProto(options_.device);
  request.set_gpu_uuid(options_.gpu_uuid);
  request.set_zone(options_.zone);
  request.set_data_address(options_.data_address);
  request.mutable_labels()->insert(options_.labels.begin(),
                                   options_.labels.end());
  request.set_capacity_bytes(options_.capacity_bytes);
  const BytesUsedReading used = store_->ReadBytesUsed();
  request.set_bytes_used(used.bytes);
  request.set_bytes_used_seq(used.seq);
  // Shards made since the last heartbeat belong to the cluster served
  // until now; the reply may name another.
  for (uint64_t id : Attribute()) {
    request.add_held_shard_ids(id);
    // What it holds under the id, for the coordinator to check.
    absl::StatusOr<ShardDesc> desc = store_->Describe(id);
    request.add_held_shard_identities(
        desc.ok()
            ? ShardIdentity(desc->tensor.str(), desc->incarnation, desc->box)
            : 0);
  }
  v1::RegisterWorkerResponse response;
  absl::Status status = Call(CoordinatorCall(loop.coordinator.leaders()),
                             [&](grpc::ClientContext* context) {
                               return loop.coordinator.stub()->RegisterWorker(
                                   context, request, &response);
                             });
  if (status.ok()) {
    Registered(loop, response);
    return true;
  }
  // Once this worker has registered (and may hold shards), a refused
  // secret is a rotation under way -- the coordinator's --tokens and this
  // worker's --token_file are reloaded separately -- not a reason to exit
  // and drop the shards: keep trying.
  const bool rotating =
      absl::IsUnauthenticated(status) && registered_.HasBeenNotified();
  if (IsFatal(status) && !rotating) {
    spdlog::error("coordinator refused registration: {}",
                  std::string(status.message()));
    on_fatal_(status);
    return false;
  }
  const bool say = loop.failures++ % 20 == 0;
  if (say && rotating) {
    spdlog::error(
        "coordinator refused registration: {}; keeping the shards and "
        "retrying (is --token_file out of date with the coordinator's "
        "--tokens?)",
        std::string(status.message()));
  } else if (say) {
    spdlog::warn("coordinator {} not reachable yet ({}); retrying",
                 options_.coordinator, std::string(status.message()));
  }
  stop_.WaitForNotificationWithTimeout(loop.backoff);
  loop.backoff = std::min(loop.backoff * 2, options_.max_backoff);
  return true;
}

void Registration::Registered(Loop& loop,
                              const v1::RegisterWorkerResponse& response) {
  loop.registered = true;
  loop.send_held = false;
  Attribute();
  Serve(response.cluster_id());
  if (options_.on_key)
    options_.on_key(response.capability_key(), response.cluster_id());
  if (options_.on_registered) options_.on_registered(true);
  loop.failures = 0;
  loop.backoff = absl::Milliseconds(50);
  if (response.heartbeat_interval_ms() > 0) {
    loop.heartbeat_interval =
        absl::Milliseconds(response.heartbeat_interval_ms());
  }
  FreeOwn(std::vector<uint64_t>(response.set_aside_shard_ids().begin(),
                                response.set_aside_shard_ids().end()),
          /*set_aside=*/true);
  FreeOwn(std::vector<uint64_t>(response.free_shard_ids().begin(),
                                response.free_shard_ids().end()));
  {
    absl::MutexLock lock(&mu_);
    rank_ = response.rank();
  }
  spdlog::info("registered with coordinator {} as '{}' rank {}",
               options_.coordinator, options_.name, response.rank());
  if (!registered_.HasBeenNotified()) registered_.Notify();
}

v1::HeartbeatRequest Registration::NextHeartbeat(bool send_held) {
  v1::HeartbeatRequest request;
  request.set_name(options_.name);
  const BytesUsedReading used = store_->ReadBytesUsed();
  request.set_bytes_used(used.bytes);
  request.set_bytes_used_seq(used.seq);
  Attribute();
  uint64_t held_xor = 0;
  const std::vector<uint64_t> own = OwnShards();
  for (uint64_t id : own) held_xor ^= id;
  request.set_held_count(static_cast<int64_t>(own.size()));
  request.set_held_xor(held_xor);
  if (send_held) {
    request.set_held_list(true);
    request.mutable_held_shard_ids()->Assign(own.begin(), own.end());
  }
  // What is kept for another cluster, so `workers` shows it.
  ExpireQuarantine();
  int64_t quarantined_bytes = 0;
  const std::vector<uint64_t> quarantined = QuarantinedShards();
  for (uint64_t id : quarantined) {
    absl::StatusOr<ShardDesc> desc = store_->Describe(id);
    if (desc.ok()) quarantined_bytes += desc->ByteSize();
  }
  request.set_quarantined_shards(static_cast<int64_t>(quarantined.size()));
  request.set_quarantined_bytes(quarantined_bytes);
  if (std::optional<DeviceMemory> memory = store_->DeviceMemoryNow(); memory) {
    request.set_device_total_bytes(memory->total_bytes);
    request.set_device_free_bytes(memory->free_bytes);
  }
  return request;
}

void Registration::Heartbeat(Loop& loop) {
  const v1::HeartbeatRequest request = NextHeartbeat(loop.send_held);
  loop.send_held = false;
  v1::HeartbeatResponse response;
  LeaderChannels* const leaders = loop.coordinator.leaders();
  absl::Status status =
      Call(CoordinatorCall(leaders), [&](grpc::ClientContext* context) {
        return loop.coordinator.stub()->Heartbeat(context, request, &response);
      });
  // The leader may have moved: the next heartbeat goes at once.
  loop.try_next = leaders != nullptr && (absl::IsUnavailable(status) ||
                                         absl::IsDeadlineExceeded(status));
  if (status.ok() && !response.reregister() && !response.cluster_id().empty() &&
      response.cluster_id() != cluster_id()) {
    // Not the coordinator this worker registered with: learn who it is.
    spdlog::warn("coordinator {} answers for cluster {}; registering again",
                 options_.coordinator, response.cluster_id());
    loop.registered = false;
    if (options_.on_registered) options_.on_registered(false);
  } else if (status.ok() && !response.reregister()) {
    if (!response.free_shard_ids().empty()) {
      spdlog::info("coordinator frees {} shard(s) no tensor references",
                   response.free_shard_ids_size());
      FreeOwn(std::vector<uint64_t>(response.free_shard_ids().begin(),
                                    response.free_shard_ids().end()));
    }
    loop.send_held = response.send_held_shards();
    loop.failures = 0;
    if (options_.on_revoked) {
      std::vector<std::pair<std::string, int64_t>> revoked;
      const int n = std::min<int>(response.revoked_size(),
                                  static_cast<int>(Revocations::kMaxEntries));
      revoked.reserve(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        revoked.emplace_back(response.revoked(i).principal(),
                             response.revoked(i).before_ms());
      }
      options_.on_revoked(std::move(revoked));
    }
  } else if (status.ok() && response.reregister()) {
    spdlog::info(
        "coordinator does not know this worker any more; registering again");
    loop.registered = false;
    if (options_.on_registered) options_.on_registered(false);
  } else if (!status.ok() && loop.failures++ % 20 == 0) {
    spdlog::warn("heartbeat to coordinator {} failed: {}", options_.coordinator,
                 std::string(status.message()));
  } else if (status.ok()) {
    loop.failures = 0;
  }
}

}  // namespace tessera
