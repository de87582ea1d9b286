// The Worker gRPC service: a thin layer that validates requests through
// core/ and rpc/convert, then calls the ShardStore. Thread-safe (the store is).
//
// Region reads are served raw (callback API, grpc::ByteBuffer): a chunk of a
// sub-box that is contiguous in the shard goes out as a slice pointing into
// the shard's memory (kept alive until gRPC releases it), so the worker
// copies nothing; other chunks are gathered once into a fresh slice. One
// write is in flight per stream, and reads run on gRPC's callback threads
// instead of a thread per stream.
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
  // Pull pieces from a peer on the same host through its shared-memory
  // segment (one strided copy) instead of its gRPC stream.
  bool shared_memory_pull = true;
};

// ReadRegion streams raw ByteBuffers (zero-copy slices over shard memory)
// from a synchronous handler put in place of the generated one. Every
// method stays on the synchronous API: registering any callback method costs
// every call on the server about 40 us of p50 latency (measured in bench/).
class WorkerService final : public v1::Worker::Service {
 public:
  WorkerService(ShardStore* store, WorkerServiceOptions options);

  grpc::Status AllocateShards(grpc::ServerContext* context,
                              const v1::AllocateShardsRequest* request,
                              v1::AllocateShardsResponse* response) override;
  grpc::Status WriteShard(grpc::ServerContext* context,
                          grpc::ServerReader<v1::WriteShardRequest>* reader,
                          v1::WriteShardResponse* response) override;
  grpc::Status StreamRegion(
      grpc::ServerContext* context,
      grpc::ServerSplitStreamer<v1::ReadRegionRequest, grpc::ByteBuffer>*
          stream);
  grpc::Status ReadSmallRegion(grpc::ServerContext* context,
                               const v1::ReadRegionRequest* request,
                               v1::ReadRegionResponse* response) override;
  grpc::Status MapShard(grpc::ServerContext* context,
                        const v1::MapShardRequest* request,
                        v1::MapShardResponse* response) override;
  grpc::Status PullRegion(grpc::ServerContext* context,
                          const v1::PullRegionRequest* request,
                          v1::PullRegionResponse* response) override;
  grpc::Status Transfer(grpc::ServerContext* context,
                        const v1::TransferRequest* request,
                        v1::TransferResponse* response) override;
  grpc::Status FreeShards(grpc::ServerContext* context,
                          const v1::FreeShardsRequest* request,
                          v1::FreeShardsResponse* response) override;

 private:
  class RegionReader;
  // Copies a piece from a same-host peer's shared memory; FAILED_PRECONDITION
  // when that path is not available (the caller then streams it).
  absl::Status PullShared(const v1::PullRegionRequest& request,
                          const Box& src_box, const Box& dst_box, int64_t item);

  ShardStore* const store_;
  const WorkerServiceOptions options_;
  ChannelCache peers_;  // channels to other workers, for PullRegion
};

}  // namespace tessera

#endif  // TESSERA_WORKER_WORKER_SERVICE_H_
