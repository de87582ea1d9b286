#include "worker/registration.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "proto/coordinator.grpc.pb.h"
#include "rpc/call.h"
#include "rpc/channel.h"
#include "rpc/convert.h"
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

CallOptions Registration::CoordinatorCall() const {
  CallOptions call;
  call.timeout = options_.rpc_timeout;
  call.peer = absl::StrCat("coordinator at ", options_.coordinator);
  return call;
}

void Registration::Run() {
  auto stub = v1::Coordinator::NewStub(
      MakeChannel(options_.coordinator, options_.channel));
  absl::Duration backoff = absl::Milliseconds(50);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  bool registered = false;
  int failures = 0;
  while (!stop_.HasBeenNotified()) {
    if (!registered) {
      v1::RegisterWorkerRequest request;
      request.set_name(options_.name);
      if (options_.rank.has_value()) request.set_rank(*options_.rank);
      request.set_address(options_.address);
      *request.mutable_device() = DeviceToProto(options_.device);
      request.set_capacity_bytes(options_.capacity_bytes);
      request.set_bytes_used(store_->BytesUsed());
      for (uint64_t id : store_->ShardIds()) request.add_held_shard_ids(id);
      v1::RegisterWorkerResponse response;
      absl::Status status =
          Call(CoordinatorCall(), [&](grpc::ClientContext* context) {
            return stub->RegisterWorker(context, request, &response);
          });
      if (status.ok()) {
        registered = true;
        if (options_.on_key) options_.on_key(response.capability_key());
        if (options_.on_registered) options_.on_registered(true);
        failures = 0;
        backoff = absl::Milliseconds(50);
        if (response.heartbeat_interval_ms() > 0) {
          heartbeat_interval =
              absl::Milliseconds(response.heartbeat_interval_ms());
        }
        for (uint64_t id : response.free_shard_ids())
          store_->Free(id).IgnoreError();
        {
          absl::MutexLock lock(&mu_);
          rank_ = response.rank();
        }
        spdlog::info("registered with coordinator {} as '{}' rank {}",
                     options_.coordinator, options_.name, response.rank());
        if (!registered_.HasBeenNotified()) registered_.Notify();
        continue;
      }
      if (IsFatal(status)) {
        spdlog::error("coordinator refused registration: {}",
                      std::string(status.message()));
        on_fatal_(status);
        return;
      }
      if (failures++ % 20 == 0) {
        spdlog::warn("coordinator {} not reachable yet ({}); retrying",
                     options_.coordinator, std::string(status.message()));
      }
      stop_.WaitForNotificationWithTimeout(backoff);
      backoff = std::min(backoff * 2, options_.max_backoff);
      continue;
    }
    if (stop_.WaitForNotificationWithTimeout(heartbeat_interval)) break;
    v1::HeartbeatRequest request;
    request.set_name(options_.name);
    request.set_bytes_used(store_->BytesUsed());
    v1::HeartbeatResponse response;
    absl::Status status =
        Call(CoordinatorCall(), [&](grpc::ClientContext* context) {
          return stub->Heartbeat(context, request, &response);
        });
    if (status.ok() && response.reregister()) {
      spdlog::info(
          "coordinator does not know this worker any more; registering again");
      registered = false;
      if (options_.on_registered) options_.on_registered(false);
    } else if (!status.ok() && failures++ % 20 == 0) {
      spdlog::warn("heartbeat to coordinator {} failed: {}",
                   options_.coordinator, std::string(status.message()));
    } else if (status.ok()) {
      failures = 0;
    }
  }
}

}  // namespace tessera
