#include "worker/data_port.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/box_runs.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "core/threads.h"
#include "rpc/listener_guard.h"
#include "rpc/tcp_socket.h"
#include "spdlog/spdlog.h"
#include "transport/data_stream.h"
#include "transport/tcp_wire.h"

namespace tessera {
namespace {

// The gRPC twins whose capabilities the data port's requests carry.
constexpr char kReadMethod[] = "/tessera.v1.Worker/ReadRegion";
constexpr char kRowsMethod[] = "/tessera.v1.Worker/ReadRows";
constexpr char kWriteMethod[] = "/tessera.v1.Worker/WriteShard";

// The buffer of packed reads and of writes, and the window of a direct
// read's spans.
constexpr int64_t kBufferBytes = int64_t{4} << 20;

// Takes `bytes` of a budget shared by a port's connections while it
// lives; `ok()` false (nothing taken) when the budget has not that much
// left.
class BudgetLease {
 public:
  BudgetLease(std::atomic<int64_t>* used, int64_t budget, int64_t bytes)
      : used_(used), bytes_(bytes) {
    if (used_->fetch_add(bytes_) + bytes_ > budget) {
      used_->fetch_sub(bytes_);
      bytes_ = -1;
    }
  }
  ~BudgetLease() {
    if (bytes_ > 0) used_->fetch_sub(bytes_);
  }
  BudgetLease(const BudgetLease&) = delete;
  BudgetLease& operator=(const BudgetLease&) = delete;
  bool ok() const { return bytes_ >= 0; }

 private:
  std::atomic<int64_t>* const used_;
  int64_t bytes_;
};

// What a request's handling leaves the connection: in step for the next
// request, or to be closed (a write's bytes left unread, a peer gone).
enum class After { kNext, kClose };

// One connection's requests, served in order.
class Session {
 public:
  Session(WorkerNode* node, const DataPortOptions& options, DataStream* stream,
          std::atomic<int64_t>* sent, std::atomic<int64_t>* received,
          std::atomic<int64_t>* meta_in_flight)
      : node_(node),
        options_(options),
        stream_(stream),
        sent_(sent),
        received_(received),
        meta_in_flight_(meta_in_flight) {}

  // Serves until the peer leaves, stalls, idles out or misbehaves; true
  // when it was closed for a malformed request or a refused capability.
  bool Run(const std::atomic<bool>& stopping, std::atomic<int64_t>* requests);

 private:
  // Sends the reply header (and `status`'s message, for an error) and then
  // `payload`.
  absl::Status Reply(const absl::Status& status,
                     absl::Span<const iovec> payload = {},
                     uint64_t payload_bytes = 0);
  // An OK reply of `bytes` bytes straight out of `data`, the memory of an
  // array of `shape`: the elements of `box`, window by window (the first
  // one sent with the header).
  absl::Status ReplyFrom(char* data, absl::Span<const int64_t> shape,
                         const Box& box, int64_t item, uint64_t bytes);
  // `principal`: whom the capability was granted to, whose rate the reply
  // keeps (WorkerNode::PaceRead).
  After Read(const v1::DataRequest& request, absl::string_view principal);
  After ReadRows(const v1::DataRequest& request, absl::string_view principal);
  After Write(const v1::DataRequest& request, uint64_t payload_bytes);
  // A write's `expected` bytes received into a buffer and copied into
  // shard `id` (into `box` of it for a patch): memory the host cannot
  // address, or runs too short to receive into one by one. kNext once all
  // landed (nothing answered yet).
  After WriteThroughBuffer(uint64_t id, bool patch, const Box& box,
                           int64_t expected);
  // Replies with an error; keeps the connection if it stays in step.
  After Refuse(const absl::Status& status, After after = After::kNext) {
    return Reply(status).ok() ? after : After::kClose;
  }

