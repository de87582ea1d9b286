// DataPort: a worker's port for bulk shard bytes over TCP
// (transport/tcp_wire.h), beside its gRPC port. It serves reads of boxes
// and rows and writes of pending shards for a WorkerNode, each admitted
// with the capability its gRPC twin needs (ReadRegion, ReadRows,
// WriteShard) by the same WorkerNode::Admit. Reads go out of shard memory
// with sendmsg, run by run, with no copy in user space.
//
// With `tls`, every connection is mutual TLS 1.3 (rpc/tls_context.h): the
// peer's certificate must verify against the cluster CA before a byte of a
// request is read; a plaintext client is answered UNAUTHENTICATED in the
// clear and closed.
//
// Hostile peers: a connection that sends anything but the preface and
// well-formed requests with valid capabilities is closed with nothing
// written; each connection holds one thread and counts toward
// `max_connections` (the listener guard also bounds it per peer host); one
// that finds the worker at its limit of threads is refused, not fatal;
// a peer silent for `idle_timeout` between requests, or stalled for
// `stall_timeout` within one, is dropped. Thread-safe.
#ifndef TESSERA_WORKER_DATA_PORT_H_
#define TESSERA_WORKER_DATA_PORT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/rate_limited_log.h"
#include "rpc/tls_context.h"
#include "worker/worker_node.h"

namespace tessera {

struct DataPortOptions {
  // HOST:PORT to listen on; port 0 picks one.
  std::string listen = "127.0.0.1:0";
  // Connections open at once, and from one peer host (0: no bound).
  int max_connections = 1024;
  int max_per_peer = 0;
  absl::Duration idle_timeout = absl::Minutes(2);
  absl::Duration stall_timeout = absl::Seconds(30);
  // Mutual TLS 1.3 on every connection (null: plaintext), and the time a
  // peer has to finish its handshake.
  std::shared_ptr<TlsContextSource> tls;
  absl::Duration handshake_timeout = absl::Seconds(10);
  // Most bytes of requests' meta held at once, over every connection,
  // before their capabilities are checked; a request beyond it closes its
  // connection.
  int64_t max_meta_in_flight = int64_t{64} << 20;
};

// What a data port has done since it started.
struct DataPortStats {
  int64_t connections = 0;  // accepted
  int64_t open = 0;         // open now
  // Closed at once: max_connections open, or no thread to serve it.
  int64_t refused = 0;
  int64_t dropped = 0;      // closed for a malformed request or capability
  int64_t tls_refused = 0;  // a TLS handshake failed, or a plaintext client
  int64_t requests = 0;     // admitted (answered or being answered)
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

class DataPort {
 public:
  // Listens and serves `node` (not owned; outlives the port).
  // INVALID_ARGUMENT for a malformed `listen`, UNAVAILABLE when it cannot
  // be bound.
  static absl::StatusOr<std::unique_ptr<DataPort>> Start(
      WorkerNode* node, DataPortOptions options);
  // Closes the port and every connection, and waits for their threads.
  ~DataPort();
  DataPort(const DataPort&) = delete;
  DataPort& operator=(const DataPort&) = delete;

  int port() const { return port_; }
  DataPortStats Stats() const;

 private:
  DataPort(WorkerNode* node, DataPortOptions options, int listen_fd, int port);
  void AcceptLoop();
  void Serve(int fd);

  WorkerNode* const node_;
  const DataPortOptions options_;
  const int listen_fd_;
  const int port_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;

  // The connections being served, shared with their threads so that the
  // last one's unlock never touches a destroyed port.
  struct Open {
    absl::Mutex mu;
    absl::flat_hash_set<int> fds ABSL_GUARDED_BY(mu);
    int serving ABSL_GUARDED_BY(mu) = 0;  // connection threads running
  };
  const std::shared_ptr<Open> open_ = std::make_shared<Open>();

  std::atomic<int64_t> connections_{0};
  std::atomic<int64_t> refused_{0};
  RateLimitedLog no_thread_log_;
  std::atomic<int64_t> dropped_{0};
  std::atomic<int64_t> tls_refused_{0};
  std::atomic<int64_t> requests_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> meta_in_flight_{0};
};

}  // namespace tessera

#endif  // TESSERA_WORKER_DATA_PORT_H_
