#include "transport/tcp_transport.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/box_runs.h"
#include "core/limits.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/call.h"
#include "rpc/channel.h"
#include "rpc/status.h"
#include "rpc/tcp_socket.h"
#include "rpc/tls_context.h"
#include "transport/data_stream.h"

namespace tessera {
namespace {

// Bytes received or sent between progress counts, and the buffer of a
// read or write that cannot use the caller's memory directly.
constexpr int64_t kStepBytes = int64_t{4} << 20;

// A connected socket to `data_address` within `timeout`; errors name
// `what`. An address that is not HOST:PORT cannot be reached this way
// (FAILED_PRECONDITION: another transport may).
absl::StatusOr<int> Connect(const std::string& data_address,
                            absl::Duration timeout, absl::string_view what) {
  absl::StatusOr<int> fd = ConnectTcp(data_address, absl::Now() + timeout);
  if (fd.ok()) return fd;
  return absl::Status(absl::IsInvalidArgument(fd.status())
                          ? absl::StatusCode::kFailedPrecondition
                          : absl::StatusCode::kUnavailable,
                      absl::StrCat(what, ": ", fd.status().message()));
}

// Receives the box's elements straight into the caller's array, a window
// of about kStepBytes at a time, counting each as landed.
absl::Status ReceiveInPlace(DataStream& stream,
                            absl::Span<const int64_t> box_sizes, int64_t item,
                            const ReadTarget& target, absl::Duration idle,
                            absl::string_view what) {
  return ForEachSpanWindow(
      target.data(), target.shape(), target.offsets(), box_sizes, item,
      kStepBytes, [&](absl::Span<const iovec> spans, int64_t bytes) {
        TESSERA_RETURN_IF_ERROR(stream.Receive(spans, idle, what));
        target.Landed(bytes);
        return absl::OkStatus();
      });
}

// Receives `total` elements through a buffer into the target.
absl::Status ReceiveBuffered(DataStream& stream,
                             absl::Span<const int64_t> box_sizes, int64_t total,
                             int64_t item, const ReadTarget& target,
                             absl::Duration idle, absl::string_view what) {
  const int64_t step = std::max<int64_t>(1, kStepBytes / item);
  std::string buffer(static_cast<size_t>(std::min(step, total) * item), '\0');
  for (int64_t first = 0; first < total;) {
    const int64_t count = std::min(step, total - first);
    TESSERA_RETURN_IF_ERROR(stream.Receive(
        buffer.data(), static_cast<size_t>(count * item), idle, what));
    TESSERA_RETURN_IF_ERROR(target.Deliver(
        box_sizes, first, count, buffer.data(), static_cast<size_t>(item)));
    first += count;
  }
  return absl::OkStatus();
}

// Sends elements [0, total) of the row-major `box_sizes` at
// source.offsets of source.data: straight from the array when the stream
// sends its rows directly (or the box is one span of it), else packed
// through a buffer.
absl::Status SendBox(DataStream& stream, const WriteSource& source,
                     absl::Span<const int64_t> box_sizes, int64_t total,
                     int64_t item, absl::Duration idle,
                     absl::string_view what) {
  if (total == 0) return absl::OkStatus();
  if (stream.SendsDirectly(source.shape, source.offsets, box_sizes, item)) {
    // The spans are only read from (sendmsg takes iovecs, not const ones).
    return ForEachSpanWindow(
        const_cast<char*>(source.data), source.shape, source.offsets, box_sizes,
        item, kStepBytes, [&](absl::Span<const iovec> spans, int64_t bytes) {
          TESSERA_RETURN_IF_ERROR(stream.Send(spans, idle, what));
          source.Sent(bytes);
          return absl::OkStatus();
        });
  }
  const int64_t step = std::max<int64_t>(1, kStepBytes / item);
  std::string buffer(static_cast<size_t>(std::min(step, total) * item), '\0');
  for (int64_t first = 0; first < total;) {
    const int64_t count = std::min(step, total - first);
    CopyBoxToFlatRange(source.data, source.shape, source.offsets, box_sizes,
                       first, count, buffer.data(), static_cast<size_t>(item));
    const iovec part{buffer.data(), static_cast<size_t>(count * item)};
    TESSERA_RETURN_IF_ERROR(
        stream.Send(absl::MakeConstSpan(&part, 1), idle, what));
    source.Sent(count * item);
    first += count;
  }
  return absl::OkStatus();
}

}  // namespace

class TcpTransport::Connection {
 public:
  explicit Connection(int fd) : fd_(fd) {}
  ~Connection() {
    stream_.reset();
    close(fd_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  int fd() const { return fd_; }
  DataStream& stream() { return *stream_; }
  void set_stream(std::unique_ptr<DataStream> stream) {
    stream_ = std::move(stream);
  }

 private:
  const int fd_;
  std::unique_ptr<DataStream> stream_;
};

// One request and what to do with its reply.
struct TcpTransport::Exchange {
  DataOp op = DataOp::kRead;
  v1::DataRequest request;
  uint64_t payload_bytes = 0;  // a write's
  // Sends the write's payload_bytes after the request.
  std::function<absl::Status(DataStream& stream, absl::Duration idle,
                             absl::string_view what)>
      send;
  uint64_t expected = 0;  // the OK reply's payload bytes
  // Receives exactly `expected` bytes.
  std::function<absl::Status(DataStream& stream, absl::Duration idle,
                             absl::string_view what)>
      receive;
};

TcpTransport::TcpTransport(ChannelCache* channels, TcpTransportOptions options)
    : channels_(channels), options_(std::move(options)) {}

TcpTransport::~TcpTransport() = default;

const std::string& TcpTransport::name() const {
  static const std::string* name = new std::string("tcp");
  return *name;
}

absl::StatusOr<std::string> TcpTransport::DataAddress(
    const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    auto it = data_addresses_.find(address);
    if (it != data_addresses_.end()) return it->second;
  }
  std::string data_address;
  if (options_.resolve) {
    TESSERA_ASSIGN_OR_RETURN(data_address, options_.resolve(address));
  } else {
    std::unique_ptr<v1::Worker::Stub> stub =
        v1::Worker::NewStub(channels_->Get(address));
    v1::DataAddressResponse response;
    // No capability: a worker's data address is no secret.
    const absl::Status status =
        DataCall(std::min(options_.timeout, absl::Seconds(10)), "",
                 [&](grpc::ClientContext* context) {
                   return stub->DataAddress(context, v1::DataAddressRequest(),
                                            &response);
                 });
    // A worker that predates data ports has none.
    if (!status.ok() && !absl::IsUnimplemented(status)) return status;
    data_address = response.data_address();
  }
  absl::MutexLock lock(&mu_);
  data_addresses_[address] = data_address;
  return data_address;
}

absl::StatusOr<std::unique_ptr<TcpTransport::Connection>> TcpTransport::Take(
    const std::string& data_address, bool* reused) {
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.find(data_address);
    if (it != idle_.end() && !it->second.empty()) {
      std::unique_ptr<Connection> c = std::move(it->second.back());
      it->second.pop_back();
      *reused = true;
      return c;
    }
  }
  *reused = false;
  const std::string what = absl::StrCat("data port ", data_address);
  TESSERA_ASSIGN_OR_RETURN(
      int fd, Connect(data_address,
                      std::min(options_.timeout, absl::Seconds(10)), what));
  auto c = std::make_unique<Connection>(fd);
  opened_.fetch_add(1);
  if (options_.tls == nullptr) {
    c->set_stream(DataStream::Plain(fd));
  } else {
    std::string host, port;
    SplitHostPort(data_address, &host, &port);
    TESSERA_ASSIGN_OR_RETURN(
        std::unique_ptr<DataStream> stream,
        DataStream::Connect(fd, options_.tls->Get().get(), host,
                            std::min(options_.timeout, absl::Seconds(10)),
                            what));
    c->set_stream(std::move(stream));
  }
  const std::string preface = DataPreface();
  const iovec part{const_cast<char*>(preface.data()), preface.size()};
  TESSERA_RETURN_IF_ERROR(
      c->stream().Send(absl::MakeConstSpan(&part, 1), options_.timeout, what));
  if (options_.tls != nullptr) {
    // The worker's answer says it took this client's certificate; a
    // refusal arrives here as its TLS alert (UNAUTHENTICATED).
    char echo[kDataPrefaceBytes];
    TESSERA_RETURN_IF_ERROR(
        c->stream().Receive(echo, sizeof(echo), options_.timeout, what));
    if (absl::string_view(echo, sizeof(echo)) != preface) {
      return absl::DataLossError(
          absl::StrCat(what, ": answered the preface with other bytes"));
    }
  }
  return c;
}

void TcpTransport::Keep(const std::string& data_address,
                        std::unique_ptr<Connection> c) {
  absl::MutexLock lock(&mu_);
  std::vector<std::unique_ptr<Connection>>& idle = idle_[data_address];
  if (static_cast<int>(idle.size()) < options_.max_idle_per_worker)
    idle.push_back(std::move(c));
}

absl::Status TcpTransport::Call(const std::string& address,
                                const Exchange& exchange) {
  absl::Status status = CallOnce(address, exchange);
  if (!absl::IsUnavailable(status)) return status;
  // A worker restarted since its data address was asked listens on another
  // port: asked again, and tried once more where it moved.
  absl::StatusOr<std::string> before = DataAddress(address);
  {
    absl::MutexLock lock(&mu_);
    data_addresses_.erase(address);
  }
  absl::StatusOr<std::string> now = DataAddress(address);
  if (!before.ok() || !now.ok() || *now == *before) return status;
  return CallOnce(address, exchange);
}

absl::Status TcpTransport::CallOnce(const std::string& address,
                                    const Exchange& exchange) {
  TESSERA_ASSIGN_OR_RETURN(std::string data_address, DataAddress(address));
  if (data_address.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker at ", address, " has no data port"));
  }
  const std::string what =
      absl::StrCat("data port ", data_address, " of worker at ", address);
  std::string meta;
  exchange.request.SerializeToString(&meta);
  char header[kDataHeaderBytes];
  EncodeRequestHeader(
      {exchange.op, static_cast<uint32_t>(meta.size()), exchange.payload_bytes},
      header);
  const iovec request[2] = {{header, sizeof(header)},
                            {meta.data(), meta.size()}};
  const absl::Duration idle = options_.timeout;
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    absl::StatusOr<std::unique_ptr<Connection>> taken =
        Take(data_address, &reused);
    if (!taken.ok()) return taken.status();
    std::unique_ptr<Connection> c = *std::move(taken);
    DataStream& stream = c->stream();
    bool replied = false;
    absl::Status status = stream.Send(request, idle, what);
    if (status.ok() && exchange.send)
      status = exchange.send(stream, idle, what);
    // A write the worker refused before its bytes: its answer is waiting
    // even though the send broke off.
    const absl::Duration reply_wait = status.ok() ? idle : absl::Seconds(1);
    char reply[kDataHeaderBytes];
    absl::Status received =
        stream.Receive(reply, sizeof(reply), reply_wait, what);
    if (received.ok()) {
      replied = true;
      absl::StatusOr<DataReplyHeader> decoded = DecodeReplyHeader(
          absl::string_view(reply, sizeof(reply)), exchange.expected);
      if (!decoded.ok()) {
        return absl::Status(
            decoded.status().code(),
            absl::StrCat(what, ": ", decoded.status().message()));
      }
      if (decoded->code != absl::StatusCode::kOk) {
        std::string message(decoded->message_bytes, '\0');
        if (!message.empty()) {
          TESSERA_RETURN_IF_ERROR(
              stream.Receive(message.data(), message.size(), idle, what));
        }
        // Still in step unless the send broke off.
        if (status.ok()) Keep(data_address, std::move(c));
        return absl::Status(decoded->code, message);
      }
      if (status.ok()) {
        status = exchange.receive ? exchange.receive(stream, idle, what)
                                  : absl::OkStatus();
      }
    } else if (status.ok()) {
      status = received;
    }
    if (status.ok()) {
      Keep(data_address, std::move(c));
      return status;
    }
    // A kept connection the worker closed while it sat idle: once more on
    // a new one, since nothing of this request was answered.
    if (!(reused && !replied && attempt == 0)) return status;
  }
}

