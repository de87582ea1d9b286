// WorkerDaemon: one tessera worker as an object: its shard store, node,
// gRPC (and UCX) services, metrics and its registration with the
// coordinator. `tessera-worker` is flags → WorkerDaemonOptions → Start →
// a termination signal → Stop; tests start the same object in-process.
#ifndef TESSERA_WORKER_WORKER_DAEMON_H_
#define TESSERA_WORKER_WORKER_DAEMON_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/labels.h"
#include "core/placement.h"
#include "ops/daemon_life.h"
#include "ops/daemon_security.h"
#include "rpc/server.h"
#include "transport/shared_memory_arena.h"
#include "transport/ucx_server.h"
#include "worker/data_port.h"
#include "worker/registration.h"
#include "worker/shard_table.h"
#include "worker/worker_node.h"

namespace tessera {

struct WorkerDaemonOptions {
  std::string coordinator = "127.0.0.1:7070";
  std::string listen = "127.0.0.1:0";  // port 0 picks one
  // Where clients and peers dial; empty: the bound listen address (which
  // must then not be a wildcard).
  std::string advertise;
  // The data port for bulk bytes over TCP (worker/data_port.h): HOST:PORT,
  // empty for the --listen host and a port the system picks, "off" for
  // none. Plaintext, so loopback only unless security.insecure or the
  // daemon runs tokens; a daemon that runs TLS opens none.
  std::string data_listen;
  // Where clients and peers dial it; empty: the advertised (else listen)
  // host with the bound data port.
  std::string data_advertise;
  DataPortOptions data_port;    // limits; `listen` is filled by Start
  std::string name;             // empty: w<port>
  std::optional<int32_t> rank;  // empty: the lowest free rank
  Device device;                // cpu by default
  std::string zone;             // empty: none (flags default it to the host)
  Labels labels;                // --labels: what mirror groups select by
  int64_t capacity_bytes = 0;   // 0: no limit
  int64_t shard_charge_bytes = kShardChargeBytes;
  std::string metrics_listen;  // empty: no metrics port
  // A file holding the worker's secret, followed on disk; empty: none.
  std::string token_file;
  std::string store_dir;  // empty: shards in memory only
  bool ucx = true;        // --ucx and TESSERA_UCX together
  bool nccl = true;
  bool trusted_fabric = false;
  UcxServerOptions ucx_server;
  SharedMemoryArenaOptions arena;
  // Chunking, limits, checkpoint root and peer transport; the arena,
  // channels, UCX and exchange fields are filled by Start.
  WorkerNodeOptions node;
  // Threads, streams per connection and connection bounds; metrics,
  // credentials and health_listen are filled by Start from `security`.
  ServerOptions server;
  absl::Duration shutdown_grace = absl::Seconds(2);
  // Shards kept for another cluster are freed after this long.
  absl::Duration quarantine_grace = RegistrationOptions().quarantine_grace;
  DaemonSecurity security;  // default: plaintext, no health port
  // Called (once, from any thread) when the daemon fails for good after
  // Start: its registration is refused or its port stops accepting. Wait
  // returns too; `tessera-worker` uses it to wake its signal wait.
  std::function<void()> on_fatal;

  // The checks a flag parser cannot make: ranges, names, the store's
  // device. INVALID_ARGUMENT names the flag.
  absl::Status Validate() const;
};

class WorkerDaemon {
 public:
  // Opens the store (re-attaching --store_dir's shards), starts the
  // services and the registration. Fails on files, TLS, CUDA or a port
  // that cannot be bound, with nothing left running.
  static absl::StatusOr<std::unique_ptr<WorkerDaemon>> Start(
      WorkerDaemonOptions options);
  // Stops at once (Stop with no grace) unless stopped already.
  ~WorkerDaemon();

  WorkerDaemon(const WorkerDaemon&) = delete;
  WorkerDaemon& operator=(const WorkerDaemon&) = delete;

  // Blocks until Stop is called (OK) or the daemon fails (why).
  absl::Status Wait() { return life_.Wait(); }
  // Why the daemon failed; OK while it has not.
  absl::Status failure() const { return life_.failure(); }

  // Stops the registration, then the server: calls in flight get `grace`
  // to finish. False when a handler outlived it: the process must then
  // exit without destroying this object (std::_Exit).
  bool Stop(absl::Duration grace);

  const std::string& name() const { return name_; }
  const std::string& address() const { return address_; }  // advertised
  // The data port's advertised address; empty when it has none.
  const std::string& data_address() const { return data_address_; }
  int port() const;
  WorkerNode& node() { return *node_; }

 private:
  class Parts;
  explicit WorkerDaemon(WorkerDaemonOptions options);
  absl::Status StartParts();
  void Fail(const absl::Status& status) { life_.Fail(status); }

  WorkerDaemonOptions options_;
  std::string name_;
  std::string address_;
  std::string data_address_;
  std::unique_ptr<Parts> parts_;
  WorkerNode* node_ = nullptr;  // in parts_
  DaemonLife life_;
  bool stopped_ = false;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_WORKER_DAEMON_H_
