// A relay hop's progress (core/relay_plan.h): which shards on this worker
// relay hops are filling and how far each got, so that the hop after it
// pulls a chunk only once this worker holds it; and how a hop asks the copy
// it pulls from the same (RelayUpstreams). Bounded: at most
// kMaxRunningRelayFills fills run here at once, and the outcome of the last
// kMaxFinishedRelayFills is kept for hops that ask after the end.
#ifndef TESSERA_WORKER_RELAY_FILLS_H_
#define TESSERA_WORKER_RELAY_FILLS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/transfer.h"

namespace tessera {

inline constexpr size_t kMaxRunningRelayFills = 1024;
inline constexpr size_t kMaxFinishedRelayFills = 4096;
// An AwaitRelayFill answers within this even when nothing changed, so a
// hop notices its own deadline and a waiter holds a server thread briefly.
inline constexpr absl::Duration kRelayAwaitSlice = absl::Seconds(1);

struct RelayFillProgress {
  bool started = false;     // the hop began filling the shard
  int64_t chunks_done = 0;  // its first chunks_done chunks are held
  bool done = false;        // all of them
};

class RelayFills {
 public:
  // Hop `relay` begins filling `shard`. ALREADY_EXISTS when one fills it
  // now; RESOURCE_EXHAUSTED when kMaxRunningRelayFills run.
  absl::Status Begin(uint64_t relay, uint64_t shard) ABSL_LOCKS_EXCLUDED(mu_);
  // Its first `chunks_done` chunks are held.
  void Advance(uint64_t relay, uint64_t shard, int64_t chunks_done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // It ended: every chunk held (`done`), or it failed.
  void Finish(uint64_t relay, uint64_t shard, bool done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until `relay`'s fill of `shard` holds more than `have` chunks,
  // ends, or `until` passes (then: how far it is, or not started).
  // UNAVAILABLE when the fill failed.
  absl::StatusOr<RelayFillProgress> Await(uint64_t relay, uint64_t shard,
                                          int64_t have, absl::Time until)
      ABSL_LOCKS_EXCLUDED(mu_);
  size_t running() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Key = std::pair<uint64_t, uint64_t>;  // relay, shard
  struct Fill {
    int64_t chunks_done = 0;
    bool ended = false;
    bool done = false;
  };

  mutable absl::Mutex mu_;
  std::map<Key, Fill> fills_ ABSL_GUARDED_BY(mu_);
  std::deque<Key> finished_ ABSL_GUARDED_BY(mu_);  // oldest first
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
};

// A chunk of a shard as the changes from an earlier version of it
// (core/delta_codec.h), or not `encoded` when they would not be shorter.
struct ShardDelta {
  bool encoded = false;
  std::string changes;
  uint32_t crc32 = 0;  // of the chunk's bytes in the later version
};

// Bytes [byte_offset, byte_offset + bytes) of a shard, as changes no longer
// than max_encoded_bytes.
struct ShardDeltaRequest {
  int64_t byte_offset = 0;
  int64_t bytes = 0;
  int64_t max_encoded_bytes = 0;
};

// How a hop asks the copy it pulls from how far that copy's own fill got
// (AwaitRelayFill on the worker holding it), and for a chunk of it as the
// changes from that worker's copy of the earlier version
// (upstream.base_shard_id; ReadShardDelta).
class RelayUpstreams {
 public:
  virtual ~RelayUpstreams() = default;
  virtual absl::StatusOr<RelayFillProgress> Await(const RelayUpstream& upstream,
                                                  uint64_t relay,
                                                  int64_t have) = 0;
  virtual absl::StatusOr<ShardDelta> ReadDelta(
      const RelayUpstream& upstream, const ShardDeltaRequest& request) = 0;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_RELAY_FILLS_H_
