// ListenerProbe: notices that a daemon's own gRPC port no longer accepts
// connections. A TCP probe cannot: the kernel completes connections into
// the backlog of a listener nobody accepts from, and calls on connections
// opened before (heartbeats) still work. So every `interval` the probe opens
// a fresh connection to the port and calls grpc.health.v1.Health/Check
// with `timeout`. Any answer from the server counts: a status, a refusal
// (unauthenticated, permission denied, resource exhausted) or a failed TLS
// handshake (an expired certificate is not a deaf listener), and so does a
// connection the listener took and closed at its bound. After
// `failures` probes in a row got none, `on_dead` runs once, on the probe's
// thread, and the probe stops.
//
// rpc/listener_guard.h keeps the port accepting through the failures known
// to stop gRPC 1.51's listener; the probe is the backstop for the rest: a
// daemon that cannot be reached should say so (NOT_SERVING) and exit, to be
// restarted, rather than look alive.
#ifndef TESSERA_RPC_LISTENER_PROBE_H_
#define TESSERA_RPC_LISTENER_PROBE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tessera {

struct ListenerProbeOptions {
  absl::Duration interval = absl::Seconds(10);
  // How long one probe waits for the connection, its handshakes and the
  // answer.
  absl::Duration timeout = absl::Seconds(10);
  // Probes in a row without an answer before `on_dead`.
  int failures = 3;
  // How the probe connects (ProbeCredentialsFor under TLS; null:
  // plaintext).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // How many connections the port's listener has taken from its backlog so
  // far (ListenerStats::taken; null: not known). A probe that got no
  // answer while this grew still counts as answered: the listener took
  // the probe's connection and closed it at a bound (a flood holds every
  // connection the port allows), which is not a deaf listener.
  std::function<int64_t()> connections_taken;
};

class ListenerProbe {
 public:
  // Probes `address` (HOST:PORT; SelfAddress) until destroyed or dead.
  ListenerProbe(std::string address, ListenerProbeOptions options,
                std::function<void(const std::string& why)> on_dead);
  // Stops probing (cancelling a probe in flight) and joins.
  ~ListenerProbe();
  ListenerProbe(const ListenerProbe&) = delete;
  ListenerProbe& operator=(const ListenerProbe&) = delete;

  // One probe on a fresh connection: OK when the server at `address`
  // answered within `timeout`, else UNAVAILABLE saying what happened.
  static absl::Status ProbeOnce(
      const std::string& address,
      const std::shared_ptr<grpc::ChannelCredentials>& credentials,
      absl::Duration timeout);

 private:
  // ProbeOnce on `context` (which sets no deadline of its own).
  static absl::Status Probe(
      const std::string& address,
      const std::shared_ptr<grpc::ChannelCredentials>& credentials,
      absl::Duration timeout, grpc::ClientContext* context);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string address_;
  const ListenerProbeOptions options_;
  const std::function<void(const std::string&)> on_dead_;
  absl::Notification stop_;
  absl::Mutex mu_;
  // The probe in flight, cancelled by the destructor (null: none).
  grpc::ClientContext* in_flight_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

// The address a daemon dials to reach its own port `port` when serving on
// `listen` (HOST:PORT): a wildcard host becomes loopback.
std::string SelfAddress(const std::string& listen, int port);

}  // namespace tessera

#endif  // TESSERA_RPC_LISTENER_PROBE_H_
