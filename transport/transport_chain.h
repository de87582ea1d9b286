// TransportChain: the data plane's one place of choice. It holds transports
// in order of preference (same-host shared memory first, then UCX, then
// gRPC, which reaches everything) and, for each read or write, tries them in
// turn: a transport that answers FAILED_PRECONDITION ("not possible from
// here") is counted as a fallback and the next one is tried; any other
// answer is final. A transport may be skipped for small moves (`min_bytes`,
// `min_write_bytes`): pieces under kChunkBytes skip shared memory even on
// the same host, since mapping a segment costs about as much as a call
// (bench/), and small whole-shard writes skip UCX.
//
// It counts the bytes each transport moved and the fallbacks, for `get
// --json` and metrics. It is itself a ShardTransport (its Transfer reads each
// piece through the chain), so callers hold one object. Thread-safe.
#ifndef TESSERA_TRANSPORT_TRANSPORT_CHAIN_H_
#define TESSERA_TRANSPORT_TRANSPORT_CHAIN_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/limits.h"
#include "transport/shard_transport.h"

namespace tessera {

class ChannelCache;      // rpc/channel.h; this header stays free of gRPC
class TlsContextSource;  // rpc/tls_context.h

// The transports a chain may use, by name: "auto" (shared memory for
// workers on this host, else UCX where allowed, else the workers' data
// ports over TCP, else gRPC), or "shm", "ucx", "tcp" or "grpc" alone.
// INVALID_ARGUMENT for any other name.
absl::Status CheckTransportName(const std::string& name);

struct DataPlaneOptions {
  // Deadline of one read or write (one piece, one shard).
  absl::Duration timeout = absl::Minutes(30);
  // "auto", or one transport forced (see CheckTransportName). A forced
  // transport that cannot reach a worker fails the move (FAILED_PRECONDITION
  // or UNAVAILABLE naming the transport and the worker); nothing falls back.
  std::string transport = "auto";
  // Try same-host shared memory first ("auto" only). Off: no shared-memory
  // link.
  bool shared_memory = true;
  // Try UCX before gRPC ("auto" only). Off, or TESSERA_UCX=0 in the
  // environment: no UCX link.
  bool ucx = true;
  // The network between the cluster's hosts is trusted (a worker's
  // --trusted_fabric; TESSERA_TRUSTED_FABRIC in the environment says the
  // same): UCX may use it. Otherwise UCX reaches only same-user peers on
  // this host (transport/ucx_common.h UcxReach), and "auto" leaves UCX out
  // when the channels use TLS, since UCX would carry the bytes outside it.
  bool ucx_trusted_fabric = false;
  // Try workers' data ports (TCP) before gRPC ("auto" only). Under
  // channels that run TLS, only with `tcp_tls`.
  bool tcp = true;
  // Mutual TLS to the data ports (a client's or a worker's certificate;
  // null: plaintext).
  std::shared_ptr<TlsContextSource> tcp_tls;
  // Keep whole-shard mappings across reads (a client reading the same
  // shards again and again); off: map each piece's span once (a worker
  // pulling reshard pieces).
  bool cache_mappings = true;
  // Without cache_mappings: bytes of peers' whole segments kept mapped by
  // identity, so pages a peer reuses are not mapped again
  // (SharedMemoryTransportOptions::keep_segment_bytes).
  int64_t keep_segment_bytes = 0;
  // Reads and writes smaller than this skip shared memory.
  int64_t shared_memory_min_bytes = kChunkBytes;
  // Whole-shard writes smaller than this skip UCX ("auto" only): a put
  // costs two calls around it (keys, then the seal), one stream more than
  // gRPC's WriteShard, which wins for small shards.
  int64_t ucx_min_write_bytes = kChunkBytes;
};

// What a chain has moved since it was made: bytes that crossed each
// transport, which may differ from what the caller's output holds (a row
// gather moves each distinct row once, however often it is asked for).
struct DataPlaneStats {
  std::map<std::string, int64_t> bytes;      // by transport name
  std::map<std::string, int64_t> fallbacks;  // by the transport that declined
  std::map<std::string, int64_t> served;     // bytes read, by serving worker
  // Progress, counted as the bytes move (parts of reads and writes still
  // running included; a part read again after a fallback counts again):
  // bytes landed in this client's arrays, and bytes taken from them.
  int64_t landed = 0;
  int64_t sent = 0;
  // Bytes each worker sent to others for this client's writes and
  // reshards (filling replicas and mirrors, moving pieces), as the
  // coordinator's replies counted them: the writes' `"sent"` (CLI.md
  // "Relay"). A client's own count; transports leave it empty.
  std::map<std::string, int64_t> workers_sent;
};

class TransportChain : public ShardTransport {
 public:
  struct Link {
    std::unique_ptr<ShardTransport> transport;
    // Moves of fewer bytes skip this transport.
    int64_t min_bytes = 0;
    // Whole-shard writes of fewer bytes skip this transport too.
    int64_t min_write_bytes = 0;
  };

  // Tries `links` in order; the last should reach every worker. A `forced`
  // chain (one transport named by the user) words its failures to name the
  // transport and the worker.
  explicit TransportChain(std::vector<Link> links, bool forced = false);

  // The standard chain per options.transport: for "auto", shared memory
  // (if options.shared_memory), then UCX (if options.ucx), then gRPC, all
  // reaching workers through `channels` (not owned; outlives the chain).
  // An unknown transport name is taken as "auto" (check it first).
  static std::unique_ptr<TransportChain> Make(ChannelCache* channels,
                                              const DataPlaneOptions& options);

  const std::string& name() const override;
  absl::Status Read(const RemoteShard& shard, const Box& box,
                    const ReadTarget& target) override;
  absl::Status Write(const RemoteShard& shard,
                     const WriteSource& source) override;
  // Rows skip no link for their size: they come out of kept mappings, so
  // even small lookups are cheaper than a call.
  absl::Status ReadRows(absl::Span<const ShardRows> entries,
                        const RowSink& sink) override;
  absl::Status WriteBox(const RemoteShard& shard, const Box& box,
                        const WriteSource& source) override;

  DataPlaneStats Stats() const;
  // Bytes of the reads from the worker at `address` running now: the
  // reader's tie-break between equally near replicas.
  int64_t InFlight(const std::string& address) const;

 private:
  std::atomic<int64_t> landed_{0};  // DataPlaneStats::landed
  std::atomic<int64_t> sent_{0};    // DataPlaneStats::sent

  struct Counted {
    Link link;
    std::atomic<int64_t> bytes{0};
    std::atomic<int64_t> fallbacks{0};
  };

  // Runs `op` on each eligible transport until one does not decline. With
  // `by_size` false, no link is skipped for moving fewer than min_bytes.
  // `shard` names the worker in the errors of a forced chain. `write`: a
  // whole-shard write (min_write_bytes applies too).
  template <typename Op>
  absl::Status Run(const RemoteShard& shard, int64_t bytes, const Op& op,
                   bool by_size = true, bool write = false);

  // A read of `bytes` from `shard`'s worker: counted in flight while `op`
  // runs, and as served by that worker when it succeeds.
  absl::Status CountRead(const RemoteShard& shard, int64_t bytes,
                         const std::function<absl::Status()>& op);

  // Fixed at construction; only the counters change.
  std::vector<std::unique_ptr<Counted>> links_;
  const bool forced_;
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> served_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_TRANSPORT_CHAIN_H_
