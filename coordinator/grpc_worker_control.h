// GrpcWorkerControl: WorkerControl over the Worker gRPC service, one cached
// channel per worker address. Thread-safe.
#ifndef TESSERA_COORDINATOR_GRPC_WORKER_CONTROL_H_
#define TESSERA_COORDINATOR_GRPC_WORKER_CONTROL_H_

#include "absl/time/time.h"
#include "coordinator/worker_control.h"
#include "proto/worker.pb.h"
#include "rpc/channel.h"

namespace tessera {

// The Worker request that carries a batch allocation.
v1::AllocateShardsRequest AllocateRequestFor(const AllocateBatch& batch);

class GrpcWorkerControl : public WorkerControl {
 public:
  struct Options {
    absl::Duration allocate_timeout =
        absl::Minutes(2);  // init fills of large shards take time
    absl::Duration free_timeout = absl::Seconds(10);
    absl::Duration transfer_timeout = absl::Minutes(10);
  };
  explicit GrpcWorkerControl(Options options) : options_(options) {}

  absl::StatusOr<int64_t> Allocate(const std::string& address,
                                   const AllocateBatch& batch) override;
  absl::StatusOr<int64_t> Free(const std::string& address,
                               const std::vector<uint64_t>& shard_ids) override;
  absl::Status Transfer(const TransferBatch& batch) override;
  void Reset(const std::string& address) override { channels_.Forget(address); }

 private:
  const Options options_;
  ChannelCache channels_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_GRPC_WORKER_CONTROL_H_
