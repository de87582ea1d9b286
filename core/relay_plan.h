// The relay (CLI.md "Mirrors (v4)", "Relay"): how the same bytes reach
// several workers. A shard moves in chunks; its destinations form a chain
// (or a tree of degree 2 where a chain would be deeper than the chunks can
// fill) and each passes chunk i on while it receives chunk i+1, so K
// destinations take about as long as one and no worker sends a byte more
// than twice. Pure rules; PieceMover::Relay carries a plan out and the
// worker runs each hop (WorkerNode::Transfer with a relay).
#ifndef TESSERA_CORE_RELAY_PLAN_H_
#define TESSERA_CORE_RELAY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/box.h"

namespace tessera {

// A chunk is at least this (a call per chunk stays well under 1% of its
// bytes' time) and at most this (a hop waits at most one chunk-time for
// its first bytes).
inline constexpr int64_t kMinRelayChunkBytes = int64_t{1} << 20;
inline constexpr int64_t kMaxRelayChunkBytes = int64_t{16} << 20;
// A shard of B bytes goes in about this many chunks (within the bounds
// above): a chain of K copies takes (chunks + K - 1) / chunks of one
// shard-time, so 8 mirrors add about 5 % and a chain of 128 one
// shard-time (bench figure 21).
inline constexpr int64_t kRelayChunksPerShard = 128;

// The chunk size for a shard of `bytes` of `item`-byte elements: about
// bytes / kRelayChunksPerShard, clamped to the bounds, a whole number of
// elements.
int64_t RelayChunkBytes(int64_t bytes, int64_t item);

// A shard of `shape` cut into boxes of at most `chunk_bytes` (at least one
// row of the innermost dimension that fits), each contiguous in the
// shard's row-major memory, in memory order: the units a hop waits for and
// pulls. Empty shape: one chunk. `chunk_bytes` >= item.
std::vector<Box> RelayChunks(absl::Span<const int64_t> shape, int64_t item,
                             int64_t chunk_bytes);

// A worker taking part in a relay.
struct RelayMember {
  std::string name;
  std::string host;  // the host part of its address
  std::string zone;  // its failure domain; empty: a zone of its own host
  int64_t busy = 0;  // moves it serves now: busier members go later
};

// Where each destination pulls from.
struct RelayPlan {
  // The destinations (indices into the ones given) in the order they are
  // started: each one's parent comes before it.
  std::vector<int> order;
  // For each destination (by index): its parent, another destination's
  // index or -1 for the source.
  std::vector<int> parent;
  bool tree = false;  // degree 2 (else a chain)
};

// The relay from `source` to `destinations` for a shard that goes in
// `chunks` chunks. The order keeps the source's host, then its zone,
// first, and each other zone and host together (zones and hosts by their
// least busy member, then name), members of a host least busy first. A
// chain when K - 1 <= chunks + 2 * depth(tree), else a tree of degree 2
// in that order (breadth first: the source feeds the first two).
RelayPlan PlanRelay(const RelayMember& source,
                    const std::vector<RelayMember>& destinations,
                    int64_t chunks);

// The host part of a worker address ("host:port", "[v6]:port").
std::string AddressHost(absl::string_view address);

}  // namespace tessera

#endif  // TESSERA_CORE_RELAY_PLAN_H_
