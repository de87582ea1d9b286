#include "transport/data_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/box_runs.h"
#include "core/no_sigpipe.h"
#include "core/status_macros.h"
#include "rpc/tls_context.h"
#include "transport/tcp_wire.h"

namespace tessera {
namespace {

// Whether OpenSSL's first queued error is a verdict on a certificate: an
// alert the peer sent (unknown CA, certificate required), or a chain this
// side could not verify.
bool IsCertificateVerdict(unsigned long error) {
  if (ERR_GET_LIB(error) != ERR_LIB_SSL) return false;
  const int reason = ERR_GET_REASON(error);
  return reason >= SSL_AD_REASON_OFFSET ||
         reason == SSL_R_CERTIFICATE_VERIFY_FAILED ||
         reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE;
}

// The status of a TLS call on `ssl` that returned `ret` (not a wait):
// UNAUTHENTICATED for a certificate verdict, UNAVAILABLE otherwise.
absl::Status TlsFailure(SSL* ssl, int ret, absl::string_view what,
                        absl::string_view during) {
  const int saved_errno = errno;
  const int error = SSL_get_error(ssl, ret);
  if (error == SSL_ERROR_ZERO_RETURN) {
    ERR_clear_error();
    return absl::UnavailableError(absl::StrCat(what, " closed the connection"));
  }
  const unsigned long first = ERR_peek_error();
  const bool handshake = during == "handshake";
  if (error == SSL_ERROR_SYSCALL && first == 0) {
    if (saved_errno == 0 && !handshake)
      return absl::UnavailableError(
          absl::StrCat(what, " closed the connection"));
    return absl::UnavailableError(
        absl::StrCat(what, ": TLS ", during, ": ",
                     saved_errno == 0 ? "the peer closed the connection"
                                      : std::strerror(saved_errno),
                     handshake ? "; does the peer speak TLS?" : ""));
  }
  const bool verdict = IsCertificateVerdict(first);
  const int reason = ERR_GET_REASON(first);
  std::string text = TakeOpenSslErrors();
  const long verify = SSL_get_verify_result(ssl);
  if (verify != X509_V_OK) {
    absl::StrAppend(&text, " (", X509_verify_cert_error_string(verify), ")");
  }
  if (!verdict && ERR_GET_LIB(first) == ERR_LIB_SSL &&
      (reason == SSL_R_WRONG_VERSION_NUMBER ||
       reason == SSL_R_UNEXPECTED_EOF_WHILE_READING ||
       reason == SSL_R_PACKET_LENGTH_TOO_LONG)) {
    absl::StrAppend(&text, "; does the peer speak TLS?");
  }
  const std::string message = absl::StrCat(what, ": TLS ", during, ": ", text);
  return verdict ? absl::UnauthenticatedError(message)
                 : absl::UnavailableError(message);
}

// Drives `step` (SSL_accept or SSL_connect) to its end by `deadline`.
template <typename Step>
absl::Status Handshake(SSL* ssl, int fd, absl::Time deadline,
                       absl::string_view what, const Step& step) {
  ScopedNoSigpipe no_sigpipe;
  while (true) {
    ERR_clear_error();
    const int ret = step(ssl);
    if (ret == 1) return absl::OkStatus();
    const int error = SSL_get_error(ssl, ret);
    if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE)
      return TlsFailure(ssl, ret, what, "handshake");
    const int ready =
        PollFor(fd, error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                deadline - absl::Now());
    if (ready == 0) {
      return absl::UnavailableError(
          absl::StrCat(what, ": the TLS handshake did not finish in time"));
    }
    if (ready < 0) {
      return absl::UnavailableError(
          absl::StrCat(what, ": TLS handshake: ", std::strerror(errno)));
    }
  }
}

absl::StatusOr<SslPtr> NewSsl(int fd, SSL_CTX* context) {
  SslPtr ssl(SSL_new(context));
  if (ssl == nullptr || SSL_set_fd(ssl.get(), fd) != 1) {
    return absl::InternalError(absl::StrCat("SSL_new: ", TakeOpenSslErrors()));
  }
  // OpenSSL reads and writes the socket itself: it must not block.
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::InternalError(
        absl::StrCat("making the socket non-blocking: ", std::strerror(errno)));
  }
  return ssl;
}

}  // namespace

std::unique_ptr<DataStream> DataStream::Plain(int fd) {
  return std::unique_ptr<DataStream>(new DataStream(fd, nullptr));
}

absl::StatusOr<std::unique_ptr<DataStream>> DataStream::Accept(
    int fd, SSL_CTX* context, absl::Duration timeout) {
  absl::StatusOr<SslPtr> ssl = NewSsl(fd, context);
  if (!ssl.ok()) return ssl.status();
  absl::Status done = Handshake(ssl->get(), fd, absl::Now() + timeout, "peer",
                                [](SSL* s) { return SSL_accept(s); });
  if (!done.ok()) return done;
  return std::unique_ptr<DataStream>(new DataStream(fd, *std::move(ssl)));
}

