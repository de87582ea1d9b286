#include "rpc/security.h"

#include <arpa/inet.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/auth.h"
#include "core/placement.h"
#include "core/small_file.h"
#include "rpc/openssl_ptr.h"

namespace tessera {
namespace {

// PEM files: a CA bundle is the largest (the system's is about 200 KiB).
constexpr int64_t kMaxPemFileBytes = int64_t{16} << 20;

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view what) {
  absl::StatusOr<std::string> pem =
      ReadSmallFile(path, kMaxPemFileBytes, absl::StrCat(what, " file"));
  if (!pem.ok()) {
    return absl::UnauthenticatedError(pem.status().message());
  }
  return pem;
}

X509Ptr ParseCert(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

absl::Status CheckValidNow(X509* cert, const std::string& path) {
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) <= 0) {
    return absl::UnauthenticatedError(
        absl::StrCat("certificate ", path, " has expired"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) >= 0) {
    return absl::UnauthenticatedError(
        absl::StrCat("certificate ", path, " is not valid yet"));
  }
  return absl::OkStatus();
}

class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const BearerSecret* secret) : secret_(secret) {}
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert(
          {kAuthorizationHeader, secret_->Header()});
    }
    methods->Proceed();
  }

 private:
  const BearerSecret* secret_;
};

class BearerInterceptorFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(std::shared_ptr<const BearerSecret> secret)
      : secret_(std::move(secret)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(secret_.get());
  }

 private:
  std::shared_ptr<const BearerSecret> secret_;
};

