// Telling a TLS mismatch from a peer that is down. gRPC reports both alike:
// a plaintext client that dials a TLS server, or a client whose certificate
// the server refuses after the handshake (TLS 1.3), sees only a connection
// that closes or a deadline that passes, as if nothing were listening. On
// that failure path a client makes one handshake of its own with OpenSSL
// (sending no secret: only a ClientHello, its certificate and the HTTP/2
// preface) and reads what the peer answers.
//
// Free functions, no shared state; thread-safe.
#ifndef TESSERA_RPC_TLS_PROBE_H_
#define TESSERA_RPC_TLS_PROBE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "rpc/security.h"

namespace tessera {

// What one handshake with the peer at an address showed.
struct TlsProbeResult {
  bool reached = false;     // a TCP connection was made
  bool speaks_tls = false;  // the peer answered the ClientHello in TLS
  // Why the peer's certificate does not verify against the client's CA
  // for the host dialled (empty: it does, or no CA was given).
  std::string peer_certificate_error;
  // The fatal TLS alert the peer sent ("unknown CA"), empty: none.
  std::string alert;
  // The peer closed the connection after the handshake, without an alert
  // and without answering the HTTP/2 preface (what a gRPC server does with
  // a client certificate it refuses).
  bool closed_after_handshake = false;
  // The peer answered the HTTP/2 preface: the handshake was accepted.
  bool accepted = false;
};

// Dials `address` (HOST:PORT) and makes one TLS handshake, presenting
// `tls`'s certificate when it has one and checking the peer's against its
// CA (null `tls`: a client without TLS settings, only asking whether the
// peer speaks TLS). Connecting, and then each read or write, gives up
// after what is left of `timeout`.
TlsProbeResult ProbeTls(const std::string& address, const TlsMaterial* tls,
                        absl::Duration timeout);

// UNAUTHENTICATED naming the mismatch and what to check, when a probe of
// `address` finds one: the peer speaks TLS and this client has no TLS
// settings; or the peer's certificate does not verify against the
// client's CA; or the peer refused (or required) the client's certificate.
// `peer` names it in the message ("the coordinator at 127.0.0.1:7070").
// OK when the probe finds no mismatch (the peer is down, unreachable, or
// accepts this client's TLS): the caller's own error then stands.
absl::Status DiagnoseTlsMismatch(const std::string& address,
                                 const TlsMaterial* tls, absl::string_view peer,
                                 absl::Duration timeout);

}  // namespace tessera

#endif  // TESSERA_RPC_TLS_PROBE_H_
