#include "transport/tcp_wire.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "core/limits.h"
#include "rpc/convert.h"

namespace tessera {
namespace {

constexpr char kMagic[4] = {'T', 'S', 'D', 'P'};
constexpr int64_t kMaxItemBytesOnWire = 64;

void Put32(uint32_t v, char* out) { absl::little_endian::Store32(out, v); }
void Put64(uint64_t v, char* out) { absl::little_endian::Store64(out, v); }
uint32_t Get32(const char* in) { return absl::little_endian::Load32(in); }
uint64_t Get64(const char* in) { return absl::little_endian::Load64(in); }

absl::Status CheckBox(const v1::DataRequest& request, bool optional) {
  const int rank = request.sizes_size();
  if (optional && rank == 0 && request.offsets_size() == 0)
    return absl::OkStatus();
  if (rank < 1 || rank > kMaxRank || request.offsets_size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a data request's box has ", request.offsets_size(), " offsets and ",
        rank, " sizes; give 1 to ", kMaxRank, " of each"));
  }
  for (int64_t size : request.sizes()) {
    if (size < 0) {
      return absl::InvalidArgumentError(
          "a data request's box has a negative size");
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string DataPreface() {
  std::string out(kDataPrefaceBytes, '\0');
  std::memcpy(out.data(), kMagic, 4);
  Put32(kDataPortVersion, out.data() + 4);
  return out;
}

absl::Status CheckDataPreface(absl::string_view bytes) {
  if (bytes.size() != kDataPrefaceBytes ||
      std::memcmp(bytes.data(), kMagic, 4) != 0) {
    return absl::InvalidArgumentError("not a tessera data connection");
  }
  const uint32_t version = Get32(bytes.data() + 4);
  if (version != kDataPortVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("data protocol version ", version, " (this end speaks ",
                     kDataPortVersion, ")"));
  }
  return absl::OkStatus();
}

void EncodeRequestHeader(const DataRequestHeader& header,
                         char out[kDataHeaderBytes]) {
  Put32(static_cast<uint32_t>(header.op), out);
  Put32(header.meta_bytes, out + 4);
  Put64(header.payload_bytes, out + 8);
}

absl::StatusOr<DataRequestHeader> DecodeRequestHeader(absl::string_view bytes) {
  if (bytes.size() != kDataHeaderBytes) {
    return absl::InvalidArgumentError("a data request header is 16 bytes");
  }
  DataRequestHeader header;
  const uint32_t op = Get32(bytes.data());
  if (op < static_cast<uint32_t>(DataOp::kRead) ||
      op > static_cast<uint32_t>(DataOp::kWrite)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown data request op ", op));
  }
  header.op = static_cast<DataOp>(op);
  header.meta_bytes = Get32(bytes.data() + 4);
  header.payload_bytes = Get64(bytes.data() + 8);
  if (header.meta_bytes == 0 || header.meta_bytes > kMaxDataMetaBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a data request's meta is 1 to ", kMaxDataMetaBytes,
                     " bytes, not ", header.meta_bytes));
  }
  if (header.op != DataOp::kWrite && header.payload_bytes != 0) {
    return absl::InvalidArgumentError("only a write carries bytes");
  }
  return header;
}

absl::StatusOr<v1::DataRequest> ParseDataRequest(DataOp op,
                                                 absl::string_view meta) {
  v1::DataRequest request;
  if (!request.ParseFromArray(meta.data(), static_cast<int>(meta.size()))) {
    return absl::InvalidArgumentError("a data request's meta does not parse");
  }
  if (request.capability().size() > kMaxDataCapabilityBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a capability is at most ", kMaxDataCapabilityBytes, " bytes"));
  }
  if (op == DataOp::kReadRows) {
    if (request.sizes_size() > 0 || request.offsets_size() > 0) {
      return absl::InvalidArgumentError("a row read names no box");
    }
    const int shards = request.rows_size();
    if (shards < 1 || shards > kMaxDataRowShards) {
      return absl::InvalidArgumentError(absl::StrCat("a row read names 1 to ",
                                                     kMaxDataRowShards,
                                                     " shards, not ", shards));
    }
    int64_t rows = 0;
    for (const v1::DataRows& entry : request.rows()) {
      rows += entry.rows_size();
      if (entry.rows_size() == 0 || rows > kMaxRowsPerRead) {
        return absl::InvalidArgumentError(
            absl::StrCat("a row read names 1 to ", kMaxRowsPerRead,
                         " rows in all, at least one per shard"));
      }
    }
    return request;
  }
  if (request.rows_size() > 0) {
    return absl::InvalidArgumentError("only a row read names rows");
  }
  if (op == DataOp::kRead || request.sizes_size() > 0 ||
      request.offsets_size() > 0) {
    if (absl::Status s = CheckBox(request, op == DataOp::kWrite); !s.ok())
      return s;
  }
  if (request.item_bytes() < 1 || request.item_bytes() > kMaxItemBytesOnWire) {
    return absl::InvalidArgumentError(
        absl::StrCat("element size ", request.item_bytes(), " is not in [1, ",
                     kMaxItemBytesOnWire, "]"));
  }
  return request;
}

