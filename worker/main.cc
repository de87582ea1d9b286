// tessera-worker: holds shards in memory and serves them.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/auth.h"
#include "core/errors.h"
#include "core/limits.h"
#include "core/metrics.h"
#include "core/placement.h"
#include "core/replica_placement.h"
#include "core/status_macros.h"
#include "ops/daemon_help.h"
#include "ops/daemon_listener.h"
#include "ops/daemon_security.h"
#include "ops/heap.h"
#include "ops/logging.h"
#include "ops/metrics_http.h"
#include "ops/process_metrics.h"
#include "ops/version.h"
#include "rpc/security.h"
#include "rpc/server.h"
#include "rpc/signals.h"
#include "spdlog/spdlog.h"
#include "transport/shared_memory_arena.h"
#include "worker/host_shard_store.h"
#include "worker/shard_files.h"
#ifdef TESSERA_CUDA
#include "worker/cuda_shard_store.h"
#include "worker/cuda_status.h"
#include "worker/nccl_exchange.h"
#endif
#include "transport/transport_chain.h"
#include "transport/ucx_common.h"
#include "transport/ucx_server.h"
#include "worker/registration.h"
#include "worker/ucx_service.h"
#include "worker/worker_node.h"
#include "worker/worker_service.h"

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
ABSL_FLAG(int64_t, capacity_bytes, 0,
          "most shard bytes this worker holds; 0 = no limit");
ABSL_FLAG(std::string, advertise, "",
          "address clients and peers dial, HOST:PORT, when it differs from "
          "--listen (e.g. --listen=0.0.0.0:7071); default: the --listen "
          "address");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://HOST:PORT/metrics (plaintext, "
          "no authentication); :PORT or PORT alone serves on 127.0.0.1; "
          "empty = off");
ABSL_FLAG(std::string, log_format, "text", "log lines as text or json");
ABSL_FLAG(bool, version, false, "print the version and exit");
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
          "this host, else UCX, else gRPC), or shm, ucx or grpc alone");
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
          "shards of the sizes lately allocated, made with spare CPU (a "
          "first reshard or repair then copies without page faults); at most "
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
namespace {

// The address this worker registers: --advertise, else the bound --listen
// address, which must then be one others can dial.
absl::StatusOr<std::string> AdvertisedAddress(const std::string& bound) {
  std::string address = absl::GetFlag(FLAGS_advertise);
  if (address.empty()) {
    const std::string host = bound.substr(0, bound.rfind(':'));
    if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--listen=", bound,
                       " is a wildcard address that clients cannot dial; give "
                       "--advertise=HOST:PORT"));
    }
    return bound;
  }
  TESSERA_RETURN_IF_ERROR(CheckDialAddress(address, "--advertise"));
  return address;
}

