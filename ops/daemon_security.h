// The TLS and protected-mode flags both daemons share (--tls_ca,
// --tls_cert, --tls_key, --tls_client_cert, --insecure; CLI.md
// "Security"), turned into the credentials of the daemon's server and of
// every channel it opens.
#ifndef TESSERA_OPS_DAEMON_SECURITY_H_
#define TESSERA_OPS_DAEMON_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rpc/channel.h"
#include "rpc/security.h"

namespace tessera {

struct DaemonSecurity {
  bool tls = false;
  // Null without TLS (plaintext).
  std::shared_ptr<grpc::ServerCredentials> server_credentials;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
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

}  // namespace tessera

#endif  // TESSERA_OPS_DAEMON_SECURITY_H_