Box RequestBox(const v1::DataRequest& request) {
  Box box;
  box.offsets.assign(request.offsets().begin(), request.offsets().end());
  box.sizes.assign(request.sizes().begin(), request.sizes().end());
  return box;
}

void EncodeReplyHeader(const DataReplyHeader& header,
                       char out[kDataHeaderBytes]) {
  Put32(static_cast<uint32_t>(header.code), out);
  Put32(header.message_bytes, out + 4);
  Put64(header.payload_bytes, out + 8);
}

absl::StatusOr<DataReplyHeader> DecodeReplyHeader(absl::string_view bytes,
                                                  uint64_t expected_payload) {
  if (bytes.size() != kDataHeaderBytes) {
    return absl::DataLossError("a data reply header is 16 bytes");
  }
  DataReplyHeader header;
  const uint32_t code = Get32(bytes.data());
  header.message_bytes = Get32(bytes.data() + 4);
  header.payload_bytes = Get64(bytes.data() + 8);
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError(
        absl::StrCat("a data reply has an unknown status code ", code));
  }
  header.code = static_cast<absl::StatusCode>(code);
  if (header.message_bytes > kMaxDataMessageBytes) {
    return absl::DataLossError(
        absl::StrCat("a data reply's message of ", header.message_bytes,
                     " bytes is over ", kMaxDataMessageBytes));
  }
  if (header.code == absl::StatusCode::kOk) {
    if (header.message_bytes != 0 || header.payload_bytes != expected_payload) {
      return absl::DataLossError(
          absl::StrCat("a data reply carries ", header.payload_bytes,
                       " bytes for a request of ", expected_payload));
    }
  } else if (header.payload_bytes != 0) {
    return absl::DataLossError("an error reply carries bytes");
  }
  return header;
}

int PollFor(int fd, short events, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    const int64_t ms =
        std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (n > 0) return 1;
    if (n == 0) return 0;
    if (errno != EINTR) return -1;
  }
}

namespace {

// Moves the cursor (`at`, `offset`) past `n` bytes of `iov`.
void Advance(std::vector<iovec>& iov, size_t& at, size_t n) {
  while (n > 0 && at < iov.size()) {
    const size_t take = std::min(n, iov[at].iov_len);
    iov[at].iov_base = static_cast<char*>(iov[at].iov_base) + take;
    iov[at].iov_len -= take;
    n -= take;
    if (iov[at].iov_len == 0) ++at;
  }
  while (at < iov.size() && iov[at].iov_len == 0) ++at;
}

template <typename Io>
absl::Status MoveAll(int fd, absl::Span<const iovec> spans, short events,
                     absl::Duration idle, absl::string_view what,
                     const char* verb, const Io& io) {
  std::vector<iovec> iov(spans.begin(), spans.end());
  size_t at = 0;
  Advance(iov, at, 0);
  while (at < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + at;
    msg.msg_iovlen = std::min<size_t>(iov.size() - at, IOV_MAX);
    const ssize_t n = io(fd, &msg);
    if (n > 0) {
      Advance(iov, at, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat(what, " closed the connection"));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const int ready = PollFor(fd, events, idle);
      if (ready > 0) continue;
      if (ready == 0) {
        return absl::UnavailableError(absl::StrCat(what, " stopped: nothing ",
                                                   verb, " for ",
                                                   absl::FormatDuration(idle)));
      }
    }
    return absl::UnavailableError(
        absl::StrCat(what, ": ", verb, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

bool WaitReadable(int fd, absl::Duration wait) {
  return PollFor(fd, POLLIN, wait) != 0;
}

absl::Status ReceiveFully(int fd, absl::Span<const iovec> iov,
                          absl::Duration idle, absl::string_view what) {
  return MoveAll(
      fd, iov, POLLIN, idle, what, "received",
      [](int f, msghdr* msg) { return recvmsg(f, msg, MSG_DONTWAIT); });
}

absl::Status ReceiveFully(int fd, char* data, size_t bytes, absl::Duration idle,
                          absl::string_view what) {
  const iovec one{data, bytes};
  return ReceiveFully(fd, absl::MakeConstSpan(&one, 1), idle, what);
}

absl::Status SendFully(int fd, absl::Span<const iovec> iov, absl::Duration idle,
                       absl::string_view what) {
  return MoveAll(fd, iov, POLLOUT, idle, what, "sent", [](int f, msghdr* msg) {
    return sendmsg(f, msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  });
}

}  // namespace tessera
