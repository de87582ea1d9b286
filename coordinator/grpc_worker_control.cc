#include "coordinator/grpc_worker_control.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "core/checkpoint_index.h"
#include "core/status_macros.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/call.h"
#include "rpc/convert.h"

namespace tessera {
namespace {

// Every order to a worker is idempotent (the same ids, the same bytes), so a
// call that could not reach the worker is tried again.
CallOptions WorkerCall(const std::string& address, absl::Duration timeout) {
  CallOptions options;
  options.timeout = timeout;
  options.idempotent = true;
  options.peer = absl::StrCat("worker at ", address);
  return options;
}

}  // namespace

void GrpcWorkerControl::SignOrder(grpc::ClientContext* context,
                                  const std::string& worker) const {
  context->AddMetadata(kCapabilityHeader, authority_->Order(worker));
}

v1::AllocateShardsRequest AllocateRequestFor(const AllocateBatch& batch) {
  v1::AllocateShardsRequest request;
  request.set_tensor(batch.tensor);
  request.set_version(batch.version);
  request.set_writable(batch.writable);
  request.set_incarnation(batch.incarnation);
  request.set_change(batch.change);
  request.set_filled_by_copies(batch.filled_by_copies);
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

absl::StatusOr<BytesUsedReading> GrpcWorkerControl::Allocate(
    const WorkerRef& worker, const AllocateBatch& batch) {
  const v1::AllocateShardsRequest request = AllocateRequestFor(batch);
  v1::AllocateShardsResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  TESSERA_RETURN_IF_ERROR(
      Call(WorkerCall(worker.address, options_.allocate_timeout),
           [&](grpc::ClientContext* context) {
             SignOrder(context, worker.name);
             return stub->AllocateShards(context, request, &response);
           }));
  return BytesUsedReading{response.bytes_used(), response.bytes_used_seq()};
}

absl::StatusOr<BytesUsedReading> GrpcWorkerControl::Free(
    const WorkerRef& worker, const std::vector<uint64_t>& shard_ids) {
  v1::FreeShardsRequest request;
  request.mutable_shard_ids()->Assign(shard_ids.begin(), shard_ids.end());
  v1::FreeShardsResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  TESSERA_RETURN_IF_ERROR(
      Call(WorkerCall(worker.address, options_.free_timeout),
           [&](grpc::ClientContext* context) {
             SignOrder(context, worker.name);
             return stub->FreeShards(context, request, &response);
           }));
  return BytesUsedReading{response.bytes_used(), response.bytes_used_seq()};
}

absl::Status GrpcWorkerControl::Seal(const WorkerRef& worker,
                                     const std::vector<uint64_t>& shard_ids,
                                     bool persist) {
  v1::SealShardsRequest request;
  request.mutable_shard_ids()->Assign(shard_ids.begin(), shard_ids.end());
  request.set_defer_persist(!persist);
  v1::SealShardsResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  return Call(WorkerCall(worker.address, options_.free_timeout),
              [&](grpc::ClientContext* context) {
                SignOrder(context, worker.name);
                return stub->SealShards(context, request, &response);
              });
}

absl::Status GrpcWorkerControl::Transfer(const TransferBatch& batch,
                                         SentBytes* sent) {
  v1::TransferRequest request;
  TransferBatchToProto(batch, &request);
  // The destination reads the pieces from the source with this (and a
  // relay hop each copy further up with its own).
  auto read_grant = [&](const std::string& worker) {
    return authority_->Grant(worker, batch.tensor, batch.src_version,
                             batch.incarnation, kRightRead);
  };
  request.set_src_capability(read_grant(batch.src_worker));
  for (v1::RelayUpstream& up : *request.mutable_relay_upstreams()) {
    up.set_capability(read_grant(up.worker()));
  }
  v1::TransferResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(batch.dst_address));
  TESSERA_RETURN_IF_ERROR(
      Call(WorkerCall(batch.dst_address, options_.transfer_timeout),
           [&](grpc::ClientContext* context) {
             SignOrder(context, batch.dst_worker);
             return stub->Transfer(context, request, &response);
           }));
  if (sent == nullptr) return absl::OkStatus();
  // A worker's reply is input: only the sources it was given, each once,
  // no negative count and none past what one order could move (so totals
  // cannot overflow).
  constexpr int64_t kMaxSentPerOrder = int64_t{1} << 50;
  std::set<std::string> sources = {batch.src_worker};
  for (const RelayUpstream& up : batch.relay.fallbacks)
    sources.insert(up.worker);
  for (const v1::SentBytes& entry : response.sent()) {
    if (sources.erase(entry.worker()) == 0 || entry.bytes() < 0 ||
        entry.bytes() > kMaxSentPerOrder) {
      return absl::InternalError(absl::StrCat(
          "worker '", batch.dst_worker, "' reported ", entry.bytes(),
          " bytes sent by '", entry.worker().substr(0, 64),
          "', not a source of its order (or not once, or past any order's "
          "size)"));
    }
    (*sent)[entry.worker()] += entry.bytes();
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointListing> GrpcWorkerControl::ListCheckpoint(
    const WorkerRef& worker, const std::string& dir) {
  v1::ListCheckpointRequest request;
  request.set_dir(dir);
  v1::ListCheckpointResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  TESSERA_RETURN_IF_ERROR(
      Call(WorkerCall(worker.address, options_.transfer_timeout),
           [&](grpc::ClientContext* context) {
             SignOrder(context, worker.name);
             return stub->ListCheckpoint(context, request, &response);
           }));
  // A worker's reply is input too: bounded and checked.
  absl::StatusOr<CheckpointListing> listing =
      CheckpointListingFromProto(response.entries(), response.origin());
  if (!listing.ok()) {
    return Annotate(listing.status(), absl::StrCat("the listing worker '",
                                                   worker.name, "' sent"));
  }
  if (static_cast<int64_t>(response.save_id().size()) > kMaxSavedByBytes ||
      static_cast<int64_t>(response.saved_by().size()) > kMaxSavedByBytes) {
    return absl::InternalError(absl::StrCat("the listing worker '", worker.name,
                                            "' sent a save id or saver of "
                                            "more than ",
                                            kMaxSavedByBytes, " bytes"));
  }
  listing->save_id = response.save_id();
  listing->saved_by = response.saved_by();
  return listing;
}

absl::StatusOr<LoadedRuns> GrpcWorkerControl::LoadShard(
    const WorkerRef& worker, const std::string& dir, const LoadOrder& order) {
  v1::LoadShardRequest request;
  request.set_dir(dir);
  request.set_file(order.file);
  request.set_shard_id(order.shard_id);
  for (const FileRun& run : order.runs) {
    v1::FileRun* r = request.add_runs();
    r->set_file_offset(run.file_offset);
    r->set_length(run.length);
    r->set_shard_offset(run.shard_offset);
  }
  request.set_piece_offset(order.piece_offset);
  request.set_piece_bytes(order.piece_bytes);
  v1::LoadShardResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  TESSERA_RETURN_IF_ERROR(
      Call(WorkerCall(worker.address, options_.transfer_timeout),
           [&](grpc::ClientContext* context) {
             SignOrder(context, worker.name);
             return stub->LoadShard(context, request, &response);
           }));
  return LoadedRuns{response.bytes_read(), response.part_crc32()};
}

absl::StatusOr<std::vector<SavedItem>> GrpcWorkerControl::SaveShards(
    const WorkerRef& worker, const std::string& dir, const std::string& file,
    const std::vector<SaveItem>& items,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  v1::SaveShardsRequest request;
  request.set_dir(dir);
  request.set_file(file);
  for (const SaveItem& item : items) {
    v1::SaveShardsRequest::Item* out = request.add_items();
    out->set_entry(item.entry);
    out->set_shard_id(item.shard_id);
    out->set_tensor(item.tensor);
    out->set_version(item.version);
    out->set_scalar(item.scalar);
  }
  for (const auto& [key, value] : metadata) {
    v1::FileOrigin::Pair* pair = request.add_metadata();
    pair->set_key(key);
    pair->set_value(value);
  }
  v1::SaveShardsResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  TESSERA_RETURN_IF_ERROR(
      Call(WorkerCall(worker.address, options_.transfer_timeout),
           [&](grpc::ClientContext* context) {
             SignOrder(context, worker.name);
             return stub->SaveShards(context, request, &response);
           }));
  if (response.items_size() != static_cast<int>(items.size())) {
    return absl::InternalError(
        absl::StrCat("worker '", worker.name, "' answered a save of ",
                     items.size(), " shards with ", response.items_size()));
  }
  std::vector<SavedItem> saved;
  for (const v1::SaveShardsResponse::Stored& s : response.items())
    saved.push_back({s.data_offset(), s.bytes(), s.crc32()});
  return saved;
}

absl::Status GrpcWorkerControl::WriteCheckpointFile(const WorkerRef& worker,
                                                    const std::string& dir,
                                                    const std::string& name,
                                                    const std::string& content,
                                                    int64_t size) {
  v1::WriteCheckpointFileRequest request;
  request.set_dir(dir);
  request.set_name(name);
  request.set_content(content);
  request.set_size(size);
  v1::WriteCheckpointFileResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  return Call(WorkerCall(worker.address, options_.transfer_timeout),
              [&](grpc::ClientContext* context) {
                SignOrder(context, worker.name);
                return stub->WriteCheckpointFile(context, request, &response);
              });
}

absl::StatusOr<int64_t> GrpcWorkerControl::WriteShardRuns(
    const WorkerRef& worker, const std::string& dir, const std::string& file,
    const std::string& save_id, uint64_t shard_id, const std::string& tensor,
    uint64_t version, const std::vector<FileRun>& runs) {
  v1::WriteShardRunsRequest request;
  request.set_dir(dir);
  request.set_file(file);
  request.set_save_id(save_id);
  request.set_shard_id(shard_id);
  request.set_tensor(tensor);
  request.set_version(version);
  for (const FileRun& run : runs) {
    v1::FileRun* out = request.add_runs();
    out->set_file_offset(run.file_offset);
    out->set_length(run.length);
    out->set_shard_offset(run.shard_offset);
  }
  v1::WriteShardRunsResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  TESSERA_RETURN_IF_ERROR(
      Call(WorkerCall(worker.address, options_.transfer_timeout),
           [&](grpc::ClientContext* context) {
             SignOrder(context, worker.name);
             return stub->WriteShardRuns(context, request, &response);
           }));
  return response.bytes_written();
}

absl::Status GrpcWorkerControl::PublishCheckpointFiles(
    const WorkerRef& worker, const std::string& dir, const std::string& save_id,
    const std::vector<std::pair<std::string, std::string>>& renames) {
  v1::PublishCheckpointFilesRequest request;
  request.set_dir(dir);
  request.set_save_id(save_id);
  for (const auto& [from, to] : renames) {
    v1::PublishCheckpointFilesRequest::Rename* r = request.add_renames();
    r->set_from(from);
    r->set_to(to);
  }
  v1::PublishCheckpointFilesResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  // Not tried again: a publish whose reply was lost has renamed its files.
  CallOptions call = WorkerCall(worker.address, options_.transfer_timeout);
  call.idempotent = false;
  return Call(call, [&](grpc::ClientContext* context) {
    SignOrder(context, worker.name);
    return stub->PublishCheckpointFiles(context, request, &response);
  });
}

absl::Status GrpcWorkerControl::RemoveCheckpointFiles(
    const WorkerRef& worker, const std::string& dir,
    const std::vector<std::string>& names, const std::string& save_id) {
  v1::RemoveCheckpointFilesRequest request;
  request.set_dir(dir);
  request.set_save_id(save_id);
  for (const std::string& name : names) request.add_names(name);
  v1::RemoveCheckpointFilesResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  return Call(WorkerCall(worker.address, options_.transfer_timeout),
              [&](grpc::ClientContext* context) {
                SignOrder(context, worker.name);
                return stub->RemoveCheckpointFiles(context, request, &response);
              });
}

absl::StatusOr<std::string> GrpcWorkerControl::ExchangeId(
    const WorkerRef& worker) {
  v1::NcclUniqueIdRequest request;
  v1::NcclUniqueIdResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  // Not tried again: each id starts a bootstrap in the worker that waits
  // for its members, so an id whose reply was lost must not be made twice.
  CallOptions call = WorkerCall(worker.address, options_.exchange_timeout);
  call.idempotent = false;
  TESSERA_RETURN_IF_ERROR(Call(call, [&](grpc::ClientContext* context) {
    SignOrder(context, worker.name);
    return stub->NcclUniqueId(context, request, &response);
  }));
  if (response.unique_id().size() != kExchangeIdBytes) {
    return absl::InternalError(
        absl::StrCat("the worker at ", worker.address, " gave a ",
                     response.unique_id().size(), "-byte communicator id"));
  }
  return response.unique_id();
}

absl::StatusOr<int64_t> GrpcWorkerControl::Exchange(
    const WorkerRef& worker, const ExchangePlan& plan,
    Cancellation* cancellation) {
  v1::NcclExchangeRequest request;
  ExchangePlanToProto(plan, &request);
  v1::NcclExchangeResponse response;
  auto stub = v1::Worker::NewStub(channels_.Get(worker.address));
  // Not tried again: every member joins and posts once, together.
  CallOptions call = WorkerCall(worker.address, options_.exchange_timeout);
  call.idempotent = false;
  call.cancellation = cancellation;
  TESSERA_RETURN_IF_ERROR(Call(call, [&](grpc::ClientContext* context) {
    SignOrder(context, worker.name);
    return stub->NcclExchange(context, request, &response);
  }));
  return response.bytes_received();
}

}  // namespace tessera
