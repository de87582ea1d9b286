#include "worker/worker_daemon.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/auth.h"
#include "core/metrics.h"
#include "core/replica_placement.h"
#include "core/status_macros.h"
#include "ops/credential_watch.h"
#include "ops/daemon_listener.h"
#include "ops/metrics_http.h"
#include "ops/process_metrics.h"
#include "rpc/security.h"
#include "spdlog/spdlog.h"
#include "transport/transport_chain.h"
#include "transport/ucx_common.h"
#include "worker/gpu_support.h"
#include "worker/grpc_relay_upstreams.h"
#include "worker/host_shard_store.h"
#include "worker/registration.h"
#include "worker/shard_files.h"
#include "worker/ucx_service.h"
#include "worker/worker_service.h"

namespace tessera {
namespace {

bool IsWildcardHost(const std::string& address) {
  const std::string host = address.substr(0, address.rfind(':'));
  return host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty();
}

}  // namespace

absl::Status WorkerDaemonOptions::Validate() const {
  if (!zone.empty()) TESSERA_RETURN_IF_ERROR(CheckZone(zone));
  TESSERA_RETURN_IF_ERROR(CheckLabels(labels));
  if (capacity_bytes < 0 || node.chunk_bytes <= 0) {
    return absl::InvalidArgumentError(
        "--capacity_bytes must be >= 0 and --chunk_bytes > 0");
  }
  if (shard_charge_bytes < 0 || node.max_shards_per_request <= 0 ||
      node.max_streams <= 0 || node.max_peer_channels == 0 ||
      server.max_threads < 0 || server.max_concurrent_streams < 0 ||
      node.stream_idle_timeout <= absl::ZeroDuration() ||
      node.pull_timeout <= absl::ZeroDuration() ||
      node.pull_idle_timeout <= absl::ZeroDuration() ||
      shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--shard_charge_bytes, --max_threads and "
        "--max_streams_per_connection must be >= 0 (0: no limit for the "
        "last two); --max_shards_per_request, --max_streams, "
        "--max_peer_channels and the timeouts must be > 0");
  }
  if (arena.warm_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard_warm_bytes=", arena.warm_bytes, " is negative"));
  }
  if (arena.reuse_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard_reuse_bytes=", arena.reuse_bytes, " is negative"));
  }
  if (!store_dir.empty() && device.kind != Device::Kind::kCpu) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store_dir keeps host shards; a worker with --device=",
                     device.ToString(), " keeps them in GPU memory"));
  }
  if (absl::Status s = CheckTransportName(node.peers.transport); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_transport: ", s.message()));
  }
  if (advertise.empty() && IsWildcardHost(listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", listen,
                     " is a wildcard address that clients cannot dial; give "
                     "--advertise=HOST:PORT"));
  }
  if (!advertise.empty()) {
    TESSERA_RETURN_IF_ERROR(CheckDialAddress(advertise, "--advertise"));
  }
  if (!data_advertise.empty()) {
    TESSERA_RETURN_IF_ERROR(
        CheckDialAddress(data_advertise, "--data_advertise"));
  }
  if (!name.empty()) {
    if (absl::Status s = CheckWorkerName(name); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--name: ", s.message()));
    }
  }
  return absl::OkStatus();
}

// Everything the daemon runs, declared in the order it is built, so that it
// is torn down the other way round.
class WorkerDaemon::Parts {
 public:
  std::shared_ptr<BearerSecret> secret;
  std::unique_ptr<CredentialWatch> watch;
  std::shared_ptr<SharedMemoryArena> arena;
  std::unique_ptr<ShardStore> store;
  std::string gpu_uuid;  // a GPU worker's, for its registration
  // Shards found in --store_dir, by the cluster each belongs to.
  absl::flat_hash_map<uint64_t, std::string> reattached;
  ShardFiles::ScanResult scan;
  std::unique_ptr<DeviceExchange> nccl;
  std::unique_ptr<WorkerNode> node;
  std::unique_ptr<GrpcRelayUpstreams> relay_upstreams;  // over node's channels
  std::unique_ptr<WorkerService> service;
  std::unique_ptr<UcxServer> ucx;
  std::unique_ptr<UcxDataService> ucx_service;
  std::unique_ptr<DataPort> data_port;
  MetricsRegistry metrics;
  std::optional<RunningServer> server;
  std::unique_ptr<MetricsHttpServer> metrics_server;
  std::unique_ptr<Registration> registration;
  std::unique_ptr<ListenerProbe> probe;

