#include "coordinator/coordinator_daemon.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/cluster_authority.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/etcd_client.h"
#include "coordinator/etcd_metadata_store.h"
#include "coordinator/file_metadata_store.h"
#include "coordinator/grpc_worker_control.h"
#include "coordinator/leadership.h"
#include "core/status_macros.h"
#include "ops/credential_watch.h"
#include "ops/daemon_listener.h"
#include "ops/metrics_http.h"
#include "ops/process_metrics.h"
#include "rpc/server.h"
#include "spdlog/spdlog.h"

namespace tessera {

absl::Status CoordinatorDaemonOptions::Validate() const {
  const CoordinatorOptions& c = coordinator;
  if (c.lease <= absl::ZeroDuration() ||
      c.heartbeat_interval <= absl::ZeroDuration() || c.snapshot_every <= 0) {
    return absl::InvalidArgumentError(
        "--lease_ms, --heartbeat_ms and --snapshot_every must be > 0");
  }
  if (c.pending_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--pending_timeout must be > 0");
  }
  if (c.pending_lease < absl::Milliseconds(300)) {
    return absl::InvalidArgumentError("--pending_lease must be at least 300ms");
  }
  if (c.max_workers == 0 || c.max_shards_per_tensor <= 0 ||
      c.max_tensor_metadata_bytes <= 0 ||
      c.plan_budget <= absl::ZeroDuration() ||
      shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--max_workers, --max_shards_per_tensor, --max_tensor_metadata_bytes "
        "and --plan_budget must be > 0, --shutdown_grace >= 0");
  }
  if (c.repair_bytes_per_second < 0) {
    return absl::InvalidArgumentError("--repair_bytes_per_second must be >= 0");
  }
  if (metadata.empty()) return absl::OkStatus();
  if (!data_dir.empty()) {
    return absl::InvalidArgumentError(
        "--metadata and --data_dir name two places for the metadata: give "
        "one");
  }
  TESSERA_RETURN_IF_ERROR(ParseEtcdUrl(metadata).status());
  const std::string advertised = advertise.empty() ? listen : advertise;
  // Clients and workers reach a standby at this address once it leads: it
  // must name a port (--listen's 0 is picked only when serving).
  if (!IsHostPort(advertised)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--advertise '", advertised,
        "' is not HOST:PORT (with --metadata, give --advertise or a --listen "
        "port other than 0)"));
  }
  // etcd leases are whole seconds; renewing every third of one must not
  // spin.
  if (leader_lease < absl::Seconds(1) || leader_lease > absl::Hours(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--leader_lease=", absl::FormatDuration(leader_lease),
                     " must be 1s to 1h"));
  }
  return absl::OkStatus();
}

namespace {

// What an operator reads once the coordinator serves: where its metadata
// is, its security, what it recovered, and whether its cluster is new.
void LogServing(const Coordinator& coordinator,
                const std::string& store_description,
                const FileMetadataStore* file_store, bool etcd,
                const CoordinatorDaemonOptions& o, bool authorization,
                size_t principals) {
  spdlog::info("metadata: {}", store_description);
  spdlog::info("security: {}, {}", o.security.tls ? "mutual TLS" : "plaintext",
               authorization
                   ? absl::StrCat("tokens for ", principals, " principal(s)")
                   : std::string("no tokens (every caller is trusted)"));
  if (file_store != nullptr) {
    spdlog::info(
        "recovered {} tensor(s) and {} worker(s) ({} log records{})",
        coordinator.recovered().tensors, coordinator.recovered().workers,
        file_store->records_recovered(),
        file_store->damaged_records_dropped() > 0
            ? absl::StrCat("; --recover_truncate_log_at dropped ",
                           file_store->torn_bytes_dropped(), " bytes holding ",
                           file_store->damaged_records_dropped(),
                           " valid record(s) after a damaged one")
        : file_store->torn_bytes_dropped() > 0
            ? absl::StrCat("; dropped a torn tail of ",
                           file_store->torn_bytes_dropped(), " bytes")
            : std::string());
  }
  if (etcd) {
    spdlog::info("cluster {} (recovered {} tensor(s) and {} worker(s))",
                 coordinator.cluster_id(), coordinator.recovered().tensors,
                 coordinator.recovered().workers);
  } else if (file_store == nullptr || file_store->cluster_id_created()) {
    spdlog::warn(
        "NEW CLUSTER {}: {}. Workers that served another cluster keep its "
        "shards quarantined (never freed on this coordinator's word) until "
        "that cluster's coordinator is back; if you meant to continue an "
        "existing cluster, stop now and give its --data_dir",
        coordinator.cluster_id(),
        file_store == nullptr
            ? std::string("no --data_dir, so metadata and cluster live only "
                          "as long as this process")
        : coordinator.recovered().tensors + coordinator.recovered().workers == 0
            ? absl::StrCat("--data_dir=", o.data_dir,
                           " held no cluster, so a new, empty one "
                           "starts there")
            : absl::StrCat("the metadata in --data_dir=", o.data_dir,
                           " had no cluster id; this is its id now"));
  } else {
    spdlog::info("cluster {}", coordinator.cluster_id());
  }
}

}  // namespace

