// CoordinatorDaemon: one tessera coordinator as an object: its metadata
// store (memory, --data_dir or etcd), the Coordinator, its gRPC service,
// metrics and, with etcd, its Leadership. `tessera-coordinator` is flags →
// CoordinatorDaemonOptions → Start → a termination signal → Stop; tests
// start the same object in-process.
#ifndef TESSERA_COORDINATOR_COORDINATOR_DAEMON_H_
#define TESSERA_COORDINATOR_COORDINATOR_DAEMON_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "ops/daemon_life.h"
#include "ops/daemon_security.h"
#include "rpc/channel.h"
#include "rpc/security.h"

namespace tessera {

struct CoordinatorDaemonOptions {
  std::string listen = "127.0.0.1:0";  // port 0 picks one
  std::string data_dir;                // empty: metadata in memory
  // etcd://H1:P1[,H2:P2...]/PREFIX: metadata in etcd, shared with other
  // coordinators of which one leads; instead of data_dir.
  std::string metadata;
  std::string advertise;  // with metadata; empty: listen
  // With metadata: TLS to etcd (null: plaintext).
  std::shared_ptr<grpc::ChannelCredentials> etcd_credentials;
  absl::Duration leader_lease = absl::Seconds(2);
  int64_t recover_truncate_log_at = -1;
  std::string metrics_listen;  // empty: no metrics port
  std::string tokens;          // the --tokens file; empty: no authorization
  // The --quotas file (followed on disk like --tokens; empty: nothing is
  // limited) and its limits as read at start (null: none).
  std::string quotas_file;
  std::shared_ptr<const QuotaTable> quotas;
  // Leases, limits, repair; `metrics` is filled by Start.
  CoordinatorOptions coordinator;
  // Connection bounds; metrics, credentials and health_listen are filled
  // by Start from `security`.
  ServerOptions server;
  absl::Duration shutdown_grace = absl::Seconds(2);
  DaemonSecurity security;  // default: plaintext, no health port
  // Called (once, from any thread) when the daemon fails for good after
  // Start: the campaign or recovery fails, the leader's lease is lost, the
  // port stops accepting. Wait returns too.
  std::function<void()> on_fatal;

  // The checks a flag parser cannot make. INVALID_ARGUMENT names the flag.
  absl::Status Validate() const;
};

class CoordinatorDaemon {
 public:
  // Without etcd: recovers the metadata and serves before it returns. With
  // etcd: stands by (its port answers, naming the leader) and returns; it
  // campaigns, and once it leads recovers and serves, on a thread of its
  // own. Fails with nothing left running.
  static absl::StatusOr<std::unique_ptr<CoordinatorDaemon>> Start(
      CoordinatorDaemonOptions options);
  ~CoordinatorDaemon();

  CoordinatorDaemon(const CoordinatorDaemon&) = delete;
  CoordinatorDaemon& operator=(const CoordinatorDaemon&) = delete;

  // Blocks until Stop is called (OK) or the daemon fails (why).
  absl::Status Wait() { return life_.Wait(); }
  absl::Status failure() const { return life_.failure(); }
  // Blocks until it serves (true), fails or is stopped (false), or
  // `timeout` passes (false).
  bool WaitUntilServing(absl::Duration timeout) {
    return life_.WaitUntilServing(timeout);
  }

  // Stops standing by or serving: calls in flight get `grace` to finish; a
  // leader then steps down. False when a handler outlived the grace: the
  // process must then exit without destroying this object (std::_Exit).
  bool Stop(absl::Duration grace);

  // The address it serves (or stands by) at: listen with its bound port.
  std::string address() const;

 private:
  class Parts;
  explicit CoordinatorDaemon(CoordinatorDaemonOptions options);
  absl::Status Stand();
  void Lead();
  absl::Status Serve();
  void Fail(const absl::Status& status);

  const CoordinatorDaemonOptions options_;
  std::unique_ptr<Parts> parts_;
  absl::Notification stop_;
  std::thread leader_;
  DaemonLife life_;
  mutable absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  bool stopped_ = false;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_COORDINATOR_DAEMON_H_
