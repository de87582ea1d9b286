// gRPC channels with tessera's settings, built from one options struct: the
// credentials, interceptors, message limits, flow-control windows and
// keepalive of every link a tessera process opens. A thread-safe cache gives
// each peer one channel.
#ifndef TESSERA_RPC_CHANNEL_H_
#define TESSERA_RPC_CHANNEL_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/limits.h"
#include "core/metrics.h"

namespace tessera {

// HTTP/2 flow-control window per stream and largest frame, for data
// streams (tuned in bench/: the 64 KiB default window stalls 1 MiB chunks).
inline constexpr int kStreamWindowBytes = 8 << 20;
inline constexpr int kMaxFrameBytes = 1 << 20;

using ClientInterceptorFactories = std::vector<
    std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>;

struct ChannelOptions {
  // Transport security; null means plaintext (insecure credentials).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Makes the interceptors of each new channel (one set per channel, since
  // gRPC takes ownership); empty: none.
  std::function<ClientInterceptorFactories()> interceptors;
  // Largest message either side accepts.
  int max_message_bytes = kMaxMessageBytes;
  // Keepalive pings on idle connections, so a dead peer is noticed.
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // Reconnect quickly after a peer restarts instead of gRPC's 20 s ceiling.
  absl::Duration initial_reconnect_backoff = absl::Milliseconds(100);
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
  // How long one connection attempt may take, handshake included. gRPC
  // reads it from GRPC_ARG_MIN_RECONNECT_BACKOFF_MS; too short and a peer
  // busy moving a reshard's bytes fails the handshake ("connection attempt
  // timed out before receiving SETTINGS frame").
  absl::Duration connect_timeout = absl::Seconds(10);
};

struct ServerOptions {
  // Transport security; null means plaintext (insecure credentials).
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Server interceptors (authorization); gRPC takes ownership. Run before
  // the metrics interceptor.
  std::function<std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>()>
      interceptors;
  // When set, every call is counted and timed into it, per method and
  // status code (rpc/metrics_interceptor.h). Not owned; outlives the server.
  MetricsRegistry* metrics = nullptr;
  // Serve grpc.health.v1.Health (NOT_SERVING until RunningServer::SetServing)
  // and server reflection.
  bool health = true;
  bool reflection = true;
  // Largest message either side accepts.
  int max_message_bytes = kMaxMessageBytes;
  // Most concurrent streams per client connection; 0: gRPC's default.
  int max_concurrent_streams = 0;
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
};

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelOptions& options = {});

// Debian builds Abseil without NDEBUG, so every absl::Mutex -- gRPC's own
// locks included -- checks for deadlock cycles through one process-wide
// graph lock. Turns that off for the process; MakeChannel and
// ConfigureServerBuilder call it, so any process that speaks gRPC through
// tessera gets it. Idempotent.
void DisableLockDebuggingOnce();

// Applies `options` (limits, windows, keepalive, interceptors) to a server
// under construction. Credentials go with each listening port (StartServer).
void ConfigureServerBuilder(grpc::ServerBuilder* builder,
                            const ServerOptions& options = {});

// One channel per address, created on first use with the cache's options.
// Safe for concurrent use.
class ChannelCache {
 public:
  explicit ChannelCache(ChannelOptions options = {})
      : options_(std::move(options)) {}

  std::shared_ptr<grpc::Channel> Get(const std::string& address)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the channel to `address` (its peer restarted): the next Get
  // connects afresh instead of waiting out a reconnect backoff.
  void Forget(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  const ChannelOptions& options() const { return options_; }

 private:
  const ChannelOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_RPC_CHANNEL_H_