namespace {

// A read's or write's request for `box` of `shard` (a write of the whole
// shard names no box).
v1::DataRequest BoxRequest(const RemoteShard& shard, const Box* box) {
  v1::DataRequest request;
  request.set_capability(shard.location.capability);
  request.set_shard_id(shard.location.shard_id);
  if (box != nullptr) {
    request.mutable_offsets()->Assign(box->offsets.begin(), box->offsets.end());
    request.mutable_sizes()->Assign(box->sizes.begin(), box->sizes.end());
  }
  request.set_item_bytes(shard.item_bytes);
  return request;
}

}  // namespace

absl::Status TcpTransport::Read(const RemoteShard& shard, const Box& box,
                                const ReadTarget& target) {
  const int64_t item = shard.item_bytes;
  const int64_t total = box.NumElements();
  Exchange exchange;
  exchange.op = DataOp::kRead;
  exchange.request = BoxRequest(shard, &box);
  exchange.expected = static_cast<uint64_t>(total * item);
  exchange.receive = [&](DataStream& stream, absl::Duration idle,
                         absl::string_view what) {
    // Straight into the caller's array when its runs are long enough.
    if (target.is_host_array() && total > 0 &&
        stream.ReceivesDirectly(target.shape(), target.offsets(), box.sizes,
                                item)) {
      return ReceiveInPlace(stream, box.sizes, item, target, idle, what);
    }
    return ReceiveBuffered(stream, box.sizes, total, item, target, idle, what);
  };
  return Call(shard.location.address, exchange);
}

