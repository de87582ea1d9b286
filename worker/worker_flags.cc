#include "worker/worker_flags.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "core/placement.h"
#include "core/quota.h"
#include "core/replica_placement.h"
#include "core/status_macros.h"
#include "ops/daemon_listener.h"
#include "ops/daemon_main.h"
#include "transport/shared_memory_arena.h"
#include "transport/ucx_common.h"
#include "transport/ucx_server.h"
#include "worker/registration.h"
#include "worker/shard_table.h"
#include "worker/worker_node.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070",
          "coordinator address HOST:PORT");
ABSL_FLAG(std::string, listen, "127.0.0.1:7071",
          "address to serve on, HOST:PORT (port 0 picks one)");
ABSL_FLAG(std::string, name, "",
          "unique worker name (letters, digits, _ . -); default w<port>");
ABSL_FLAG(int32_t, rank, -1, "requested rank; default: the lowest free rank");
ABSL_FLAG(std::string, device, "cpu",
          "device holding the shards: cpu or cuda:N");
ABSL_FLAG(std::string, zone, "",
          "this worker's failure domain (1 to 64 of letters, digits, _ . - : "
          "/); a shard's replicas go to distinct zones where the cluster has "
          "them; default: this host's name");
ABSL_FLAG(std::string, labels, "",
          "KEY=VALUE[,KEY=VALUE...]: what mirror groups select this worker "
          "by (tessera create ... --mirror=SELECTOR)");
ABSL_FLAG(int64_t, capacity_bytes, 0,
          "most shard bytes this worker holds; 0 = no limit");
ABSL_FLAG(std::string, advertise, "",
          "address clients and peers dial, HOST:PORT, when it differs from "
          "--listen (e.g. --listen=0.0.0.0:7071); default: the --listen "
          "address");
ABSL_FLAG(std::string, data_listen, "",
          "address of the data port, HOST:PORT, where clients and peers "
          "move shard bytes over TCP beside gRPC; default: the --listen host "
          "and a port the system picks; off: none (bytes move over gRPC)");
ABSL_FLAG(std::string, data_advertise, "",
          "address clients and peers dial for the data port, HOST:PORT, when "
          "a service or NAT stands between; default: the --advertise (else "
          "--listen) host with the data port");
ABSL_FLAG(std::string, token_file, "",
          "file holding this worker's secret (a `worker` principal of the "
          "coordinator's --tokens)");
ABSL_FLAG(bool, ucx, true,
          "serve shard bytes to readers and peers over UCX (sent and received "
          "by this worker, each range checked against the key's shard) and "
          "pull reshard pieces through it; false (or TESSERA_UCX=0) leaves "
          "shared memory and gRPC. Without --trusted_fabric UCX reaches only "
          "processes of this user on this host; off when the worker runs TLS "
          "unless --trusted_fabric");
ABSL_FLAG(bool, nccl, true,
          "GPU workers (--device=cuda:N): move reshard pieces between GPUs "
          "with NCCL send/recv when the coordinator orders an exchange; "
          "false leaves host staging and gRPC. Off when the worker runs TLS "
          "(NCCL would carry shard bytes outside it) unless --trusted_fabric");
ABSL_FLAG(bool, trusted_fabric, false,
          "the network between the cluster's hosts (a private RDMA, NVLink "
          "or VLAN fabric) is reached only by the cluster: UCX may serve and "
          "pull shard bytes over it (TCP or RDMA; UCX trusts its peers, so "
          "anyone who reaches the worker's UCX port reaches its memory), and "
          "with TLS, UCX and NCCL may move shard bytes outside TLS. Control "
          "calls, capabilities and UCX keys stay on gRPC");
ABSL_FLAG(bool, bulk_outside_tls, false, "the former name of --trusted_fabric");
ABSL_FLAG(int32_t, ucx_max_peers,
          static_cast<int32_t>(tessera::UcxServerOptions().max_peers),
          "most reader endpoints UCX keeps (each maps part of its reader's "
          "memory); the least recently used is closed beyond");
ABSL_FLAG(absl::Duration, ucx_peer_idle_timeout,
          tessera::UcxServerOptions().peer_idle_timeout,
          "a reader endpoint unused this long is closed (readers that died "
          "without a goodbye)");
