#include "worker/ucx_service.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "rpc/security.h"
#include "rpc/status.h"

namespace tessera {
namespace {

// A read key is what MapShard gives (the shard's memory, to a reader); a
// write key what WriteShard allows. The capability table has these names.
constexpr char kReadMethod[] = "/tessera.v1.Worker/MapShard";
constexpr char kWriteMethod[] = "/tessera.v1.Worker/WriteShard";

}  // namespace

absl::StatusOr<std::unique_ptr<UcxServer>> StartUcxServer(
    WorkerNode* node, UcxServerOptions options) {
  ShardStore* store = &node->store();
  options.pin = [store](uint64_t id) -> absl::StatusOr<UcxPinnedShard> {
    TESSERA_ASSIGN_OR_RETURN(PinnedShard pinned, store->Pin(id));
    UcxPinnedShard out;
    out.keep_alive = std::move(pinned.keep_alive);
    out.keep_mapped = std::move(pinned.keep_mapped);
    out.data = pinned.data;
    out.bytes = pinned.bytes;
    out.shape.assign(pinned.desc.box.sizes.begin(),
                     pinned.desc.box.sizes.end());
    out.item_bytes = static_cast<int64_t>(ItemSize(pinned.desc.dtype));
    return out;
  };
  options.held = [store](uint64_t id) { return store->Describe(id).ok(); };
  options.writable = [node](uint64_t id) { return node->TakesWrites(id); };
  return UcxServer::Start(std::move(options));
}

grpc::Status UcxDataService::Describe(grpc::ServerContext* context,
                                      const v1::UcxDescribeRequest* request,
                                      v1::UcxDescribeResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    const int n = request->shard_ids_size();
    if (n == 0 || n > kMaxUcxDescribeShards) {
      return absl::InvalidArgumentError(absl::StrCat("UcxData.Describe names ",
                                                     n, " shards; give 1 to ",
                                                     kMaxUcxDescribeShards));
    }
    const std::vector<uint64_t> ids(request->shard_ids().begin(),
                                    request->shard_ids().end());
    TESSERA_RETURN_IF_ERROR(
        node_->Admit(PresentedCapability(*context),
                     request->write() ? kWriteMethod : kReadMethod, ids));
    response->set_worker_address(server_->address());
    for (uint64_t id : ids) {
      TESSERA_ASSIGN_OR_RETURN(UcxKey key,
                               server_->Register(id, request->write()));
      v1::UcxShardKey* out = response->add_shards();
      out->set_shard_id(id);
      out->set_bytes(key.bytes);
      out->set_registration(key.registration);
      for (int64_t d : key.shape) out->add_shape(d);
      out->set_item_bytes(key.item_bytes);
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) response->Clear();
  return ToGrpcStatus(status);
}

grpc::Status UcxDataService::FinishWrite(
    grpc::ServerContext* context, const v1::UcxFinishWriteRequest* request,
    v1::UcxFinishWriteResponse* response) {
  const uint64_t id = request->shard_id();
  absl::Status status = [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(
        node_->Admit(PresentedCapability(*context), kWriteMethod, {id}));
    TESSERA_ASSIGN_OR_RETURN(ShardDesc desc, node_->store().Describe(id));
    if (request->bytes_written() != desc.ByteSize()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a UCX write of ", request->bytes_written(),
                       " bytes does not cover shard ", id, " (",
                       desc.ByteSize(), " bytes)"));
    }
    // Written whole: no write reaches it again, through any transport.
    server_->FinishWrite(id);
    node_->Seal(id);
    return absl::OkStatus();
  }();
  return ToGrpcStatus(status);
}

grpc::Status UcxDataService::Stage(grpc::ServerContext* context,
                                   const v1::UcxStageRequest* request,
                                   v1::UcxStageResponse* response) {
  const uint64_t id = request->shard_id();
  absl::Status status = [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(
        node_->Admit(PresentedCapability(*context), kReadMethod, {id}));
    const int rank = request->sizes_size();
    if (rank < 1 || rank > kMaxUcxStageRank ||
        request->offsets_size() != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "UcxData.Stage: a box of ", request->offsets_size(), " offsets and ",
          rank, " sizes; give 1 to ", kMaxUcxStageRank, " of each"));
    }
    Box box;
    box.offsets.assign(request->offsets().begin(), request->offsets().end());
    box.sizes.assign(request->sizes().begin(), request->sizes().end());
    TESSERA_ASSIGN_OR_RETURN(
        UcxStaged staged,
        server_->Stage(id, box, request->first(), request->count()));
    response->set_worker_address(server_->address());
    response->set_lease(staged.lease);
    response->set_bytes(staged.bytes);
    return absl::OkStatus();
  }();
  if (!status.ok()) response->Clear();
  return ToGrpcStatus(status);
}

}  // namespace tessera