std::string MetadataValue(const grpc::ServerContextBase& context,
                          absl::string_view key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

absl::StatusOr<ClientCertPolicy> ParseClientCertPolicy(absl::string_view text) {
  if (text == "require") return ClientCertPolicy::kRequire;
  if (text == "optional") return ClientCertPolicy::kOptional;
  return absl::InvalidArgumentError(absl::StrCat(
      "--tls_client_cert must be require or optional, got '", text, "'"));
}

absl::StatusOr<TlsMaterial> LoadTls(const TlsFiles& files, bool need_cert) {
  if (files.ca.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs --tls_ca (the cluster CA that signed every certificate)");
  }
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (need_cert && files.cert.empty()) {
    return absl::InvalidArgumentError(
        "a daemon with TLS needs --tls_cert and --tls_key");
  }
  TlsMaterial tls;
  absl::StatusOr<std::string> ca = ReadPem(files.ca, "CA");
  if (!ca.ok()) return ca.status();
  tls.ca_pem = *std::move(ca);
  if (ParseCert(tls.ca_pem) == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat("--tls_ca=", files.ca, " holds no PEM certificate"));
  }
  if (files.cert.empty()) return tls;
  absl::StatusOr<std::string> cert = ReadPem(files.cert, "certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(files.key, "key");
  if (!key.ok()) return key.status();
  tls.cert_pem = *std::move(cert);
  tls.key_pem = *std::move(key);
  X509Ptr x509 = ParseCert(tls.cert_pem);
  if (x509 == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat("--tls_cert=", files.cert, " holds no PEM certificate"));
  }
  BioPtr bio(BIO_new_mem_buf(tls.key_pem.data(),
                             static_cast<int>(tls.key_pem.size())));
  EvpKeyPtr pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (pkey == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat("--tls_key=", files.key, " holds no PEM private key"));
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    return absl::UnauthenticatedError(absl::StrCat(
        "--tls_key=", files.key, " does not match --tls_cert=", files.cert));
  }
  if (absl::Status valid = CheckValidNow(x509.get(), files.cert); !valid.ok()) {
    return valid;
  }
  return tls;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(
    const TlsMaterial& tls) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls.ca_pem;
  options.pem_private_key = tls.key_pem;
  options.pem_cert_chain = tls.cert_pem;
  return grpc::SslCredentials(options);
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(
    const TlsMaterial& tls, ClientCertPolicy policy) {
  grpc::SslServerCredentialsOptions options(
      policy == ClientCertPolicy::kRequire
          ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
          : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls.ca_pem;
  options.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  return grpc::SslServerCredentials(options);
}

WatchedTls WatchTlsFiles(const TlsFiles& files, ClientCertPolicy policy,
                         absl::Duration refresh) {
  namespace gx = grpc::experimental;
  const unsigned int seconds = static_cast<unsigned int>(
      std::max<int64_t>(1, absl::ToInt64Seconds(refresh)));
  // One provider: the server and every channel see the same files.
  auto provider = std::make_shared<gx::FileWatcherCertificateProvider>(
      files.key, files.cert, files.ca, seconds);
  WatchedTls out;
  gx::TlsServerCredentialsOptions server(provider);
  server.watch_root_certs();
  server.watch_identity_key_cert_pairs();
  server.set_cert_request_type(
      policy == ClientCertPolicy::kRequire
          ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
          : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  out.server = grpc::experimental::TlsServerCredentials(server);
  auto channel_options = [&](std::shared_ptr<gx::CertificateVerifier> verifier,
                             bool check_call_host) {
    gx::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(provider);
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    options.set_verify_server_certs(true);
    options.set_certificate_verifier(std::move(verifier));
    options.set_check_call_host(check_call_host);
    return options;
  };
  // As SslCredentials: the server's certificate must name the host dialled.
  out.channel = grpc::experimental::TlsCredentials(channel_options(
      std::make_shared<gx::HostNameCertificateVerifier>(), true));
  out.self_probe = grpc::experimental::TlsCredentials(
      channel_options(std::make_shared<gx::NoOpCertificateVerifier>(), false));
  return out;
}

absl::StatusOr<CertificateInfo> ReadCertificateInfo(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadPem(path, "certificate");
  if (!pem.ok()) return pem.status();
  X509Ptr cert = ParseCert(*pem);
  if (cert == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat(path, " holds no PEM certificate"));
  }
  CertificateInfo info;
  char subject[256];
  X509_NAME_oneline(X509_get_subject_name(cert.get()), subject,
                    sizeof(subject));
  info.subject = subject;
  auto to_time = [](const ASN1_TIME* t) {
    struct tm parts {};
    ASN1_TIME_to_tm(t, &parts);
    return absl::FromTimeT(timegm(&parts));
  };
  info.not_before = to_time(X509_get0_notBefore(cert.get()));
  info.not_after = to_time(X509_get0_notAfter(cert.get()));
  return info;
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  if (absl::AsciiStrToLower(host) == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, std::string(host).c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, std::string(host).c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return false;
}

absl::Status CheckProtectedMode(absl::string_view listen, bool secured,
                                bool insecure) {
  if (secured || insecure) return absl::OkStatus();
  const size_t colon = listen.rfind(':');
  const absl::string_view host =
      colon == absl::string_view::npos ? listen : listen.substr(0, colon);
  if (IsLoopbackHost(host)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to serve on ", listen,
      " without TLS or tokens: anyone who reaches it would own the cluster "
      "(insecure). Pass --tls_ca/--tls_cert/--tls_key and tokens, listen on "
      "loopback, or pass --insecure on a network you trust"));
}

void BearerSecret::Set(std::string token) {
  std::string header = absl::StrCat(kBearerPrefix, token);
  absl::MutexLock lock(&mu_);
  header_ = std::move(header);
}

std::string BearerSecret::Header() const {
  absl::MutexLock lock(&mu_);
  return header_;
}

std::string BearerSecret::token() const {
  absl::MutexLock lock(&mu_);
  return header_.substr(sizeof(kBearerPrefix) - 1);
}

std::function<ClientInterceptorFactories()> BearerTokenInterceptors(
    std::string token) {
  return BearerTokenInterceptors(
      std::make_shared<const BearerSecret>(std::move(token)));
}

std::function<ClientInterceptorFactories()> BearerTokenInterceptors(
    std::shared_ptr<const BearerSecret> secret) {
  return [secret] {
    ClientInterceptorFactories factories;
    factories.push_back(std::make_unique<BearerInterceptorFactory>(secret));
    return factories;
  };
}

void PresentCapability(grpc::ClientContext* context,
                       absl::string_view capability) {
  if (!capability.empty()) {
    context->AddMetadata(kCapabilityHeader, std::string(capability));
  }
}

std::string BearerToken(const grpc::ServerContextBase& context) {
  std::string value = MetadataValue(context, kAuthorizationHeader);
  if (!absl::StartsWith(value, kBearerPrefix)) return "";
  return value.substr(sizeof(kBearerPrefix) - 1);
}

std::string PeerCommonName(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  // The property gRPC's TLS layer sets from the verified peer certificate.
  for (const grpc::string_ref& cn :
       auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    return std::string(cn.data(), cn.size());
  }
  return "";
}

std::string PresentedCapability(const grpc::ServerContextBase& context) {
  return MetadataValue(context, kCapabilityHeader);
}

bool IsTlsHandshakeFailure(absl::string_view message) {
  for (absl::string_view word :
       {"handshake", "SSL_ERROR", "certificate", "CERTIFICATE", "tlsv1 alert",
        "sslv3 alert", "TSI_"}) {
    if (absl::StrContains(message, word)) return true;
  }
  return false;
}

}  // namespace tessera
