#include "rpc/tls_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/no_sigpipe.h"
#include "rpc/openssl_ptr.h"
#include "rpc/tcp_socket.h"
#include "rpc/tls_context.h"

namespace tessera {
namespace {

// What the callbacks of one handshake saw.
struct ProbeState {
  bool speaks_tls = false;
  std::string alert;
  std::string certificate_error;
};

void OnMessage(int write_p, int /*version*/, int content_type, const void* buf,
               size_t len, SSL* /*ssl*/, void* arg) {
  if (write_p) return;
  auto* state = static_cast<ProbeState*>(arg);
  // Only records that decoded as TLS count (not raw record headers, which
  // OpenSSL reports before checking them).
  if (content_type == SSL3_RT_HANDSHAKE) state->speaks_tls = true;
  if (content_type == SSL3_RT_ALERT && len >= 2) {
    state->speaks_tls = true;
    const auto* alert = static_cast<const unsigned char*>(buf);
    if (alert[1] != SSL3_AD_CLOSE_NOTIFY && state->alert.empty())
      state->alert = SSL_alert_desc_string_long(alert[1]);
  }
}

// Records why the peer's certificate fails, and goes on: the probe wants
// to hear what the peer says next too.
int VerifyAndGoOn(int ok, X509_STORE_CTX* store) {
  if (!ok) {
    SSL* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(
        store, SSL_get_ex_data_X509_STORE_CTX_idx()));
    auto* state = static_cast<ProbeState*>(SSL_get_app_data(ssl));
    if (state != nullptr && state->certificate_error.empty()) {
      state->certificate_error =
          X509_verify_cert_error_string(X509_STORE_CTX_get_error(store));
    }
  }
  return 1;
}

int MillisUntil(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(ms, 60000)));
}

// Bounds a connected socket's reads and writes by the time left.
void LimitTo(int fd, absl::Time deadline) {
  const int ms = std::max(1, MillisUntil(deadline));
  timeval limit{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
}

}  // namespace

TlsProbeResult ProbeTls(const std::string& address, const TlsMaterial* tls,
                        absl::Duration timeout) {
  TlsProbeResult result;
  const absl::Time deadline = absl::Now() + timeout;
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) return result;
  const absl::StatusOr<int> connected = ConnectTcp(address, deadline);
  if (!connected.ok()) return result;
  const int fd = *connected;
  LimitTo(fd, deadline);
  result.reached = true;
  ScopedNoSigpipe no_sigpipe;

  SslCtxPtr ctx(SSL_CTX_new(TLS_client_method()));
  if (ctx == nullptr || (tls != nullptr && !UseTlsMaterial(ctx.get(), *tls))) {
    ERR_clear_error();
    close(fd);
    return result;
  }
  ProbeState state;
  // The peer's certificate is checked only to report on it; nothing secret
  // is sent.
  SSL_CTX_set_verify(ctx.get(),
                     tls != nullptr && !tls->ca_pem.empty() ? SSL_VERIFY_PEER
                                                            : SSL_VERIFY_NONE,
                     VerifyAndGoOn);
  SslPtr ssl(SSL_new(ctx.get()));
  if (ssl == nullptr) {
    close(fd);
    return result;
  }
  SSL_set_app_data(ssl.get(), &state);
  SSL_set_msg_callback(ssl.get(), OnMessage);
  SSL_set_msg_callback_arg(ssl.get(), &state);
  static const unsigned char kAlpn[] = {2, 'h', '2'};  // as gRPC asks
  SSL_set_alpn_protos(ssl.get(), kAlpn, sizeof(kAlpn));
  in6_addr ip;
  const bool is_ip = inet_pton(AF_INET, host.c_str(), &ip) == 1 ||
                     inet_pton(AF_INET6, host.c_str(), &ip) == 1;
  if (is_ip) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl.get(), host.c_str());
    SSL_set1_host(ssl.get(), host.c_str());
  }
  SSL_set_fd(ssl.get(), fd);

  if (SSL_connect(ssl.get()) == 1) {
    // Under TLS 1.3 the server judges the client's certificate after the
    // client's handshake is done: its verdict is the answer to the HTTP/2
    // preface (SETTINGS) or an alert.
    static const char kPreface[] =
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        "\x00\x00\x00\x04\x00\x00\x00\x00\x00";  // an empty SETTINGS frame
    char byte = 0;
    int rc = SSL_write(ssl.get(), kPreface, sizeof(kPreface) - 1);
    if (rc > 0) rc = SSL_read(ssl.get(), &byte, 1);
    const int err = errno;
    if (rc > 0) {
      result.accepted = true;
    } else {
      // Anything but our own timeout: the peer hung up on us.
      const int error = SSL_get_error(ssl.get(), rc);
      const bool timed_out =
          error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE ||
          (error == SSL_ERROR_SYSCALL && (err == EAGAIN || err == EWOULDBLOCK));
      result.closed_after_handshake = state.alert.empty() && !timed_out;
    }
  }
  ERR_clear_error();
  result.speaks_tls = state.speaks_tls;
  result.alert = state.alert;
  result.peer_certificate_error = state.certificate_error;
  ssl.reset();
  close(fd);
  return result;
}

absl::Status DiagnoseTlsMismatch(const std::string& address,
                                 const TlsMaterial* tls, absl::string_view peer,
                                 absl::Duration timeout) {
  const TlsProbeResult probe = ProbeTls(address, tls, timeout);
  if (!probe.reached || !probe.speaks_tls) return absl::OkStatus();
  if (tls == nullptr) {
    return absl::UnauthenticatedError(absl::StrCat(
        "unauthenticated: ", peer,
        " speaks TLS, and this client has no TLS settings: pass --tls_ca, "
        "--tls_cert and --tls_key (or set TESSERA_TLS_CA, TESSERA_TLS_CERT "
        "and TESSERA_TLS_KEY): the cluster's CA, and a certificate it "
        "signed with its key"));
  }
  std::vector<std::string> problems;
  if (!probe.peer_certificate_error.empty()) {
    problems.push_back(absl::StrCat(
        "its TLS certificate does not verify against this client's --tls_ca (",
        probe.peer_certificate_error,
        "): check that --tls_ca (TESSERA_TLS_CA) is the cluster's CA"));
  }
  if (tls->cert_pem.empty() &&
      (!probe.alert.empty() || probe.closed_after_handshake)) {
    problems.push_back(
        "it requires a TLS client certificate, and this client has none: "
        "pass --tls_cert and --tls_key (or set TESSERA_TLS_CERT and "
        "TESSERA_TLS_KEY)");
  } else if (!probe.alert.empty() || probe.closed_after_handshake) {
    // A gRPC server that refuses the certificate just hangs up, without
    // an alert, once the client's side of the handshake is done.
    problems.push_back(absl::StrCat(
        "it refused this client's TLS certificate (",
        probe.alert.empty()
            ? std::string("it closed the connection right after the handshake")
            : absl::StrCat("TLS alert: ", probe.alert),
        "): check that --tls_cert (TESSERA_TLS_CERT) was signed by the CA "
        "the coordinator trusts (the cluster's CA) and that --tls_key is "
        "its key"));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::UnauthenticatedError(absl::StrCat(
      "unauthenticated: ", peer, ": ", absl::StrJoin(problems, "; and ")));
}

}  // namespace tessera