  absl::Status FollowTokenFile(const std::string& path);
  absl::Status OpenStore(const WorkerDaemonOptions& options);
  // Whether UCX may serve here, and NCCL for a GPU worker.
  void ChooseBulkTransports(const WorkerDaemonOptions& options,
                            WorkerNodeOptions* node_options, bool* ucx_allowed);
  void StartUcx(const WorkerDaemonOptions& options, bool allowed);
  // Opens the data port unless it is off; returns its advertised address
  // (empty: none).
  absl::StatusOr<std::string> StartDataPort(const WorkerDaemonOptions& options);
  void AddWorkerMetrics(const WorkerDaemonOptions& options);
};

absl::Status WorkerDaemon::Parts::FollowTokenFile(const std::string& path) {
  std::string token;
  if (!path.empty()) {
    absl::StatusOr<std::string> read = ReadTokenFile(path);
    if (!read.ok()) {
      return absl::Status(
          read.status().code(),
          absl::StrCat("--token_file: ", read.status().message()));
    }
    token = *std::move(read);
  }
  // The secret presented to the coordinator follows --token_file on disk.
  secret = std::make_shared<BearerSecret>(token);
  if (path.empty()) return absl::OkStatus();
  watch->WatchFile(path, [path, secret = secret] {
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
  return absl::OkStatus();
}

absl::Status WorkerDaemon::Parts::OpenStore(
    const WorkerDaemonOptions& options) {
  // Large host shards live in shared memory, for same-host readers; a GPU
  // worker stages device reads for them there. Memory held ahead of need
  // stays small beside what shards may take (a pod's limit is sized for
  // those).
  SharedMemoryArenaOptions arena_options = options.arena;
  if (options.capacity_bytes > 0) {
    arena_options.warm_bytes =
        std::min(arena_options.warm_bytes, options.capacity_bytes / 8);
  }
  arena = std::make_shared<SharedMemoryArena>(arena_options);
  const Device& device = options.device;
  if (device.kind == Device::Kind::kCpu) {
    HostShardStoreOptions store_options;
    store_options.capacity_bytes = options.capacity_bytes;
    store_options.shard_charge_bytes = options.shard_charge_bytes;
    store_options.arena = arena;
    if (!options.store_dir.empty()) {
      absl::StatusOr<std::shared_ptr<ShardFiles>> files =
          ShardFiles::Open(options.store_dir);
      if (!files.ok()) {
        return absl::Status(
            files.status().code(),
            absl::StrCat("--store_dir: ", files.status().message()));
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
    return absl::OkStatus();
  }
  const GpuSupport* gpu = RegisteredGpuSupport();
  if (gpu == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=", device.ToString(),
        ": this build has no CUDA support; run with --device=cpu or use a "
        "build made with --config=cuda"));
  }
  if (absl::Status s = gpu->check_device(device.index); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--device=", device.ToString(),
                                               ": ", s.message()));
  }
  store = gpu->make_store(device.index, options.capacity_bytes);
  // Tells the coordinator which workers share a GPU, whatever index each
  // sees it under (CUDA_VISIBLE_DEVICES).
  absl::StatusOr<std::string> uuid = gpu->device_uuid(device.index);
  if (uuid.ok()) {
    gpu_uuid = *std::move(uuid);
  } else {
    spdlog::warn("--device={}: {}", device.ToString(),
                 std::string(uuid.status().message()));
  }
  return absl::OkStatus();
}