// Everything the daemon runs, declared in the order it is built, so that it
// is torn down the other way round.
class CoordinatorDaemon::Parts {
 public:
  MetricsRegistry metrics;
  // tessera_coordinator_leader: 1 while this coordinator leads and serves.
  MetricValue* leader = nullptr;
  std::optional<TokenTable> tokens;
  std::unique_ptr<EtcdMetadataStore> etcd_store;  // until Serve takes it
  std::unique_ptr<Leadership> leadership;
  std::unique_ptr<ClusterAuthority> authority;
  std::unique_ptr<Coordinator> coordinator;
  // After the authority and the coordinator, which its callbacks (--tokens,
  // --quotas) change: its thread stops before they go.
  std::unique_ptr<CredentialWatch> watch;
  // After the coordinator, so it stops serving (and calling the
  // coordinator's collector) before the coordinator is destroyed.
  std::unique_ptr<MetricsHttpServer> metrics_server;
  std::unique_ptr<CoordinatorService> service;
  std::optional<RunningServer> server;
  std::unique_ptr<ListenerProbe> probe;

  void FollowTokens(const std::string& path);
  void FollowQuotas(const std::string& path);
  // The metadata store --data_dir or memory give (etcd's is made by Stand).
  std::unique_ptr<MetadataStore> LocalStore(
      const CoordinatorDaemonOptions& options, FileMetadataStore** file_store);
  void ListCoordinators(const std::string& listen);
};

void CoordinatorDaemon::Parts::FollowTokens(const std::string& path) {
  watch->WatchFile(path, [path, authority = authority.get()] {
    absl::StatusOr<TokenTable> table = TokenTable::Load(path);
    if (!table.ok()) {
      spdlog::error(
          "--tokens {} changed but cannot be used ({}); the previous "
          "principals stay in force",
          path, std::string(table.status().message()));
      return;
    }
    const size_t count = table->size();
    if (absl::Status s = authority->ReplaceTokens(*std::move(table)); !s.ok()) {
      spdlog::error("--tokens {}: {}", path, std::string(s.message()));
      return;
    }
    spdlog::info("--tokens {} changed: {} principal(s) now", path, count);
  });
}

void CoordinatorDaemon::Parts::FollowQuotas(const std::string& path) {
  watch->WatchFile(path, [path, coordinator = coordinator.get()] {
    absl::StatusOr<QuotaTable> table = QuotaTable::Load(path);
    if (!table.ok()) {
      spdlog::error(
          "--quotas {} changed but cannot be used ({}); the previous quotas "
          "stay in force",
          path, std::string(table.status().message()));
      return;
    }
    const size_t listed = table->Listed().size();
    const bool others = table->HasDefault();
    coordinator->SetQuotas(
        std::make_shared<const QuotaTable>(*std::move(table)));
    spdlog::info("--quotas {} changed: {} principal(s) listed{}", path, listed,
                 others ? ", and a quota for the others" : "");
  });
}

