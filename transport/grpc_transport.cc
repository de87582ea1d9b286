#include "transport/grpc_transport.h"

#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"
#include "rpc/call.h"
#include "rpc/convert.h"
#include "rpc/security.h"
#include "rpc/status.h"

namespace tessera {
namespace {

constexpr char kReadRegionMethod[] = "/tessera.v1.Worker/ReadRegion";
constexpr char kReadSmallRegionMethod[] = "/tessera.v1.Worker/ReadSmallRegion";
constexpr char kReadSmallRegionsMethod[] =
    "/tessera.v1.Worker/ReadSmallRegions";

absl::Status WithContext(const absl::Status& status,
                         absl::string_view context_text) {
  return context_text.empty() ? status : Annotate(status, context_text);
}

size_t PutVarint(uint64_t v, uint8_t* out) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  out[n++] = static_cast<uint8_t>(v);
  return n;
}

// Reads bytes across a sequence of slices.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices)
      : slices_(slices) {
    SkipEmpty();
  }
  bool done() const { return index_ >= slices_.size(); }
  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = slices_[index_].begin()[pos_];
    Advance(1);
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // Takes the next `n` bytes as views into the slices (or skips them).
  bool Take(uint64_t n, std::vector<absl::string_view>* views) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[index_];
      const size_t k = std::min<uint64_t>(n, s.size() - pos_);
      if (views != nullptr) {
        views->emplace_back(reinterpret_cast<const char*>(s.begin()) + pos_, k);
      }
      Advance(k);
      n -= k;
    }
    return true;
  }

 private:
  void Advance(size_t k) {
    pos_ += k;
    if (pos_ == slices_[index_].size()) {
      ++index_;
      pos_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (index_ < slices_.size() && slices_[index_].size() == 0) ++index_;
  }
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t pos_ = 0;
};

// Delivers a message's payload views to the sink in whole elements: an
// element split across two slices is joined in a small buffer first.
class AlignedDelivery {
 public:
  AlignedDelivery(const ChunkSink& sink, int64_t align)
      : sink_(sink), align_(align) {}

  absl::Status Deliver(int64_t offset,
                       const std::vector<absl::string_view>& views) {
    char carry[64];
    int64_t carried = 0;
    for (absl::string_view v : views) {
      if (carried > 0) {
        const int64_t k = std::min<int64_t>(align_ - carried, v.size());
        std::memcpy(carry + carried, v.data(), k);
        carried += k;
        v.remove_prefix(k);
        if (carried < align_) continue;
        TESSERA_RETURN_IF_ERROR(
            sink_(offset, absl::string_view(carry, align_)));
        offset += align_;
        carried = 0;
      }
      const int64_t whole = static_cast<int64_t>(v.size()) / align_ * align_;
      if (whole > 0) {
        TESSERA_RETURN_IF_ERROR(sink_(offset, v.substr(0, whole)));
        offset += whole;
      }
      v.remove_prefix(whole);
      std::memcpy(carry, v.data(), v.size());
      carried = static_cast<int64_t>(v.size());
    }
    if (carried != 0)
      return absl::DataLossError("chunk is not aligned to whole elements");
    return absl::OkStatus();
  }

 private:
  const ChunkSink& sink_;
  const int64_t align_;
};

v1::ReadRegionRequest MakeRequest(uint64_t shard_id, const Box& box) {
  v1::ReadRegionRequest request;
  request.set_shard_id(shard_id);
  BoxToProto(box, request.mutable_offsets(), request.mutable_sizes());
  return request;
}

absl::Status CheckContinues(const RegionChunkView& chunk, int64_t received,
                            int64_t total) {
  if (chunk.offset != received || chunk.size > total - received) {
    return absl::DataLossError(
        absl::StrCat("chunk at byte ", chunk.offset, " of ", chunk.size,
                     " bytes does not continue the ", total,
                     "-byte stream at byte ", received));
  }
  return absl::OkStatus();
}

// One unary call. Returns UNIMPLEMENTED untouched for workers without it.
absl::Status ReadSmall(const std::shared_ptr<grpc::Channel>& channel,
                       const v1::ReadRegionRequest& request, int64_t total,
                       int64_t item_bytes, absl::Duration timeout,
                       const ChunkSink& sink, absl::string_view capability) {
  grpc::ByteBuffer response;
  const absl::Status status =
      DataCall(timeout, capability, [&](grpc::ClientContext* context) {
        grpc::internal::RpcMethod method(kReadSmallRegionMethod,
                                         grpc::internal::RpcMethod::NORMAL_RPC,
                                         channel);
        return grpc::internal::BlockingUnaryCall<v1::ReadRegionRequest,
                                                 grpc::ByteBuffer>(
            channel.get(), method, context, request, &response);
      });
  if (!status.ok()) return status;
  return RegionReceiver(total, item_bytes, sink).ReceiveWhole(&response);
}

