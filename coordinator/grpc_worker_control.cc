#include "coordinator/grpc_worker_control.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/errors.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/convert.h"
#include "rpc/status.h"

namespace tessera {
namespace {

// A worker that cannot be reached is reported in the system's own words.
absl::Status WorkerStatus(const grpc::Status& status,
                          const std::string& address) {
  if (IsTransportFailure(status) ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return UnavailableError(
        absl::StrCat("worker at ", address, " (", status.error_message(), ")"));
  }
  return FromGrpcStatus(status);
}

}  // namespace

v1::AllocateShardsRequest AllocateRequestFor(const AllocateBatch& batch) {
  v1::AllocateShardsRequest request;
  request.set_tensor(batch.tensor);
  request.set_dtype(DTypeToProto(batch.dtype));
  request.mutable_tensor_shape()->Assign(batch.tensor_shape.begin(),
                                         batch.tensor_shape.end());
  *request.mutable_init() = InitToProto(batch.init);
  request.mutable_shards()->Reserve(batch.shards.size());
  for (const auto& [id, box] : batch.shards) {
    v1::AllocateShardsRequest::Item* item = request.add_shards();
    item->set_shard_id(id);
    BoxToProto(box, item->mutable_offsets(), item->mutable_sizes());
  }
  return request;
}

absl::StatusOr<int64_t> GrpcWorkerControl::Allocate(
    const std::string& address, const AllocateBatch& batch) {
  const v1::AllocateShardsRequest request = AllocateRequestFor(batch);
  v1::AllocateShardsResponse response;
  absl::Status status = RetryConnectFailures([&]() -> absl::Status {
    grpc::ClientContext context;
    SetDeadline(&context, options_.allocate_timeout);
    return WorkerStatus(v1::Worker::NewStub(channels_.Get(address))
                            ->AllocateShards(&context, request, &response),
                        address);
  });
  if (!status.ok()) return status;
  return response.bytes_used();
}

absl::StatusOr<int64_t> GrpcWorkerControl::Free(
    const std::string& address, const std::vector<uint64_t>& shard_ids) {
  v1::FreeShardsRequest request;
  request.mutable_shard_ids()->Assign(shard_ids.begin(), shard_ids.end());
  v1::FreeShardsResponse response;
  absl::Status status = RetryConnectFailures([&]() -> absl::Status {
    grpc::ClientContext context;
    SetDeadline(&context, options_.free_timeout);
    return WorkerStatus(v1::Worker::NewStub(channels_.Get(address))
                            ->FreeShards(&context, request, &response),
                        address);
  });
  if (!status.ok()) return status;
  return response.bytes_used();
}

absl::Status GrpcWorkerControl::Transfer(const TransferBatch& batch) {
  v1::TransferRequest request;
  TransferBatchToProto(batch, &request);
  v1::TransferResponse response;
  return RetryConnectFailures([&]() -> absl::Status {
    grpc::ClientContext context;
    SetDeadline(&context, options_.transfer_timeout);
    return WorkerStatus(v1::Worker::NewStub(channels_.Get(batch.dst_address))
                            ->Transfer(&context, request, &response),
                        batch.dst_address);
  });
}

}  // namespace tessera
