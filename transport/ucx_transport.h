// ShardTransport over UCX (name "ucx"): shard bytes sent by the worker as
// tagged messages straight into the caller's destination, and written into
// a pending shard as active messages the worker receives straight into it.
// RDMA or TCP between hosts on a trusted fabric; shared memory and CMA on
// one host otherwise (ucx_common.h UcxReach).
//
// A read asks the worker's UcxData service (proto/ucx.proto, over the
// worker's gRPC channel, presenting the same capability as the other
// transports) for the worker's UCX address and a key naming the shard,
// connects, and asks for ranges of it (UcxSendRequest in ucx_common.h):
// one per contiguous run of the box (cut at `send_bytes`), each received
// straight into its place, up to kMaxUcxSendRanges per request. A box
// whose runs are short is packed by the worker into its staging memory
// (UcxData.Stage, a lease checked and ended like a key, see ucx_server.h)
// and sent in a few large messages, straight into a host array whose runs
// are long, else into a buffer and placed from there; a box that is one
// range of the shard but lands in short runs is sent whole into a buffer;
// a worker that stages nothing has the box's whole rows sent and copied
// out. Endpoints and keys are cached per worker and shard (bounded, least
// recently used dropped) and dropped on any failure; a key is asked for
// again after `key_ttl`, and an endpoint idle for `peer_idle_timeout` is
// closed with a goodbye (the worker then closes its side).
//
// After its bytes are in, the reader asks the worker (an active message)
// whether the key's shard is still held: a shard freed meanwhile fails the
// read with NOT_FOUND, a withdrawn key is asked for again once, so a stale
// key never returns bytes the worker no longer vouches for (ucx_server.h).
//
// Errors, per shard_transport.h:
//   FAILED_PRECONDITION  UCX is off or cannot start here (no context, no
//                        worker: counted as a fallback), the worker offers
//                        no UCX (no UcxData service), the shard is not in
//                        host memory, or the caller's shape or element size
//                        differs from the worker's: the chain falls back.
//   NOT_FOUND            the shard is not held (freed).
//                        Also when the worker answers gRPC but UCX cannot
//                        reach it (after one retry on a fresh endpoint, or a
//                        UCX operation stalled for `stall_timeout`); the
//                        worker is then not tried over UCX for no_ucx_ttl.
//   UNAVAILABLE          the worker cannot be reached at all.
//   OUT_OF_RANGE         the box lies outside the shard.
//   PERMISSION_DENIED    a write to a shard that takes no more (sealed).
// Every field of a worker's reply is checked before it is used.
//
// Threads: each call takes a lane (a UCX worker with its endpoints and keys)
// for itself and progresses it while it waits, spinning briefly and then
// sleeping on the lane's event fd. Thread-safe.
#ifndef TESSERA_TRANSPORT_UCX_TRANSPORT_H_
#define TESSERA_TRANSPORT_UCX_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/box.h"
#include "core/buffer_pool.h"
#include "rpc/channel.h"
#include "transport/shard_transport.h"

