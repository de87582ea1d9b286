// ClientOptions: how an SDK client talks to the cluster. Plain values (no
// gRPC types), so the SDK's public header does not pull in gRPC.
#ifndef TESSERA_CLIENT_CLIENT_OPTIONS_H_
#define TESSERA_CLIENT_CLIENT_OPTIONS_H_

#include <string>

#include "absl/time/time.h"

namespace tessera {

struct ClientOptions {
  // Deadline of each control-plane call to the coordinator.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // How long to wait for the coordinator when connecting.
  absl::Duration connect_timeout = absl::Seconds(2);
  // Deadline of one data stream (a piece of a get, or one shard of a put).
  absl::Duration data_timeout = absl::Minutes(30);
  // Idempotent control-plane calls (describe, list, workers) are retried
  // this many times, with doubling backoff from 50 ms, while the coordinator
  // cannot be reached (e.g. it is restarting).
  int control_retries = 4;
  // Reuse tensor metadata between reads (see Client); at most this many
  // tensors are remembered. 0 disables the cache.
  int metadata_cache_entries = 1024;
  // Most data streams running at once (one thread each).
  int max_parallel_streams = 16;
  // How shard bytes move: "auto" (shared memory for workers on this host,
  // else UCX, else gRPC), or "shm", "ucx" or "grpc" to force one; a forced
  // transport that cannot reach a worker fails the call (FAILED_PRECONDITION
  // or UNAVAILABLE naming the transport and the worker). Anything else:
  // INVALID_ARGUMENT at connect. TESSERA_UCX=0 in the environment leaves UCX
  // out of "auto"; so does TLS (UCX would carry the bytes outside it),
  // unless the fabric is trusted.
  std::string transport = "auto";
  // A read with another replica to go to waits for one replica at most
  // replica_timeout plus its bytes at replica_min_bytes_per_second, then
  // goes on to the next (a hung worker looks alive until its lease ends).
  // The last replica gets data_timeout.
  absl::Duration replica_timeout = absl::Seconds(1);
  int64_t replica_min_bytes_per_second = int64_t{64} << 20;
  // This reader's zone: reads prefer replicas on this host, then on
  // workers of this zone (a worker's --zone), then the least busy.
  // Empty: $TESSERA_ZONE.
  std::string zone;
  // The network between this client and the workers is reached only by the
  // cluster (TESSERA_TRUSTED_FABRIC=1 in the environment says the same):
  // UCX may use it, and under TLS "auto" takes UCX too. Otherwise UCX
  // reaches only workers of this user on this host.
  bool trusted_fabric = false;
  // With "auto": read shards through shared memory when the worker is on
  // this host (and its shard lives in a shared segment). False: no
  // shared-memory link.
  bool shared_memory = true;
  // Mutual TLS (CLI.md "Security"): PEM files of the cluster CA, this
  // client's certificate and key. All empty: plaintext. Only `tls_ca`: TLS
  // without a client certificate (where the daemons allow it).
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // The secret presented to the coordinator when it has --tokens (the
  // contents of a --token_file). Never sent to workers.
  std::string token;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_CLIENT_OPTIONS_H_