void WorkerDaemon::Parts::ChooseBulkTransports(
    const WorkerDaemonOptions& options, WorkerNodeOptions* node_options,
    bool* ucx_allowed) {
  const bool tls = options.security.tls;
  // Without TLS, or with TLS and a fabric the operator trusts.
  const bool bulk_fabric_ok = !tls || options.trusted_fabric;
  if (options.trusted_fabric) {
    spdlog::warn(
        "--trusted_fabric: UCX{} moves shard bytes over the network "
        "unencrypted, and whoever reaches this worker's UCX port reaches "
        "its memory; only the fabric between the hosts protects them",
        tls ? " (and NCCL)" : "");
  }
  // UCX: both serving keys and pulling from peers, or neither.
  *ucx_allowed = options.ucx && bulk_fabric_ok &&
                 options.device.kind == Device::Kind::kCpu;
  node_options->peers.ucx = *ucx_allowed;
  node_options->peers.ucx_trusted_fabric =
      *ucx_allowed && options.trusted_fabric;
  if (!options.ucx) {
    spdlog::info(
        "UCX off (--ucx=false or TESSERA_UCX=0): shard bytes move "
        "over shared memory and gRPC");
  } else if (!*ucx_allowed) {
    spdlog::info("UCX off: {}; shard bytes move over shared memory and gRPC",
                 !bulk_fabric_ok ? "this worker runs TLS, and UCX would carry "
                                   "shard bytes outside it (--trusted_fabric "
                                   "allows it)"
                                 : "shards are not in host memory");
  }
  // NCCL only for a GPU store, which only a build with CUDA opens.
  const GpuSupport* gpu = RegisteredGpuSupport();
  if (options.device.kind != Device::Kind::kCuda || gpu == nullptr) return;
  if (!options.nccl) {
    spdlog::info("NCCL off (--nccl=false): GPU pieces move through the host");
  } else if (!bulk_fabric_ok) {
    spdlog::info(
        "NCCL off: this worker runs TLS, and NCCL would carry shard bytes "
        "outside it (--trusted_fabric allows it)");
  } else {
    nccl = gpu->make_exchange(store.get());
    node_options->exchange = nccl.get();
    spdlog::info(
        "NCCL on: reshard pieces between GPU workers move by "
        "send/recv when the coordinator orders an exchange");
  }
}

void WorkerDaemon::Parts::StartUcx(const WorkerDaemonOptions& options,
                                   bool allowed) {
  if (!allowed) return;
  UcxServerOptions ucx_options = options.ucx_server;
  ucx_options.reach.trusted_fabric = options.trusted_fabric;
  ucx_options.max_peers = std::max<size_t>(1, ucx_options.max_peers);
  ucx_options.reach.loopback_only =
      IsLoopbackHost(options.listen.substr(0, options.listen.rfind(':')));
  absl::StatusOr<std::unique_ptr<UcxServer>> started =
      StartUcxServer(node.get(), ucx_options);
  if (!started.ok()) {
    spdlog::warn(
        "UCX cannot start here ({}); shard bytes move over shared "
        "memory and gRPC",
        std::string(started.status().message()));
    return;
  }
  ucx = *std::move(started);
  ucx_service = std::make_unique<UcxDataService>(node.get(), ucx.get());
  spdlog::info(
      "UCX on ({}): readers and peers have shard bytes sent to them "
      "(UcxData keys on the gRPC port)",
      options.trusted_fabric ? "the trusted fabric and this host"
                             : "this host's processes of this user only; "
                               "--trusted_fabric for other hosts");
}

absl::StatusOr<std::string> WorkerDaemon::Parts::StartDataPort(
    const WorkerDaemonOptions& options) {
  if (options.data_listen == "off") {
    spdlog::info(
        "no data port (--data_listen=off): shard bytes move over gRPC");
    return std::string();
  }
  const std::string listen_host =
      options.listen.substr(0, options.listen.rfind(':'));
  DataPortOptions port_options = options.data_port;
  port_options.listen = options.data_listen.empty()
                            ? absl::StrCat(listen_host, ":0")
                            : options.data_listen;
  port_options.tls = options.security.data_server_tls;
  if (absl::Status s = CheckProtectedMode(
          port_options.listen,
          options.security.tls || !options.token_file.empty(),
          options.security.insecure);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--data_listen: ", s.message()));
  }
  port_options.max_connections = options.server.max_connections;
  port_options.max_per_peer = options.server.max_connections_per_peer;
  absl::StatusOr<std::unique_ptr<DataPort>> started =
      DataPort::Start(node.get(), port_options);
  if (!started.ok()) {
    return absl::Status(
        started.status().code(),
        absl::StrCat("--data_listen: ", started.status().message()));
  }
  data_port = *std::move(started);
  if (!options.data_advertise.empty()) return options.data_advertise;
  const std::string& dialed =
      options.advertise.empty() ? options.listen : options.advertise;
  const std::string address =
      absl::StrCat(dialed.substr(0, dialed.rfind(':')), ":", data_port->port());
  spdlog::info("data port on {} ({}), dialed as {}",
               WithPort(port_options.listen, data_port->port()),
               port_options.tls != nullptr ? "mutual TLS 1.3" : "plaintext",
               address);
  return address;
}