absl::StatusOr<std::unique_ptr<DataStream>> DataStream::Connect(
    int fd, SSL_CTX* context, const std::string& host, absl::Duration timeout,
    absl::string_view what) {
  absl::StatusOr<SslPtr> ssl = NewSsl(fd, context);
  if (!ssl.ok()) return ssl.status();
  SSL* s = ssl->get();
  in6_addr ip;
  if (inet_pton(AF_INET, host.c_str(), &ip) == 1 ||
      inet_pton(AF_INET6, host.c_str(), &ip) == 1) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s), host.c_str());
  } else {
    SSL_set_tlsext_host_name(s, host.c_str());
    SSL_set1_host(s, host.c_str());
  }
  absl::Status done = Handshake(s, fd, absl::Now() + timeout, what,
                                [](SSL* c) { return SSL_connect(c); });
  if (!done.ok()) return done;
  return std::unique_ptr<DataStream>(new DataStream(fd, *std::move(ssl)));
}

bool DataStream::kernel_tls_send() const {
  return ssl_ != nullptr && BIO_get_ktls_send(SSL_get_wbio(ssl_.get())) == 1;
}

absl::Status DataStream::Receive(absl::Span<const iovec> iov,
                                 absl::Duration idle, absl::string_view what) {
  if (ssl_ == nullptr) return ReceiveFully(fd_, iov, idle, what);
  return MoveTls(/*reading=*/true, iov, idle, what);
}

absl::Status DataStream::Receive(char* data, size_t bytes, absl::Duration idle,
                                 absl::string_view what) {
  const iovec one{data, bytes};
  return Receive(absl::MakeConstSpan(&one, 1), idle, what);
}

absl::Status DataStream::Send(absl::Span<const iovec> iov, absl::Duration idle,
                              absl::string_view what) {
  if (ssl_ == nullptr) return SendFully(fd_, iov, idle, what);
  return MoveTls(/*reading=*/false, iov, idle, what);
}

bool DataStream::WaitReadable(absl::Duration wait) {
  if (ssl_ != nullptr && SSL_has_pending(ssl_.get()) == 1) return true;
  return tessera::WaitReadable(fd_, wait);
}

absl::Status DataStream::MoveTls(bool reading, absl::Span<const iovec> iov,
                                 absl::Duration idle, absl::string_view what) {
  SSL* ssl = ssl_.get();
  ScopedNoSigpipe no_sigpipe;
  for (const iovec& part : iov) {
    char* at = static_cast<char*>(part.iov_base);
    size_t left = part.iov_len;
    while (left > 0) {
      ERR_clear_error();
      size_t moved = 0;
      // A write that must wait is called again with the same span, as
      // OpenSSL requires.
      const int ret = reading ? SSL_read_ex(ssl, at, left, &moved)
                              : SSL_write_ex(ssl, at, left, &moved);
      if (ret == 1) {
        at += moved;
        left -= moved;
        continue;
      }
      const int error = SSL_get_error(ssl, ret);
      if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE)
        return TlsFailure(ssl, ret, what, reading ? "read" : "write");
      const int ready =
          PollFor(fd_, error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, idle);
      if (ready == 0) {
        return absl::UnavailableError(absl::StrCat(
            what, " stopped: nothing ", reading ? "received" : "sent", " for ",
            absl::FormatDuration(idle)));
      }
      if (ready < 0) {
        return absl::UnavailableError(
            absl::StrCat(what, ": ", std::strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

bool DataStream::MovesDirectly(absl::Span<const int64_t> shape,
                               absl::Span<const int64_t> box_offsets,
                               absl::Span<const int64_t> box_sizes,
                               int64_t item, int64_t min_row_bytes) {
  return (!box_sizes.empty() && box_sizes.back() * item >= min_row_bytes) ||
         BoxSpanStart(shape, box_offsets, box_sizes).has_value();
}

absl::Status ForEachSpanWindow(
    char* base, absl::Span<const int64_t> shape,
    absl::Span<const int64_t> box_offsets, absl::Span<const int64_t> box_sizes,
    int64_t item, int64_t window_bytes,
    const std::function<absl::Status(absl::Span<const iovec> spans,
                                     int64_t bytes)>& fn) {
  if (box_sizes.empty()) {  // a scalar: its one element
    const iovec one{base, static_cast<size_t>(item)};
    return fn(absl::MakeConstSpan(&one, 1), item);
  }
  int64_t total = 1;
  for (int64_t size : box_sizes) total *= size;
  const int64_t step = std::max<int64_t>(1, window_bytes / item);
  std::vector<iovec> spans;
  if (std::optional<int64_t> start =
          BoxSpanStart(shape, box_offsets, box_sizes)) {
    // One span: its windows without a walk over its rows.
    for (int64_t first = 0; first < total; first += step) {
      const int64_t count = std::min(step, total - first);
      const iovec span{base + (*start + first) * item,
                       static_cast<size_t>(count * item)};
      TESSERA_RETURN_IF_ERROR(fn(absl::MakeConstSpan(&span, 1), count * item));
    }
    return absl::OkStatus();
  }
  for (int64_t first = 0; first < total; first += step) {
    const int64_t count = std::min(step, total - first);
    spans.clear();
    ForEachBoxRun(
        shape, box_offsets, box_sizes, first, count,
        [&](int64_t array_element, int64_t, int64_t n) {
          char* at = base + array_element * item;
          const size_t bytes = static_cast<size_t>(n * item);
          // Rows that follow one another in memory are one span.
          if (!spans.empty() && static_cast<char*>(spans.back().iov_base) +
                                        spans.back().iov_len ==
                                    at) {
            spans.back().iov_len += bytes;
          } else {
            spans.push_back({at, bytes});
          }
        });
    if (absl::Status s = fn(spans, count * item); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tessera