int Run() {
  if (absl::GetFlag(FLAGS_version)) {
    PrintVersion("tessera-worker");
    return 0;
  }
  if (absl::Status s =
          ConfigureLogging(absl::GetFlag(FLAGS_log_format), "tessera-worker");
      !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  absl::StatusOr<Device> device = ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    spdlog::error("--device: {}", std::string(device.status().message()));
    return 2;
  }
  std::string zone = absl::GetFlag(FLAGS_zone);
  if (zone.empty()) {
    // The host is the failure domain nobody has to configure.
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0 && CheckZone(host).ok()) {
      zone = host;
    }
  } else if (absl::Status s = CheckZone(zone); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  if (absl::GetFlag(FLAGS_capacity_bytes) < 0 ||
      absl::GetFlag(FLAGS_chunk_bytes) <= 0) {
    spdlog::error("--capacity_bytes must be >= 0 and --chunk_bytes > 0");
    return 2;
  }
  if (absl::GetFlag(FLAGS_shard_charge_bytes) < 0 ||
      absl::GetFlag(FLAGS_max_shards_per_request) <= 0 ||
      absl::GetFlag(FLAGS_max_streams) <= 0 ||
      absl::GetFlag(FLAGS_max_peer_channels) <= 0 ||
      absl::GetFlag(FLAGS_max_threads) < 0 ||
      absl::GetFlag(FLAGS_max_streams_per_connection) < 0 ||
      absl::GetFlag(FLAGS_stream_idle_timeout) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_pull_timeout) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_pull_idle_timeout) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_shutdown_grace) < absl::ZeroDuration()) {
    spdlog::error(
        "--shard_charge_bytes, --max_threads and "
        "--max_streams_per_connection must be >= 0 (0: no limit for the "
        "last two); --max_shards_per_request, --max_streams, "
        "--max_peer_channels and the timeouts must be > 0");
    return 2;
  }
  std::string token;
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> secret = ReadTokenFile(path);
    if (!secret.ok()) {
      spdlog::error("--token_file: {}", std::string(secret.status().message()));
      return 1;
    }
    token = *std::move(secret);
  }
  absl::StatusOr<DaemonSecurity> security =
      DaemonSecurityFromFlags(listen, !token.empty());
  if (!security.ok()) {
    spdlog::error("{}", std::string(security.status().message()));
    return 1;
  }
  // The secret presented to the coordinator follows --token_file on disk.
  auto secret = std::make_shared<BearerSecret>(token);
  std::unique_ptr<CredentialWatch> watch = MakeCredentialWatch(*security);
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    watch->WatchFile(path, [path, secret] {
      absl::StatusOr<std::string> now = ReadTokenFile(path);
      if (!now.ok()) {
        spdlog::error(
            "--token_file {} changed but cannot be used ({}); still "
            "presenting the previous secret",
            path, std::string(now.status().message()));
      } else if (*now != secret->token()) {
        secret->Set(*std::move(now));
        spdlog::info(
            "--token_file {} changed: presenting the new secret to the "
            "coordinator",
            path);
      }
    });
  }
  watch->Start();
  std::unique_ptr<ShardStore> store;
  std::string gpu_uuid;  // a GPU worker's, for its registration
  // Large host shards live in shared memory, for same-host readers; a GPU
  // worker stages device reads for them there.
  SharedMemoryArenaOptions arena_options;
  arena_options.reuse_bytes = absl::GetFlag(FLAGS_shard_reuse_bytes);
  arena_options.warm_bytes = absl::GetFlag(FLAGS_shard_warm_bytes);
  if (arena_options.warm_bytes < 0) {
    spdlog::error("--shard_warm_bytes={} is negative",
                  arena_options.warm_bytes);
    return 1;
  }
  // Memory held ahead of need stays small beside what shards may take (a
  // pod's limit is sized for those).
  if (const int64_t capacity = absl::GetFlag(FLAGS_capacity_bytes);
      capacity > 0) {
    arena_options.warm_bytes = std::min(arena_options.warm_bytes, capacity / 8);
  }
  if (arena_options.reuse_bytes < 0) {
    spdlog::error("--shard_reuse_bytes={} is negative",
                  arena_options.reuse_bytes);
    return 1;
  }
  auto arena = std::make_shared<SharedMemoryArena>(arena_options);
  // Shards found in --store_dir, by the cluster each belongs to.
  absl::flat_hash_map<uint64_t, std::string> reattached;
  ShardFiles::ScanResult scan;
  if (device->kind == Device::Kind::kCpu) {
    HostShardStoreOptions store_options;
    store_options.capacity_bytes = absl::GetFlag(FLAGS_capacity_bytes);
    store_options.shard_charge_bytes = absl::GetFlag(FLAGS_shard_charge_bytes);
    store_options.arena = arena;
    if (const std::string dir = absl::GetFlag(FLAGS_store_dir); !dir.empty()) {
      absl::StatusOr<std::shared_ptr<ShardFiles>> files = ShardFiles::Open(dir);
      if (!files.ok()) {
        spdlog::error("--store_dir: {}", std::string(files.status().message()));
        return 1;
      }
      store_options.files = *std::move(files);
    }
    auto host = std::make_unique<HostShardStore>(store_options);
    if (store_options.files != nullptr) {
      const absl::Time start = absl::Now();
      scan = host->Reattach(&reattached);
      for (const std::string& problem : scan.problems)
        spdlog::error("--store_dir: {}", problem);
      spdlog::info(
          "--store_dir {}: {} shard(s) re-attached ({} bytes, nothing copied) "
          "in {:.3f} s; {} damaged and {} never committed removed",
          store_options.files->dir(), reattached.size(), scan.intact_bytes,
          absl::ToDoubleSeconds(absl::Now() - start), scan.damaged,
          scan.unsealed);
    }
    store = std::move(host);
  } else {
    if (!absl::GetFlag(FLAGS_store_dir).empty()) {
      spdlog::error(
          "--store_dir keeps host shards; a worker with --device={} keeps "
          "them in GPU memory",
          device->ToString());
      return 2;
    }
#ifdef TESSERA_CUDA
    if (absl::Status s = CheckCudaDevice(device->index); !s.ok()) {
      spdlog::error("--device={}: {}", device->ToString(),
                    std::string(s.message()));
      return 1;
    }
    store = std::make_unique<CudaShardStore>(
        device->index, absl::GetFlag(FLAGS_capacity_bytes));
    // Tells the coordinator which workers share a GPU, whatever index each
    // sees it under (CUDA_VISIBLE_DEVICES).
    absl::StatusOr<std::string> uuid = CudaDeviceUuid(device->index);
    if (uuid.ok()) {
      gpu_uuid = *std::move(uuid);
    } else {
      spdlog::warn("--device={}: {}", device->ToString(),
                   std::string(uuid.status().message()));
    }
#else
    spdlog::error(
        "--device={}: this build has no CUDA support; run with --device=cpu or "
        "use "
        "a build made with --config=cuda",
        device->ToString());
    return 1;
#endif
  }
  WorkerNodeOptions node_options;
  node_options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  node_options.max_shards_per_request =
      absl::GetFlag(FLAGS_max_shards_per_request);
  node_options.max_streams = absl::GetFlag(FLAGS_max_streams);
  node_options.max_small_reads = absl::GetFlag(FLAGS_max_threads);
  node_options.stream_idle_timeout = absl::GetFlag(FLAGS_stream_idle_timeout);
  node_options.pull_timeout = absl::GetFlag(FLAGS_pull_timeout);
  node_options.pull_idle_timeout = absl::GetFlag(FLAGS_pull_idle_timeout);
  node_options.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  node_options.max_peer_channels =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_peer_channels));
  node_options.arena = arena;
  node_options.device_export_hold = absl::GetFlag(FLAGS_device_export_hold);
  node_options.max_staging_bytes = absl::GetFlag(FLAGS_max_staging_bytes);
  node_options.channels.credentials = security->channel_credentials;
  // UCX: both serving keys and pulling from peers, or neither.
  const bool ucx_wanted = absl::GetFlag(FLAGS_ucx) && UcxAllowedByEnvironment();
  const bool trusted_fabric = absl::GetFlag(FLAGS_trusted_fabric) ||
                              absl::GetFlag(FLAGS_bulk_outside_tls) ||
                              TrustedFabricByEnvironment();
  // Without TLS, or with TLS and a fabric the operator trusts.
  const bool bulk_fabric_ok = !security->tls || trusted_fabric;
  if (trusted_fabric) {
    spdlog::warn(
        "--trusted_fabric: UCX{} moves shard bytes over the network "
        "unencrypted, and whoever reaches this worker's UCX port reaches "
        "its memory; only the fabric between the hosts protects them",
        security->tls ? " (and NCCL)" : "");
  }
  const bool ucx_allowed =
      ucx_wanted && bulk_fabric_ok && device->kind == Device::Kind::kCpu;
  node_options.peers.ucx = ucx_allowed;
  node_options.peers.ucx_trusted_fabric = ucx_allowed && trusted_fabric;
  node_options.peers.transport = absl::GetFlag(FLAGS_peer_transport);
  if (absl::Status s = CheckTransportName(node_options.peers.transport);
      !s.ok()) {
    spdlog::error("--peer_transport: {}", std::string(s.message()));
    return 2;
  }