std::unique_ptr<MetadataStore> CoordinatorDaemon::Parts::LocalStore(
    const CoordinatorDaemonOptions& options, FileMetadataStore** file_store) {
  if (options.data_dir.empty()) return std::make_unique<MemoryMetadataStore>();
  RecoveryOptions recovery;
  recovery.truncate_log_at = options.recover_truncate_log_at;
  auto owned = std::make_unique<FileMetadataStore>(options.data_dir, FileOps(),
                                                   recovery);
  *file_store = owned.get();
  return owned;
}

void CoordinatorDaemon::Parts::ListCoordinators(const std::string& listen) {
  service->SetCoordinatorLister(
      [this, listen]() -> absl::StatusOr<std::vector<v1::CoordinatorInfo>> {
        std::vector<v1::CoordinatorInfo> out;
        if (leadership == nullptr) {
          v1::CoordinatorInfo& self = out.emplace_back();
          self.set_address(listen);
          self.set_role("leader");
          self.set_alive(true);
          return out;
        }
        TESSERA_ASSIGN_OR_RETURN(std::vector<EtcdLeadership::Member> members,
                                 leadership->Members());
        for (const EtcdLeadership::Member& m : members) {
          v1::CoordinatorInfo& c = out.emplace_back();
          c.set_address(m.address);
          c.set_role(m.leader ? "leader" : "standby");
          c.set_alive(true);
        }
        return out;
      });
}

CoordinatorDaemon::CoordinatorDaemon(CoordinatorDaemonOptions options)
    : options_(std::move(options)),
      parts_(std::make_unique<Parts>()),
      life_(options_.on_fatal) {}

CoordinatorDaemon::~CoordinatorDaemon() {
  if (!stopped_) Stop(absl::ZeroDuration());
}

absl::StatusOr<std::unique_ptr<CoordinatorDaemon>> CoordinatorDaemon::Start(
    CoordinatorDaemonOptions options) {
  TESSERA_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<CoordinatorDaemon> daemon(
      new CoordinatorDaemon(std::move(options)));
  Parts& p = *daemon->parts_;
  if (!daemon->options_.tokens.empty()) {
    absl::StatusOr<TokenTable> table =
        TokenTable::Load(daemon->options_.tokens);
    if (!table.ok()) {
      return absl::Status(table.status().code(),
                          absl::StrCat("--tokens: ", table.status().message()));
    }
    p.tokens = *std::move(table);
  }
  // The metrics port opens first: a standby is scraped too, and says that
  // it stands by.
  p.leader = p.metrics.Gauge(
      "tessera_coordinator_leader",
      "1 while this coordinator leads and serves; 0 while it stands by");
  AddProcessMetrics(&p.metrics, "coordinator");
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> metrics =
      ServeMetricsIfAsked(daemon->options_.metrics_listen, &p.metrics);
  if (!metrics.ok()) return metrics.status();
  p.metrics_server = *std::move(metrics);
  absl::Status started =
      daemon->options_.metadata.empty() ? daemon->Serve() : daemon->Stand();
  if (!started.ok()) {
    daemon->Stop(absl::ZeroDuration());
    return started;
  }
  if (p.leadership != nullptr) {
    daemon->leader_ = std::thread([d = daemon.get()] { d->Lead(); });
  }
  return daemon;
}

