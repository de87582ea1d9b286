// TcpTransport: shard bytes over workers' data ports (transport/tcp_wire.h),
// received straight into the caller's array at their final offsets and sent
// straight from it: no framing to strip, no buffer of gRPC's to copy out of.
//
// A worker's data address comes from the worker itself (Worker.DataAddress
// over gRPC, asked once and kept); a worker with none (`--data_listen=off`,
// an older worker) makes every call decline (FAILED_PRECONDITION), so a
// chain falls back to gRPC. Connections to each worker are kept and reused,
// one per call in flight; a kept connection the worker has since closed is
// replaced once, transparently, before any reply byte arrives.
//
// With TLS, each connection is mutual TLS 1.3 (transport/data_stream.h); a
// worker that refuses this client's certificate, or whose own does not
// verify, fails the call UNAUTHENTICATED.
//
// Errors follow transport/shard_transport.h: the worker's own answers as it
// gives them, UNAVAILABLE when its data port cannot be reached or the
// connection breaks (a refused capability closes it too). Thread-safe.
#ifndef TESSERA_TRANSPORT_TCP_TRANSPORT_H_
#define TESSERA_TRANSPORT_TCP_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/shard_transport.h"
#include "transport/tcp_wire.h"

namespace tessera {

class ChannelCache;      // rpc/channel.h
class TlsContextSource;  // rpc/tls_context.h

struct TcpTransportOptions {
  // Most time a call waits with nothing moving before giving up.
  absl::Duration timeout = absl::Minutes(1);
  // Idle connections kept per worker.
  int max_idle_per_worker = 8;
  // The data address of the worker whose gRPC address is given: empty when
  // it has none. Null: asked of the worker (Worker.DataAddress) through the
  // transport's channels.
  std::function<absl::StatusOr<std::string>(const std::string& address)>
      resolve;
  // Mutual TLS 1.3 to every data port (null: plaintext). The worker's
  // certificate must name the host of its data address.
  std::shared_ptr<TlsContextSource> tls;
};

class TcpTransport : public ShardTransport {
 public:
  // `channels` (not owned, outlives the transport) reach workers' gRPC
  // ports to ask their data addresses; may be null when options.resolve is
  // given.
  TcpTransport(ChannelCache* channels, TcpTransportOptions options);
  ~TcpTransport() override;

  const std::string& name() const override;
  absl::Status Read(const RemoteShard& shard, const Box& box,
                    const ReadTarget& target) override;
  absl::Status Write(const RemoteShard& shard,
                     const WriteSource& source) override;
  absl::Status ReadRows(absl::Span<const ShardRows> entries,
                        const RowSink& sink) override;
  absl::Status WriteBox(const RemoteShard& shard, const Box& box,
                        const WriteSource& source) override;

  // Connections opened so far (for tests: reuse keeps it low).
  int64_t connections_opened() const { return opened_.load(); }

 private:
  class Connection;
  struct Exchange;

  // The data address of the worker at `address`; empty when it has none.
  absl::StatusOr<std::string> DataAddress(const std::string& address)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A kept connection to `data_address` (`reused` set), or a new one.
  absl::StatusOr<std::unique_ptr<Connection>> Take(
      const std::string& data_address, bool* reused) ABSL_LOCKS_EXCLUDED(mu_);
  void Keep(const std::string& data_address, std::unique_ptr<Connection> c)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Sends one request to the worker of `address` and hands its OK reply's
  // payload (exactly `expected` bytes) to `receive`; the worker's error
  // answer otherwise.
  absl::Status Call(const std::string& address, const Exchange& exchange);
  // Writes `box` of `shard` from `source`: a patch of that sub-box, or
  // (patch false, `box` the whole shard) the whole shard, sealed.
  absl::Status SendWrite(const RemoteShard& shard, const Box& box, bool patch,
                         const WriteSource& source);
  // One try of Call at the data address known now.
  absl::Status CallOnce(const std::string& address, const Exchange& exchange);

  ChannelCache* const channels_;
  const TcpTransportOptions options_;
  std::atomic<int64_t> opened_{0};
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> data_addresses_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::vector<std::unique_ptr<Connection>>>
      idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_TCP_TRANSPORT_H_
