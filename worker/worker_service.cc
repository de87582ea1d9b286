#include "worker/worker_service.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"
#include "rpc/convert.h"
#include "rpc/status.h"
#include "transport/grpc_transport.h"
#include "transport/shared_memory.h"

namespace tessera {
namespace {

// Validates one shard of an allocation request.
absl::StatusOr<ShardDesc> DescFromAllocate(
    const v1::AllocateShardsRequest& request, int index, DType dtype,
    const Shape& tensor_shape) {
  const v1::AllocateShardsRequest::Item& item = request.shards(index);
  const std::string field = absl::StrCat("shards[", index, "]");
  ShardDesc desc;
  desc.tensor = request.tensor();
  desc.dtype = dtype;
  desc.tensor_shape = tensor_shape;
  TESSERA_ASSIGN_OR_RETURN(desc.box,
                           BoxFromProto(item.offsets(), item.sizes(), field));
  for (int64_t s : desc.box.sizes) {
    if (s < 0)
      return OutOfBoundsError(absl::StrCat(field, " has a negative size"));
  }
  // Chunk sharding makes empty shards past the end; only non-empty ones must
  // fit. (IsEmpty, not NumElements: the sizes are not validated yet and may
  // overflow.)
  if (!desc.box.IsEmpty() || desc.box.rank() != tensor_shape.size()) {
    TESSERA_RETURN_IF_ERROR(CheckWithin(desc.box, tensor_shape, field));
  }
  // An empty shard's sizes still fit the tensor, so its volume cannot overflow.
  for (size_t d = 0; d < desc.box.rank(); ++d) {
    if (desc.box.sizes[d] > tensor_shape[d]) {
      return OutOfBoundsError(
          field, absl::StrCat("dim ", d, " has size ", desc.box.sizes[d],
                              " but the tensor's has ", tensor_shape[d]));
    }
  }
  TESSERA_RETURN_IF_ERROR(ByteSize(desc.box.sizes, ItemSize(dtype)).status());
  return desc;
}

// A sub-box of a shard named by a request, checked against the shard.
absl::StatusOr<Box> SubBox(
    const ShardDesc& desc,
    const google::protobuf::RepeatedField<int64_t>& offsets,
    const google::protobuf::RepeatedField<int64_t>& sizes,
    absl::string_view field) {
  TESSERA_ASSIGN_OR_RETURN(Box box, BoxFromProto(offsets, sizes, field));
  TESSERA_RETURN_IF_ERROR(CheckWithin(box, desc.box.sizes, field));
  return box;
}

}  // namespace

WorkerService::WorkerService(ShardStore* store, WorkerServiceOptions options)
    : store_(store), options_(options) {
  // Same method, but chunks go out as ByteBuffers of slices over the shard's
  // memory instead of protobuf copies. (Server streaming, as gRPC's
  // split-streaming handler runs it: one read, then the writes.)
  MarkMethodStreamed(
      v1::ReadRegionRequest::descriptor()
          ->file()
          ->FindServiceByName("Worker")
          ->FindMethodByName("ReadRegion")
          ->index(),
      new grpc::internal::SplitServerStreamingHandler<v1::ReadRegionRequest,
                                                      grpc::ByteBuffer>(
          [this](grpc::ServerContext* context,
                 grpc::ServerSplitStreamer<v1::ReadRegionRequest,
                                           grpc::ByteBuffer>* stream) {
            return StreamRegion(context, stream);
          }));
}

grpc::Status WorkerService::AllocateShards(
    grpc::ServerContext* context, const v1::AllocateShardsRequest* request,
    v1::AllocateShardsResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(request->dtype()));
    TESSERA_ASSIGN_OR_RETURN(
        Shape shape, ShapeFromProto(request->tensor_shape(), "tensor_shape"));
    TESSERA_ASSIGN_OR_RETURN(InitSpec init, InitFromProto(request->init()));
    TESSERA_RETURN_IF_ERROR(CheckInitValue(init, dtype));
    std::vector<ShardDesc> descs;
    descs.reserve(request->shards_size());
    for (int i = 0; i < request->shards_size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(ShardDesc desc,
                               DescFromAllocate(*request, i, dtype, shape));
      descs.push_back(std::move(desc));
    }
    // All or nothing. A caller that went away (the coordinator died
    // mid-create) will never record these shards: undo them too.
    auto undo = [&](int allocated) {
      for (int j = 0; j < allocated; ++j)
        store_->Free(request->shards(j).shard_id()).IgnoreError();
    };
    const absl::Status cancelled =
        absl::CancelledError("the caller cancelled the allocation");
    // IsCancelled polls the completion queue (tens of µs): ask every 1024
    // shards.
    for (int i = 0; i < request->shards_size(); ++i) {
      absl::Status s =
          i % 1024 == 1023 && context->IsCancelled()
              ? cancelled
              : store_->Allocate(request->shards(i).shard_id(), descs[i], init);
      if (!s.ok()) {
        undo(i);
        return s;
      }
    }
    if (context->IsCancelled()) {
      undo(request->shards_size());
      return cancelled;
    }
    return absl::OkStatus();
  }();
  response->set_bytes_used(store_->BytesUsed());
  return ToGrpcStatus(status);
}

