#include "bench/tls_reference.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/loopback.h"
#include "rpc/openssl_ptr.h"

namespace tessera {
namespace {

absl::Status OpenSslError(const char* what) {
  char text[256] = "unknown error";
  if (const unsigned long e = ERR_get_error(); e != 0) {
    ERR_error_string_n(e, text, sizeof(text));
  }
  ERR_clear_error();
  return absl::InternalError(absl::StrCat(what, ": ", text));
}

// Both ends speak TLS 1.3 with one suite only.
absl::StatusOr<SslCtxPtr> MakeContext(bool server, EVP_PKEY* key, X509* cert) {
  SslCtxPtr ctx(
      SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()));
  if (ctx == nullptr) return OpenSslError("SSL_CTX_new");
  if (SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(ctx.get(), TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_ciphersuites(ctx.get(), "TLS_AES_128_GCM_SHA256") != 1) {
    return OpenSslError("configuring TLS 1.3");
  }
  if (server) {
    if (SSL_CTX_use_certificate(ctx.get(), cert) != 1 ||
        SSL_CTX_use_PrivateKey(ctx.get(), key) != 1) {
      return OpenSslError("loading the certificate");
    }
    SSL_CTX_set_num_tickets(ctx.get(), 0);
  } else {
    // Bulk bytes are what is measured: the peer is this process.
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
    // Records read from the socket many at a time, not a header and a body
    // per record (two reads per 16 KiB).
    SSL_CTX_set_read_ahead(ctx.get(), 1);
    SSL_CTX_set_default_read_buffer_len(ctx.get(), 256 << 10);
  }
  return ctx;
}

absl::Status SelfSigned(EvpKeyPtr* key, X509Ptr* cert) {
  key->reset(EVP_EC_gen("P-256"));
  if (*key == nullptr) return OpenSslError("EVP_EC_gen");
  cert->reset(X509_new());
  X509* x = cert->get();
  if (x == nullptr) return OpenSslError("X509_new");
  X509_NAME* name = X509_get_subject_name(x);
  if (X509_set_version(x, 2) != 1 ||
      ASN1_INTEGER_set(X509_get_serialNumber(x), 1) != 1 ||
      X509_gmtime_adj(X509_getm_notBefore(x), 0) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(x), 3600) == nullptr ||
      X509_set_pubkey(x, key->get()) != 1 ||
      X509_NAME_add_entry_by_txt(
          name, "CN", MBSTRING_ASC,
          reinterpret_cast<const unsigned char*>("tessera-bench"), -1, -1,
          0) != 1 ||
      X509_set_issuer_name(x, name) != 1 ||
      X509_sign(x, key->get(), EVP_sha256()) == 0) {
    return OpenSslError("making a certificate");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TlsStreamsResult> OpenSslTlsStreams(int streams, int64_t total,
                                                   char* dst) {
  if (streams < 1 || total < streams) {
    return absl::InvalidArgumentError("give at least one byte per stream");
  }
  EvpKeyPtr key;
  X509Ptr cert;
  if (absl::Status s = SelfSigned(&key, &cert); !s.ok()) return s;
  absl::StatusOr<SslCtxPtr> server_ctx =
      MakeContext(true, key.get(), cert.get());
  if (!server_ctx.ok()) return server_ctx.status();
  absl::StatusOr<SslCtxPtr> client_ctx = MakeContext(false, nullptr, nullptr);
  if (!client_ctx.ok()) return client_ctx.status();

  // The server end sends (as a worker does), the client end receives.
  std::vector<int> fds;
  std::vector<SslPtr> senders, receivers;
  auto close_all = [&] {
    senders.clear();
    receivers.clear();
    for (int fd : fds) close(fd);
  };
  for (int i = 0; i < streams; ++i) {
    absl::StatusOr<std::pair<int, int>> pair = LoopbackPair();
    if (!pair.ok()) {
      close_all();
      return pair.status();
    }
    fds.push_back(pair->first);
    fds.push_back(pair->second);
    senders.emplace_back(SSL_new(server_ctx->get()));
    receivers.emplace_back(SSL_new(client_ctx->get()));
    if (senders.back() == nullptr || receivers.back() == nullptr ||
        SSL_set_fd(senders.back().get(), pair->first) != 1 ||
        SSL_set_fd(receivers.back().get(), pair->second) != 1) {
      close_all();
      return OpenSslError("SSL_new");
    }
  }
  std::atomic<bool> failed{false};
  // A failed end unblocks the others.
  auto fail = [&] {
    failed = true;
    for (int fd : fds) shutdown(fd, SHUT_RDWR);
  };
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < streams; ++i) {
      threads.emplace_back([&, i] {
        if (SSL_accept(senders[i].get()) != 1) fail();
      });
      threads.emplace_back([&, i] {
        if (SSL_connect(receivers[i].get()) != 1) fail();
      });
    }
    for (std::thread& t : threads) t.join();
  }
  if (failed) {
    close_all();
    return OpenSslError("the TLS handshake");
  }
  TlsStreamsResult result;
  result.cipher = SSL_get_cipher_name(receivers[0].get());

  const int64_t part = total / streams;
  const std::vector<char> source(1 << 20, 'x');
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back([&, i] {
      for (int64_t sent = 0; sent < part && !failed;) {
        size_t n = 0;
        const size_t want = static_cast<size_t>(std::min<int64_t>(
            static_cast<int64_t>(source.size()), part - sent));
        if (SSL_write_ex(senders[i].get(), source.data(), want, &n) != 1) {
          fail();
          return;
        }
        sent += static_cast<int64_t>(n);
      }
    });
    threads.emplace_back([&, i] {
      char* out = dst + i * part;
      for (int64_t got = 0; got < part && !failed;) {
        size_t n = 0;
        if (SSL_read_ex(receivers[i].get(), out + got,
                        static_cast<size_t>(part - got), &n) != 1) {
          fail();
          return;
        }
        got += static_cast<int64_t>(n);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  close_all();
  if (failed) return absl::InternalError("a TLS stream failed mid-transfer");
  return result;
}

}  // namespace tessera
