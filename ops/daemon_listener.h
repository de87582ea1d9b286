// What both daemons do to keep their gRPC port reachable (README
// "Limits"): raise the open-file limit to the hard limit, bound the
// connections each port holds (--max_connections, within the descriptors
// there are), and probe their own port on a fresh connection
// (--listener_probe_interval): a daemon whose port stopped accepting
// reports NOT_SERVING and exits, to be restarted, instead of looking alive.
#ifndef TESSERA_OPS_DAEMON_LISTENER_H_
#define TESSERA_OPS_DAEMON_LISTENER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "core/metrics.h"
#include "rpc/listener_probe.h"
#include "rpc/server.h"

namespace tessera {

// Raises RLIMIT_NOFILE to its hard limit and sets `options`'
// max_connections from --max_connections and that limit; logs both.
// INVALID_ARGUMENT for a negative flag.
absl::Status ConfigureListenerLimits(ServerOptions* options);

// Starts probing the port `server` bound for `listen` every
// --listener_probe_interval (null when it is 0). When the port answers no
// more, logs why, turns `server` NOT_SERVING for good (liveness included)
// and calls `on_dead` (which should make the daemon exit non-zero).
// `credentials`: the daemon's own channel credentials (null: plaintext).
std::unique_ptr<ListenerProbe> StartListenerProbe(
    const std::string& listen, RunningServer* server,
    std::shared_ptr<grpc::ChannelCredentials> credentials,
    std::function<void()> on_dead);

// tessera_grpc_connections and tessera_grpc_connections_refused_total for
// the ports `server` bound.
void AddListenerMetrics(MetricsRegistry* registry, const RunningServer& server);

}  // namespace tessera

#endif  // TESSERA_OPS_DAEMON_LISTENER_H_