grpc::Status WorkerService::WriteShard(
    grpc::ServerContext*, grpc::ServerReader<v1::WriteShardRequest>* reader,
    v1::WriteShardResponse* response) {
  v1::WriteShardRequest chunk;
  int64_t written = 0;
  uint64_t shard_id = 0;
  bool first = true;
  while (reader->Read(&chunk)) {
    if (first) {
      shard_id = chunk.shard_id();
      first = false;
    } else if (chunk.shard_id() != shard_id) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("write stream switched from shard ", shard_id,
                       " to shard ", chunk.shard_id())));
    }
    absl::Status status = store_->Write(shard_id, chunk.offset(), chunk.data());
    if (!status.ok()) return ToGrpcStatus(status);
    written += static_cast<int64_t>(chunk.data().size());
  }
  response->set_bytes_written(written);
  return grpc::Status::OK;
}

// A validated region read: the shard, the sub-box, and how to cut chunks.
class WorkerService::RegionReader {
 public:
  static absl::StatusOr<RegionReader> Open(ShardStore* store,
                                           const v1::ReadRegionRequest& proto,
                                           int64_t default_chunk_bytes) {
    RegionReader reader;
    reader.store_ = store;
    reader.id_ = proto.shard_id();
    TESSERA_ASSIGN_OR_RETURN(ShardDesc desc, store->Describe(proto.shard_id()));
    TESSERA_ASSIGN_OR_RETURN(
        reader.box_, SubBox(desc, proto.offsets(), proto.sizes(), "region"));
    reader.item_ = static_cast<int64_t>(ItemSize(desc.dtype));
    const int64_t chunk_bytes =
        proto.chunk_bytes() > 0
            ? std::min<int64_t>(proto.chunk_bytes(), kMaxChunkBytes)
            : default_chunk_bytes;
    reader.chunk_elements_ = std::max<int64_t>(1, chunk_bytes / reader.item_);
    reader.total_ = reader.box_.NumElements();
    // A sub-box whose dims before the last partial one are 1 is one run of
    // the shard's memory: its chunks are sent straight from there.
    absl::StatusOr<PinnedShard> pinned = store->Pin(reader.id_);
    if (pinned.ok() && reader.total_ > 0) {
      const BoxCoords& shape = pinned->desc.box.sizes;
      size_t last_partial = 0;
      for (size_t d = 0; d < shape.size(); ++d) {
        if (reader.box_.sizes[d] != shape[d]) last_partial = d;
      }
      bool contiguous = true;
      for (size_t d = 0; d < last_partial; ++d)
        contiguous &= reader.box_.sizes[d] == 1;
      if (contiguous) {
        reader.base_ =
            pinned->data + BoxByteSpan(shape, reader.box_, reader.item_).first;
        reader.pinned_ = std::move(pinned->keep_alive);
      }
    }
    return reader;
  }

  int64_t total() const { return total_; }
  uint64_t id() const { return id_; }
  const Box& box() const { return box_; }
  int64_t chunk_elements() const { return chunk_elements_; }
  int64_t item() const { return item_; }

