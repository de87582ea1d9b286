#include "ops/daemon_security.h"

#include "absl/flags/flag.h"
#include "core/status_macros.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the cluster CA; with --tls_cert and --tls_key every "
          "link is mutual TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate of this daemon");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_cert, "require",
          "require: callers must present a certificate signed by --tls_ca; "
          "optional: callers without one are let in (tokens then identify "
          "them)");
ABSL_FLAG(std::string, health_listen, "",
          "HOST:PORT of a plaintext port serving only grpc.health.v1, for "
          "probes that cannot present a client certificate (the kubelet's "
          "gRPC probe); empty = none");
ABSL_FLAG(absl::Duration, reload_interval, absl::Seconds(30),
          "how often the TLS files (--tls_ca, --tls_cert, --tls_key) and the "
          "token file (the coordinator's --tokens, a worker's --token_file) "
          "are looked at again: a changed file takes effect for new "
          "connections and calls without a restart. 0: read once, at start");
ABSL_FLAG(bool, insecure, false,
          "serve a non-loopback address without TLS or tokens (only on a "
          "network you trust)");

namespace tessera {

absl::StatusOr<DaemonSecurity> DaemonSecurityFromFlags(
    const std::string& listen, bool tokens) {
  TlsFiles files{absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert),
                 absl::GetFlag(FLAGS_tls_key)};
  TESSERA_ASSIGN_OR_RETURN(
      ClientCertPolicy policy,
      ParseClientCertPolicy(absl::GetFlag(FLAGS_tls_client_cert)));
  DaemonSecurity security;
  security.tls = files.enabled();
  security.files = files;
  security.reload_interval = absl::GetFlag(FLAGS_reload_interval);
  if (security.reload_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--reload_interval is negative");
  }
  security.health_listen = absl::GetFlag(FLAGS_health_listen);
  security.insecure = absl::GetFlag(FLAGS_insecure);
  TESSERA_RETURN_IF_ERROR(CheckProtectedMode(listen, security.tls || tokens,
                                             absl::GetFlag(FLAGS_insecure)));
  if (!security.tls) return security;
  // Checked once here, so that a bad file stops the start with a clear
  // message; later changes are reported by the CredentialWatch.
  TESSERA_ASSIGN_OR_RETURN(TlsMaterial tls, LoadTls(files, /*need_cert=*/true));
  if (security.reload_interval > absl::ZeroDuration()) {
    WatchedTls watched = WatchTlsFiles(files, policy, security.reload_interval);
    security.server_credentials = std::move(watched.server);
    security.channel_credentials = std::move(watched.channel);
    security.self_probe_credentials = std::move(watched.self_probe);
  } else {
    security.server_credentials = ServerCredentialsFor(tls, policy);
    security.channel_credentials = ChannelCredentialsFor(tls);
    security.self_probe_credentials = security.channel_credentials;
  }
  TESSERA_ASSIGN_OR_RETURN(
      security.data_server_tls,
      TlsContextSource::Watch(files, TlsContextSource::Side::kServer, policy,
                              security.reload_interval));
  TESSERA_ASSIGN_OR_RETURN(
      security.data_client_tls,
      TlsContextSource::Watch(files, TlsContextSource::Side::kClient, policy,
                              security.reload_interval));
  return security;
}

std::unique_ptr<CredentialWatch> MakeCredentialWatch(
    const DaemonSecurity& security) {
  CredentialWatchOptions options;
  options.interval = security.reload_interval;
  auto watch = std::make_unique<CredentialWatch>(options);
  if (security.tls) {
    watch->WatchCertificate(security.files.cert,
                            {security.files.key, security.files.ca}, nullptr);
  }
  return watch;
}

}  // namespace tessera