  WorkerNode* const node_;
  const DataPortOptions& options_;
  DataStream* const stream_;
  std::atomic<int64_t>* const sent_;
  std::atomic<int64_t>* const received_;
  // Meta bytes held by all connections before their capability is checked.
  std::atomic<int64_t>* const meta_in_flight_;
};

bool Session::Run(const std::atomic<bool>& stopping,
                  std::atomic<int64_t>* requests) {
  const absl::Duration stall = options_.stall_timeout;
  char preface[kDataPrefaceBytes];
  if (!stream_->Receive(preface, sizeof(preface), stall, "peer").ok())
    return false;
  if (!CheckDataPreface(absl::string_view(preface, sizeof(preface))).ok())
    return true;
  // Under TLS the preface is answered in kind: the client learns that its
  // certificate was taken (TLS 1.3 tells a refusal only after the client's
  // handshake is done) before it sends a request.
  if (stream_->tls()) {
    const iovec echo{preface, sizeof(preface)};
    if (!stream_->Send(absl::MakeConstSpan(&echo, 1), stall, "peer").ok())
      return false;
  }
  while (!stopping.load()) {
    if (!stream_->WaitReadable(options_.idle_timeout)) return false;
    char header_bytes[kDataHeaderBytes];
    if (!stream_->Receive(header_bytes, sizeof(header_bytes), stall, "peer")
             .ok()) {
      return false;
    }
    absl::StatusOr<DataRequestHeader> header = DecodeRequestHeader(
        absl::string_view(header_bytes, sizeof(header_bytes)));
    if (!header.ok()) return true;
    // What strangers can make the worker hold before a capability is
    // checked is bounded for the whole port, not per connection.
    BudgetLease lease(meta_in_flight_, options_.max_meta_in_flight,
                      header->meta_bytes);
    if (!lease.ok()) return true;
    std::string meta(header->meta_bytes, '\0');
    if (!stream_->Receive(meta.data(), meta.size(), stall, "peer").ok())
      return false;
    absl::StatusOr<v1::DataRequest> request =
        ParseDataRequest(header->op, meta);
    if (!request.ok()) return true;
    std::vector<uint64_t> ids;
    const char* method = kReadMethod;
    if (header->op == DataOp::kReadRows) {
      method = kRowsMethod;
      for (const v1::DataRows& entry : request->rows())
        ids.push_back(entry.shard_id());
    } else {
      if (header->op == DataOp::kWrite) method = kWriteMethod;
      ids.push_back(request->shard_id());
    }
    // A valid capability for a shard no longer held is answered (as gRPC
    // answers it); any other refusal closes the connection unanswered.
    std::string principal;
    absl::Status admitted =
        node_->Admit(request->capability(), method, ids, &principal);
    if (!admitted.ok() && !absl::IsNotFound(admitted)) return true;
    requests->fetch_add(1);
    if (!admitted.ok()) {
      const After next =
          header->payload_bytes == 0 ? After::kNext : After::kClose;
      if (Refuse(admitted, next) == After::kClose) return false;
      continue;
    }
    After after = After::kNext;
    const std::shared_ptr<void> moving = node_->MovingBytes();
    switch (header->op) {
      case DataOp::kRead:
        after = Read(*request, principal);
        break;
      case DataOp::kReadRows:
        after = ReadRows(*request, principal);
        break;
      case DataOp::kWrite:
        after = Write(*request, header->payload_bytes);
        break;
    }
    if (after == After::kClose) return false;
  }
  return false;
}

absl::Status Session::Reply(const absl::Status& status,
                            absl::Span<const iovec> payload,
                            uint64_t payload_bytes) {
  std::string message(status.message().substr(0, kMaxDataMessageBytes));
  char header[kDataHeaderBytes];
  EncodeReplyHeader({status.code(), static_cast<uint32_t>(message.size()),
                     status.ok() ? payload_bytes : 0},
                    header);
  std::vector<iovec> parts;
  parts.reserve(2 + payload.size());
  parts.push_back({header, sizeof(header)});
  if (!message.empty()) parts.push_back({message.data(), message.size()});
  if (status.ok()) parts.insert(parts.end(), payload.begin(), payload.end());
  absl::Status sent = stream_->Send(parts, options_.stall_timeout, "peer");
  // A packed read's bytes follow the header and are counted as they go.
  if (sent.ok() && !payload.empty())
    sent_->fetch_add(static_cast<int64_t>(payload_bytes));
  return sent;
}

absl::Status Session::ReplyFrom(char* data, absl::Span<const int64_t> shape,
                                const Box& box, int64_t item, uint64_t bytes) {
  char header[kDataHeaderBytes];
  EncodeReplyHeader({absl::StatusCode::kOk, 0, bytes}, header);
  std::vector<iovec> parts;
  return ForEachSpanWindow(
      data, shape, box.offsets, box.sizes, item, kBufferBytes,
      [&](absl::Span<const iovec> spans, int64_t n) {
        absl::Span<const iovec> out = spans;
        if (parts.empty()) {  // a small read leaves in one segment
          parts.push_back({header, sizeof(header)});
          parts.insert(parts.end(), spans.begin(), spans.end());
          out = parts;
        }
        TESSERA_RETURN_IF_ERROR(
            stream_->Send(out, options_.stall_timeout, "peer"));
        sent_->fetch_add(n);
        return absl::OkStatus();
      });
}

After Session::Read(const v1::DataRequest& request,
                    absl::string_view principal) {
  const uint64_t id = request.shard_id();
  const Box box = RequestBox(request);
  absl::StatusOr<RegionReader> reader = node_->OpenRegion(id, box, 0);
  if (!reader.ok()) return Refuse(reader.status());
  const int64_t item = reader->item();
  if (item != request.item_bytes()) {
    return Refuse(absl::InvalidArgumentError(
        absl::StrCat("shard ", id, " has ", item, "-byte elements, not ",
                     request.item_bytes())));
  }
  const int64_t total = reader->total();
  const uint64_t bytes = static_cast<uint64_t>(total * item);
  node_->PaceRead(principal, static_cast<int64_t>(bytes));
  // Straight out of shard memory when the runs are long enough.
  absl::StatusOr<PinnedShard> pinned = node_->store().Pin(id);
  if (pinned.ok() && total > 0 &&
      stream_->SendsDirectly(pinned->desc.box.sizes, box.offsets, box.sizes,
                             item)) {
    return ReplyFrom(pinned->data, pinned->desc.box.sizes, box, item, bytes)
                   .ok()
               ? After::kNext
               : After::kClose;
  }
  // Packed through a buffer: short runs, or memory the host cannot address.
  if (!Reply(absl::OkStatus(), {}, bytes).ok()) return After::kClose;
  const int64_t step = std::max<int64_t>(1, kBufferBytes / item);
  std::string buffer(static_cast<size_t>(std::min(step, total) * item), '\0');
  for (int64_t first = 0; first < total;) {
    const int64_t count = std::min(step, total - first);
    // The header promised the bytes: a failure now can only end the
    // connection, which the reader sees as a broken read.
    if (!reader->Read(first, count, buffer.data()).ok()) return After::kClose;
    const iovec part{buffer.data(), static_cast<size_t>(count * item)};
    if (!stream_
             ->Send(absl::MakeConstSpan(&part, 1), options_.stall_timeout,
                    "peer")
             .ok()) {
      return After::kClose;
    }
    sent_->fetch_add(count * item);
    first += count;
  }
  return After::kNext;
}

After Session::ReadRows(const v1::DataRequest& request,
                        absl::string_view principal) {
  std::vector<WorkerNode::ShardRows> shards;
  shards.reserve(request.rows_size());
  for (const v1::DataRows& entry : request.rows()) {
    shards.push_back(
        {entry.shard_id(),
         std::vector<int64_t>(entry.rows().begin(), entry.rows().end())});
  }
  std::string rows;
  if (absl::Status s = node_->ReadRows(shards, &rows); !s.ok())
    return Refuse(s);
  node_->PaceRead(principal, static_cast<int64_t>(rows.size()));
  const iovec part{rows.data(), rows.size()};
  return Reply(absl::OkStatus(), absl::MakeConstSpan(&part, 1), rows.size())
                 .ok()
             ? After::kNext
             : After::kClose;
}

After Session::Write(const v1::DataRequest& request, uint64_t payload_bytes) {
  const uint64_t id = request.shard_id();
  // Refusals before the bytes leave them unread: the connection closes.
  absl::StatusOr<ShardDesc> desc = node_->store().Describe(id);
  if (!desc.ok()) return Refuse(desc.status(), After::kClose);
  const int64_t item = static_cast<int64_t>(ItemSize(desc->dtype));
  if (item != request.item_bytes()) {
    return Refuse(absl::InvalidArgumentError(absl::StrCat(
                      "shard ", id, " has ", item, "-byte elements, not ",
                      request.item_bytes())),
                  After::kClose);
  }
  const bool patch = request.sizes_size() > 0;
  const Box box = RequestBox(request);
  if (patch) {
    if (absl::Status s = CheckWithin(box, desc->box.sizes, "written region");
        !s.ok()) {
      return Refuse(s, After::kClose);
    }
  }
  const int64_t expected = patch ? box.NumElements() * item : desc->ByteSize();
  if (payload_bytes != static_cast<uint64_t>(expected)) {
    return Refuse(absl::InvalidArgumentError(absl::StrCat(
                      "a write of ", payload_bytes, " bytes to ",
                      patch ? "region " + box.ToString() + " of " : "",
                      "shard ", id, ", which takes ", expected)),
                  After::kClose);
  }
  // Straight into shard memory when its runs are long enough.
  const Box target = patch ? box : WholeBox(desc->box.sizes);
  absl::StatusOr<PinnedShard> pinned = node_->store().Pin(id);
  if (pinned.ok() && expected > 0 && !target.sizes.empty() &&
      stream_->ReceivesDirectly(pinned->desc.box.sizes, target.offsets,
                                target.sizes, item)) {
    const absl::Status landed = ForEachSpanWindow(
        pinned->data, pinned->desc.box.sizes, target.offsets, target.sizes,
        item, kBufferBytes, [&](absl::Span<const iovec> spans, int64_t n) {
          TESSERA_RETURN_IF_ERROR(
              stream_->Receive(spans, options_.stall_timeout, "peer"));
          received_->fetch_add(n);
          return absl::OkStatus();
        });
    if (!landed.ok()) return After::kClose;
  } else if (After after = WriteThroughBuffer(id, patch, box, expected);
             after == After::kClose) {
    return after;
  }
  // Written whole: sealed, as a whole WriteShard stream seals it.
  if (!patch) node_->Seal(id);
  return Reply(absl::OkStatus()).ok() ? After::kNext : After::kClose;
}

After Session::WriteThroughBuffer(uint64_t id, bool patch, const Box& box,
                                  int64_t expected) {
  std::string buffer(
      static_cast<size_t>(std::min<int64_t>(kBufferBytes, expected)), '\0');
  for (int64_t offset = 0; offset < expected;) {
    const int64_t n = std::min<int64_t>(kBufferBytes, expected - offset);
    if (!stream_
             ->Receive(buffer.data(), static_cast<size_t>(n),
                       options_.stall_timeout, "peer")
             .ok()) {
      return After::kClose;
    }
    received_->fetch_add(n);
    const absl::string_view chunk(buffer.data(), static_cast<size_t>(n));
    absl::Status s = patch ? node_->WriteBox(id, box, offset, chunk)
                           : node_->Write(id, offset, chunk);
    // Its remaining bytes are unread: answered, then closed.
    if (!s.ok()) return Refuse(s, After::kClose);
    offset += n;
  }
  return After::kNext;
}

// A client that speaks plaintext to a TLS port is told so in the clear (a
// fixed message, nothing secret) and closed: true when `fd`'s first bytes
// are the plaintext preface (counted on `refused` before it is answered).
bool AnswerPlaintextClient(int fd, absl::Duration wait,
                           std::atomic<int64_t>* refused) {
  if (!WaitReadable(fd, wait)) return false;
  char first[4];
  if (recv(fd, first, sizeof(first), MSG_PEEK | MSG_DONTWAIT) !=
          static_cast<ssize_t>(sizeof(first)) ||
      DataPreface().compare(0, sizeof(first), first, sizeof(first)) != 0) {
    return false;
  }
  // Counted before the answer: a client that has read it sees the count.
  refused->fetch_add(1);
  const std::string message =
      "this worker's data port speaks TLS: give the client the cluster's "
      "--tls_ca (and its --tls_cert and --tls_key)";
  char header[kDataHeaderBytes];
  EncodeReplyHeader({absl::StatusCode::kUnauthenticated,
                     static_cast<uint32_t>(message.size()), 0},
                    header);
  const iovec parts[2] = {{header, sizeof(header)},
                          {const_cast<char*>(message.data()), message.size()}};
  if (!SendFully(fd, parts, absl::Seconds(1), "peer").ok()) return true;
  // What the client sent is read and dropped before the close, so that the
  // close does not reset the connection before the answer is read.
  shutdown(fd, SHUT_WR);
  char sink[4096];
  for (int64_t drained = 0; drained < (int64_t{1} << 20);) {
    if (!WaitReadable(fd, absl::Seconds(1))) break;
    const ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n <= 0) break;
    drained += n;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPort>> DataPort::Start(
    WorkerNode* node, DataPortOptions options) {
  TESSERA_ASSIGN_OR_RETURN(auto bound, ListenTcp(options.listen));
  GuardListener(bound.second, options.max_connections, options.max_per_peer,
                "data");
  std::unique_ptr<DataPort> port(
      new DataPort(node, std::move(options), bound.first, bound.second));
  std::optional<std::thread> acceptor =
      TryStartThread([p = port.get()] { p->AcceptLoop(); });
  if (!acceptor.has_value()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("data port ", port->port(),
                     ": no thread for its acceptor: ", std::strerror(errno)));
  }
  port->acceptor_ = std::move(*acceptor);
  return port;
}

DataPort::DataPort(WorkerNode* node, DataPortOptions options, int listen_fd,
                   int port)
    : node_(node),
      options_(std::move(options)),
      listen_fd_(listen_fd),
      port_(port) {}

DataPort::~DataPort() {
  stopping_.store(true);
  // Wakes the acceptor's accept() (Linux answers EINVAL from then on).
  shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  {
    absl::MutexLock lock(&open_->mu);
    for (int fd : open_->fds) shutdown(fd, SHUT_RDWR);
    open_->mu.Await(absl::Condition(
        +[](int* serving) { return *serving == 0; }, &open_->serving));
  }
  ReleaseListener(port_);
  close(listen_fd_);
}

DataPortStats DataPort::Stats() const {
  DataPortStats stats;
  stats.connections = connections_.load();
  stats.refused = refused_.load();
  stats.dropped = dropped_.load();
  stats.tls_refused = tls_refused_.load();
  stats.requests = requests_.load();
  stats.bytes_sent = bytes_sent_.load();
  stats.bytes_received = bytes_received_.load();
  absl::MutexLock lock(&open_->mu);
  stats.open = open_->serving;
  return stats;
}

void DataPort::Serve(int fd) {
  std::unique_ptr<DataStream> stream;
  if (options_.tls == nullptr) {
    stream = DataStream::Plain(fd);
  } else {
    if (AnswerPlaintextClient(fd, options_.handshake_timeout, &tls_refused_))
      return;
    absl::StatusOr<std::unique_ptr<DataStream>> accepted = DataStream::Accept(
        fd, options_.tls->Get().get(), options_.handshake_timeout);
    if (!accepted.ok()) {
      tls_refused_.fetch_add(1);
      spdlog::debug("data port: {}", accepted.status().ToString());
      return;
    }
    stream = *std::move(accepted);
  }
  Session session(node_, options_, stream.get(), &bytes_sent_, &bytes_received_,
                  &meta_in_flight_);
  if (session.Run(stopping_, &requests_)) dropped_.fetch_add(1);
}

void DataPort::AcceptLoop() {
  while (!stopping_.load()) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_.load()) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      continue;
    }
    {
      absl::MutexLock lock(&open_->mu);
      if (open_->serving >= options_.max_connections) {
        refused_.fetch_add(1);
        close(fd);
        continue;
      }
      ++open_->serving;
      open_->fds.insert(fd);
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // Counted before its thread runs, so that a peer served and gone is
    // always in the count.
    connections_.fetch_add(1);
    std::optional<std::thread> serving =
        TryStartThread([this, fd, open = open_] {
          Serve(fd);
          // The port may be destroyed from here on: only `open` is touched.
          absl::MutexLock lock(&open->mu);
          open->fds.erase(fd);
          close(fd);
          --open->serving;
        });
    if (serving.has_value()) {
      serving->detach();
      continue;
    }
    connections_.fetch_sub(1);
    // No thread to serve it (the worker, or its container, is at its limit
    // of tasks): refused as one over max_connections is; the port goes on.
    const int error = errno;
    {
      absl::MutexLock lock(&open_->mu);
      open_->fds.erase(fd);
      --open_->serving;
    }
    close(fd);
    refused_.fetch_add(1);
    int64_t refused = 0;
    if (no_thread_log_.Due(&refused)) {
      spdlog::warn(
          "data port {}: no thread to serve a connection ({}; the worker is "
          "at its limit of tasks): refused {} connection(s) since the last "
          "such message",
          port_, std::strerror(error), refused);
    }
  }
}

}  // namespace tessera
