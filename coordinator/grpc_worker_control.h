// GrpcWorkerControl: WorkerControl over the Worker gRPC service, one cached
// channel per worker address. Thread-safe.
#ifndef TESSERA_COORDINATOR_GRPC_WORKER_CONTROL_H_
#define TESSERA_COORDINATOR_GRPC_WORKER_CONTROL_H_

#include <string>

#include "absl/time/time.h"
#include "coordinator/cluster_authority.h"
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
    // A member of an NCCL exchange waits this long for its peers (a peer
    // that died holds the others until then; the pieces are then pulled).
    absl::Duration exchange_timeout = absl::Minutes(2);
  };
  // Every order is signed by `authority` (not owned; outlives this) for
  // the worker it goes to; `channels` carry the coordinator's TLS.
  GrpcWorkerControl(Options options, const ClusterAuthority* authority,
                    ChannelOptions channels = {})
      : options_(options),
        authority_(authority),
        channels_(std::move(channels)) {}

  absl::StatusOr<BytesUsedReading> Allocate(
      const WorkerRef& worker, const AllocateBatch& batch) override;
  absl::Status Seal(const WorkerRef& worker,
                    const std::vector<uint64_t>& shard_ids,
                    bool persist) override;
  absl::StatusOr<BytesUsedReading> Free(
      const WorkerRef& worker, const std::vector<uint64_t>& shard_ids) override;
  absl::Status Transfer(const TransferBatch& batch,
                        SentBytes* sent = nullptr) override;
  absl::StatusOr<std::string> ExchangeId(const WorkerRef& worker) override;
  absl::StatusOr<int64_t> Exchange(const WorkerRef& worker,
                                   const ExchangePlan& plan,
                                   Cancellation* cancellation) override;
  absl::StatusOr<CheckpointListing> ListCheckpoint(
      const WorkerRef& worker, const std::string& dir) override;
  absl::StatusOr<LoadedRuns> LoadShard(const WorkerRef& worker,
                                       const std::string& dir,
                                       const LoadOrder& order) override;
  absl::StatusOr<std::vector<SavedItem>> SaveShards(
      const WorkerRef& worker, const std::string& dir, const std::string& file,
      const std::vector<SaveItem>& items,
      const std::vector<std::pair<std::string, std::string>>& metadata)
      override;
  absl::Status WriteCheckpointFile(const WorkerRef& worker,
                                   const std::string& dir,
                                   const std::string& name,
                                   const std::string& content,
                                   int64_t size) override;
  absl::StatusOr<int64_t> WriteShardRuns(
      const WorkerRef& worker, const std::string& dir, const std::string& file,
      const std::string& save_id, uint64_t shard_id, const std::string& tensor,
      uint64_t version, const std::vector<FileRun>& runs) override;
  absl::Status PublishCheckpointFiles(
      const WorkerRef& worker, const std::string& dir,
      const std::string& save_id,
      const std::vector<std::pair<std::string, std::string>>& renames) override;
  absl::Status RemoveCheckpointFiles(const WorkerRef& worker,
                                     const std::string& dir,
                                     const std::vector<std::string>& names,
                                     const std::string& save_id) override;
  void Reset(const std::string& address) override { channels_.Forget(address); }

 private:
  // The order capability for `worker`, as call metadata.
  void SignOrder(grpc::ClientContext* context, const std::string& worker) const;

  const Options options_;
  const ClusterAuthority* const authority_;
  ChannelCache channels_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_GRPC_WORKER_CONTROL_H_