ABSL_FLAG(std::string, peer_transport, "auto",
          "how reshard pieces are pulled from peers: auto (shared memory on "
          "this host, else UCX, else the peer's data port over TCP, else "
          "gRPC), or shm, ucx, tcp or grpc alone");
ABSL_FLAG(std::string, principal_read_rate, "0",
          "bytes per second (K, M, G suffixes) this worker serves each "
          "principal's reads over gRPC and its data port, at most: a read "
          "past it is delayed, never refused; 0: no limit");
ABSL_FLAG(int64_t, chunk_bytes, tessera::kChunkBytes,
          "bytes per data message when streaming regions");
// Limits (README "Limits"); the defaults are the options' own.
ABSL_FLAG(int64_t, shard_charge_bytes, tessera::kShardChargeBytes,
          "least bytes each shard counts against --capacity_bytes (its "
          "bookkeeping)");
ABSL_FLAG(int64_t, max_shards_per_request,
          tessera::WorkerNodeOptions().max_shards_per_request,
          "most shards one allocation may name");
ABSL_FLAG(int32_t, max_streams, tessera::WorkerNodeOptions().max_streams,
          "most region reads and shard writes streamed at once");
ABSL_FLAG(absl::Duration, stream_idle_timeout,
          tessera::WorkerNodeOptions().stream_idle_timeout,
          "a stream whose peer reads or sends nothing for this long is "
          "cancelled");
ABSL_FLAG(absl::Duration, pull_timeout,
          tessera::WorkerNodeOptions().pull_timeout,
          "most time one transfer order may spend pulling from a peer when "
          "the order carries no deadline");
ABSL_FLAG(absl::Duration, pull_idle_timeout,
          tessera::WorkerNodeOptions().pull_idle_timeout,
          "a peer that sends nothing for this long during a pull is given "
          "up on");
ABSL_FLAG(std::string, store_dir, "",
          "keep host shards in files under this directory (a local disk, or "
          "a memory-backed volume that outlives the container): a worker "
          "started again on it serves the shards it held, each checked "
          "against the checksum written when it was committed; empty: in "
          "memory only (a restart loses them)");
ABSL_FLAG(std::string, checkpoint_root, "",
          "directory checkpoints are loaded from (a load's DIR is relative to "
          "it; nothing outside it is read); empty: none");
ABSL_FLAG(int32_t, max_peer_channels,
          static_cast<int32_t>(tessera::WorkerNodeOptions().max_peer_channels),
          "most connections to peers kept open (least recently used closed)");
ABSL_FLAG(absl::Duration, device_export_hold,
          tessera::WorkerNodeOptions().device_export_hold,
          "GPU workers: how long a CUDA IPC export keeps a shard's device "
          "memory after a client maps it, freed or not (clients renew)");
ABSL_FLAG(int64_t, max_staging_bytes,
          tessera::WorkerNodeOptions().max_staging_bytes,
          "GPU workers: most bytes of page-locked shared memory staging "
          "device reads for same-host clients at once");
ABSL_FLAG(int64_t, shard_reuse_bytes,
          tessera::SharedMemoryArenaOptions().reuse_bytes,
          "most bytes of freed host shards kept mapped (for up to 30 s) to "
          "serve new shards of the same size without first-touch page "
          "faults; 0 returns freed memory at once");
ABSL_FLAG(int64_t, shard_warm_bytes, int64_t{512} << 20,
          "most bytes of shared memory kept populated ahead of new host "
          "shards of the sizes lately allocated, made with spare CPU (not "
          "while bytes move; a first reshard or repair then copies without "
          "page faults); at most "
          "an eighth of --capacity_bytes when that is set, and only while "
          "/dev/shm keeps twice a block free; 0: none");
ABSL_FLAG(int32_t, max_threads, tessera::ServerOptions().max_threads,
          "most threads serving calls, and most small region and row "
          "reads in flight on a host-memory worker (which serves them on "
          "gRPC's own threads); calls beyond are refused with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, max_streams_per_connection,
          tessera::ServerOptions().max_concurrent_streams,
          "most concurrent calls per client connection (more wait)");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(2),
          "on SIGTERM, how long calls in flight may finish before they are "
          "cancelled; the process exits within this plus 1 s whatever runs");
