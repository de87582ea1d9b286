// Starts a gRPC server on a listen address (":0" picks a free port) and
// reports the port actually bound.
#ifndef TESSERA_RPC_SERVER_H_
#define TESSERA_RPC_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/stop.h"
#include "rpc/channel.h"
#include "rpc/health_service.h"

namespace tessera {

struct RunningServer {
  // Declared first, destroyed last: the servers' health services use it.
  std::shared_ptr<HealthState> health;
  std::unique_ptr<HealthService> health_service;       // on `server`
  std::unique_ptr<HealthService> health_port_service;  // on health_server
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port
  // The plaintext health-only server of ServerOptions::health_listen, and
  // its bound port (null and 0 without one).
  std::unique_ptr<grpc::Server> health_server;
  int health_port = 0;

  // Stops accepting calls, gives calls in flight `grace` to finish, cancels
  // the rest, and waits until every handler has returned, but no longer
  // than `grace` + `margin`: true when it stopped in time. False means a
  // handler ignores its cancellation; `server` is then released (left
  // running) and the process should exit without destroying what the
  // handlers use (std::_Exit). Health turns NOT_SERVING first, so probes
  // see the drain.
  bool Stop(absl::Duration grace, absl::Duration margin = absl::Seconds(1));

  // What grpc.health.v1.Health answers for the server as a whole and every
  // service: SERVING only once the daemon can do its job (metadata
  // recovered; worker registered). Starts NOT_SERVING.
  void SetServing(bool serving);
  // The daemon is broken for good (HealthState::SetBroken): NOT_SERVING,
  // liveness included, whatever SetServing says later.
  void SetBroken();
};

// `listen` is HOST:PORT. Fails with a clear message when the port is taken.
absl::StatusOr<RunningServer> StartServer(
    const std::string& listen, const std::vector<grpc::Service*>& services,
    const ServerOptions& options = {});

// Replaces the port of HOST:PORT (used when listening on port 0).
std::string WithPort(const std::string& listen, int port);

// A handler's stop: the caller's deadline, and its cancellation (the
// caller gave up, or the server is shutting down). Valid while the call
// runs.
StopCondition CallerStop(grpc::ServerContext* context);

}  // namespace tessera

#endif  // TESSERA_RPC_SERVER_H_
