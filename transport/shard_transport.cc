#include "transport/shard_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/limits.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"

namespace tessera {

ReadTarget ReadTarget::HostArray(char* data, absl::Span<const int64_t> shape,
                                 absl::Span<const int64_t> offsets) {
  ReadTarget target;
  target.data_ = data;
  target.shape_.assign(shape.begin(), shape.end());
  target.offsets_.assign(offsets.begin(), offsets.end());
  return target;
}

ReadTarget ReadTarget::Sink(ElementSink sink) {
  ReadTarget target;
  target.sink_ = std::move(sink);
  return target;
}

ReadTarget ReadTarget::CountingInto(std::atomic<int64_t>* landed) const {
  ReadTarget target = *this;
  target.landed_ = landed_.With(landed);
  return target;
}

absl::Status ReadTarget::Deliver(absl::Span<const int64_t> box_sizes,
                                 int64_t first, int64_t count, const char* src,
                                 size_t item) const {
  if (count <= 0) return absl::OkStatus();
  if (sink_ != nullptr) {
    TESSERA_RETURN_IF_ERROR(sink_(first, count, src));
    Landed(count * static_cast<int64_t>(item));
    return absl::OkStatus();
  }
  CopyFlatRangeToBox(src, first, count, box_sizes, data_, shape_, offsets_,
                     item);
  Landed(count * static_cast<int64_t>(item));
  return absl::OkStatus();
}

int64_t RowBytes(absl::Span<const int64_t> shape, int64_t item_bytes) {
  if (shape.empty()) return 0;
  int64_t bytes = item_bytes;
  for (size_t d = 1; d < shape.size(); ++d) bytes *= shape[d];
  return bytes;
}

absl::Status ReadRowsInRequests(ShardTransport& transport,
                                absl::Span<const ShardRows> entries,
                                const RowSink& sink, size_t max_shards,
                                const RowRequestSender& send) {
  if (entries.empty()) return absl::OkStatus();
  const std::string& address = entries[0].shard.location.address;
  // The rows of the request being filled, in request order.
  struct Slot {
    size_t entry;
    size_t k;
    int64_t bytes;
  };
  std::vector<Slot> slots;
  RowRequest request;
  std::string reply;
  auto flush = [&]() -> absl::Status {
    if (slots.empty()) return absl::OkStatus();
    reply.clear();
    TESSERA_RETURN_IF_ERROR(send(request, &reply));
    // Outside input: exactly the bytes asked for, or nothing is delivered.
    if (static_cast<int64_t>(reply.size()) != request.bytes) {
      return absl::DataLossError(absl::StrCat(
          "worker at ", address, " returned ", reply.size(), " bytes for ",
          slots.size(), " rows of ", request.bytes, " bytes"));
    }
    const char* at = reply.data();
    for (const Slot& slot : slots) {
      sink(slot.entry, slot.k, at);
      at += slot.bytes;
    }
    slots.clear();
    request = RowRequest();
    return absl::OkStatus();
  };
  std::string big_row;  // a row too large for one request
  for (size_t e = 0; e < entries.size(); ++e) {
    const ShardRows& entry = entries[e];
    const RemoteShard& shard = entry.shard;
    if (shard.location.address != address || shard.shape.empty()) {
      return absl::InvalidArgumentError(
          "a row read names shards of one worker, with their shapes");
    }
    const int64_t row_bytes = RowBytes(shard.shape, shard.item_bytes);
    bool open = false;  // this entry has a shard in `request`
    for (size_t k = 0; k < entry.rows.size(); ++k) {
      if (row_bytes > kMaxChunkBytes) {
        Box row = WholeBox(shard.shape);
        row.offsets[0] = entry.rows[k];
        row.sizes[0] = 1;
        big_row.resize(static_cast<size_t>(row_bytes));
        TESSERA_RETURN_IF_ERROR(transport.Read(
            shard, row,
            ReadTarget::HostArray(big_row.data(), row.sizes,
                                  std::vector<int64_t>(row.rank(), 0))));
        sink(e, k, big_row.data());
        continue;
      }
      if (static_cast<int64_t>(slots.size()) == kMaxRowsPerRead ||
          request.bytes + row_bytes > kMaxChunkBytes ||
          (!open && max_shards > 0 && request.shards.size() == max_shards)) {
        TESSERA_RETURN_IF_ERROR(flush());
        open = false;
      }
      if (!open) {
        request.shards.push_back({shard.location.shard_id, {}});
        open = true;
      }
      request.shards.back().rows.push_back(entry.rows[k]);
      slots.push_back({e, k, row_bytes});
      request.bytes += row_bytes;
    }
  }
  return flush();
}

absl::Status ShardTransport::ReadRows(absl::Span<const ShardRows> entries,
                                      const RowSink& sink) {
  return absl::FailedPreconditionError(
      absl::StrCat("the ", name(), " transport does not read rows"));
}

absl::Status ShardTransport::WriteBox(const RemoteShard& shard, const Box& box,
                                      const WriteSource& source) {
  return absl::FailedPreconditionError(
      absl::StrCat("the ", name(), " transport does not write sub-boxes"));
}

absl::StatusOr<int64_t> ShardTransport::Transfer(const TransferBatch& batch,
                                                 TransferReceiver& receiver) {
  int64_t bytes = 0;
  for (const TransferPiece& piece : batch.pieces) {
    TESSERA_ASSIGN_OR_RETURN(PieceTarget target, receiver.TargetFor(piece));
    RemoteShard source;
    source.location.worker = batch.src_worker;
    source.location.address = batch.src_address;
    source.location.shard_id = piece.src_shard_id;
    source.location.capability = batch.src_capability;
    source.item_bytes = target.item_bytes;
    const Box box = piece.SrcBox();
    absl::Status status = Read(source, box, target.target);
    if (!status.ok()) {
      return Annotate(status, absl::StrCat("pulling shard ", piece.src_shard_id,
                                           " from ", batch.src_address));
    }
    bytes += box.NumElements() * target.item_bytes;
  }
  return bytes;
}

}  // namespace tessera
