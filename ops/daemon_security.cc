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
  security.health_listen = absl::GetFlag(FLAGS_health_listen);
  TESSERA_RETURN_IF_ERROR(CheckProtectedMode(listen, security.tls || tokens,
                                             absl::GetFlag(FLAGS_insecure)));
  if (!security.tls) return security;
  TESSERA_ASSIGN_OR_RETURN(TlsMaterial tls, LoadTls(files, /*need_cert=*/true));
  security.server_credentials = ServerCredentialsFor(tls, policy);
  security.channel_credentials = ChannelCredentialsFor(tls);
  return security;
}

}  // namespace tessera
