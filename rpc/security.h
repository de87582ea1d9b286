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

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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

// A daemon's credentials that follow its TLS files on disk: gRPC's
// FileWatcherCertificateProvider reads --tls_ca, --tls_cert and --tls_key
// again every `refresh`, and each new connection, served or dialled, uses
// what it read last (connections already open keep theirs). A renewed
// certificate written over the old file (a Kubernetes Secret's update)
// thus takes effect without a restart. Check `files` with LoadTls first:
// the provider reports nothing itself, and a pair that is unreadable or
// does not match fails the handshakes made while it lasts.
struct WatchedTls {
  std::shared_ptr<grpc::ServerCredentials> server;
  std::shared_ptr<grpc::ChannelCredentials> channel;
  // For a daemon's probe of its own port (rpc/listener_probe.h): the
  // chain is checked against the CA, the host name is not (the daemon
  // dials loopback, which its certificate need not name).
  std::shared_ptr<grpc::ChannelCredentials> self_probe;
};
WatchedTls WatchTlsFiles(const TlsFiles& files, ClientCertPolicy policy,
                         absl::Duration refresh);

// What a PEM certificate file says of itself.
struct CertificateInfo {
  std::string subject;  // e.g. "CN=w0"
  absl::Time not_before;
  absl::Time not_after;
};
// Reads the first certificate of `path`; UNAUTHENTICATED when unreadable
// or not PEM (as LoadTls). Does not judge its dates.
absl::StatusOr<CertificateInfo> ReadCertificateInfo(const std::string& path);

// Protected mode: without TLS and without tokens, a daemon may listen only
// on loopback; elsewhere it refuses to start (the message says `insecure`)
// unless `insecure` (--insecure) is set.
absl::Status CheckProtectedMode(absl::string_view listen, bool secured,
                                bool insecure);
bool IsLoopbackHost(absl::string_view host);

// A secret presented as `authorization: Bearer`, replaceable while
// channels use it (a worker's --token_file rewritten on disk). Thread-safe.
class BearerSecret {
 public:
  explicit BearerSecret(std::string token) { Set(std::move(token)); }
  void Set(std::string token) ABSL_LOCKS_EXCLUDED(mu_);
  // The token now.
  std::string token() const ABSL_LOCKS_EXCLUDED(mu_);
  // The header value now: "Bearer <token>".
  std::string Header() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::string header_ ABSL_GUARDED_BY(mu_);
};

// Client side: interceptors that present `token` (or the secret as it is
// at each call) as `authorization: Bearer` on every call of a channel (only
// the coordinator's: workers never see a user's secret).
std::function<ClientInterceptorFactories()> BearerTokenInterceptors(
    std::string token);
std::function<ClientInterceptorFactories()> BearerTokenInterceptors(
    std::shared_ptr<const BearerSecret> secret);

// Presents `capability` (when there is one) on a call to a worker.
void PresentCapability(grpc::ClientContext* context,
                       absl::string_view capability);

// Server side: what the caller presented (empty when nothing).
std::string BearerToken(const grpc::ServerContextBase& context);
// The subject CN of the client certificate the caller presented over mutual
// TLS, checked by the handshake ("" without one).
std::string PeerCommonName(const grpc::ServerContextBase& context);
std::string PresentedCapability(const grpc::ServerContextBase& context);

// A TLS handshake that failed (unknown CA, no or expired certificate) shows
// at the client as UNAVAILABLE with OpenSSL's words; this tells it apart
// from a peer that is down, so it can be reported as UNAUTHENTICATED.
bool IsTlsHandshakeFailure(absl::string_view grpc_message);

}  // namespace tessera

#endif  // TESSERA_RPC_SECURITY_H_
