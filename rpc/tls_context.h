// OpenSSL contexts for tessera's own TLS connections (the workers' data
// ports and their readers), made from the same --tls_* material as gRPC's
// credentials and held to the same rules: mutual TLS with the cluster CA,
// the client's certificate required unless the server's policy is
// `optional`, the server's checked against the host dialled. Only TLS 1.3
// is spoken, AES-128-GCM first (what the bench's bare OpenSSL streams use),
// and kernel TLS is asked for (SSL_OP_ENABLE_KTLS): where the kernel has
// it, records are sealed in the kernel; elsewhere OpenSSL does it in user
// space.
//
// A source that follows the files re-reads them when asked for a context
// and `refresh` has passed: a renewed certificate takes effect for new
// connections without a restart (open ones keep theirs), as the gRPC
// ports' WatchTlsFiles does. Thread-safe.
#ifndef TESSERA_RPC_TLS_CONTEXT_H_
#define TESSERA_RPC_TLS_CONTEXT_H_

#include <openssl/ssl.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/security.h"

namespace tessera {

class TlsContextSource {
 public:
  enum class Side { kServer, kClient };

  // From material fixed for the source's life (a client's, read once).
  // A client may have no certificate (a server with `optional` lets it
  // in); a server must. INVALID_ARGUMENT when OpenSSL refuses the
  // material.
  static absl::StatusOr<std::shared_ptr<TlsContextSource>> Fixed(
      const TlsMaterial& material, Side side,
      ClientCertPolicy policy = ClientCertPolicy::kRequire);
  // Following `files` on disk (a daemon's): read now (an error stops
  // here), then again every `refresh` (zero: never). A later read that
  // fails (a half-written file, a key that no longer matches) keeps the
  // last good context (the daemon's CredentialWatch reports the files).
  static absl::StatusOr<std::shared_ptr<TlsContextSource>> Watch(
      const TlsFiles& files, Side side, ClientCertPolicy policy,
      absl::Duration refresh);

  // The context new connections use now.
  std::shared_ptr<SSL_CTX> Get() ABSL_LOCKS_EXCLUDED(mu_);
  Side side() const { return side_; }

 private:
  TlsContextSource(Side side, ClientCertPolicy policy, TlsFiles files,
                   absl::Duration refresh, std::shared_ptr<SSL_CTX> context,
                   TlsMaterial material);

  const Side side_;
  const ClientCertPolicy policy_;
  const TlsFiles files_;  // empty: fixed
  const absl::Duration refresh_;
  absl::Mutex mu_;
  std::shared_ptr<SSL_CTX> context_ ABSL_GUARDED_BY(mu_);
  TlsMaterial material_ ABSL_GUARDED_BY(mu_);  // what context_ was made of
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
};

// Loads a CA bundle, a certificate chain and its key (as LoadTls checked
// them) into `ctx`; any part may be empty. False if OpenSSL refuses one.
bool UseTlsMaterial(SSL_CTX* ctx, const TlsMaterial& tls);

// OpenSSL's queued errors as one line ("unknown error" when none), and
// the queue cleared.
std::string TakeOpenSslErrors();

}  // namespace tessera

#endif  // TESSERA_RPC_TLS_CONTEXT_H_
