#include "worker/worker_service.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "rpc/convert.h"
#include "rpc/status.h"
#include "transport/grpc_transport.h"

namespace tessera {
namespace {

// Validates one shard of an allocation request.
absl::StatusOr<ShardDesc> DescFromAllocate(const v1::AllocateShardsRequest& request, int index,
                                           DType dtype, const Shape& tensor_shape) {
  const v1::AllocateShardsRequest::Item& item = request.shards(index);
  const std::string field = absl::StrCat("shards[", index, "]");
  ShardDesc desc;
  desc.tensor = request.tensor();
  desc.dtype = dtype;
  desc.tensor_shape = tensor_shape;
  TESSERA_ASSIGN_OR_RETURN(desc.box, BoxFromProto(item.offsets(), item.sizes(), field));
  for (int64_t s : desc.box.sizes) {
    if (s < 0) return OutOfBoundsError(absl::StrCat(field, " has a negative size"));
  }
  // Chunk sharding makes empty shards past the end; only non-empty ones must fit.
  if (desc.box.NumElements() > 0 || desc.box.rank() != tensor_shape.size()) {
    TESSERA_RETURN_IF_ERROR(CheckWithin(desc.box, tensor_shape, field));
  }
  TESSERA_RETURN_IF_ERROR(ByteSize(desc.box.sizes, ItemSize(dtype)).status());
  return desc;
}

// A sub-box of a shard named by a request, checked against the shard.
absl::StatusOr<Box> SubBox(const ShardDesc& desc,
                           const google::protobuf::RepeatedField<int64_t>& offsets,
                           const google::protobuf::RepeatedField<int64_t>& sizes,
                           absl::string_view field) {
  TESSERA_ASSIGN_OR_RETURN(Box box, BoxFromProto(offsets, sizes, field));
  TESSERA_RETURN_IF_ERROR(CheckWithin(box, desc.box.sizes, field));
  return box;
}

}  // namespace

WorkerService::WorkerService(ShardStore* store, WorkerServiceOptions options)
    : store_(store), options_(options) {}

grpc::Status WorkerService::AllocateShards(grpc::ServerContext*,
                                           const v1::AllocateShardsRequest* request,
                                           v1::AllocateShardsResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(request->dtype()));
    TESSERA_ASSIGN_OR_RETURN(Shape shape, ShapeFromProto(request->tensor_shape(), "tensor_shape"));
    TESSERA_ASSIGN_OR_RETURN(InitSpec init, InitFromProto(request->init()));
    TESSERA_RETURN_IF_ERROR(CheckInitValue(init, dtype));
    std::vector<ShardDesc> descs;
    descs.reserve(request->shards_size());
    for (int i = 0; i < request->shards_size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(ShardDesc desc, DescFromAllocate(*request, i, dtype, shape));
      descs.push_back(std::move(desc));
    }
    // All or nothing: undo this call's allocations if one fails.
    for (int i = 0; i < request->shards_size(); ++i) {
      absl::Status s = store_->Allocate(request->shards(i).shard_id(), descs[i], init);
      if (!s.ok()) {
        for (int j = 0; j < i; ++j) store_->Free(request->shards(j).shard_id()).IgnoreError();
        return s;
      }
    }
    return absl::OkStatus();
  }();
  response->set_bytes_used(store_->BytesUsed());
  return ToGrpcStatus(status);
}

grpc::Status WorkerService::WriteShard(grpc::ServerContext*,
                                       grpc::ServerReader<v1::WriteShardRequest>* reader,
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
      return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          "write stream switched from shard ", shard_id, " to shard ", chunk.shard_id())));
    }
    absl::Status status = store_->Write(shard_id, chunk.offset(), chunk.data());
    if (!status.ok()) return ToGrpcStatus(status);
    written += static_cast<int64_t>(chunk.data().size());
  }
  response->set_bytes_written(written);
  return grpc::Status::OK;
}

