// tessera-coordinator: worker membership and the global metadata of every
// sharded tensor.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "coordinator/cluster_authority.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/etcd_leadership.h"
#include "coordinator/etcd_metadata_store.h"
#include "coordinator/file_metadata_store.h"
#include "coordinator/grpc_worker_control.h"
#include "core/status_macros.h"
#include "ops/daemon_help.h"
#include "ops/daemon_listener.h"
#include "ops/daemon_security.h"
#include "ops/logging.h"
#include "ops/metrics_http.h"
#include "ops/process_metrics.h"
#include "ops/version.h"
#include "rpc/security.h"
#include "rpc/server.h"
#include "rpc/signals.h"
#include "rpc/standby_service.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "address to serve on, HOST:PORT (port 0 picks one)");
ABSL_FLAG(std::string, data_dir, "",
          "directory for durable metadata; empty = in memory only");
ABSL_FLAG(std::string, metadata, "",
          "etcd://H1:P1[,H2:P2...]/PREFIX: keep the metadata in etcd, shared "
          "by several coordinators of which one leads (an etcd lease) and "
          "the others stand by; instead of --data_dir");
ABSL_FLAG(std::string, advertise, "",
          "with --metadata: HOST:PORT where clients and workers reach this "
          "coordinator (default: --listen, with its port)");
ABSL_FLAG(std::string, etcd_ca, "",
          "with --metadata: CA certificate (PEM) etcd's certificates chain to; "
          "set, the coordinator speaks TLS to etcd");
ABSL_FLAG(std::string, etcd_cert, "",
          "with --metadata and --etcd_ca: client certificate (PEM) for etcd's "
          "client-certificate auth (--client-cert-auth)");
ABSL_FLAG(std::string, etcd_key, "", "the private key of --etcd_cert");
ABSL_FLAG(absl::Duration, leader_lease, absl::Seconds(2),
          "with --metadata: the leader's etcd lease; a standby takes over "
          "this long after the leader dies");
ABSL_FLAG(int64_t, lease_ms, 5000,
          "a worker silent for this long is marked dead");
ABSL_FLAG(int64_t, heartbeat_ms, 1000, "how often workers heartbeat");
ABSL_FLAG(int64_t, snapshot_every, 1000,
          "write a metadata snapshot after this many log records");
ABSL_FLAG(int64_t, recover_truncate_log_at, -1,
          "only when the coordinator refused to start because the metadata "
          "log in --data_dir is damaged at this byte offset (it names it): "
          "keep a copy of the log as log.damaged-OFFSET, then drop the "
          "damaged record and every record after it and start");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://HOST:PORT/metrics (plaintext, "
          "no authentication); :PORT or PORT alone serves on 127.0.0.1; "
          "empty = off");
ABSL_FLAG(std::string, log_format, "text", "log lines as text or json");
ABSL_FLAG(bool, version, false, "print the version and exit");
ABSL_FLAG(std::string, tokens, "",
          "file of principals, one `NAME ROLE SECRET` per line (mode 0600); "
          "turns authorization on");
// Limits (README "Limits"); the defaults are CoordinatorOptions' own.
ABSL_FLAG(int64_t, max_workers,
          static_cast<int64_t>(tessera::CoordinatorOptions().max_workers),
          "most workers known at once, dead ones included");
ABSL_FLAG(int64_t, max_shards_per_tensor,
          tessera::CoordinatorOptions().max_shards_per_tensor,
          "most shards one tensor version may have");
ABSL_FLAG(
    int64_t, max_tensor_metadata_bytes,
    tessera::CoordinatorOptions().max_tensor_metadata_bytes,
    "most coordinator memory the metadata of one tensor version may take");
ABSL_FLAG(absl::Duration, plan_budget,
          tessera::CoordinatorOptions().plan_budget,
          "longest the coordinator validates one layout or plans one reshard");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(2),
          "on SIGTERM, how long calls in flight may finish before the "
          "process exits regardless");
