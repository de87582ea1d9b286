// The encrypted-stream reference for figure 7: what OpenSSL alone moves
// over TLS 1.3 on loopback, with no RPC layer.
#ifndef TESSERA_BENCH_TLS_REFERENCE_H_
#define TESSERA_BENCH_TLS_REFERENCE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tessera {

struct TlsStreamsResult {
  double seconds = 0;  // from the first byte sent to the last received
  std::string cipher;  // as OpenSSL names the suite negotiated
};

// `streams` TLS 1.3 connections over 127.0.0.1 (an ephemeral P-256
// certificate, AES-128-GCM: the suite gRPC's TLS 1.3 offers first) move
// `total` bytes, each receiver reading straight into its part of `dst`.
// The handshakes are done before the clock starts.
absl::StatusOr<TlsStreamsResult> OpenSslTlsStreams(int streams, int64_t total,
                                                   char* dst);

}  // namespace tessera

#endif  // TESSERA_BENCH_TLS_REFERENCE_H_
