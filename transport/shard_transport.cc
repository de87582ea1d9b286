#include "transport/shard_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
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
