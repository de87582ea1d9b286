// The TLS and protected-mode flags both daemons share (--tls_ca,
// --tls_cert, --tls_key, --tls_client_cert, --insecure, --reload_interval;
// CLI.md "Security"), turned into the credentials of the daemon's server
// and of every channel it opens.
#ifndef TESSERA_OPS_DAEMON_SECURITY_H_
#define TESSERA_OPS_DAEMON_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ops/credential_watch.h"
#include "rpc/channel.h"
#include "rpc/security.h"
#include "rpc/tls_context.h"

namespace tessera {

struct DaemonSecurity {
  bool tls = false;
  // --insecure: plaintext ports may listen beyond loopback (protected mode
  // off), for the daemon's other plaintext ports to check as its gRPC one.
  bool insecure = false;
  TlsFiles files;
  // Null without TLS (plaintext). With --reload_interval > 0 they follow
  // the TLS files on disk (rpc/security.h WatchTlsFiles).
  std::shared_ptr<grpc::ServerCredentials> server_credentials;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  // The data port's TLS (a worker's, serving) and its readers' (a worker
  // pulling from peers); null without TLS. They follow the files as the
  // credentials above do.
  std::shared_ptr<TlsContextSource> data_server_tls;
  std::shared_ptr<TlsContextSource> data_client_tls;
  // For the daemon's probe of its own port (no host name check).
  std::shared_ptr<grpc::ChannelCredentials> self_probe_credentials;
  // --reload_interval: how often the TLS and token files are looked at
  // again (0: read once, at start).
  absl::Duration reload_interval;
  // --health_listen: a plaintext port serving grpc.health.v1 alone, for
  // probes that cannot speak mutual TLS (ServerOptions::health_listen).
  std::string health_listen;
};

// Reads the shared flags. `tokens`: the daemon authenticates with tokens
// (the coordinator's --tokens, a worker's --token_file). Fails, with a
// message for the operator, on unreadable or mismatched TLS files and in
// protected mode on a non-loopback `listen` (CLI.md: `insecure`).
absl::StatusOr<DaemonSecurity> DaemonSecurityFromFlags(
    const std::string& listen, bool tokens);

// A CredentialWatch for the daemon's files: its certificate (and key and
// CA) under TLS, reported as they change and before they expire; the
// caller adds its token file(s) before Start.
std::unique_ptr<CredentialWatch> MakeCredentialWatch(
    const DaemonSecurity& security);

}  // namespace tessera

#endif  // TESSERA_OPS_DAEMON_SECURITY_H_