ABSL_FLAG(int64_t, retire_grace_ms, 5000,
          "how long a reader's lease on a tensor version lasts: a version "
          "replaced by a reshard or update is freed once its last reader "
          "is done (at once when nobody reads it), at most this long after");
ABSL_FLAG(absl::Duration, pending_timeout,
          tessera::CoordinatorOptions().pending_timeout,
          "a put or update whose client never commits or abandons it (it "
          "died) is given up this long after it began: its name, bytes and "
          "the tensor's change lock are freed (ls --all lists it meanwhile)");
ABSL_FLAG(absl::Duration, pending_lease,
          tessera::CoordinatorOptions().pending_lease,
          "a put or update whose client stops keeping it (the SDK does, "
          "every third of this, while it writes) is given up this long "
          "after the client's last sign: a dead client's change ends within "
          "seconds (--pending_timeout bounds every change)");

ABSL_FLAG(int64_t, repair_bytes_per_second, 0,
          "the most bytes per second that repairs copy from surviving "
          "replicas to new ones, on average (0: no limit)");
ABSL_FLAG(std::string, replica_forward, "fanout",
          "how a commit copies a written shard from its first replica to the "
          "others: fanout (all pull from the first at once) or chain (each "
          "from the one before it, R-1 rounds; no worker sends more than one "
          "copy)");
ABSL_FLAG(bool, repair, true,
          "copy the shards of dead and draining workers from surviving "
          "replicas to other workers until each has its R replicas again "
          "(false: only count them, tessera_under_replicated_shards)");

