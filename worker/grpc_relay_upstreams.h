// RelayUpstreams over gRPC: a hop asks the worker holding its source how
// far that copy's fill got (Worker.AwaitRelayFill) and for a chunk's
// changes (Worker.ReadShardDelta), with the read capability the order gave
// it for that worker.
#ifndef TESSERA_WORKER_GRPC_RELAY_UPSTREAMS_H_
#define TESSERA_WORKER_GRPC_RELAY_UPSTREAMS_H_

#include "rpc/channel.h"
#include "worker/relay_fills.h"

namespace tessera {

class GrpcRelayUpstreams : public RelayUpstreams {
 public:
  // `channels` (not owned) outlives it.
  explicit GrpcRelayUpstreams(ChannelCache* channels) : channels_(channels) {}

  // A worker too busy to answer (RESOURCE_EXHAUSTED) answers "no news"
  // after a short pause, not a failure.
  absl::StatusOr<RelayFillProgress> Await(const RelayUpstream& upstream,
                                          uint64_t relay,
                                          int64_t have) override;
  // A reply is input: changes longer than asked for are refused.
  absl::StatusOr<ShardDelta> ReadDelta(
      const RelayUpstream& upstream, const ShardDeltaRequest& request) override;

 private:
  ChannelCache* const channels_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_GRPC_RELAY_UPSTREAMS_H_