  // Elements [begin, begin + count) as one serialized ReadRegionResponse.
  absl::Status Chunk(int64_t begin, int64_t count,
                     grpc::ByteBuffer* out) const {
    const size_t bytes = static_cast<size_t>(count * item_);
    std::vector<grpc::Slice> data;
    if (bytes > 0 && base_ != nullptr) {
      data.emplace_back(base_ + begin * item_, bytes, &ReleasePin,
                        new std::shared_ptr<void>(pinned_));
    } else if (bytes > 0) {
      grpc::Slice slice(bytes);
      TESSERA_RETURN_IF_ERROR(store_->ReadBox(
          id_, box_, begin, count,
          reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()))));
      data.push_back(std::move(slice));
    }
    EncodeRegionChunk(begin * item_, std::move(data), out);
    return absl::OkStatus();
  }

 private:
  static void ReleasePin(void* pin) {
    delete static_cast<std::shared_ptr<void>*>(pin);
  }

  ShardStore* store_ = nullptr;
  uint64_t id_ = 0;
  Box box_;
  int64_t item_ = 1;
  int64_t chunk_elements_ = 1;
  int64_t total_ = 0;
  std::shared_ptr<void> pinned_;  // set with base_
  char* base_ = nullptr;          // first byte of a contiguous sub-box
};

grpc::Status WorkerService::StreamRegion(
    grpc::ServerContext*,
    grpc::ServerSplitStreamer<v1::ReadRegionRequest, grpc::ByteBuffer>*
        stream) {
  v1::ReadRegionRequest request;
  if (!stream->Read(&request)) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("malformed or missing ReadRegionRequest"));
  }
  absl::StatusOr<RegionReader> reader =
      RegionReader::Open(store_, request, options_.chunk_bytes);
  if (!reader.ok()) return ToGrpcStatus(reader.status());
  const int64_t total = reader->total();
  grpc::ByteBuffer buffer;
  for (int64_t next = 0; next < total;) {
    const int64_t count = std::min(reader->chunk_elements(), total - next);
    absl::Status status = reader->Chunk(next, count, &buffer);
    if (!status.ok()) return ToGrpcStatus(status);
    next += count;
    grpc::WriteOptions options;
    if (next >= total) options.set_last_message();
    // Write fails once the reader has gone (cancelled, disconnected).
    if (!stream->Write(buffer, options)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away");
    }
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::ReadSmallRegion(
    grpc::ServerContext*, const v1::ReadRegionRequest* request,
    v1::ReadRegionResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(
        RegionReader reader,
        RegionReader::Open(store_, *request, options_.chunk_bytes));
    const int64_t bytes = reader.total() * reader.item();
    if (bytes > kMaxChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "region of ", bytes, " bytes is too large for one message (",
          kMaxChunkBytes, " bytes at most): use ReadRegion"));
    }
    std::string* data = response->mutable_data();
    data->resize(static_cast<size_t>(bytes));
    return store_->ReadBox(reader.id(), reader.box(), 0, reader.total(),
                           data->data());
  }();
  return ToGrpcStatus(status);
}

grpc::Status WorkerService::MapShard(grpc::ServerContext*,
                                     const v1::MapShardRequest* request,
                                     v1::MapShardResponse* response) {
  absl::StatusOr<PinnedShard> pinned = store_->Pin(request->shard_id());
  if (absl::IsUnimplemented(pinned.status())) {
    return ToGrpcStatus(
        absl::FailedPreconditionError("shards are not in host memory"));
  }
  if (!pinned.ok()) return ToGrpcStatus(pinned.status());
  if (pinned->segment.empty()) {
    return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
        "shard ", request->shard_id(), " is not in shared memory")));
  }
  response->set_host_id(LocalHostId());
  response->set_segment(pinned->segment);
  response->set_bytes(pinned->bytes);
  for (int64_t s : pinned->desc.box.sizes) response->add_shape(s);
  response->set_item_bytes(static_cast<int64_t>(ItemSize(pinned->desc.dtype)));
  response->set_liveness(pinned->liveness);
  return grpc::Status::OK;
}

absl::Status WorkerService::PullShared(const v1::PullRegionRequest& request,
                                       const Box& src_box, const Box& dst_box,
                                       int64_t item) {
  if (!options_.shared_memory_pull)
    return absl::FailedPreconditionError("disabled");
  absl::StatusOr<PinnedShard> dst = store_->Pin(request.dst_shard_id());
  if (!dst.ok()) return absl::FailedPreconditionError(dst.status().message());
  TESSERA_ASSIGN_OR_RETURN(
      std::unique_ptr<ShardMapping> src,
      MapShardBox(peers_.Get(request.src_address()), request.src_shard_id(),
                  src_box, item, options_.pull_timeout));
  if (src_box.NumElements() == 0) return absl::OkStatus();
  // src->At(0) is the shard's byte 0; only the mapped span is touched.
  CopyBox(src->At(0), src->shape(), src_box.offsets, dst->data,
          dst->desc.box.sizes, dst_box.offsets, src_box.sizes,
          static_cast<size_t>(item));
  return absl::OkStatus();
}