namespace tessera {
namespace {

// How often a standby reads what the leader wrote since.
constexpr absl::Duration kFollowEvery = absl::Milliseconds(200);

int Run() {
  if (absl::GetFlag(FLAGS_version)) {
    PrintVersion("tessera-coordinator");
    return 0;
  }
  if (absl::Status s = ConfigureLogging(absl::GetFlag(FLAGS_log_format),
                                        "tessera-coordinator");
      !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  if (absl::GetFlag(FLAGS_lease_ms) <= 0 ||
      absl::GetFlag(FLAGS_heartbeat_ms) <= 0 ||
      absl::GetFlag(FLAGS_snapshot_every) <= 0) {
    spdlog::error(
        "--lease_ms, --heartbeat_ms and --snapshot_every must be > 0");
    return 2;
  }
  CoordinatorOptions options;
  options.lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  options.heartbeat_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  options.snapshot_every = absl::GetFlag(FLAGS_snapshot_every);
  options.retire_grace = absl::Milliseconds(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_retire_grace_ms)));
  options.pending_timeout = absl::GetFlag(FLAGS_pending_timeout);
  if (options.pending_timeout <= absl::ZeroDuration()) {
    spdlog::error("--pending_timeout must be > 0");
    return 2;
  }
  options.pending_lease = absl::GetFlag(FLAGS_pending_lease);
  if (options.pending_lease < absl::Milliseconds(300)) {
    spdlog::error("--pending_lease must be at least 300ms");
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_workers) <= 0 ||
      absl::GetFlag(FLAGS_max_shards_per_tensor) <= 0 ||
      absl::GetFlag(FLAGS_max_tensor_metadata_bytes) <= 0 ||
      absl::GetFlag(FLAGS_plan_budget) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_shutdown_grace) < absl::ZeroDuration()) {
    spdlog::error(
        "--max_workers, --max_shards_per_tensor, --max_tensor_metadata_bytes "
        "and --plan_budget must be > 0, --shutdown_grace >= 0");
    return 2;
  }
  options.max_workers = static_cast<size_t>(absl::GetFlag(FLAGS_max_workers));
  options.max_shards_per_tensor = absl::GetFlag(FLAGS_max_shards_per_tensor);
  options.max_tensor_metadata_bytes =
      absl::GetFlag(FLAGS_max_tensor_metadata_bytes);
  options.plan_budget = absl::GetFlag(FLAGS_plan_budget);
  if (absl::GetFlag(FLAGS_repair_bytes_per_second) < 0) {
    spdlog::error("--repair_bytes_per_second must be >= 0");
    return 2;
  }
  options.repair_bytes_per_second =
      absl::GetFlag(FLAGS_repair_bytes_per_second);
  options.repair = absl::GetFlag(FLAGS_repair);
  const std::string forward = absl::GetFlag(FLAGS_replica_forward);
  if (forward != "fanout" && forward != "chain") {
    spdlog::error("--replica_forward={}: expected fanout or chain", forward);
    return 2;
  }
  options.replica_forward =
      forward == "chain" ? ReplicaForward::kChain : ReplicaForward::kFanOut;
  MetricsRegistry metrics;
  options.metrics = &metrics;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  const std::string tokens_path = absl::GetFlag(FLAGS_tokens);
  std::optional<TokenTable> tokens;
  if (!tokens_path.empty()) {
    absl::StatusOr<TokenTable> table = TokenTable::Load(tokens_path);
    if (!table.ok()) {
      spdlog::error("--tokens: {}", std::string(table.status().message()));
      return 1;
    }
    tokens = *std::move(table);
  }
  absl::StatusOr<DaemonSecurity> security =
      DaemonSecurityFromFlags(listen, tokens.has_value());
  if (!security.ok()) {
    spdlog::error("{}", std::string(security.status().message()));
    return 1;
  }
  ServerOptions server_options;
  server_options.metrics = &metrics;
  server_options.credentials = security->server_credentials;
  server_options.health_listen = security->health_listen;
  if (absl::Status s = ConfigureListenerLimits(&server_options); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  // A termination signal stops a standby's wait as well as the server.
  std::atomic<int> signal_seen{0};
  absl::Notification terminating;
  std::thread signal_waiter([&] {
    signal_seen = WaitForTerminationSignal();
    terminating.Notify();
  });
  auto join_waiter = absl::MakeCleanup([&] {
    if (!terminating.HasBeenNotified()) kill(getpid(), SIGTERM);
    signal_waiter.join();
  });
  // --metadata=etcd://...: stand by until this coordinator leads.
  std::unique_ptr<EtcdMetadataStore> etcd_store;
  std::unique_ptr<EtcdLeadership> leadership;
  std::unique_ptr<StandbyService> standby;
  std::unique_ptr<RunningServer> standby_server;
  std::string serve_at = listen;
  std::string advertised;  // with --metadata
  EtcdMetadataStore* followed = nullptr;
  EtcdMetadataStore::FollowStats followed_before;
  absl::Notification leading;
  std::thread follower;
  auto stop_following = [&] {
    if (!leading.HasBeenNotified()) leading.Notify();
    if (follower.joinable()) follower.join();
  };
  auto stop_following_at_exit = absl::MakeCleanup(stop_following);
  if (const std::string metadata = absl::GetFlag(FLAGS_metadata);
      !metadata.empty()) {
    if (!data_dir.empty()) {
      spdlog::error(
          "--metadata and --data_dir name two places for the metadata: give "
          "one");
      return 2;
    }
    absl::StatusOr<EtcdTarget> target = ParseEtcdUrl(metadata);
    if (!target.ok()) {
      spdlog::error("{}", std::string(target.status().message()));
      return 2;
    }
    std::string advertise = absl::GetFlag(FLAGS_advertise);
    if (advertise.empty()) advertise = listen;
    advertised = advertise;
    // Clients and workers reach a standby at this address once it leads:
    // it must name a port (--listen's 0 is picked only when serving).
    if (!IsHostPort(advertise)) {
      spdlog::error(
          "--advertise '{}' is not HOST:PORT (with --metadata, give "
          "--advertise or a --listen port other than 0)",
          advertise);
      return 2;
    }
    // etcd leases are whole seconds; renewing every third of one must not
    // spin.
    const absl::Duration leader_lease = absl::GetFlag(FLAGS_leader_lease);
    if (leader_lease < absl::Seconds(1) || leader_lease > absl::Hours(1)) {
      spdlog::error("--leader_lease={} must be 1s to 1h",
                    absl::FormatDuration(leader_lease));
      return 2;
    }
    EtcdClientOptions etcd_options;
    const TlsFiles etcd_tls{absl::GetFlag(FLAGS_etcd_ca),
                            absl::GetFlag(FLAGS_etcd_cert),
                            absl::GetFlag(FLAGS_etcd_key)};
    if (!etcd_tls.ca.empty()) {
      absl::StatusOr<TlsMaterial> tls = LoadTls(etcd_tls, /*need_cert=*/false);
      if (!tls.ok()) {
        spdlog::error("--etcd_ca/--etcd_cert/--etcd_key: {}",
                      std::string(tls.status().message()));
        return 2;
      }
      etcd_options.credentials = ChannelCredentialsFor(*tls);
    } else if (etcd_tls.enabled()) {
      spdlog::error("--etcd_cert and --etcd_key need --etcd_ca");
      return 2;
    }
    auto etcd = std::make_shared<EtcdClient>(target->endpoints,
                                             std::move(etcd_options));
    if (absl::Status up =
            etcd->FirstKey(target->prefix, PrefixEnd(target->prefix)).status();
        !up.ok()) {
      spdlog::error("--metadata: etcd is unreachable: {}",
                    std::string(up.message()));
      return 1;
    }
    EtcdStoreOptions store_options;
    store_options.prefix = target->prefix;
    etcd_store = std::make_unique<EtcdMetadataStore>(etcd, store_options);
    // Before any key is written (the election's, the secret): a prefix of
    // another cluster, or inside one, is refused untouched.
    if (absl::Status prefix = etcd_store->CheckPrefix(); !prefix.ok()) {
      spdlog::error("--metadata: {}", std::string(prefix.message()));
      return 1;
    }
    leadership = std::make_unique<EtcdLeadership>(etcd, target->prefix,
                                                  advertise, leader_lease);
    // Standing by, this coordinator answers on its port, naming the leader
    // (no call runs), and follows the metadata so that it takes over
    // without reading it all.
    standby = std::make_unique<StandbyService>(advertise);
    ServerOptions standby_options = server_options;
    standby_options.fallback = standby.get();
    absl::StatusOr<RunningServer> standing =
        StartServer(listen, {}, standby_options);
    if (!standing.ok()) {
      spdlog::error("{}", std::string(standing.status().message()));
      return 1;
    }
    standby_server = std::make_unique<RunningServer>(*std::move(standing));
    serve_at = WithPort(listen, standby_server->port);
    spdlog::info("standing for leader of etcd prefix {} as {} (standby on {})",
                 target->prefix, advertise, serve_at);
    follower = std::thread([&, store = etcd_store.get()] {
      std::string said;
      do {
        const absl::Status followed = store->Follow();
        if (!followed.ok() && followed.ToString() != said) {
          spdlog::warn("standing by: cannot follow the metadata yet: {}",
                       std::string(followed.message()));
        }
        said = followed.ok() ? std::string() : followed.ToString();
      } while (!leading.WaitForNotificationWithTimeout(kFollowEvery));
    });
    absl::StatusOr<int64_t> fence = leadership->Campaign(
        terminating,
        [&](const std::string& leader) {
          standby->SetLeader(leader);
          if (leader.empty()) {
            spdlog::info("standing by: no coordinator serves as leader yet");
          } else {
            spdlog::info("standing by: the leader is {}", leader);
          }
        },
        [] {
          // The fence already refuses this coordinator's writes; a new
          // process stands by again.
          spdlog::critical(
              "lost the leader's etcd lease: exiting so that another "
              "coordinator leads");
          spdlog::default_logger()->flush();
          std::_Exit(1);
        });
    stop_following();
    if (!fence.ok()) {
      spdlog::info("{}", std::string(fence.status().message()));
      return absl::IsCancelled(fence.status()) ? 0 : 1;
    }
    spdlog::info("leading etcd prefix {} (fence revision {})", target->prefix,
                 *fence);
    etcd_store->SetFence(leadership->key(), *fence);
    followed_before = etcd_store->follow_stats();
  }
  // The directory is private (0700, files 0600) before the secret goes in.
  if (!data_dir.empty()) {
    if (absl::Status status = PrepareDataDir(data_dir); !status.ok()) {
      spdlog::error("--data_dir: {}", std::string(status.message()));
      return 1;
    }
  }
  absl::StatusOr<std::string> cluster_secret =
      etcd_store != nullptr ? etcd_store->LoadOrMakeSecret(32)
                            : LoadOrMakeClusterSecret(data_dir);
  // A new leader on a busy etcd: a timeout is tried again (the lease, kept
  // alive meanwhile, says whether it still leads).
  for (int tries = 1; etcd_store != nullptr && tries < 5 &&
                      (absl::IsUnavailable(cluster_secret.status()) ||
                       absl::IsDeadlineExceeded(cluster_secret.status()));
       ++tries) {
    absl::SleepFor(absl::Milliseconds(200));
    cluster_secret = etcd_store->LoadOrMakeSecret(32);
  }
  if (!cluster_secret.ok()) {
    spdlog::error("{}", std::string(cluster_secret.status().message()));
    return 1;
  }
  const bool authorization = tokens.has_value();
  const size_t principals = authorization ? tokens->size() : 0;
  ClusterAuthority authority(std::move(tokens), *std::move(cluster_secret));
  // Principals follow --tokens on disk; certificates are reported as they
  // change and before they expire.
  std::unique_ptr<CredentialWatch> watch = MakeCredentialWatch(*security);
  if (authorization) {
    watch->WatchFile(tokens_path, [tokens_path, &authority] {
      absl::StatusOr<TokenTable> table = TokenTable::Load(tokens_path);
      if (!table.ok()) {
        spdlog::error(
            "--tokens {} changed but cannot be used ({}); the previous "
            "principals stay in force",
            tokens_path, std::string(table.status().message()));
        return;
      }
      const size_t count = table->size();
      if (absl::Status s = authority.ReplaceTokens(*std::move(table));
          !s.ok()) {
        spdlog::error("--tokens {}: {}", tokens_path, std::string(s.message()));
        return;
      }
      spdlog::info("--tokens {} changed: {} principal(s) now", tokens_path,
                   count);
    });
  }
  watch->AddMetrics(&metrics);
  watch->Start();
  std::unique_ptr<MetadataStore> store;
  FileMetadataStore* file_store = nullptr;
  if (etcd_store != nullptr) {
    followed = etcd_store.get();
    store = std::move(etcd_store);
  } else if (data_dir.empty()) {
    store = std::make_unique<MemoryMetadataStore>();
  } else {
    RecoveryOptions recovery;
    recovery.truncate_log_at = absl::GetFlag(FLAGS_recover_truncate_log_at);
    auto owned =
        std::make_unique<FileMetadataStore>(data_dir, FileOps(), recovery);
    file_store = owned.get();
    store = std::move(owned);
  }
  const std::string store_description = store->Describe();
  ChannelOptions worker_channels;
  worker_channels.credentials = security->channel_credentials;
  auto control = std::make_unique<GrpcWorkerControl>(
      GrpcWorkerControl::Options(), &authority, std::move(worker_channels));
  Coordinator coordinator(options, std::move(control), std::move(store));
  // Declared after the coordinator, so it stops serving (and calling the
  // coordinator's collector) before the coordinator is destroyed.
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> metrics_server =
      ServeMetricsIfAsked(absl::GetFlag(FLAGS_metrics_listen), &metrics);
  if (!metrics_server.ok()) {
    spdlog::error("{}", std::string(metrics_server.status().message()));
    return 1;
  }
  if (absl::Status status = coordinator.Recover(); !status.ok()) {
    spdlog::error("cannot recover metadata from {}: {}", store_description,
                  std::string(status.message()));
    return 1;
  }
  if (followed != nullptr) {
    const EtcdMetadataStore::FollowStats after = followed->follow_stats();
    spdlog::info(
        "took over the metadata: read {} snapshot(s) and {} log entries at "
        "promotion, after {} and {} while standing by",
        after.snapshots_read - followed_before.snapshots_read,
        after.entries_read - followed_before.entries_read,
        followed_before.snapshots_read, followed_before.entries_read);
  }
  CoordinatorService service(&coordinator, &authority);
  // A leader paused past its lease (SIGSTOP, a VM stall) may be deposed
  // already: it answers nothing from its state until renewed.
  if (leadership != nullptr) {
    service.SetServingGate([&] { return leadership->CheckLease(); });
  }
  service.SetCoordinatorLister(
      [&]() -> absl::StatusOr<std::vector<v1::CoordinatorInfo>> {
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
  // The standby's port is handed to the leader's server.
  if (standby_server != nullptr) {
    standby_server->Stop(absl::ZeroDuration());
    standby_server.reset();
  }
  absl::StatusOr<RunningServer> server =
      StartServer(serve_at, {&service}, server_options);
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return 1;
  }
  AddListenerMetrics(&metrics, *server);
  AddProcessMetrics(&metrics, "coordinator");
  spdlog::info("tessera-coordinator serving on {}",
               WithPort(serve_at, server->port));
  if (server->health_port > 0) {
    spdlog::info("health (plaintext, grpc.health.v1 only) on {}",
                 WithPort(security->health_listen, server->health_port));
  }
  spdlog::info("metadata: {}", store_description);
  spdlog::info("security: {}, {}", security->tls ? "mutual TLS" : "plaintext",
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
  if (leadership != nullptr) {
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
            ? absl::StrCat("--data_dir=", data_dir,
                           " held no cluster, so a new, empty one "
                           "starts there")
            : absl::StrCat("the metadata in --data_dir=", data_dir,
                           " had no cluster id; this is its id now"));
  } else {
    spdlog::info("cluster {}", coordinator.cluster_id());
  }
  // Recovered and serving: health says so, and standbys name this one.
  server->SetServing(true);
  if (leadership != nullptr) {
    if (absl::Status published = leadership->Publish(); !published.ok()) {
      spdlog::critical("cannot publish this coordinator as the leader: {}",
                       std::string(published.message()));
      spdlog::default_logger()->flush();
      std::_Exit(1);
    }
    spdlog::info("serving as the leader; standbys now send callers to {}",
                 advertised);
  }
  std::atomic<bool> listener_dead{false};
  std::unique_ptr<ListenerProbe> probe = StartListenerProbe(
      serve_at, &*server, security->self_probe_credentials, [&] {
        listener_dead = true;
        kill(getpid(), SIGTERM);  // wakes the signal wait below
      });
  terminating.WaitForNotification();
  const int sig = signal_seen;
  probe.reset();
  if (listener_dead) {
    // Every acknowledged change is durable already.
    if (!server->Stop(absl::ZeroDuration())) std::_Exit(1);
    return 1;
  }
  spdlog::info("signal {} received; shutting down", sig);
  if (!server->Stop(absl::GetFlag(FLAGS_shutdown_grace))) {
    // A handler ignores its cancellation: the grace bounds the exit, and
    // what the handlers use must not be destroyed under them. Every
    // acknowledged change is durable already.
    spdlog::warn("calls still running after the shutdown grace; exiting");
    spdlog::default_logger()->flush();
    std::_Exit(0);
  }
  // A standby takes over at once.
  if (leadership != nullptr) leadership->Resign();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::BlockTerminationSignals();
  // Blocks of 1 MiB and up (the shard lists of big tensors, their replies)
  // get their own mappings, returned to the system when freed. By default
  // glibc raises this threshold after the first such free, and later big
  // blocks then stay resident in its arenas.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  absl::SetProgramUsageMessage(
      "tessera-coordinator --listen=HOST:PORT [--data_dir=DIR]");
  if (tessera::PrintDaemonHelp(argc, argv,
                               std::string(absl::ProgramUsageMessage()),
                               "coordinator/main.cc")) {
    return 0;
  }
  absl::ParseCommandLine(argc, argv);
  return tessera::Run();
}
