#include "worker/grpc_relay_upstreams.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/call.h"
#include "rpc/channel.h"
#include "rpc/security.h"

namespace tessera {
namespace {

// Tried once (a failed source is the relay's to fail over from), within
// `timeout` cut to the caller's deadline.
CallOptions UpstreamCall(absl::Duration timeout) {
  CallOptions options;
  options.timeout = CallTimeout(timeout);
  return options;
}

}  // namespace

absl::StatusOr<RelayFillProgress> GrpcRelayUpstreams::Await(
    const RelayUpstream& upstream, uint64_t relay, int64_t have) {
  v1::AwaitRelayFillRequest request;
  request.set_shard_id(upstream.shard_id);
  request.set_relay_id(relay);
  request.set_have_chunks(have);
  v1::AwaitRelayFillResponse response;
  // The worker answers within kRelayAwaitSlice; the rest is the network.
  const absl::Status status =
      Call(UpstreamCall(kRelayAwaitSlice + absl::Seconds(4)),
           [&](grpc::ClientContext* context) {
             PresentCapability(context, upstream.capability);
             return v1::Worker::NewStub(channels_->Get(upstream.address))
                 ->AwaitRelayFill(context, request, &response);
           });
  if (absl::IsResourceExhausted(status)) {
    absl::SleepFor(absl::Milliseconds(50));
    return RelayFillProgress{};
  }
  if (!status.ok()) {
    return Annotate(status, absl::StrCat("asking relay source worker '",
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

absl::StatusOr<ShardDelta> GrpcRelayUpstreams::ReadDelta(
    const RelayUpstream& upstream, const ShardDeltaRequest& request) {
  v1::ReadShardDeltaRequest wire;
  wire.set_shard_id(upstream.shard_id);
  wire.set_base_shard_id(upstream.base_shard_id);
  wire.set_byte_offset(request.byte_offset);
  wire.set_bytes(request.bytes);
  wire.set_max_encoded_bytes(request.max_encoded_bytes);
  v1::ReadShardDeltaResponse response;
  // Comparing a chunk's two versions takes about a memory pass over them.
  const absl::Status status =
      Call(UpstreamCall(absl::Seconds(30)), [&](grpc::ClientContext* context) {
        PresentCapability(context, upstream.capability);
        return v1::Worker::NewStub(channels_->Get(upstream.address))
            ->ReadShardDelta(context, wire, &response);
      });
  if (!status.ok()) {
    return Annotate(status,
                    absl::StrCat("reading a chunk's changes from relay source "
                                 "worker '",
                                 upstream.worker, "'"));
  }
  if (response.encoded() && static_cast<int64_t>(response.changes().size()) >
                                request.max_encoded_bytes) {
    return UnavailableError(absl::StrCat(
        "relay source worker '", upstream.worker, "' (it sent ",
        response.changes().size(), " bytes of changes for at most ",
        request.max_encoded_bytes, ")"));
  }
  ShardDelta delta;
  delta.encoded = response.encoded();
  if (delta.encoded) {
    delta.changes = std::move(*response.mutable_changes());
    delta.crc32 = response.crc32();
  }
  return delta;
}

}  // namespace tessera
