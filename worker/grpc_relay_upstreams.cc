#include "worker/grpc_relay_upstreams.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/security.h"
#include "rpc/status.h"

namespace tessera {

absl::StatusOr<RelayFillProgress> GrpcRelayUpstreams::Await(
    const RelayUpstream& upstream, uint64_t relay, int64_t have) {
  v1::AwaitRelayFillRequest request;
  request.set_shard_id(upstream.shard_id);
  request.set_relay_id(relay);
  request.set_have_chunks(have);
  v1::AwaitRelayFillResponse response;
  grpc::ClientContext context;
  // The worker answers within kRelayAwaitSlice; the rest is the network.
  SetDeadline(&context, CallTimeout(kRelayAwaitSlice + absl::Seconds(4)));
  PresentCapability(&context, upstream.capability);
  auto stub = v1::Worker::NewStub(channels_->Get(upstream.address));
  const grpc::Status status =
      stub->AwaitRelayFill(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    absl::SleepFor(absl::Milliseconds(50));
    return RelayFillProgress{};
  }
  if (!status.ok()) {
    return Annotate(FromGrpcStatus(status),
                    absl::StrCat("asking relay source worker '",
                                 upstream.worker, "' how far it got"));
  }
  // A peer's reply is input: a count it cannot have is a broken peer.
  if (response.chunks_done() < 0) {
    return UnavailableError(absl::StrCat("relay source worker '",
                                         upstream.worker,
                                         "' (it sent a negative progress)"));
  }
  RelayFillProgress progress;
  progress.started = response.started();
  progress.chunks_done = response.chunks_done();
  progress.done = response.done();
  return progress;
}

}  // namespace tessera
