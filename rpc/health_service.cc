#include "rpc/health_service.h"

#include <utility>

namespace tessera {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

void HealthState::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  if (broken_ && serving) return;
  if (serving_ == serving) return;
  serving_ = serving;
  ++changes_;
}

bool HealthState::serving() const {
  absl::MutexLock lock(&mu_);
  return serving_;
}

void HealthState::SetBroken() {
  absl::MutexLock lock(&mu_);
  serving_ = false;
  broken_ = true;
  ++changes_;
}

bool HealthState::alive() const {
  absl::MutexLock lock(&mu_);
  return !broken_ && !shutdown_;
}

void HealthState::Shutdown() {
  absl::MutexLock lock(&mu_);
  serving_ = false;
  shutdown_ = true;
  ++changes_;
}

HealthService::HealthService(std::shared_ptr<HealthState> state,
                             Options options)
    : state_(std::move(state)), options_(options) {}

grpc::Status HealthService::Check(grpc::ServerContext*,
                                  const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  bool up = false;
  if (request->service().empty()) {
    up = state_->serving();
  } else if (request->service() == kLivenessService) {
    up = state_->alive();
  } else {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service");
  }
  response->set_status(up ? HealthCheckResponse::SERVING
                          : HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(
    grpc::ServerContext* context, const HealthCheckRequest* request,
    grpc::ServerWriter<HealthCheckResponse>* writer) {
  HealthState& state = *state_;
  {
    absl::MutexLock lock(&state.mu_);
    if (state.shutdown_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "shutting down");
    }
    if (state.watchers_ >= options_.max_watchers) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "too many health watches");
    }
    ++state.watchers_;
  }
  const bool liveness = request->service() == kLivenessService;
  const bool known = request->service().empty() || liveness;
  const absl::Time end = absl::Now() + options_.max_watch;
  uint64_t seen = 0;
  bool first = true;
  while (!context->IsCancelled() && absl::Now() < end) {
    HealthCheckResponse response;
    bool shutdown = false;
    {
      absl::MutexLock lock(&state.mu_);
      const uint64_t changes = state.changes_;
      auto changed = [&state, changes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                         state.mu_) { return state.changes_ != changes; };
      if (!first) {
        state.mu_.AwaitWithTimeout(absl::Condition(&changed), options_.poll);
      }
      shutdown = state.shutdown_;
      if (!first && state.changes_ == seen && !shutdown) continue;
      seen = state.changes_;
      const bool up =
          liveness ? !state.broken_ && !state.shutdown_ : state.serving_;
      response.set_status(!known ? HealthCheckResponse::SERVICE_UNKNOWN
                          : up   ? HealthCheckResponse::SERVING
                                 : HealthCheckResponse::NOT_SERVING);
    }
    first = false;
    if (!writer->Write(response) || shutdown) break;
  }
  absl::MutexLock lock(&state.mu_);
  --state.watchers_;
  return grpc::Status::OK;
}

}  // namespace tessera