// --metadata=etcd://...: reaches etcd and stands by until this coordinator
// leads.
absl::Status CoordinatorDaemon::Stand() {
  Parts& p = *parts_;
  const EtcdTarget target = *ParseEtcdUrl(options_.metadata);
  EtcdClientOptions etcd_options;
  etcd_options.credentials = options_.etcd_credentials;
  auto etcd =
      std::make_shared<EtcdClient>(target.endpoints, std::move(etcd_options));
  if (absl::Status up =
          etcd->FirstKey(target.prefix, PrefixEnd(target.prefix)).status();
      !up.ok()) {
    return absl::Status(up.code(), absl::StrCat("--metadata: etcd is "
                                                "unreachable: ",
                                                up.message()));
  }
  EtcdStoreOptions store_options;
  store_options.prefix = target.prefix;
  p.etcd_store = std::make_unique<EtcdMetadataStore>(etcd, store_options);
  LeadershipOptions leadership;
  leadership.listen = options_.listen;
  leadership.advertise =
      options_.advertise.empty() ? options_.listen : options_.advertise;
  leadership.lease = options_.leader_lease;
  leadership.server = options_.server;
  leadership.server.metrics = &p.metrics;
  leadership.server.credentials = options_.security.server_credentials;
  leadership.server.health_listen = options_.security.health_listen;
  TESSERA_ASSIGN_OR_RETURN(
      p.leadership, Leadership::Stand(etcd, target.prefix, p.etcd_store.get(),
                                      std::move(leadership)));
  absl::MutexLock lock(&mu_);
  address_ = p.leadership->serve_at();
  return absl::OkStatus();
}

void CoordinatorDaemon::Lead() {
  Parts& p = *parts_;
  const absl::Status campaign = p.leadership->Campaign(stop_, [this] {
    // The fence already refuses this coordinator's writes, and the serving
    // gate its reads; a new process stands by again.
    spdlog::critical(
        "lost the leader's etcd lease: exiting so that another coordinator "
        "leads");
    Fail(absl::UnavailableError("lost the leader's etcd lease"));
  });
  if (absl::IsCancelled(campaign)) {
    spdlog::info("{}", std::string(campaign.message()));
    return;
  }
  if (!campaign.ok()) return Fail(campaign);
  if (absl::Status served = Serve(); !served.ok()) Fail(served);
}

