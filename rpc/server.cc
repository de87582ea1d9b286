#include "rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/threads.h"
#include "rpc/channel.h"
#include "rpc/listener_guard.h"

namespace tessera {

absl::StatusOr<RunningServer> StartServer(
    const std::string& listen, const std::vector<grpc::Service*>& services,
    const ServerOptions& options) {
  if (listen.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", listen, "' is not HOST:PORT"));
  }
  // A process-wide switch that takes effect for servers built after.
  if (options.reflection)
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  RunningServer running;
  running.health = std::make_shared<HealthState>();
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(&builder, options);
  // SO_REUSEPORT would let two daemons share a port by accident.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen,
                           options.credentials != nullptr
                               ? options.credentials
                               : grpc::InsecureServerCredentials(),
                           &running.port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  if (options.fallback != nullptr) {
    builder.RegisterCallbackGenericService(options.fallback);
  }
  if (options.health) {
    running.health_service = std::make_unique<HealthService>(running.health);
    builder.RegisterService(running.health_service.get());
  }
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen,
                                               " (address in use or invalid)"));
  }
  GuardListener(running.port, options.max_connections,
                options.max_connections_per_peer, "gRPC");
  if (!options.health_listen.empty()) {
    if (!options.health) {
      return absl::InvalidArgumentError(
          "a health port needs the health service (ServerOptions::health)");
    }
    grpc::ServerBuilder health_builder;
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    health_builder.AddChannelArgument(
        GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
        static_cast<int>(absl::ToInt64Milliseconds(options.handshake_timeout)));
    health_builder.AddListeningPort(options.health_listen,
                                    grpc::InsecureServerCredentials(),
                                    &running.health_port);
    running.health_port_service =
        std::make_unique<HealthService>(running.health);
    health_builder.RegisterService(running.health_port_service.get());
    running.health_server = health_builder.BuildAndStart();
    if (running.health_server == nullptr || running.health_port == 0) {
      ReleaseListener(running.port);
      running.server->Shutdown();
      return absl::UnavailableError(
          absl::StrCat("cannot listen on health address ",
                       options.health_listen, " (address in use or invalid)"));
    }
    // The kubelet probes from its node's one address: no bound per peer.
    GuardListener(running.health_port, options.max_health_connections,
                  /*max_per_peer=*/0, "health");
  }
  running.SetServing(false);
  return running;
}

void RunningServer::SetServing(bool serving) {
  if (health != nullptr) health->SetServing(serving);
}

void RunningServer::SetBroken() {
  if (health != nullptr) health->SetBroken();
}

bool RunningServer::Stop(absl::Duration grace, absl::Duration margin) {
  // Watches see NOT_SERVING and end, so they hold up no drain.
  if (health != nullptr) health->Shutdown();
  // Probes see NOT_SERVING, then nothing: the health port holds no calls
  // worth a grace.
  if (health_server != nullptr) {
    ReleaseListener(health_port);
    health_server->Shutdown(std::chrono::system_clock::now());
    health_server->Wait();
  }
  ReleaseListener(port);
  // gRPC's Shutdown cancels the calls left at the deadline, then waits for
  // every handler to return, however long one ignores its cancellation:
  // wait for it here only as long as promised.
  auto stopped = std::make_shared<absl::Notification>();
  grpc::Server* const grpc_server = server.get();
  const auto deadline =
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(absl::ToInt64Milliseconds(grace));
  std::optional<std::thread> stopper =
      TryStartThread([grpc_server, deadline, stopped] {
        grpc_server->Shutdown(deadline);
        grpc_server->Wait();
        stopped->Notify();
      });
  if (stopper.has_value()) stopper->detach();
  // Without a thread to stop it, the server is left to the process's exit
  // like one whose handlers outlive the grace.
  if (stopper.has_value() &&
      stopped->WaitForNotificationWithTimeout(grace + margin)) {
    return true;
  }
  // Handlers still run and use the server: it must outlive them, so it is
  // left to the process's exit.
  server.release();
  return false;
}

std::string WithPort(const std::string& listen, int port) {
  size_t colon = listen.rfind(':');
  return absl::StrCat(listen.substr(0, colon), ":", port);
}

StopCondition CallerStop(grpc::ServerContext* context) {
  StopCondition stop;
  const std::chrono::system_clock::time_point deadline = context->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    stop.deadline = absl::FromChrono(deadline);
  }
  stop.cancelled = [context] { return context->IsCancelled(); };
  return stop;
}

}  // namespace tessera