#ifdef TESSERA_CUDA
  std::unique_ptr<NcclExchange> nccl;
  if (device->kind == Device::Kind::kCuda) {
    if (!absl::GetFlag(FLAGS_nccl)) {
      spdlog::info("NCCL off (--nccl=false): GPU pieces move through the host");
    } else if (!bulk_fabric_ok) {
      spdlog::info(
          "NCCL off: this worker runs TLS, and NCCL would carry shard bytes "
          "outside it (--trusted_fabric allows it)");
    } else {
      nccl = std::make_unique<NcclExchange>(
          static_cast<CudaShardStore*>(store.get()));
      node_options.exchange = nccl.get();
      spdlog::info(
          "NCCL on: reshard pieces between GPU workers move by "
          "send/recv when the coordinator orders an exchange");
    }
  }
#endif
  WorkerNode node(store.get(), node_options);
  WorkerService service(&node);
  std::unique_ptr<UcxServer> ucx;
  std::unique_ptr<UcxDataService> ucx_service;
  if (!ucx_wanted) {
    spdlog::info(
        "UCX off (--ucx=false or TESSERA_UCX=0): shard bytes move "
        "over shared memory and gRPC");
  } else if (!ucx_allowed) {
    spdlog::info("UCX off: {}; shard bytes move over shared memory and gRPC",
                 !bulk_fabric_ok ? "this worker runs TLS, and UCX would carry "
                                   "shard bytes outside it (--trusted_fabric "
                                   "allows it)"
                                 : "shards are not in host memory");
  } else if (absl::StatusOr<std::unique_ptr<UcxServer>> started =
                 StartUcxServer(
                     &node,
                     [&] {
                       UcxServerOptions ucx_options;
                       ucx_options.reach.trusted_fabric = trusted_fabric;
                       ucx_options.max_peers = static_cast<size_t>(
                           std::max(1, absl::GetFlag(FLAGS_ucx_max_peers)));
                       ucx_options.peer_idle_timeout =
                           absl::GetFlag(FLAGS_ucx_peer_idle_timeout);
                       ucx_options.reach.loopback_only =
                           IsLoopbackHost(listen.substr(0, listen.rfind(':')));
                       return ucx_options;
                     }());
             !started.ok()) {
    spdlog::warn(
        "UCX cannot start here ({}); shard bytes move over shared "
        "memory and gRPC",
        std::string(started.status().message()));
  } else {
    ucx = *std::move(started);
    ucx_service = std::make_unique<UcxDataService>(&node, ucx.get());
    spdlog::info(
        "UCX on ({}): readers and peers have shard bytes sent to them "
        "(UcxData keys on the gRPC port)",
        trusted_fabric ? "the trusted fabric and this host"
                       : "this host's processes of this user only; "
                         "--trusted_fabric for other hosts");
  }
  std::vector<grpc::Service*> services = {&service};
  if (ucx_service != nullptr) services.push_back(ucx_service.get());
  MetricsRegistry metrics;
  ServerOptions server_options;
  server_options.metrics = &metrics;
  server_options.credentials = security->server_credentials;
  server_options.health_listen = security->health_listen;
  server_options.max_threads = absl::GetFlag(FLAGS_max_threads);
  server_options.max_concurrent_streams =
      absl::GetFlag(FLAGS_max_streams_per_connection);
  if (absl::Status s = ConfigureListenerLimits(&server_options); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  absl::StatusOr<RunningServer> server =
      StartServer(listen, services, server_options);
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return 1;
  }
  AddListenerMetrics(&metrics, *server);
  AddProcessMetrics(&metrics, "worker");
  watch->AddMetrics(&metrics);
  absl::StatusOr<std::string> advertised =
      AdvertisedAddress(WithPort(listen, server->port));
  if (!advertised.ok()) {
    spdlog::error("{}", std::string(advertised.status().message()));
    server->Stop(absl::ZeroDuration());
    return 2;
  }
  const std::string address = *advertised;
  metrics.AddCollector([&](MetricsRegistry& m) {
    m.Gauge("tessera_worker_bytes_held",
            "Element bytes of the shards this worker holds.")
        ->Set(static_cast<double>(store->BytesUsed()));
    m.Gauge("tessera_worker_shards_held", "Shards this worker holds.")
        ->Set(static_cast<double>(store->ShardIds().size()));
    m.Gauge("tessera_worker_charged_bytes",
            "Bytes counted against the capacity: shards held (each at least "
            "its bookkeeping charge) and freed shards readers still pin.")
        ->Set(static_cast<double>(store->ChargedBytes()));
    m.Gauge("tessera_worker_pinned_bytes",
            "Bytes of freed shards that readers still pin (counted against "
            "the capacity until released).")
        ->Set(static_cast<double>(store->PinnedBytes()));
    if (ucx != nullptr) {
      const auto [live, dead] = ucx->Counts();
      m.Gauge("tessera_worker_ucx_keys", "UCX keys handed out, live.")
          ->Set(static_cast<double>(live));
      m.Gauge("tessera_worker_ucx_retired_keys",
              "UCX keys of freed shards, remembered for their grace.")
          ->Set(static_cast<double>(dead));
      m.Gauge("tessera_ucx_peers",
              "Reader endpoints this worker's UCX keeps (closed on a "
              "reader's goodbye, when idle, or past the bound).")
          ->Set(static_cast<double>(ucx->Peers()));
    }
    if (arena != nullptr) {
      const ArenaCounts blocks = arena->Counts();
      for (const auto& [source, count] :
           {std::pair<const char*, int64_t>{"fresh", blocks.fresh},
            {"reused", blocks.reused},
            {"warm", blocks.warm}}) {
        m.Counter("tessera_worker_shm_blocks_total",
                  "Shared-memory blocks given to shards, by where their "
                  "pages came from: fresh (faulted in by the first write), "
                  "reused (a freed shard's), warm (populated ahead).",
                  {{"source", source}})
            ->Set(static_cast<double>(count));
      }
      m.Gauge("tessera_worker_warm_bytes",
              "Bytes of shared memory populated ahead of new shards, "
              "waiting (bounded by --shard_warm_bytes).")
          ->Set(static_cast<double>(blocks.warm_bytes));
    }
    if (!absl::GetFlag(FLAGS_store_dir).empty()) {
      m.Gauge("tessera_worker_reattached_shards",
              "Shards found intact in --store_dir at start and served again "
              "without a copy.")
          ->Set(static_cast<double>(reattached.size()));
      m.Gauge("tessera_worker_reattached_bytes", "Their bytes.")
          ->Set(static_cast<double>(scan.intact_bytes));
      m.Gauge("tessera_worker_store_damaged_shards",
              "Shards in --store_dir that failed their check at start "
              "(removed; the coordinator repairs them from replicas).")
          ->Set(static_cast<double>(scan.damaged));
    }
    m.Gauge("tessera_worker_small_reads_in_flight",
            "Small region and row reads being served or waiting for their "
            "replies to be written, on a host-memory worker (at most "
            "--max_threads).")
        ->Set(static_cast<double>(service.small_reads_in_flight()));
    m.Gauge("tessera_worker_capacity_bytes",
            "Most shard bytes this worker holds (0: no limit).")
        ->Set(static_cast<double>(absl::GetFlag(FLAGS_capacity_bytes)));
    const DataPlaneStats moved = node.PeerStats();
    for (const auto& [transport, bytes] : moved.bytes) {
      // Counters read from the chain's own monotonic counts.
      m.Counter("tessera_transfer_bytes_total",
                "Bytes this worker pulled from peers, by transport.",
                {{"transport", transport}})
          ->Set(static_cast<double>(bytes));
    }
    for (const auto& [transport, count] : moved.fallbacks) {
      m.Counter("tessera_transfer_fallbacks_total",
                "Pulls a transport declined and left to the next, by the "
                "transport that declined.",
                {{"transport", transport}})
          ->Set(static_cast<double>(count));
    }
  });
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> metrics_server =
      ServeMetricsIfAsked(absl::GetFlag(FLAGS_metrics_listen), &metrics);
  if (!metrics_server.ok()) {
    spdlog::error("{}", std::string(metrics_server.status().message()));
    server->Stop(absl::ZeroDuration());
    return 1;
  }
  std::string name = absl::GetFlag(FLAGS_name);
  if (name.empty()) name = absl::StrCat("w", server->port);
  if (absl::Status s = CheckWorkerName(name); !s.ok()) {
    spdlog::error("--name: {}", std::string(s.message()));
    return 2;
  }
  spdlog::info(
      "tessera-worker '{}' serving on {} as {} (device {}, capacity {}, {})",
      name, WithPort(listen, server->port), address, device->ToString(),
      absl::GetFlag(FLAGS_capacity_bytes) == 0
          ? std::string("unlimited")
          : absl::StrCat(absl::GetFlag(FLAGS_capacity_bytes), " bytes"),
      security->tls ? "mutual TLS" : "plaintext");
  if (server->health_port > 0) {
    spdlog::info("health (plaintext, grpc.health.v1 only) on {}",
                 WithPort(security->health_listen, server->health_port));
  }

  RegistrationOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.name = name;
  if (absl::GetFlag(FLAGS_rank) >= 0) options.rank = absl::GetFlag(FLAGS_rank);
  options.address = address;
  options.device = *device;
  options.gpu_uuid = gpu_uuid;
  options.zone = zone;
  options.capacity_bytes = absl::GetFlag(FLAGS_capacity_bytes);
  options.quarantine_grace = absl::GetFlag(FLAGS_quarantine_grace);
  options.channel.credentials = security->channel_credentials;
  if (!token.empty())
    options.channel.interceptors = BearerTokenInterceptors(secret);
  // Capabilities are checked with the key of the latest registration.
  options.on_key = [&node, name](const std::string& key,
                                 const std::string& cluster_id) {
    node.SetIdentity(name, key, cluster_id);
  };
  options.on_revoked =
      [&node](std::vector<std::pair<std::string, int64_t>> revoked) {
        node.SetRevoked(std::move(revoked));
      };
  // Health: SERVING while registered with the coordinator.
  options.on_registered = [&](bool registered) {
    server->SetServing(registered);
  };
  absl::Mutex fatal_mu;
  absl::Status fatal;
  auto die = [&](const absl::Status& status) {
    {
      absl::MutexLock lock(&fatal_mu);
      fatal = status;
    }
    kill(getpid(), SIGTERM);  // wakes the main thread's signal wait
  };
  Registration registration(options, store.get(), die);
  registration.Adopt(reattached);
  registration.Start();
  std::unique_ptr<ListenerProbe> probe = StartListenerProbe(
      listen, &*server, security->self_probe_credentials,
      [&] { die(absl::UnavailableError("the gRPC port accepts nothing")); });

  const int sig = WaitForTerminationSignal();
  probe.reset();
  registration.Stop();
  {
    absl::MutexLock lock(&fatal_mu);
    if (!fatal.ok()) {
      if (!server->Stop(absl::ZeroDuration())) std::_Exit(1);
      return 1;
    }
  }
  spdlog::info("signal {} received; shutting down", sig);
  if (!server->Stop(absl::GetFlag(FLAGS_shutdown_grace))) {
    // A handler ignores its cancellation: the grace bounds the exit, and
    // what the handlers use must not be destroyed under them.
    spdlog::warn("calls still running after the shutdown grace; exiting");
    spdlog::default_logger()->flush();
    std::_Exit(0);
  }
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::RetainFreedBuffers();
  tessera::BlockTerminationSignals();
  absl::SetProgramUsageMessage(
      "tessera-worker --coordinator=HOST:PORT --listen=HOST:PORT --name=NAME");
  if (tessera::PrintDaemonHelp(argc, argv,
                               std::string(absl::ProgramUsageMessage()),
                               "worker/main.cc")) {
    return 0;
  }
  absl::ParseCommandLine(argc, argv);
  return tessera::Run();
}