namespace tessera {

struct UcxTransportOptions {
  // Deadline of one read or write, and of each UcxData call.
  absl::Duration timeout = absl::Minutes(30);
  // A UCX operation that makes no progress for this long fails the call
  // with UNAVAILABLE (the peer is dropped).
  absl::Duration stall_timeout = absl::Seconds(30);
  // Who this process's UCX may reach (ucx_common.h): the network only on a
  // trusted fabric (or TESSERA_TRUSTED_FABRIC in the environment); this
  // host's same-user shared memory otherwise.
  bool trusted_fabric = false;
  // Most lanes (threads moving bytes at once); more calls wait for one.
  int max_lanes = 16;
  // Per lane: most workers with an endpoint, and most keys per worker.
  size_t max_peers = 64;
  size_t max_keys = 1024;
  // An endpoint unused this long is closed (with a goodbye). Below the
  // worker's own limit (UcxServerOptions::peer_idle_timeout).
  absl::Duration peer_idle_timeout = absl::Seconds(60);
  // A cached key is asked for again after this long (and a long read checks
  // its shard this often).
  absl::Duration key_ttl = absl::Seconds(10);
  // Largest single write message, and most written messages in flight on
  // one lane.
  int64_t max_write_bytes = int64_t{4} << 20;
  int max_in_flight = 32;
  // Largest range the worker sends as one message: over TCP, a large
  // tagged message goes as a rendezvous straight between the two buffers.
  int64_t send_bytes = int64_t{64} << 20;
  // Boxes whose contiguous runs are shorter are staged (packed by the
  // worker). A rows->cols reshard (1 KiB runs) moved 0.5 GB/s staged and
  // 0.07 GB/s with one message per run (bench/, figure 8).
  int64_t min_run_bytes = 2048;
  // Staging buffer size.
  int64_t stage_bytes = int64_t{4} << 20;
  // A box with short runs is first asked of the worker packed (UcxData.Stage)
  // this many bytes at a time; whole rows are read only when the worker
  // stages nothing. 0: never asked.
  int64_t remote_stage_bytes = int64_t{16} << 20;
  // Whole rows may be at most this many times the box's bytes (else
  // FAILED_PRECONDITION: the worker's own gather over gRPC is better).
  int64_t max_stage_inflation = 16;
  // Endpoints with peer-failure handling (UCP_ERR_HANDLING_MODE_PEER): a
  // dead worker fails the call at once rather than by stall_timeout, and
  // both ends can close the endpoint for good (UCX keeps an endpoint
  // without it, and what it maps of the peer, until its worker goes).
  bool detect_peer_failure = true;
  // A worker that offers no UCX is not asked again for this long.
  absl::Duration no_ucx_ttl = absl::Seconds(10);
};

class UcxTransport : public ShardTransport {
 public:
  // `channels` (not owned, outlives this) reaches the workers' UcxData
  // service. UCX itself starts at the first call; when it cannot (or the
  // environment turns it off, TESSERA_UCX=0) every call answers
  // FAILED_PRECONDITION and that is logged once.
  UcxTransport(ChannelCache* channels, UcxTransportOptions options);
  ~UcxTransport() override;

  const std::string& name() const override;
  absl::Status Read(const RemoteShard& shard, const Box& box,
                    const ReadTarget& target) override;
  absl::Status Write(const RemoteShard& shard,
                     const WriteSource& source) override;
  // Whole rows, one get each (many in flight), checked per staging buffer
  // before they reach `sink`. Rows outside a shard: FAILED_PRECONDITION
  // (gRPC gives the worker's own answer).
  absl::Status ReadRows(absl::Span<const ShardRows> entries,
                        const RowSink& sink) override;

  // Whether UCX started (after a first call); for tests and reports.
  bool started() const ABSL_LOCKS_EXCLUDED(mu_);
  // Closes every idle lane's endpoints, each with a goodbye (as the
  // destructor does); for tests.
  void CloseIdle() ABSL_LOCKS_EXCLUDED(mu_);

  class Lane;  // ucx_transport.cc

 private:
  absl::Status EnsureStarted() ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::unique_ptr<Lane>> AcquireLane() ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseLane(std::unique_ptr<Lane> lane) ABSL_LOCKS_EXCLUDED(mu_);
  bool NoUcxAt(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  // What every call checks of a shard before it takes a lane: an element
  // size UCX can move (INVALID_ARGUMENT) and a worker not known to lack UCX
  // (FAILED_PRECONDITION).
  absl::Status CheckShard(const RemoteShard& shard) ABSL_LOCKS_EXCLUDED(mu_);
  void MarkNoUcx(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  ChannelCache* const channels_;
  const UcxTransportOptions options_;

  // Guards the start, the idle lanes and the workers without UCX.
  // Invariant: lanes_made_ counts idle_ plus the lanes taken by calls.
  mutable absl::Mutex mu_;
  bool start_tried_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status start_status_ ABSL_GUARDED_BY(mu_);
  void* context_ ABSL_GUARDED_BY(mu_) = nullptr;  // ucp_context_h
  std::vector<std::unique_ptr<Lane>> idle_ ABSL_GUARDED_BY(mu_);
  int lanes_made_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, absl::Time> no_ucx_until_
      ABSL_GUARDED_BY(mu_);
  // Bounce buffers of the lanes (ranges placed into short runs).
  BufferPool buffers_{int64_t{64} << 20, absl::Seconds(10)};
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_UCX_TRANSPORT_H_