void WorkerDaemon::Parts::AddWorkerMetrics(const WorkerDaemonOptions& options) {
  const bool store_dir = !options.store_dir.empty();
  const int64_t capacity = options.capacity_bytes;
  metrics.AddCollector([this, store_dir, capacity](MetricsRegistry& m) {
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
    if (store_dir) {
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
        ->Set(static_cast<double>(service->small_reads_in_flight()));
    m.Gauge("tessera_worker_capacity_bytes",
            "Most shard bytes this worker holds (0: no limit).")
        ->Set(static_cast<double>(capacity));
    for (const auto& [principal, seconds] : node->ReadDelays()) {
      m.Counter("tessera_read_delay_seconds_total",
                "Seconds this worker held a principal's reads back to "
                "--principal_read_rate.",
                {{"principal", principal}})
          ->Set(seconds);
    }
    // What this worker sent: to readers, and to peers pulling from it.
    const std::pair<const char*, int64_t> served[] = {
        {"grpc", service->served_grpc_bytes()},
        {"shm", service->served_shm_bytes()},
        {"tcp", data_port != nullptr ? data_port->Stats().bytes_sent : 0},
        {"ucx", ucx != nullptr ? ucx->BytesSent() : 0}};
    for (const auto& [transport, bytes] : served) {
      m.Counter("tessera_served_bytes_total",
                "Shard bytes this worker sent to readers and to peers pulling "
                "from it, by transport (shm: bytes staged for readers; reads "
                "of a mapped shard are the reader's own and not counted).",
                {{"transport", transport}})
          ->Set(static_cast<double>(bytes));
    }
    const DataPlaneStats moved = node->PeerStats();
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
}

WorkerDaemon::WorkerDaemon(WorkerDaemonOptions options)
    : options_(std::move(options)),
      parts_(std::make_unique<Parts>()),
      life_(options_.on_fatal) {}

WorkerDaemon::~WorkerDaemon() {
  if (!stopped_ && parts_->server.has_value()) Stop(absl::ZeroDuration());
}

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Start(
    WorkerDaemonOptions options) {
  TESSERA_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<WorkerDaemon> daemon(new WorkerDaemon(std::move(options)));
  if (absl::Status s = daemon->StartParts(); !s.ok()) {
    daemon->Stop(absl::ZeroDuration());
    return s;
  }
  return daemon;
}

absl::Status WorkerDaemon::StartParts() {
  Parts& p = *parts_;
  const WorkerDaemonOptions& o = options_;
  p.watch = MakeCredentialWatch(o.security);
  TESSERA_RETURN_IF_ERROR(p.FollowTokenFile(o.token_file));
  p.watch->Start();
  TESSERA_RETURN_IF_ERROR(p.OpenStore(o));

  WorkerNodeOptions node_options = o.node;
  node_options.arena = p.arena;
  node_options.channels.credentials = o.security.channel_credentials;
  node_options.peers.tcp_tls = o.security.data_client_tls;
  bool ucx_allowed = false;
  p.ChooseBulkTransports(o, &node_options, &ucx_allowed);
  p.node = std::make_unique<WorkerNode>(p.store.get(), node_options);
  node_ = p.node.get();
  p.relay_upstreams =
      std::make_unique<GrpcRelayUpstreams>(p.node->peer_channels());
  p.node->SetRelayUpstreams(p.relay_upstreams.get());
  p.service = std::make_unique<WorkerService>(p.node.get());
  p.StartUcx(o, ucx_allowed);
  TESSERA_ASSIGN_OR_RETURN(data_address_, p.StartDataPort(o));
  p.service->set_data_address(data_address_);

  std::vector<grpc::Service*> services = {p.service.get()};
  if (p.ucx_service != nullptr) services.push_back(p.ucx_service.get());
  ServerOptions server_options = o.server;
  server_options.metrics = &p.metrics;
  server_options.credentials = o.security.server_credentials;
  server_options.health_listen = o.security.health_listen;
  absl::StatusOr<RunningServer> server =
      StartServer(o.listen, services, server_options);
  if (!server.ok()) return server.status();
  p.server.emplace(*std::move(server));
  const std::string bound = WithPort(o.listen, p.server->port);
  address_ = o.advertise.empty() ? bound : o.advertise;
  name_ = o.name.empty() ? absl::StrCat("w", p.server->port) : o.name;
  AddListenerMetrics(&p.metrics, *p.server);
  AddProcessMetrics(&p.metrics, "worker");
  p.watch->AddMetrics(&p.metrics);
  p.AddWorkerMetrics(o);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> metrics_server =
      ServeMetricsIfAsked(o.metrics_listen, &p.metrics);
  if (!metrics_server.ok()) return metrics_server.status();
  p.metrics_server = *std::move(metrics_server);
  spdlog::info(
      "tessera-worker '{}' serving on {} as {} (device {}, capacity {}, {})",
      name_, bound, address_, o.device.ToString(),
      o.capacity_bytes == 0 ? std::string("unlimited")
                            : absl::StrCat(o.capacity_bytes, " bytes"),
      o.security.tls ? "mutual TLS" : "plaintext");
  if (p.server->health_port > 0) {
    spdlog::info("health (plaintext, grpc.health.v1 only) on {}",
                 WithPort(o.security.health_listen, p.server->health_port));
  }

  RegistrationOptions registration;
  registration.coordinator = o.coordinator;
  registration.name = name_;
  registration.rank = o.rank;
  registration.address = address_;
  registration.device = o.device;
  registration.gpu_uuid = p.gpu_uuid;
  registration.zone = o.zone;
  registration.labels = o.labels;
  registration.data_address = data_address_;
  registration.capacity_bytes = o.capacity_bytes;
  registration.quarantine_grace = o.quarantine_grace;
  registration.channel.credentials = o.security.channel_credentials;
  if (!o.token_file.empty())
    registration.channel.interceptors = BearerTokenInterceptors(p.secret);
  // Capabilities are checked with the key of the latest registration.
  registration.on_key = [node = node_, name = name_](
                            const std::string& key,
                            const std::string& cluster_id) {
    node->SetIdentity(name, key, cluster_id);
  };
  registration.on_revoked =
      [node = node_](std::vector<std::pair<std::string, int64_t>> revoked) {
        node->SetRevoked(std::move(revoked));
      };
  // Health: SERVING while registered with the coordinator.
  registration.on_registered = [server = &*p.server](bool registered) {
    server->SetServing(registered);
  };
  p.registration = std::make_unique<Registration>(
      registration, p.store.get(),
      [this](const absl::Status& status) { Fail(status); });
  p.registration->Adopt(p.reattached);
  p.registration->Start();
  p.probe = StartListenerProbe(
      o.listen, &*p.server, o.security.self_probe_credentials, [this] {
        Fail(absl::UnavailableError("the gRPC port accepts nothing"));
      });
  return absl::OkStatus();
}

int WorkerDaemon::port() const {
  return parts_ != nullptr && parts_->server.has_value() ? parts_->server->port
                                                         : 0;
}

bool WorkerDaemon::Stop(absl::Duration grace) {
  life_.RequestStop();
  stopped_ = true;
  Parts& p = *parts_;
  p.probe.reset();
  if (p.registration != nullptr) p.registration->Stop();
  if (!p.server.has_value()) return true;
  const bool in_time = p.server->Stop(grace);
  if (!in_time) {
    // Handlers still run on what the parts hold: never destroyed.
    (void)parts_.release();
  }
  return in_time;
}

}  // namespace tessera
