#include "coordinator/coordinator_flags.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "core/status_macros.h"
#include "ops/daemon_listener.h"
#include "ops/daemon_main.h"
#include "rpc/security.h"

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
ABSL_FLAG(std::string, quotas, "",
          "file of quotas, one `PRINCIPAL BYTES [NAMES]` per line (BYTES "
          "with K, M, G, T or `unlimited`; `*`: every principal not "
          "listed), read again every --reload_interval");
ABSL_FLAG(std::string, tokens, "",
          "file of principals, one `NAME ROLE SECRET` per line (mode 0600); "
          "turns authorization on");
// Limits (README "Limits"); the defaults are CoordinatorOptions' own.
ABSL_FLAG(int64_t, max_workers,
          static_cast<int64_t>(tessera::CoordinatorOptions().max_workers),
          "most workers known at once, dead ones included");
ABSL_FLAG(int64_t, max_waiters, tessera::CoordinatorOptions().max_waiters,
          "most `tessera wait` calls held at once (1 to 1000000)");
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
ABSL_FLAG(std::string, replica_forward, "relay",
          "how a commit copies a written shard from its first replica to the "
          "others and its mirrors, and how repairs and joining mirrors fill "
          "several new copies: relay (a pipeline in chunks, each copy "
          "passing a chunk on while it receives the next), fanout (all pull "
          "from the first at once) or chain (each from the one before it, "
          "R-1 rounds)");
ABSL_FLAG(bool, repair, true,
          "copy the shards of dead and draining workers from surviving "
          "replicas to other workers until each has its R replicas again "
          "(false: only count them, tessera_under_replicated_shards)");

namespace tessera {

absl::StatusOr<CoordinatorDaemonOptions> CoordinatorDaemonOptionsFromFlags() {
  CoordinatorDaemonOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.metadata = absl::GetFlag(FLAGS_metadata);
  o.advertise = absl::GetFlag(FLAGS_advertise);
  o.leader_lease = absl::GetFlag(FLAGS_leader_lease);
  o.recover_truncate_log_at = absl::GetFlag(FLAGS_recover_truncate_log_at);
  o.metrics_listen = MetricsListenFlag();
  o.tokens = absl::GetFlag(FLAGS_tokens);
  o.quotas_file = absl::GetFlag(FLAGS_quotas);
  if (!o.quotas_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(
        QuotaTable quotas,
        FlagValue("--quotas", QuotaTable::Load(o.quotas_file)));
    o.quotas = std::make_shared<const QuotaTable>(std::move(quotas));
  }
  o.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  CoordinatorOptions& c = o.coordinator;
  // A zero or negative count becomes a zero duration, refused by Validate.
  c.lease =
      absl::Milliseconds(std::max<int64_t>(0, absl::GetFlag(FLAGS_lease_ms)));
  c.heartbeat_interval = absl::Milliseconds(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_heartbeat_ms)));
  c.snapshot_every = absl::GetFlag(FLAGS_snapshot_every);
  c.retire_grace = absl::Milliseconds(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_retire_grace_ms)));
  c.pending_timeout = absl::GetFlag(FLAGS_pending_timeout);
  c.pending_lease = absl::GetFlag(FLAGS_pending_lease);
  c.max_workers = static_cast<size_t>(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_max_workers)));
  const int64_t max_waiters = absl::GetFlag(FLAGS_max_waiters);
  if (max_waiters < 1 || max_waiters > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_waiters=", max_waiters, ": expected 1 to 1000000"));
  }
  c.max_waiters = static_cast<int>(max_waiters);
  c.max_shards_per_tensor = absl::GetFlag(FLAGS_max_shards_per_tensor);
  c.max_tensor_metadata_bytes = absl::GetFlag(FLAGS_max_tensor_metadata_bytes);
  c.plan_budget = absl::GetFlag(FLAGS_plan_budget);
  c.repair_bytes_per_second = absl::GetFlag(FLAGS_repair_bytes_per_second);
  c.repair = absl::GetFlag(FLAGS_repair);
  const std::string forward = absl::GetFlag(FLAGS_replica_forward);
  if (forward != "relay" && forward != "fanout" && forward != "chain") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replica_forward=", forward, ": expected relay, fanout or chain"));
  }
  c.replica_forward = forward == "chain"    ? ReplicaForward::kChain
                      : forward == "fanout" ? ReplicaForward::kFanOut
                                            : ReplicaForward::kRelay;
  TESSERA_RETURN_IF_ERROR(o.Validate());
  const TlsFiles etcd_tls{absl::GetFlag(FLAGS_etcd_ca),
                          absl::GetFlag(FLAGS_etcd_cert),
                          absl::GetFlag(FLAGS_etcd_key)};
  if (!o.metadata.empty() && !etcd_tls.ca.empty()) {
    TESSERA_ASSIGN_OR_RETURN(const TlsMaterial tls,
                             FlagValue("--etcd_ca/--etcd_cert/--etcd_key",
                                       LoadTls(etcd_tls, /*need_cert=*/false)));
    o.etcd_credentials = ChannelCredentialsFor(tls);
  } else if (!o.metadata.empty() && etcd_tls.enabled()) {
    return absl::InvalidArgumentError(
        "--etcd_cert and --etcd_key need --etcd_ca");
  }
  TESSERA_RETURN_IF_ERROR(ConfigureListenerLimits(&o.server));
  return o;
}

}  // namespace tessera
