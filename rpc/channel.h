// gRPC channels with tessera's settings (message limits sized for 1 MiB data
// chunks, keepalive), and a thread-safe cache so each peer gets one channel.
#ifndef TESSERA_RPC_CHANNEL_H_
#define TESSERA_RPC_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

// Largest message either side accepts; data chunks are far smaller.
inline constexpr int kMaxMessageBytes = 64 << 20;

// HTTP/2 flow-control window per stream and largest frame, for data
// streams (tuned in bench/: the 64 KiB default window stalls 1 MiB chunks).
inline constexpr int kStreamWindowBytes = 8 << 20;
inline constexpr int kMaxFrameBytes = 1 << 20;

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// Sets the data-plane window, frame and socket-read sizes on `args`.
void ApplyDataPlaneArgs(grpc::ChannelArguments* args);

// Debian builds Abseil without NDEBUG, so every absl::Mutex -- gRPC's own
// locks included -- checks for deadlock cycles through one process-wide
// graph lock. Turns that off for the process; MakeChannel and
// ConfigureServerBuilder call it, so any process that speaks gRPC through
// tessera gets it. Idempotent.
void DisableLockDebuggingOnce();

// Applies tessera's limits to a server under construction.
void ConfigureServerBuilder(grpc::ServerBuilder* builder);

// One channel per address, created on first use. Safe for concurrent use.
class ChannelCache {
 public:
  std::shared_ptr<grpc::Channel> Get(const std::string& address)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the channel to `address` (its peer restarted): the next Get
  // connects afresh instead of waiting out a reconnect backoff.
  void Forget(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_RPC_CHANNEL_H_
