// DataStream: the byte stream of one data-port connection
// (transport/tcp_wire.h), plain TCP or mutual TLS 1.3 over it, with the
// same never-hanging calls either way: each gives up with UNAVAILABLE once
// nothing moves for `idle`, or when the peer closes the connection.
//
// Plain streams receive into and send from the caller's spans with
// recvmsg/sendmsg. TLS streams decrypt into them (SSL_read) and encrypt
// from them (SSL_write); with kernel TLS the kernel does the sealing.
// A TLS failure that is the peer's verdict on a certificate (an alert, a
// chain that does not verify, no certificate) is UNAUTHENTICATED, naming
// what OpenSSL saw.
//
// The socket is not owned (the caller closes it after the stream).
// One thread at a time.
#ifndef TESSERA_TRANSPORT_DATA_STREAM_H_
#define TESSERA_TRANSPORT_DATA_STREAM_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "rpc/openssl_ptr.h"

namespace tessera {

class DataStream {
 public:
  // Plain TCP on `fd`.
  static std::unique_ptr<DataStream> Plain(int fd);
  // The server's side of a TLS handshake on `fd`, finished within
  // `timeout`.
  static absl::StatusOr<std::unique_ptr<DataStream>> Accept(
      int fd, SSL_CTX* context, absl::Duration timeout);
  // The client's side: the peer's certificate must verify against the
  // context's CA and name `host` (a DNS name or an IP address). Errors
  // name `what`.
  static absl::StatusOr<std::unique_ptr<DataStream>> Connect(
      int fd, SSL_CTX* context, const std::string& host, absl::Duration timeout,
      absl::string_view what);

  // Reads exactly the bytes of the spans of `iov`, in order.
  absl::Status Receive(absl::Span<const iovec> iov, absl::Duration idle,
                       absl::string_view what);
  absl::Status Receive(char* data, size_t bytes, absl::Duration idle,
                       absl::string_view what);
  // Writes every span of `iov`, in order (never SIGPIPE).
  absl::Status Send(absl::Span<const iovec> iov, absl::Duration idle,
                    absl::string_view what);
  // True when bytes are there to read (or the peer closed) within `wait`.
  bool WaitReadable(absl::Duration wait);

  int fd() const { return fd_; }
  bool tls() const { return ssl_ != nullptr; }
  // Whether the box `box_sizes` at `box_offsets` of an array of `shape`
  // (`item`-byte elements) is sent straight from the array, one span per
  // row, or received straight into it; else it is packed through a buffer.
  // A box that is one span of its array always goes straight. A plain
  // stream takes a kernel call per IOV_MAX spans, so rows down to 512 bytes
  // go direct both ways. Under TLS every span sent is a record (and a
  // write) of its own, so only rows of a whole record (16 KiB) are sent
  // direct; a span received is a copy out of the record already decrypted,
  // so rows of 2 KiB are received direct.
  bool SendsDirectly(absl::Span<const int64_t> shape,
                     absl::Span<const int64_t> box_offsets,
                     absl::Span<const int64_t> box_sizes, int64_t item) const {
    return MovesDirectly(shape, box_offsets, box_sizes, item,
                         tls() ? 16384 : 512);
  }
  bool ReceivesDirectly(absl::Span<const int64_t> shape,
                        absl::Span<const int64_t> box_offsets,
                        absl::Span<const int64_t> box_sizes,
                        int64_t item) const {
    return MovesDirectly(shape, box_offsets, box_sizes, item,
                         tls() ? 2048 : 512);
  }
  // Records are sealed (sent) by the kernel: kernel TLS is on.
  bool kernel_tls_send() const;

 private:
  DataStream(int fd, SslPtr ssl) : fd_(fd), ssl_(std::move(ssl)) {}
  absl::Status MoveTls(bool reading, absl::Span<const iovec> iov,
                       absl::Duration idle, absl::string_view what);
  static bool MovesDirectly(absl::Span<const int64_t> shape,
                            absl::Span<const int64_t> box_offsets,
                            absl::Span<const int64_t> box_sizes, int64_t item,
                            int64_t min_row_bytes);

  const int fd_;
  const SslPtr ssl_;  // null: plain
};

// Walks elements [0, NumElements) of the row-major box `box_sizes` at
// `box_offsets` of an array of `shape` whose element 0 is at `base`
// (`item` bytes each) as the spans of array memory they occupy, in order
// (rows that follow one another joined), a window of about `window_bytes`
// at a time: `fn(spans, bytes)` gets each
// window (a view valid during the call) and ends the walk with an error.
// Windows bound the spans held at once, however many rows a box has.
// Preconditions: the box lies in the array; item > 0.
absl::Status ForEachSpanWindow(
    char* base, absl::Span<const int64_t> shape,
    absl::Span<const int64_t> box_offsets, absl::Span<const int64_t> box_sizes,
    int64_t item, int64_t window_bytes,
    const std::function<absl::Status(absl::Span<const iovec> spans,
                                     int64_t bytes)>& fn);

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_DATA_STREAM_H_