absl::Status TcpTransport::Write(const RemoteShard& shard,
                                 const WriteSource& source) {
  return SendWrite(shard, WholeBox(shard.shape), /*patch=*/false, source);
}

absl::Status TcpTransport::WriteBox(const RemoteShard& shard, const Box& box,
                                    const WriteSource& source) {
  return SendWrite(shard, box, /*patch=*/true, source);
}

absl::Status TcpTransport::SendWrite(const RemoteShard& shard, const Box& box,
                                     bool patch, const WriteSource& source) {
  const int64_t item = shard.item_bytes;
  const int64_t total = box.NumElements();
  Exchange exchange;
  exchange.op = DataOp::kWrite;
  exchange.request = BoxRequest(shard, patch ? &box : nullptr);
  exchange.payload_bytes = static_cast<uint64_t>(total * item);
  exchange.send = [&](DataStream& stream, absl::Duration idle,
                      absl::string_view what) {
    return SendBox(stream, source, box.sizes, total, item, idle, what);
  };
  return Call(shard.location.address, exchange);
}

absl::Status TcpTransport::ReadRows(absl::Span<const ShardRows> entries,
                                    const RowSink& sink) {
  if (entries.empty()) return absl::OkStatus();
  const ShardLocation& first = entries[0].shard.location;
  return ReadRowsInRequests(
      *this, entries, sink, kMaxDataRowShards,
      [&](const RowRequest& rows, std::string* reply) -> absl::Status {
        Exchange exchange;
        exchange.op = DataOp::kReadRows;
        exchange.request.set_capability(first.capability);
        for (const RowRequest::Shard& shard : rows.shards) {
          v1::DataRows* out = exchange.request.add_rows();
          out->set_shard_id(shard.shard_id);
          out->mutable_rows()->Assign(shard.rows.begin(), shard.rows.end());
        }
        exchange.expected = static_cast<uint64_t>(rows.bytes);
        exchange.receive = [&](DataStream& stream, absl::Duration idle,
                               absl::string_view what) {
          reply->resize(static_cast<size_t>(rows.bytes));
          return stream.Receive(reply->data(), reply->size(), idle, what);
        };
        return Call(first.address, exchange);
      });
}

}  // namespace tessera