grpc::Status WorkerService::PullRegion(grpc::ServerContext*,
                                       const v1::PullRegionRequest* request,
                                       v1::PullRegionResponse* response) {
  absl::StatusOr<ShardDesc> dst = store_->Describe(request->dst_shard_id());
  if (!dst.ok()) return ToGrpcStatus(dst.status());
  absl::StatusOr<Box> dst_box =
      SubBox(*dst, request->dst_offsets(), request->sizes(), "dst");
  if (!dst_box.ok()) return ToGrpcStatus(dst_box.status());
  absl::StatusOr<Box> src_box =
      BoxFromProto(request->src_offsets(), request->sizes(), "src");
  if (!src_box.ok()) return ToGrpcStatus(src_box.status());
  const int64_t item = static_cast<int64_t>(ItemSize(dst->dtype));
  const int64_t total_bytes = dst_box->NumElements() * item;
  // Shard ids are unique across the cluster: a source held here is copied
  // in memory, never over the network.
  if (store_->Describe(request->src_shard_id()).ok()) {
    absl::Status status =
        store_->CopyLocal(request->src_shard_id(), *src_box,
                          request->dst_shard_id(), dst_box->offsets);
    response->set_bytes(status.ok() ? total_bytes : 0);
    return ToGrpcStatus(status);
  }
  const std::string context_text =
      absl::StrCat("pulling shard ", request->src_shard_id(), " from ",
                   request->src_address());
  // Same host: one strided copy out of the peer's shared memory.
  absl::Status status = PullShared(*request, *src_box, *dst_box, item);
  if (status.ok() || absl::IsNotFound(status)) {
    response->set_bytes(status.ok() ? total_bytes : 0);
    return ToGrpcStatus(status.ok() ? status : Annotate(status, context_text));
  }
  const uint64_t dst_id = request->dst_shard_id();
  status = tessera::ReadRegion(
      peers_.Get(request->src_address()), request->src_shard_id(), *src_box,
      item, options_.pull_timeout,
      [&](int64_t byte_offset, absl::string_view data) -> absl::Status {
        return store_->WriteBox(dst_id, *dst_box, byte_offset / item,
                                static_cast<int64_t>(data.size()) / item,
                                data.data());
      },
      context_text);
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    status = UnavailableError(absl::StrCat("source worker at ",
                                           request->src_address(), " (",
                                           status.message(), ")"));
  }
  response->set_bytes(status.ok() ? total_bytes : 0);
  return ToGrpcStatus(status);
}

grpc::Status WorkerService::Transfer(grpc::ServerContext* context,
                                     const v1::TransferRequest* request,
                                     v1::TransferResponse* response) {
  int64_t bytes = 0;
  for (const v1::TransferPiece& piece : request->pieces()) {
    v1::PullRegionRequest pull;
    pull.set_dst_shard_id(piece.dst_shard_id());
    *pull.mutable_dst_offsets() = piece.dst_offsets();
    pull.set_src_address(request->src_address());
    pull.set_src_shard_id(piece.src_shard_id());
    *pull.mutable_src_offsets() = piece.src_offsets();
    *pull.mutable_sizes() = piece.sizes();
    v1::PullRegionResponse pulled;
    grpc::Status status = PullRegion(context, &pull, &pulled);
    if (!status.ok()) return status;
    bytes += pulled.bytes();
  }
  response->set_bytes(bytes);
  return grpc::Status::OK;
}

grpc::Status WorkerService::FreeShards(grpc::ServerContext*,
                                       const v1::FreeShardsRequest* request,
                                       v1::FreeShardsResponse* response) {
  absl::Status status;
  for (uint64_t id : request->shard_ids()) status.Update(store_->Free(id));
  response->set_bytes_used(store_->BytesUsed());
  return ToGrpcStatus(status);
}

}  // namespace tessera
