// Transport security and caller identity for every tessera process: TLS
// credentials from the --tls_* files (mutual TLS with one cluster CA),
// protected mode (no TLS and no tokens: loopback only), the bearer token a
// client presents to the coordinator, and the capability it presents to a
// worker. The rules of who may do what live in core/auth.h and
// core/capability.h; this is how they travel over gRPC.
#ifndef TESSERA_RPC_SECURITY_H_
#define TESSERA_RPC_SECURITY_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rpc/channel.h"

namespace tessera {

// The --tls_ca / --tls_cert / --tls_key files. All empty: plaintext.
struct TlsFiles {
  std::string ca;
  std::string cert;
  std::string key;

  bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

// Whether a TLS server insists on a client certificate (--tls_client_cert).
enum class ClientCertPolicy { kRequire, kOptional };
absl::StatusOr<ClientCertPolicy> ParseClientCertPolicy(absl::string_view text);

// PEM contents checked up front (readable, parseable, key matches cert, not
// expired), so a daemon refuses to start, and the CLI fails, with a clear
// message instead of failed handshakes later. An expired or unreadable
// certificate is UNAUTHENTICATED.
struct TlsMaterial {
  std::string ca_pem;
  std::string cert_pem;  // empty: a client without a certificate
  std::string key_pem;
};
absl::StatusOr<TlsMaterial> LoadTls(const TlsFiles& files, bool need_cert);

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    const TlsMaterial& tls);
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(
    const TlsMaterial& tls, ClientCertPolicy policy);

// Protected mode: without TLS and without tokens, a daemon may listen only
// on loopback; elsewhere it refuses to start (the message says `insecure`)
// unless `insecure` (--insecure) is set.
absl::Status CheckProtectedMode(absl::string_view listen, bool secured,
                                bool insecure);
bool IsLoopbackHost(absl::string_view host);

// Client side: interceptors that present `token` as `authorization: Bearer`
// on every call of a channel (only the coordinator's: workers never see a
// user's secret).
std::function<ClientInterceptorFactories()> BearerTokenInterceptors(
    std::string token);

// Presents `capability` (when there is one) on a call to a worker.
void PresentCapability(grpc::ClientContext* context,
                       absl::string_view capability);

// Server side: what the caller presented (empty when nothing).
std::string BearerToken(const grpc::ServerContext& context);
std::string PresentedCapability(const grpc::ServerContext& context);

// A TLS handshake that failed (unknown CA, no or expired certificate) shows
// at the client as UNAVAILABLE with OpenSSL's words; this tells it apart
// from a peer that is down, so it can be reported as UNAUTHENTICATED.
bool IsTlsHandshakeFailure(absl::string_view grpc_message);

}  // namespace tessera

#endif  // TESSERA_RPC_SECURITY_H_
