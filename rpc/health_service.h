// grpc.health.v1.Health on gRPC's synchronous API. gRPC's own service
// (grpc::EnableDefaultHealthCheckService) implements Watch with the callback
// API, and a server with any callback method pays for it on every call:
// about 40 us of p50 on a 4 KiB fetch (bench/ Figure 2). This one keeps the
// servers purely synchronous.
//
// One HealthState answers for a daemon; each server registers its own
// HealthService over it (the main port and the --health_listen port answer
// alike). Check answers for the server as a whole (service ""), as
// gRPC's own does unless told of services by name; other names get
// NOT_FOUND. Watch sends the status at
// once and again at each change, until the caller goes, the server stops,
// or it has streamed for `max_watch`; each watch holds a thread of the
// server, so at most `max_watchers` run at once (RESOURCE_EXHAUSTED beyond).
//
// One more name is answered, kLivenessService ("liveness"): SERVING while
// the daemon runs and is not broken, whether or not it can do its job yet
// (a worker waiting for its coordinator is alive). It is what an
// orchestrator's liveness probe asks (Kubernetes: `grpc: {port, service:
// liveness}`); readiness asks the server as a whole.
#ifndef TESSERA_RPC_HEALTH_SERVICE_H_
#define TESSERA_RPC_HEALTH_SERVICE_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/health.grpc.pb.h"

namespace tessera {

inline constexpr char kLivenessService[] = "liveness";

class HealthState {
 public:
  // SERVING or NOT_SERVING for the server and every service; starts
  // NOT_SERVING.
  void SetServing(bool serving) ABSL_LOCKS_EXCLUDED(mu_);
  bool serving() const ABSL_LOCKS_EXCLUDED(mu_);
  // The daemon cannot recover (its listener accepts nothing): NOT_SERVING
  // for everything, liveness included, from now on.
  void SetBroken() ABSL_LOCKS_EXCLUDED(mu_);
  // SERVING for kLivenessService: neither broken nor shut down.
  bool alive() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every watch (the server is stopping) and refuses new ones.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class HealthService;
  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  int watchers_ ABSL_GUARDED_BY(mu_) = 0;
};

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  struct Options {
    int max_watchers = 8;
    absl::Duration max_watch = absl::Hours(1);
    // How often a watch looks whether its caller went away.
    absl::Duration poll = absl::Milliseconds(500);
  };
  HealthService(std::shared_ptr<HealthState> state, Options options);
  explicit HealthService(std::shared_ptr<HealthState> state)
      : HealthService(std::move(state), Options()) {}

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>*
                         writer) override;

 private:
  const std::shared_ptr<HealthState> state_;
  const Options options_;
};

}  // namespace tessera

#endif  // TESSERA_RPC_HEALTH_SERVICE_H_