// A small region read waiting in a SmallReadCoalescer.
struct PendingRegionRead : SmallRead {
  std::shared_ptr<grpc::Channel> channel;
  uint64_t shard_id = 0;
  const Box* box = nullptr;
  int64_t item_bytes = 1;
  const ChunkSink* sink = nullptr;
  absl::string_view capability;
};

PendingRegionRead& Pending(SmallRead* read) {
  return *static_cast<PendingRegionRead*>(read);
}

}  // namespace

absl::Status GrpcTransport::SendSmallReads(absl::Span<SmallRead* const> reads) {
  PendingRegionRead& first = Pending(reads[0]);
  if (reads.size() == 1) {
    return ReadRegion(
        first.channel, first.shard_id, *first.box, first.item_bytes,
        std::max(absl::ZeroDuration(), first.deadline - absl::Now()),
        *first.sink, "", first.capability);
  }
  v1::ReadSmallRegionsRequest request;
  absl::Time deadline = absl::InfiniteFuture();
  int64_t total = 0;
  for (SmallRead* read : reads) {
    *request.add_regions() =
        MakeRequest(Pending(read).shard_id, *Pending(read).box);
    deadline = std::min(deadline, read->deadline);
    total += read->bytes;
  }
  grpc::ByteBuffer response;
  const absl::Status called = DataCall(
      deadline - absl::Now(), first.capability,
      [&](grpc::ClientContext* context) {
        grpc::internal::RpcMethod method(kReadSmallRegionsMethod,
                                         grpc::internal::RpcMethod::NORMAL_RPC,
                                         first.channel);
        return grpc::internal::BlockingUnaryCall<v1::ReadSmallRegionsRequest,
                                                 grpc::ByteBuffer>(
            first.channel.get(), method, context, request, &response);
      });
  if (!called.ok()) return called;
  // The reply is the reads' bytes one after another: each range goes to
  // its read's sink at that read's own offset. (The receiver lets no byte
  // outside [0, total) through, and every read holds whole elements of one
  // size, so the pieces stay whole elements.)
  size_t at = 0;
  int64_t start = 0;
  const ChunkSink route = [&](int64_t offset,
                              absl::string_view data) -> absl::Status {
    while (!data.empty()) {
      while (at < reads.size() && offset >= start + reads[at]->bytes) {
        start += reads[at]->bytes;
        ++at;
      }
      if (at == reads.size()) return absl::DataLossError("reply too long");
      PendingRegionRead& read = Pending(reads[at]);
      const size_t n = static_cast<size_t>(std::min<int64_t>(
          static_cast<int64_t>(data.size()), start + read.bytes - offset));
      if (read.status.ok())
        read.status = (*read.sink)(offset - start, data.substr(0, n));
      offset += static_cast<int64_t>(n);
      data.remove_prefix(n);
    }
    return absl::OkStatus();
  };
  return RegionReceiver(total, first.item_bytes, route).ReceiveWhole(&response);
}

int64_t GrpcTransport::coalesced_calls() {
  absl::MutexLock lock(&mu_);
  int64_t calls = 0;
  for (const auto& [address, coalescer] : coalescers_)
    calls += coalescer->coalesced_calls();
  return calls;
}

size_t GrpcTransport::coalescers() {
  absl::MutexLock lock(&mu_);
  return coalescers_.size();
}

int GrpcTransport::waiting_small_reads() {
  absl::MutexLock lock(&mu_);
  int waiting = 0;
  for (const auto& [address, coalescer] : coalescers_)
    waiting += coalescer->waiting();
  return waiting;
}

std::shared_ptr<SmallReadCoalescer> GrpcTransport::CoalescerFor(
    const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = coalescers_.find(address);
  if (it != coalescers_.end()) return it->second;
  // A worker not seen lately: the idle coalescers of others go first, so
  // that the map holds the workers in use, not every address ever seen.
  // (What one remembers, that its worker cannot coalesce, is relearnt in
  // one call; a read still inside one keeps it alive.)
  absl::erase_if(coalescers_,
                 [](const auto& entry) { return entry.second->lanes() == 0; });
  auto coalescer = std::make_shared<SmallReadCoalescer>(
      options_.small_reads_in_flight,
      [this](absl::Span<SmallRead* const> reads) {
        return SendSmallReads(reads);
      });
  coalescers_.emplace(address, coalescer);
  return coalescer;
}

