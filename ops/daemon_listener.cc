#include "ops/daemon_listener.h"

#include <sys/resource.h>

#include <algorithm>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "rpc/listener_guard.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(int32_t, max_connections, tessera::ServerOptions().max_connections,
          "most client connections the gRPC port holds at once (more are "
          "closed at once); at most 3/4 of the open-file limit, which is "
          "raised to its hard limit at start. 0: only that share");
ABSL_FLAG(int32_t, max_connections_per_peer,
          tessera::ServerOptions().max_connections_per_peer,
          "most of the gRPC port's connections one peer host (IP address) "
          "holds at once (more are closed at once), so that one host cannot "
          "take them all. 0: no bound of its own");
ABSL_FLAG(absl::Duration, listener_probe_interval, absl::Seconds(10),
          "how often the daemon opens a new connection to its own gRPC port "
          "and asks its health; after 3 probes in a row without an answer "
          "it reports NOT_SERVING and exits with status 1, to be restarted. "
          "0: no probe");

namespace tessera {

absl::Status ConfigureListenerLimits(ServerOptions* options) {
  const int32_t flag = absl::GetFlag(FLAGS_max_connections);
  if (flag < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_connections=", flag, " is negative"));
  }
  const int32_t per_peer = absl::GetFlag(FLAGS_max_connections_per_peer);
  if (per_peer < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_connections_per_peer=", per_peer, " is negative"));
  }
  if (absl::GetFlag(FLAGS_listener_probe_interval) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--listener_probe_interval is negative");
  }
  absl::StatusOr<OpenFileLimit> limit = RaiseOpenFileLimit();
  if (!limit.ok()) {
    // Not fatal: the daemon still serves, with fewer connections.
    spdlog::warn("{}", std::string(limit.status().message()));
    struct rlimit now {};
    getrlimit(RLIMIT_NOFILE, &now);
    limit = OpenFileLimit{now.rlim_cur, now.rlim_cur, now.rlim_max};
  }
  options->max_connections = ConnectionBudget(flag, limit->now);
  options->max_connections_per_peer = per_peer;
  spdlog::info(
      "open files: limit {}{}; the gRPC port holds at most {} connections, "
      "{} from one host{}",
      limit->now,
      limit->now != limit->before
          ? absl::StrCat(" (raised from ", limit->before, ")")
          : std::string(),
      options->max_connections,
      per_peer > 0 ? std::min(per_peer, options->max_connections)
                   : options->max_connections,
      ListenerGuardActive() ? std::string()
                            : std::string(" (unguarded: this build's accept4 "
                                          "is libc's)"));
  return absl::OkStatus();
}

std::unique_ptr<ListenerProbe> StartListenerProbe(
    const std::string& listen, RunningServer* server,
    std::shared_ptr<grpc::ChannelCredentials> credentials,
    std::function<void()> on_dead) {
  const absl::Duration interval = absl::GetFlag(FLAGS_listener_probe_interval);
  if (interval <= absl::ZeroDuration()) return nullptr;
  ListenerProbeOptions options;
  options.interval = interval;
  options.timeout = std::max(interval, absl::Seconds(5));
  options.credentials = std::move(credentials);
  // A probe the guard closed at a bound (a flood holds the port at
  // --max_connections) still saw the listener take its connection: alive.
  options.connections_taken = [port = server->port] {
    return GuardedListenerStats(port).taken();
  };
  const std::string address = SelfAddress(listen, server->port);
  return std::make_unique<ListenerProbe>(
      address, options,
      [address, server, on_dead = std::move(on_dead)](const std::string& why) {
        spdlog::error(
            "the gRPC port {} accepts no new connections ({}); reporting "
            "NOT_SERVING and exiting with status 1 so that the supervisor "
            "restarts this daemon",
            address, why);
        server->SetBroken();
        on_dead();
      });
}

void AddListenerMetrics(MetricsRegistry* registry,
                        const RunningServer& server) {
  // By value: the registry may render while the server is torn down.
  registry->AddCollector([port = server.port, health_port = server.health_port](
                             MetricsRegistry& m) {
    const std::pair<const char*, int> ports[] = {{"grpc", port},
                                                 {"health", health_port}};
    for (const auto& [name, port] : ports) {
      if (port <= 0) continue;
      const ListenerStats stats = GuardedListenerStats(port);
      m.Gauge("tessera_grpc_connections",
              "Client connections open on a gRPC port.", {{"port", name}})
          ->Set(static_cast<double>(stats.open));
      m.Counter("tessera_grpc_connections_refused_total",
                "Connections a gRPC port closed at once: `limit`, "
                "--max_connections were open; `peer`, its host held "
                "--max_connections_per_peer; `descriptors`, the process "
                "had no file descriptor left.",
                {{"port", name}, {"reason", "limit"}})
          ->Set(static_cast<double>(stats.refused_over_limit));
      m.Counter("tessera_grpc_connections_refused_total", "",
                {{"port", name}, {"reason", "descriptors"}})
          ->Set(static_cast<double>(stats.refused_no_descriptors));
      m.Counter("tessera_grpc_connections_refused_total", "",
                {{"port", name}, {"reason", "peer"}})
          ->Set(static_cast<double>(stats.refused_per_peer));
    }
  });
}

}  // namespace tessera