absl::Status CoordinatorDaemon::Serve() {
  Parts& p = *parts_;
  const CoordinatorDaemonOptions& o = options_;
  // The directory is private (0700, files 0600) before the secret goes in.
  if (!o.data_dir.empty()) {
    if (absl::Status status = PrepareDataDir(o.data_dir); !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("--data_dir: ", status.message()));
    }
  }
  EtcdMetadataStore* etcd_store = p.etcd_store.get();
  absl::StatusOr<std::string> cluster_secret =
      etcd_store != nullptr ? etcd_store->LoadOrMakeSecret(32)
                            : LoadOrMakeClusterSecret(o.data_dir);
  // A new leader on a busy etcd: a timeout is tried again (the lease, kept
  // alive meanwhile, says whether it still leads).
  for (int tries = 1; etcd_store != nullptr && tries < 5 &&
                      (absl::IsUnavailable(cluster_secret.status()) ||
                       absl::IsDeadlineExceeded(cluster_secret.status()));
       ++tries) {
    absl::SleepFor(absl::Milliseconds(200));
    cluster_secret = etcd_store->LoadOrMakeSecret(32);
  }
  if (!cluster_secret.ok()) return cluster_secret.status();
  const bool authorization = p.tokens.has_value();
  const size_t principals = authorization ? p.tokens->size() : 0;
  p.authority = std::make_unique<ClusterAuthority>(std::move(p.tokens),
                                                   *std::move(cluster_secret));
  // Principals follow --tokens on disk; certificates are reported as they
  // change and before they expire.
  p.watch = MakeCredentialWatch(o.security);
  if (authorization) p.FollowTokens(o.tokens);
  p.watch->AddMetrics(&p.metrics);
  p.watch->Start();
  FileMetadataStore* file_store = nullptr;
  std::unique_ptr<MetadataStore> store =
      etcd_store != nullptr
          ? std::unique_ptr<MetadataStore>(std::move(p.etcd_store))
          : p.LocalStore(o, &file_store);
  const std::string store_description = store->Describe();
  ChannelOptions worker_channels;
  worker_channels.credentials = o.security.channel_credentials;
  auto control = std::make_unique<GrpcWorkerControl>(
      GrpcWorkerControl::Options(), p.authority.get(),
      std::move(worker_channels));
  CoordinatorOptions coordinator_options = o.coordinator;
  coordinator_options.metrics = &p.metrics;
  p.coordinator = std::make_unique<Coordinator>(
      coordinator_options, std::move(control), std::move(store));
  if (absl::Status status = p.coordinator->Recover(); !status.ok()) {
    return absl::Status(
        status.code(), absl::StrCat("cannot recover metadata from ",
                                    store_description, ": ", status.message()));
  }
  if (p.leadership != nullptr) {
    const EtcdMetadataStore::FollowStats before =
        p.leadership->followed_before();
    const EtcdMetadataStore::FollowStats after = etcd_store->follow_stats();
    spdlog::info(
        "took over the metadata: read {} snapshot(s) and {} log entries at "
        "promotion, after {} and {} while standing by",
        after.snapshots_read - before.snapshots_read,
        after.entries_read - before.entries_read, before.snapshots_read,
        before.entries_read);
  }
  // Quotas apply from the first call served; the file is followed on disk.
  p.coordinator->SetQuotas(o.quotas);
  if (!o.quotas_file.empty()) p.FollowQuotas(o.quotas_file);
  p.service = std::make_unique<CoordinatorService>(p.coordinator.get(),
                                                   p.authority.get());
  // A leader paused past its lease (SIGSTOP, a VM stall) may be deposed
  // already: it answers nothing from its state until renewed.
  if (p.leadership != nullptr) {
    p.service->SetServingGate(
        [leadership = p.leadership.get()] { return leadership->CheckLease(); });
  }
  p.ListCoordinators(o.listen);
  // The standby's port is handed to the leader's server.
  std::string serve_at = o.listen;
  if (p.leadership != nullptr) {
    serve_at = p.leadership->serve_at();
    p.leadership->ReleasePort();
  }
  ServerOptions server_options = o.server;
  server_options.metrics = &p.metrics;
  server_options.credentials = o.security.server_credentials;
  server_options.health_listen = o.security.health_listen;
  TESSERA_ASSIGN_OR_RETURN(
      RunningServer server,
      StartServer(serve_at, {p.service.get()}, server_options));
  p.server.emplace(std::move(server));
  AddListenerMetrics(&p.metrics, *p.server);
  serve_at = WithPort(serve_at, p.server->port);
  spdlog::info("tessera-coordinator serving on {}", serve_at);
  if (p.server->health_port > 0) {
    spdlog::info("health (plaintext, grpc.health.v1 only) on {}",
                 WithPort(o.security.health_listen, p.server->health_port));
  }
  LogServing(*p.coordinator, store_description, file_store,
             p.leadership != nullptr, o, authorization, principals);
  // Recovered and serving: health says so, and standbys name this one.
  p.server->SetServing(true);
  if (p.leadership != nullptr) {
    if (absl::Status published = p.leadership->Publish(); !published.ok()) {
      return absl::Status(
          published.code(),
          absl::StrCat("cannot publish this coordinator as the leader: ",
                       published.message()));
    }
  }
  p.probe = StartListenerProbe(
      serve_at, &*p.server, o.security.self_probe_credentials, [this] {
        Fail(absl::UnavailableError("the gRPC port accepts nothing"));
      });
  {
    absl::MutexLock lock(&mu_);
    address_ = serve_at;
  }
  p.leader->Set(1);
  life_.MarkServing();
  return absl::OkStatus();
}

void CoordinatorDaemon::Fail(const absl::Status& status) {
  spdlog::error("{}", std::string(status.message()));
  life_.Fail(status);
}

std::string CoordinatorDaemon::address() const {
  absl::MutexLock lock(&mu_);
  return address_;
}

bool CoordinatorDaemon::Stop(absl::Duration grace) {
  const bool failed = life_.RequestStop();
  stopped_ = true;
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (leader_.joinable()) leader_.join();
  Parts& p = *parts_;
  p.probe.reset();
  if (p.server.has_value() && !p.server->Stop(grace)) {
    // Handlers still run on what the parts hold: never destroyed.
    (void)parts_.release();
    return false;
  }
  if (p.leader != nullptr) p.leader->Set(0);
  // A standby takes over at once.
  if (!failed && p.server.has_value() && p.leadership != nullptr) {
    p.leadership->StepDown();
  }
  return true;
}

}  // namespace tessera