void EncodeRegionChunk(int64_t offset, std::vector<grpc::Slice> data,
                       grpc::ByteBuffer* out) {
  size_t size = 0;
  for (const grpc::Slice& s : data) size += s.size();
  uint8_t header[24];
  size_t n = 0;
  if (offset != 0) {
    header[n++] = 0x08;  // field 1 (offset), varint
    n += PutVarint(static_cast<uint64_t>(offset), header + n);
  }
  header[n++] = 0x12;  // field 2 (data), length-delimited
  n += PutVarint(size, header + n);
  data.insert(data.begin(), grpc::Slice(header, n));
  grpc::ByteBuffer buffer(data.data(), data.size());
  out->Swap(&buffer);
}

absl::StatusOr<RegionChunkView> DecodeRegionChunk(grpc::ByteBuffer* buffer) {
  RegionChunkView view;
  if (!buffer->Dump(&view.slices).ok())
    return absl::DataLossError("unreadable message");
  SliceCursor cursor(view.slices);
  while (!cursor.done()) {
    uint64_t tag = 0, value = 0;
    if (!cursor.Varint(&tag)) return absl::DataLossError("truncated field tag");
    const uint64_t field = tag >> 3, wire = tag & 7;
    bool ok = true;
    if (wire == 0) {
      ok = cursor.Varint(&value);
      if (field == 1) view.offset = static_cast<int64_t>(value);
    } else if (wire == 2) {
      ok = cursor.Varint(&value) &&
           cursor.Take(value, field == 2 ? &view.data : nullptr);
      // (Only once the bytes were there: a length past the message, up
      // to 2^64, must not be added.)
      if (ok && field == 2) view.size += static_cast<int64_t>(value);
    } else if (wire == 1 || wire == 5) {
      ok = cursor.Take(wire == 1 ? 8 : 4, nullptr);
    } else {
      ok = false;
    }
    if (!ok) return absl::DataLossError("malformed ReadRegionResponse");
  }
  return view;
}

absl::StatusOr<int64_t> RegionBytes(const Box& box, int64_t item_bytes) {
  if (item_bytes < 1 || item_bytes > kMaxItemBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "element size ", item_bytes, " is not in [1, ", kMaxItemBytes, "]"));
  }
  if (box.offsets.size() != box.sizes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("box has ", box.offsets.size(), " offsets but ",
                     box.sizes.size(), " sizes"));
  }
  int64_t bytes = item_bytes;
  for (int64_t size : box.sizes) {
    if (size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("box ", box.ToString(), " has a negative size"));
    }
    TESSERA_ASSIGN_OR_RETURN(bytes, CheckedMul(bytes, size));
  }
  return bytes;
}

absl::Status RegionReceiver::Receive(grpc::ByteBuffer* message) {
  TESSERA_ASSIGN_OR_RETURN(RegionChunkView chunk, DecodeRegionChunk(message));
  TESSERA_RETURN_IF_ERROR(CheckContinues(chunk, received_, total_));
  TESSERA_RETURN_IF_ERROR(
      AlignedDelivery(sink_, item_).Deliver(chunk.offset, chunk.data));
  received_ += chunk.size;
  return absl::OkStatus();
}

absl::Status RegionReceiver::ReceiveWhole(grpc::ByteBuffer* message) {
  TESSERA_ASSIGN_OR_RETURN(RegionChunkView chunk, DecodeRegionChunk(message));
  if (received_ != 0 || chunk.offset != 0 || chunk.size != total_) {
    return absl::DataLossError(
        absl::StrCat("reply has ", chunk.size, " bytes at byte ", chunk.offset,
                     " for a read of ", total_, " bytes"));
  }
  TESSERA_RETURN_IF_ERROR(AlignedDelivery(sink_, item_).Deliver(0, chunk.data));
  received_ = total_;
  return absl::OkStatus();
}

absl::Status RegionReceiver::Finish() const {
  if (received_ != total_) {
    return absl::DataLossError(absl::StrCat("stream ended after ", received_,
                                            " of ", total_, " bytes"));
  }
  return absl::OkStatus();
}

