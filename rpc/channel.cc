#include "rpc/channel.h"

#include "absl/base/call_once.h"
#include "rpc/metrics_interceptor.h"

namespace tessera {
namespace {

int Millis(absl::Duration d) {
  return static_cast<int>(absl::ToInt64Milliseconds(d));
}

}  // namespace

void DisableLockDebuggingOnce() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelOptions& options) {
  DisableLockDebuggingOnce();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(options.keepalive_time));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(options.keepalive_timeout));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              Millis(options.max_reconnect_backoff));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              Millis(options.initial_reconnect_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              Millis(options.connect_timeout));
  // Each channel gets its own TCP connection (no sharing between channels).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Bulk streams: a large fixed flow-control window instead of growing it
  // from 64 KiB by BDP probes, and big reads off the socket.
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
  args.SetInt(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 64 << 10);
  args.SetInt(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 8 << 20);
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.credentials != nullptr ? options.credentials
                                     : grpc::InsecureChannelCredentials();
  if (options.interceptors) {
    return grpc::experimental::CreateCustomChannelWithInterceptors(
        address, credentials, args, options.interceptors());
  }
  return grpc::CreateCustomChannel(address, credentials, args);
}

void ConfigureServerBuilder(grpc::ServerBuilder* builder,
                            const ServerOptions& options) {
  DisableLockDebuggingOnce();
  builder->SetMaxReceiveMessageSize(options.max_message_bytes);
  builder->SetMaxSendMessageSize(options.max_message_bytes);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                              kStreamWindowBytes);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
  builder->AddChannelArgument(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 64 << 10);
  builder->AddChannelArgument(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 8 << 20);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                              Millis(options.keepalive_time));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                              Millis(options.keepalive_timeout));
  // Clients ping idle connections every keepalive_time: allow it.
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      Millis(options.keepalive_time) / 2);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  if (options.max_concurrent_streams > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                                options.max_concurrent_streams);
  }
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  if (options.interceptors) interceptors = options.interceptors();
  if (options.metrics != nullptr) {
    interceptors.push_back(MakeRpcMetricsInterceptorFactory(options.metrics));
  }
  if (!interceptors.empty()) {
    builder->experimental().SetInterceptorCreators(std::move(interceptors));
  }
}

std::shared_ptr<grpc::Channel> ChannelCache::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& channel = channels_[address];
  if (channel == nullptr) channel = MakeChannel(address, options_);
  return channel;
}

void ChannelCache::Forget(const std::string& address) {
  absl::MutexLock lock(&mu_);
  channels_.erase(address);
}

}  // namespace tessera