grpc::Status WorkerService::ReadRegion(grpc::ServerContext* context,
                                       const v1::ReadRegionRequest* request,
                                       grpc::ServerWriter<v1::ReadRegionResponse>* writer) {
  absl::StatusOr<ShardDesc> desc = store_->Describe(request->shard_id());
  if (!desc.ok()) return ToGrpcStatus(desc.status());
  absl::StatusOr<Box> box = SubBox(*desc, request->offsets(), request->sizes(), "region");
  if (!box.ok()) return ToGrpcStatus(box.status());
  const int64_t item = static_cast<int64_t>(ItemSize(desc->dtype));
  const int64_t chunk_bytes =
      request->chunk_bytes() > 0 ? std::min<int64_t>(request->chunk_bytes(), 4 << 20)
                                 : options_.chunk_bytes;
  const int64_t chunk_elements = std::max<int64_t>(1, chunk_bytes / item);
  const int64_t total = box->NumElements();
  v1::ReadRegionResponse chunk;
  for (int64_t begin = 0; begin < total; begin += chunk_elements) {
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    const int64_t count = std::min(chunk_elements, total - begin);
    std::string* data = chunk.mutable_data();
    data->resize(static_cast<size_t>(count * item));
    absl::Status status = store_->ReadBox(request->shard_id(), *box, begin, count, data->data());
    if (!status.ok()) return ToGrpcStatus(status);
    chunk.set_offset(begin * item);
    if (!writer->Write(chunk)) return grpc::Status::CANCELLED;  // the reader went away
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::PullRegion(grpc::ServerContext*, const v1::PullRegionRequest* request,
                                       v1::PullRegionResponse* response) {
  absl::StatusOr<ShardDesc> dst = store_->Describe(request->dst_shard_id());
  if (!dst.ok()) return ToGrpcStatus(dst.status());
  absl::StatusOr<Box> dst_box = SubBox(*dst, request->dst_offsets(), request->sizes(), "dst");
  if (!dst_box.ok()) return ToGrpcStatus(dst_box.status());
  absl::StatusOr<Box> src_box = BoxFromProto(request->src_offsets(), request->sizes(), "src");
  if (!src_box.ok()) return ToGrpcStatus(src_box.status());
  const int64_t item = static_cast<int64_t>(ItemSize(dst->dtype));
  const int64_t total_bytes = dst_box->NumElements() * item;
  // Shard ids are unique across the cluster: a source held here is copied
  // in memory, never over the network.
  if (store_->Describe(request->src_shard_id()).ok()) {
    absl::Status status = store_->CopyLocal(request->src_shard_id(), *src_box,
                                            request->dst_shard_id(), dst_box->offsets);
    response->set_bytes(status.ok() ? total_bytes : 0);
    return ToGrpcStatus(status);
  }
  auto stub = v1::Worker::NewStub(peers_.Get(request->src_address()));
  const uint64_t dst_id = request->dst_shard_id();
  absl::Status status = tessera::ReadRegion(
      stub.get(), request->src_shard_id(), *src_box, total_bytes, options_.pull_timeout,
      [&](int64_t byte_offset, absl::string_view data) -> absl::Status {
        if (byte_offset % item != 0 || data.size() % item != 0) {
          return absl::DataLossError("chunk is not aligned to whole elements");
        }
        return store_->WriteBox(dst_id, *dst_box, byte_offset / item,
                                static_cast<int64_t>(data.size()) / item, data.data());
      },
      absl::StrCat("pulling shard ", request->src_shard_id(), " from ", request->src_address()));
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    status = UnavailableError(absl::StrCat("source worker at ", request->src_address(), " (",
                                           status.message(), ")"));
  }
  response->set_bytes(status.ok() ? total_bytes : 0);
  return ToGrpcStatus(status);
}

grpc::Status WorkerService::FreeShards(grpc::ServerContext*, const v1::FreeShardsRequest* request,
                                       v1::FreeShardsResponse* response) {
  absl::Status status;
  for (uint64_t id : request->shard_ids()) status.Update(store_->Free(id));
  response->set_bytes_used(store_->BytesUsed());
  return ToGrpcStatus(status);
}

}  // namespace tessera