ChunkSink SinkToTarget(const Box& box, int64_t item_bytes,
                       const ReadTarget& target) {
  return
      [&box, item_bytes, &target](int64_t byte_offset, absl::string_view data) {
        return target.Deliver(box.sizes, byte_offset / item_bytes,
                              static_cast<int64_t>(data.size()) / item_bytes,
                              data.data(), static_cast<size_t>(item_bytes));
      };
}

absl::Status ReadRegion(const std::shared_ptr<grpc::Channel>& channel,
                        uint64_t shard_id, const Box& box, int64_t item_bytes,
                        absl::Duration timeout, const ChunkSink& sink,
                        absl::string_view context_text,
                        absl::string_view capability) {
  absl::StatusOr<int64_t> bytes = RegionBytes(box, item_bytes);
  if (!bytes.ok()) return WithContext(bytes.status(), context_text);
  const int64_t total = *bytes;
  const v1::ReadRegionRequest request = MakeRequest(shard_id, box);
  if (total > 0 && total <= kChunkBytes) {
    absl::Status status = ReadSmall(channel, request, total, item_bytes,
                                    timeout, sink, capability);
    if (!absl::IsUnimplemented(status))
      return WithContext(status, context_text);
  }
  RegionReceiver receiver(total, item_bytes, sink);
  absl::Status sink_status;
  const absl::Status status =
      DataCall(timeout, capability, [&](grpc::ClientContext* context) {
        grpc::internal::RpcMethod method(
            kReadRegionMethod, grpc::internal::RpcMethod::SERVER_STREAMING,
            channel);
        std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
            grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
                channel.get(), method, context, request));
        grpc::ByteBuffer message;
        while (reader->Read(&message)) {
          sink_status = receiver.Receive(&message);
          if (!sink_status.ok()) {
            context->TryCancel();
            break;
          }
        }
        return reader->Finish();
      });
  if (!sink_status.ok()) return WithContext(sink_status, context_text);
  if (!status.ok()) return WithContext(status, context_text);
  return WithContext(receiver.Finish(), context_text);
}

absl::Status WriteShard(v1::Worker::StubInterface* stub, uint64_t shard_id,
                        int64_t size, const ChunkSource& source,
                        absl::Duration timeout, absl::string_view context_text,
                        absl::string_view capability, const Box* part) {
  v1::WriteShardResponse response;
  const absl::Status status =
      DataCall(timeout, capability, [&](grpc::ClientContext* context) {
        std::unique_ptr<grpc::ClientWriterInterface<v1::WriteShardRequest>>
            writer = stub->WriteShard(context, &response);
        v1::WriteShardRequest chunk;
        chunk.set_shard_id(shard_id);
        if (part != nullptr) {
          chunk.mutable_box_offsets()->Assign(part->offsets.begin(),
                                              part->offsets.end());
          chunk.mutable_box_sizes()->Assign(part->sizes.begin(),
                                            part->sizes.end());
        }
        int64_t offset = 0;
        // An empty shard still sends one message so the worker sees the
        // shard id.
        do {
          const int64_t n = std::min(kChunkBytes, size - offset);
          chunk.set_offset(offset);
          std::string* data = chunk.mutable_data();
          data->resize(static_cast<size_t>(n));
          if (n > 0) source(offset, absl::MakeSpan(data->data(), data->size()));
          if (!writer->Write(chunk))
            break;  // the server ended the stream: Finish says why
          offset += n;
        } while (offset < size);
        writer->WritesDone();
        return writer->Finish();
      });
  if (!status.ok()) return WithContext(status, context_text);
  if (response.bytes_written() != size) {
    return WithContext(absl::DataLossError(absl::StrCat(
                           "worker stored ", response.bytes_written(), " of ",
                           size, " bytes")),
                       context_text);
  }
  return absl::OkStatus();
}

GrpcTransport::GrpcTransport(ChannelCache* channels,
                             GrpcTransportOptions options)
    : channels_(channels), options_(options) {}

const std::string& GrpcTransport::name() const {
  static const std::string* name = new std::string("grpc");
  return *name;
}

