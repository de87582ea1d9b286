// The wire of a worker's data port: bulk shard bytes on TCP connections of
// their own beside gRPC (CLI.md "Bulk bytes over TCP (v4)"), so that they
// land in the caller's array with no framing to strip and no buffer of
// gRPC's to copy out of.
//
// A connection opens with the client's preface ("TSDP" and the version, 8
// bytes), which a TLS data port sends back (so that the client knows its
// certificate was taken before it sends a request); then requests follow
// one after another, each answered in order:
//
//   request:  op (u32) | meta bytes (u32) | payload bytes (u64) | meta |
//   payload reply:    code (u32) | message bytes (u32) | payload bytes (u64)
//             | message | payload
//
// Integers are little-endian. The meta is a v1.DataRequest
// (proto/data.proto) carrying the capability its gRPC twin would carry; only
// a write has a request payload (the box's bytes, row-major). A read's reply
// payload is the box's bytes, row-major; a row read's every row asked for,
// whole, in order. An error reply has a status code, a message and no
// payload. The worker closes a connection that sends anything but a
// well-formed request with a valid capability, with nothing written; a
// client closes one whose reply is not exactly what it asked for.
//
// Everything here checks outside input; the functions are pure (the socket
// helpers aside) and thread-safe.
#ifndef TESSERA_TRANSPORT_TCP_WIRE_H_
#define TESSERA_TRANSPORT_TCP_WIRE_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "proto/data.pb.h"

namespace tessera {

inline constexpr uint32_t kDataPortVersion = 1;
inline constexpr size_t kDataPrefaceBytes = 8;
inline constexpr size_t kDataHeaderBytes = 16;
// Most bytes of a request's meta (a row read of kMaxRowsPerRead rows fits
// with room to spare).
inline constexpr uint32_t kMaxDataMetaBytes = 1 << 20;
// Most bytes of a reply's error message.
inline constexpr uint32_t kMaxDataMessageBytes = 4096;
// Most bytes of a capability (core/capability.h refuses longer ones).
inline constexpr size_t kMaxDataCapabilityBytes = 4096;
// Most shards one row read names.
inline constexpr int kMaxDataRowShards = 4096;

enum class DataOp : uint32_t {
  kRead = 1,      // a box of a shard
  kReadRows = 2,  // whole rows of shards
  kWrite = 3,     // a whole pending shard, or a sub-box of one
};

struct DataRequestHeader {
  DataOp op = DataOp::kRead;
  uint32_t meta_bytes = 0;
  uint64_t payload_bytes = 0;
};

struct DataReplyHeader {
  absl::StatusCode code = absl::StatusCode::kOk;
  uint32_t message_bytes = 0;
  uint64_t payload_bytes = 0;
};

// The client's first 8 bytes.
std::string DataPreface();
// OK when `bytes` is exactly DataPreface(); INVALID_ARGUMENT otherwise.
absl::Status CheckDataPreface(absl::string_view bytes);

void EncodeRequestHeader(const DataRequestHeader& header,
                         char out[kDataHeaderBytes]);
// INVALID_ARGUMENT for an unknown op, meta of 0 or more than
// kMaxDataMetaBytes bytes, or a payload on anything but a write.
absl::StatusOr<DataRequestHeader> DecodeRequestHeader(absl::string_view bytes);

// A request's meta, parsed and checked for its op: a capability of at most
// kMaxDataCapabilityBytes; a read's or write's box of 1..kMaxRank dims with
// sizes >= 0 (a write may name none: the whole shard) and element size in
// [1, 64]; a row read's 1..kMaxDataRowShards entries of at most
// kMaxRowsPerRead rows in all, and no box. INVALID_ARGUMENT otherwise.
absl::StatusOr<v1::DataRequest> ParseDataRequest(DataOp op,
                                                 absl::string_view meta);
// The box a read or write names (a write without one: nullopt-like empty
// box of rank 0).
Box RequestBox(const v1::DataRequest& request);

void EncodeReplyHeader(const DataReplyHeader& header,
                       char out[kDataHeaderBytes]);
// A reply's header, checked against what was asked: OK with exactly
// `expected_payload` bytes, or an error code (not OK, known) with a
// message of at most kMaxDataMessageBytes and no payload. DATA_LOSS
// otherwise (the connection is then beyond use).
absl::StatusOr<DataReplyHeader> DecodeReplyHeader(absl::string_view bytes,
                                                  uint64_t expected_payload);

// Blocking socket I/O that never hangs: each call gives up with
// UNAVAILABLE once nothing moves for `idle`, or when the peer closes or
// resets the connection (`what` names the peer in the error). The socket
// may be blocking; these wait with poll().

// Reads exactly the bytes of the spans of `iov`, in order.
absl::Status ReceiveFully(int fd, absl::Span<const iovec> iov,
                          absl::Duration idle, absl::string_view what);
absl::Status ReceiveFully(int fd, char* data, size_t bytes, absl::Duration idle,
                          absl::string_view what);
// Writes every span of `iov`, in order (sendmsg, never SIGPIPE).
absl::Status SendFully(int fd, absl::Span<const iovec> iov, absl::Duration idle,
                       absl::string_view what);
// Waits until `fd` has bytes to read or its peer closed (true), or `wait`
// passes (false).
bool WaitReadable(int fd, absl::Duration wait);
// Waits up to `wait` for poll() `events` on `fd`: 1 ready, 0 timed out, -1
// error.
int PollFor(int fd, short events, absl::Duration wait);

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_TCP_WIRE_H_
