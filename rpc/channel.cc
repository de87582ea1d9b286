#include "rpc/channel.h"

#include "absl/base/call_once.h"

namespace tessera {

void DisableLockDebuggingOnce() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
}

void ApplyDataPlaneArgs(grpc::ChannelArguments* args) {
  // Bulk streams: a large fixed flow-control window instead of growing it
  // from 64 KiB by BDP probes, and big reads off the socket.
  args->SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  args->SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args->SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
  args->SetInt(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 64 << 10);
  args->SetInt(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 8 << 20);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  DisableLockDebuggingOnce();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  // Reconnect quickly after a peer restarts instead of the 20 s default
  // ceiling.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  // Each channel gets its own TCP connection (no sharing between channels).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  ApplyDataPlaneArgs(&args);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

void ConfigureServerBuilder(grpc::ServerBuilder* builder) {
  DisableLockDebuggingOnce();
  builder->SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder->SetMaxSendMessageSize(kMaxMessageBytes);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                              kStreamWindowBytes);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
  builder->AddChannelArgument(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 64 << 10);
  builder->AddChannelArgument(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 8 << 20);
}

std::shared_ptr<grpc::Channel> ChannelCache::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& channel = channels_[address];
  if (channel == nullptr) channel = MakeChannel(address);
  return channel;
}

void ChannelCache::Forget(const std::string& address) {
  absl::MutexLock lock(&mu_);
  channels_.erase(address);
}

}  // namespace tessera