absl::Status GrpcTransport::Read(const RemoteShard& shard, const Box& box,
                                 const ReadTarget& target) {
  const absl::Duration timeout = CallTimeout(options_.timeout);
  const ChunkSink sink = SinkToTarget(box, shard.item_bytes, target);
  const absl::StatusOr<int64_t> bytes = RegionBytes(box, shard.item_bytes);
  // One message's worth into host memory: coalesced with other callers'
  // reads of this worker when they come at once. (A sink may need the
  // caller's own thread: a device's current context.)
  if (options_.small_reads_in_flight > 0 && target.is_host_array() &&
      bytes.ok() && *bytes > 0 && *bytes <= kChunkBytes) {
    PendingRegionRead read;
    // Reads share a call only under one capability, element size and
    // cancellation (a call given up for one caller is given up for all in
    // it: callers with a cancellation of their own are never coalesced
    // with others').
    read.key =
        absl::StrCat(shard.item_bytes, " ",
                     reinterpret_cast<uintptr_t>(ScopedCancellation::Current()),
                     " ", shard.location.capability);
    read.bytes = *bytes;
    read.deadline = absl::Now() + timeout;
    read.channel = channels_->Get(shard.location.address);
    read.shard_id = shard.location.shard_id;
    read.box = &box;
    read.item_bytes = shard.item_bytes;
    read.sink = &sink;
    read.capability = shard.location.capability;
    return CoalescerFor(shard.location.address)->Read(read);
  }
  return ReadRegion(channels_->Get(shard.location.address),
                    shard.location.shard_id, box, shard.item_bytes, timeout,
                    sink, "", shard.location.capability);
}

absl::Status GrpcTransport::Write(const RemoteShard& shard,
                                  const WriteSource& source) {
  return WriteWholeShard(channels_->Get(shard.location.address), shard, source,
                         CallTimeout(options_.timeout));
}

absl::Status WriteWholeShard(const std::shared_ptr<grpc::Channel>& channel,
                             const RemoteShard& shard,
                             const WriteSource& source,
                             absl::Duration timeout) {
  const size_t item = static_cast<size_t>(shard.item_bytes);
  const Box whole = WholeBox(shard.shape);
  std::unique_ptr<v1::Worker::Stub> stub = v1::Worker::NewStub(channel);
  return WriteShard(
      stub.get(), shard.location.shard_id,
      whole.NumElements() * shard.item_bytes,
      [&](int64_t byte_offset, absl::Span<char> dst) {
        CopyBoxToFlatRange(source.data, source.shape, source.offsets,
                           whole.sizes, byte_offset / shard.item_bytes,
                           static_cast<int64_t>(dst.size()) / shard.item_bytes,
                           dst.data(), item);
        source.Sent(static_cast<int64_t>(dst.size()));
      },
      timeout, "", shard.location.capability);
}

absl::Status GrpcTransport::ReadRows(absl::Span<const ShardRows> entries,
                                     const RowSink& sink) {
  if (entries.empty()) return absl::OkStatus();
  const ShardLocation& first = entries[0].shard.location;
  std::unique_ptr<v1::Worker::Stub> stub =
      v1::Worker::NewStub(channels_->Get(first.address));
  return ReadRowsInRequests(
      *this, entries, sink, /*max_shards=*/0,
      [&](const RowRequest& rows, std::string* reply) -> absl::Status {
        v1::ReadRowsRequest request;
        for (const RowRequest::Shard& shard : rows.shards) {
          v1::ReadRowsRequest::Shard* out = request.add_shards();
          out->set_shard_id(shard.shard_id);
          out->mutable_rows()->Assign(shard.rows.begin(), shard.rows.end());
        }
        v1::ReadRowsResponse response;
        TESSERA_RETURN_IF_ERROR(
            DataCall(CallTimeout(options_.timeout), first.capability,
                     [&](grpc::ClientContext* context) {
                       return stub->ReadRows(context, request, &response);
                     }));
        *reply = std::move(*response.mutable_data());
        return absl::OkStatus();
      });
}

absl::Status GrpcTransport::WriteBox(const RemoteShard& shard, const Box& box,
                                     const WriteSource& source) {
  const size_t item = static_cast<size_t>(shard.item_bytes);
  std::unique_ptr<v1::Worker::Stub> stub =
      v1::Worker::NewStub(channels_->Get(shard.location.address));
  return WriteShard(
      stub.get(), shard.location.shard_id, box.NumElements() * shard.item_bytes,
      [&](int64_t byte_offset, absl::Span<char> dst) {
        CopyBoxToFlatRange(source.data, source.shape, source.offsets, box.sizes,
                           byte_offset / shard.item_bytes,
                           static_cast<int64_t>(dst.size()) / shard.item_bytes,
                           dst.data(), item);
      },
      CallTimeout(options_.timeout), "", shard.location.capability, &box);
}

}  // namespace tessera