ABSL_FLAG(absl::Duration, quarantine_grace,
          tessera::RegistrationOptions().quarantine_grace,
          "shards kept for another cluster than the coordinator's (never "
          "freed on its word) are freed after this long");

namespace tessera {

absl::StatusOr<WorkerDaemonOptions> WorkerDaemonOptionsFromFlags() {
  WorkerDaemonOptions o;
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.advertise = absl::GetFlag(FLAGS_advertise);
  o.data_listen = absl::GetFlag(FLAGS_data_listen);
  o.data_advertise = absl::GetFlag(FLAGS_data_advertise);
  o.name = absl::GetFlag(FLAGS_name);
  if (absl::GetFlag(FLAGS_rank) >= 0) o.rank = absl::GetFlag(FLAGS_rank);
  TESSERA_ASSIGN_OR_RETURN(
      o.device,
      FlagValue("--device", ParseDevice(absl::GetFlag(FLAGS_device))));
  o.zone = absl::GetFlag(FLAGS_zone);
  if (o.zone.empty()) {
    // The host is the failure domain nobody has to configure.
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0 && CheckZone(host).ok()) {
      o.zone = host;
    }
  }
  TESSERA_ASSIGN_OR_RETURN(
      o.labels,
      FlagValue("--labels", ParseLabels(absl::GetFlag(FLAGS_labels))));
  o.capacity_bytes = absl::GetFlag(FLAGS_capacity_bytes);
  o.shard_charge_bytes = absl::GetFlag(FLAGS_shard_charge_bytes);
  o.metrics_listen = MetricsListenFlag();
  o.token_file = absl::GetFlag(FLAGS_token_file);
  o.store_dir = absl::GetFlag(FLAGS_store_dir);
  o.ucx = absl::GetFlag(FLAGS_ucx) && UcxAllowedByEnvironment();
  o.nccl = absl::GetFlag(FLAGS_nccl);
  o.trusted_fabric = absl::GetFlag(FLAGS_trusted_fabric) ||
                     absl::GetFlag(FLAGS_bulk_outside_tls) ||
                     TrustedFabricByEnvironment();
  o.ucx_server.max_peers =
      static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_ucx_max_peers)));
  o.ucx_server.peer_idle_timeout = absl::GetFlag(FLAGS_ucx_peer_idle_timeout);
  o.arena.reuse_bytes = absl::GetFlag(FLAGS_shard_reuse_bytes);
  o.arena.warm_bytes = absl::GetFlag(FLAGS_shard_warm_bytes);
  WorkerNodeOptions& node = o.node;
  node.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  TESSERA_ASSIGN_OR_RETURN(
      node.principal_read_rate,
      FlagValue("--principal_read_rate",
                ParseQuotaBytes(absl::GetFlag(FLAGS_principal_read_rate))));
  if (node.principal_read_rate < 0) {
    return absl::InvalidArgumentError(
        "--principal_read_rate: give a rate, or 0 for none");
  }
  node.max_shards_per_request = absl::GetFlag(FLAGS_max_shards_per_request);
  node.max_streams = absl::GetFlag(FLAGS_max_streams);
  node.max_small_reads = absl::GetFlag(FLAGS_max_threads);
  node.stream_idle_timeout = absl::GetFlag(FLAGS_stream_idle_timeout);
  node.pull_timeout = absl::GetFlag(FLAGS_pull_timeout);
  node.pull_idle_timeout = absl::GetFlag(FLAGS_pull_idle_timeout);
  node.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  node.max_peer_channels =
      static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_max_peer_channels)));
  node.device_export_hold = absl::GetFlag(FLAGS_device_export_hold);
  node.max_staging_bytes = absl::GetFlag(FLAGS_max_staging_bytes);
  node.peers.transport = absl::GetFlag(FLAGS_peer_transport);
  o.server.max_threads = absl::GetFlag(FLAGS_max_threads);
  o.server.max_concurrent_streams =
      absl::GetFlag(FLAGS_max_streams_per_connection);
  o.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  o.quarantine_grace = absl::GetFlag(FLAGS_quarantine_grace);
  TESSERA_RETURN_IF_ERROR(o.Validate());
  TESSERA_RETURN_IF_ERROR(ConfigureListenerLimits(&o.server));
  return o;
}

}  // namespace tessera
