// gRPC channels with tessera's settings, built from one options struct: the
// credentials, interceptors, message limits, flow-control windows and
// keepalive of every link a tessera process opens. A thread-safe cache gives
// each peer one channel. A watchdog cancels calls that stall.
#ifndef TESSERA_RPC_CHANNEL_H_
#define TESSERA_RPC_CHANNEL_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/limits.h"
#include "core/metrics.h"
#include "core/stop.h"

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
  // Answers every call to a method no registered service has (a standby
  // coordinator's answer). Not owned; outlives the server.
  grpc::CallbackGenericService* fallback = nullptr;
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
  // A call that sends and receives no message for this long is cancelled
  // (CANCELLED): a peer that is alive, answers keepalive pings, but stalls.
  // Calls on channels with a finite idle timeout also honour the
  // ScopedCallDeadline of the thread that starts them. Infinite: neither.
  absl::Duration idle_timeout = absl::InfiniteDuration();
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
  // HOST:PORT of a second, plaintext port serving grpc.health.v1 alone (and
  // reflection): for probes that cannot speak the main port's mutual TLS,
  // like the kubelet's gRPC probe. It answers what the main port's health
  // does; no other service is reachable on it. Empty: none.
  std::string health_listen;
  // Answers every call to a method no registered service has (a standby
  // coordinator's answer). Not owned; outlives the server.
  grpc::CallbackGenericService* fallback = nullptr;
  // Largest message either side accepts.
  int max_message_bytes = kMaxMessageBytes;
  // Most concurrent streams per client connection (more wait on the client
  // for a free slot); 0: gRPC's default, unlimited.
  int max_concurrent_streams = 256;
  // Most threads the server may run (handlers and gRPC's pollers, through
  // grpc::ResourceQuota); a call that finds none free is answered
  // RESOURCE_EXHAUSTED at once instead of queueing. 0: no limit.
  int max_threads = 512;
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // Most client connections the main port holds at once; one beyond is
  // accepted and closed at once (rpc/listener_guard.h). The health port
  // holds at most `max_health_connections`. 0: no bound. Either way a
  // port keeps accepting after the process ran out of descriptors.
  int max_connections = 16384;
  // Most of those one peer host (IP address) holds, so that one host
  // flooding the port leaves room for the others. 0: no bound of its own.
  int max_connections_per_peer = 1024;
  int max_health_connections = 64;
  // A connection whose TLS and HTTP/2 handshakes have not finished this
  // long after it was accepted is closed (gRPC's default: 120 s), so
  // callers that never complete one (no certificate) do not pile up.
  absl::Duration handshake_timeout = absl::Seconds(20);
};

// A channel to `address`, HOST:PORT; or, for "A1,A2,...", one channel over
// every address that connects to the first that accepts and moves on when
// it goes (gRPC's pick_first over the resolved addresses): coordinators
// that stand by do not listen, so it follows the leader.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelOptions& options = {});

// HOST:PORT: a host of letters, digits, '.', '-' (or an IPv6 address in
// brackets) and a port from 1 to 65535.
bool IsHostPort(absl::string_view address);

// The gRPC target of `addresses` (see MakeChannel): unchanged for one;
// "ipv4:IP:P,IP:P" (or ipv6:) for several, names resolved now.
// INVALID_ARGUMENT for an entry that is not HOST:PORT or does not resolve.
absl::StatusOr<std::string> ChannelTarget(const std::string& addresses);

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

// Runs callbacks at their deadlines on one background thread, unless
// disarmed first: how idle streams and stalled calls are cancelled without a
// thread each. Thread-safe.
class Watchdog {
 public:
  Watchdog();
  // Joins the thread; alarms still armed never fire.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The process-wide watchdog (never destroyed).
  static Watchdog& Default();

  // Calls `fire` once, on the watchdog's thread, at `deadline`, unless
  // Disarm(id) comes first. `fire` must be quick and must not call Disarm.
  uint64_t Arm(absl::Time deadline, std::function<void()> fire)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels alarm `id`; if it is firing now, waits until it has returned,
  // so that afterwards whatever `fire` touches may go. True when the alarm
  // had not fired. Unknown ids are fine.
  bool Disarm(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  // Invariants: `alarms_` and `deadlines_` hold the same armed ids;
  // `firing_` is the id whose callback runs now (0: none).
  absl::Mutex mu_;
  std::map<std::pair<absl::Time, uint64_t>, std::function<void()>> alarms_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t firing_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// While it lives, calls that this thread starts on channels with a finite
// idle_timeout are cancelled at `deadline` (the earliest of nested scopes):
// one deadline for all the calls of one piece of work, such as a worker's
// pull of many pieces for one order.
class ScopedCallDeadline {
 public:
  explicit ScopedCallDeadline(absl::Time deadline);
  ~ScopedCallDeadline();
  ScopedCallDeadline(const ScopedCallDeadline&) = delete;
  ScopedCallDeadline& operator=(const ScopedCallDeadline&) = delete;

  // The deadline in force on this thread (infinite future: none).
  static absl::Time Current();

 private:
  const absl::Time previous_;
};

// While it lives, calls this thread starts are cancelled when
// `cancellation` (not owned; null: none) is, as are calls already running
// from it: how an SDK call is given up from another thread (an asyncio
// task cancelled). The client carries it, with the deadline, into the
// threads it starts for one call.
class ScopedCancellation {
 public:
  explicit ScopedCancellation(Cancellation* cancellation);
  ~ScopedCancellation();
  ScopedCancellation(const ScopedCancellation&) = delete;
  ScopedCancellation& operator=(const ScopedCancellation&) = delete;

  // The cancellation in force on this thread (null: none).
  static Cancellation* Current();

 private:
  Cancellation* const previous_;
};

// `timeout`, cut to this thread's ScopedCallDeadline (never below zero):
// every transport times its calls with it, so that a read with another
// replica to go to can give one replica only so long (a hung worker).
absl::Duration CallTimeout(absl::Duration timeout);

// One channel per address, created on first use with the cache's options.
// With `max_channels` > 0 it keeps at most that many, dropping the least
// recently used (calls in flight keep their channel until they end), so a
// process sent many addresses does not hold a connection to each forever.
// Safe for concurrent use.
class ChannelCache {
 public:
  explicit ChannelCache(ChannelOptions options = {}, size_t max_channels = 0)
      : options_(std::move(options)), max_channels_(max_channels) {}

  std::shared_ptr<grpc::Channel> Get(const std::string& address)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the channel to `address` (its peer restarted): the next Get
  // connects afresh instead of waiting out a reconnect backoff.
  void Forget(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  const ChannelOptions& options() const { return options_; }
  // Channels kept now.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::shared_ptr<grpc::Channel> channel;
    std::list<std::string>::iterator use;  // its place in `uses_`
  };

  const ChannelOptions options_;
  const size_t max_channels_;
  // Invariant: `uses_` lists the keys of `channels_`, most recently used
  // first.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> channels_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> uses_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_RPC_CHANNEL_H_
