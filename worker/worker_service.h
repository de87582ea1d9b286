// The Worker gRPC service: a thin layer that validates requests through
// core/ and rpc/convert, then calls the ShardStore. Thread-safe (the store is).
#ifndef TESSERA_WORKER_WORKER_SERVICE_H_
#define TESSERA_WORKER_WORKER_SERVICE_H_

#include <cstdint>

#include "absl/time/time.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/channel.h"
#include "worker/shard_store.h"

namespace tessera {

struct WorkerServiceOptions {
  // Bytes per ReadRegion message; tuned in bench/.
  int64_t chunk_bytes = 1 << 20;
  // Deadline for pulling one piece from a peer worker.
  absl::Duration pull_timeout = absl::Minutes(10);
};

class WorkerService final : public v1::Worker::Service {
 public:
  WorkerService(ShardStore* store, WorkerServiceOptions options);

  grpc::Status AllocateShards(grpc::ServerContext* context,
                              const v1::AllocateShardsRequest* request,
                              v1::AllocateShardsResponse* response) override;
  grpc::Status WriteShard(grpc::ServerContext* context,
                          grpc::ServerReader<v1::WriteShardRequest>* reader,
                          v1::WriteShardResponse* response) override;
  grpc::Status ReadRegion(grpc::ServerContext* context, const v1::ReadRegionRequest* request,
                          grpc::ServerWriter<v1::ReadRegionResponse>* writer) override;
  grpc::Status PullRegion(grpc::ServerContext* context, const v1::PullRegionRequest* request,
                          v1::PullRegionResponse* response) override;
  grpc::Status FreeShards(grpc::ServerContext* context, const v1::FreeShardsRequest* request,
                          v1::FreeShardsResponse* response) override;

 private:
  ShardStore* const store_;
  const WorkerServiceOptions options_;
  ChannelCache peers_;  // channels to other workers, for PullRegion
};

}  // namespace tessera

#endif  // TESSERA_WORKER_WORKER_SERVICE_H_
