// The UcxData gRPC service (proto/ucx.proto): hands out the keys of the UCX
// data plane (transport/ucx_server.h) for shards of a WorkerNode, each only
// against the capability the worker's own reads and writes need (a read key
// as MapShard admits, a write key as WriteShard does). A thin layer: checks
// the request, admits it, asks the UcxServer, converts the answer.
// Thread-safe.
#ifndef TESSERA_WORKER_UCX_SERVICE_H_
#define TESSERA_WORKER_UCX_SERVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "proto/ucx.grpc.pb.h"
#include "transport/ucx_server.h"
#include "worker/worker_node.h"

namespace tessera {

// Most shards one Describe may name.
inline constexpr int kMaxUcxDescribeShards = 64;
// Most dims of a box one Stage may name.
inline constexpr int kMaxUcxStageRank = 64;

// Starts UCX for `node` (not owned, outlives the server): shards are pinned
// through its store; freed ones are seen by the store no longer holding
// them. Fails when UCX cannot start here.
absl::StatusOr<std::unique_ptr<UcxServer>> StartUcxServer(
    WorkerNode* node, UcxServerOptions options = {});

class UcxDataService final : public v1::UcxData::Service {
 public:
  // Neither is owned; both outlive the service.
  UcxDataService(WorkerNode* node, UcxServer* server)
      : node_(node), server_(server) {}

  grpc::Status Describe(grpc::ServerContext* context,
                        const v1::UcxDescribeRequest* request,
                        v1::UcxDescribeResponse* response) override;
  grpc::Status FinishWrite(grpc::ServerContext* context,
                           const v1::UcxFinishWriteRequest* request,
                           v1::UcxFinishWriteResponse* response) override;
  grpc::Status Stage(grpc::ServerContext* context,
                     const v1::UcxStageRequest* request,
                     v1::UcxStageResponse* response) override;

 private:
  WorkerNode* const node_;
  UcxServer* const server_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_UCX_SERVICE_H_
