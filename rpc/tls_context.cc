#include "rpc/tls_context.h"

#include <openssl/err.h>
#include <openssl/pem.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rpc/openssl_ptr.h"

namespace tessera {
namespace {

BioPtr PemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

bool SameMaterial(const TlsMaterial& a, const TlsMaterial& b) {
  return a.ca_pem == b.ca_pem && a.cert_pem == b.cert_pem &&
         a.key_pem == b.key_pem;
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> MakeContext(
    const TlsMaterial& material, TlsContextSource::Side side,
    ClientCertPolicy policy) {
  const bool server = side == TlsContextSource::Side::kServer;
  if (server && material.cert_pem.empty()) {
    return absl::InvalidArgumentError(
        "a TLS server needs a certificate and its key");
  }
  std::shared_ptr<SSL_CTX> ctx(
      SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()),
      SSL_CTX_free);
  if (ctx == nullptr) {
    return absl::InternalError(
        absl::StrCat("SSL_CTX_new: ", TakeOpenSslErrors()));
  }
  SSL_CTX* c = ctx.get();
  if (SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_ciphersuites(c,
                               "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                               "TLS_CHACHA20_POLY1305_SHA256") != 1) {
    return absl::InternalError(
        absl::StrCat("configuring TLS 1.3: ", TakeOpenSslErrors()));
  }
  if (!UseTlsMaterial(c, material)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OpenSSL refuses the TLS material: ", TakeOpenSslErrors()));
  }
#ifdef SSL_OP_ENABLE_KTLS
  SSL_CTX_set_options(c, SSL_OP_ENABLE_KTLS);
#endif
  // Records read from the socket many at a time, not a header and a body
  // per 16 KiB record.
  SSL_CTX_set_read_ahead(c, 1);
  SSL_CTX_set_default_read_buffer_len(c, 256 << 10);
  if (server) {
    SSL_CTX_set_verify(c,
                       policy == ClientCertPolicy::kRequire
                           ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
                           : SSL_VERIFY_PEER,
                       nullptr);
    // Connections are kept and reused; no session tickets to send.
    SSL_CTX_set_num_tickets(c, 0);
    SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  } else {
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER, nullptr);
    SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  }
  return ctx;
}

}  // namespace

std::string TakeOpenSslErrors() {
  std::string text;
  while (const unsigned long e = ERR_get_error()) {
    char line[256];
    ERR_error_string_n(e, line, sizeof(line));
    absl::StrAppend(&text, text.empty() ? "" : "; ", line);
  }
  return text.empty() ? "unknown error" : text;
}

bool UseTlsMaterial(SSL_CTX* ctx, const TlsMaterial& tls) {
  if (!tls.ca_pem.empty()) {
    auto bio = PemBio(tls.ca_pem);
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    while (X509* ca = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
      X509_STORE_add_cert(store, ca);
      X509_free(ca);
    }
    ERR_clear_error();  // the end of the PEM
  }
  if (tls.cert_pem.empty()) return true;
  auto bio = PemBio(tls.cert_pem);
  X509* leaf = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
  if (leaf == nullptr || SSL_CTX_use_certificate(ctx, leaf) != 1) {
    X509_free(leaf);
    return false;
  }
  X509_free(leaf);
  while (X509* more = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add_extra_chain_cert(ctx, more) != 1) X509_free(more);
  }
  ERR_clear_error();
  auto key_bio = PemBio(tls.key_pem);
  EVP_PKEY* key =
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
  const bool ok = key != nullptr && SSL_CTX_use_PrivateKey(ctx, key) == 1 &&
                  SSL_CTX_check_private_key(ctx) == 1;
  EVP_PKEY_free(key);
  return ok;
}

absl::StatusOr<std::shared_ptr<TlsContextSource>> TlsContextSource::Fixed(
    const TlsMaterial& material, Side side, ClientCertPolicy policy) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<SSL_CTX> context,
                           MakeContext(material, side, policy));
  return std::shared_ptr<TlsContextSource>(
      new TlsContextSource(side, policy, TlsFiles(), absl::ZeroDuration(),
                           std::move(context), material));
}

absl::StatusOr<std::shared_ptr<TlsContextSource>> TlsContextSource::Watch(
    const TlsFiles& files, Side side, ClientCertPolicy policy,
    absl::Duration refresh) {
  TESSERA_ASSIGN_OR_RETURN(TlsMaterial material,
                           LoadTls(files, /*need_cert=*/side == Side::kServer));
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<SSL_CTX> context,
                           MakeContext(material, side, policy));
  return std::shared_ptr<TlsContextSource>(new TlsContextSource(
      side, policy, files, refresh, std::move(context), std::move(material)));
}

TlsContextSource::TlsContextSource(Side side, ClientCertPolicy policy,
                                   TlsFiles files, absl::Duration refresh,
                                   std::shared_ptr<SSL_CTX> context,
                                   TlsMaterial material)
    : side_(side),
      policy_(policy),
      files_(std::move(files)),
      refresh_(refresh),
      context_(std::move(context)),
      material_(std::move(material)),
      checked_(absl::Now()) {}

std::shared_ptr<SSL_CTX> TlsContextSource::Get() {
  absl::MutexLock lock(&mu_);
  if (!files_.enabled() || refresh_ <= absl::ZeroDuration() ||
      absl::Now() - checked_ < refresh_) {
    return context_;
  }
  checked_ = absl::Now();
  absl::StatusOr<TlsMaterial> read =
      LoadTls(files_, /*need_cert=*/side_ == Side::kServer);
  if (read.ok() && SameMaterial(*read, material_)) return context_;
  absl::StatusOr<std::shared_ptr<SSL_CTX>> made =
      read.ok() ? MakeContext(*read, side_, policy_)
                : absl::StatusOr<std::shared_ptr<SSL_CTX>>(read.status());
  // A read that fails (a half-written file) keeps the last good context;
  // the daemon's CredentialWatch reports the files' troubles.
  if (!made.ok()) return context_;
  context_ = *std::move(made);
  material_ = *std::move(read);
  return context_;
}

}  // namespace tessera
