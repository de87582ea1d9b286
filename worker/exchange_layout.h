// How one member's share of an NCCL exchange (core/transfer.h ExchangePlan)
// lies in memory: each piece is one contiguous range that NCCL sends or
// receives. A piece whose box is one range of its shard is posted from, or
// into, the shard itself; the others go through one scratch buffer per
// exchange, packed before the group and unpacked after it, each at an
// aligned offset. Pieces of no bytes are left out: both ends skip them.
//
// Kept apart from NCCL (worker/nccl_exchange.cc only turns this into
// device pointers and copies) so that the host tests check every offset.
#ifndef TESSERA_WORKER_EXCHANGE_LAYOUT_H_
#define TESSERA_WORKER_EXCHANGE_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/transfer.h"
#include "worker/shard_store.h"

namespace tessera {

// Packed pieces start at multiples of this in the buffer.
inline constexpr int64_t kExchangeBufferAlignment = 256;

struct PostedPiece {
  const ExchangePiece* piece = nullptr;  // in the plan laid out
  size_t shard = 0;  // index into the shards given, and the piece's
  int32_t peer = 0;
  int64_t bytes = 0;
  int64_t shard_offset = -1;   // posted in place: its first byte's offset
  int64_t buffer_offset = -1;  // packed: where it lies in the buffer
  bool packed() const { return buffer_offset >= 0; }
};

struct ShareLayout {
  std::vector<PostedPiece> sends;  // in plan order
  std::vector<PostedPiece> recvs;
  int64_t buffer_bytes = 0;    // the scratch buffer, 0 when nothing packs
  int64_t received_bytes = 0;  // every received piece's bytes
};

// Lays out `plan`; `shards[i]` describes the shard of the i-th piece,
// sends first, then receives. OUT_OF_RANGE or INVALID_ARGUMENT when a
// piece is not within its shard (WorkerNode checks this before; the layout
// does not rely on it), INVALID_ARGUMENT when the shards given do not
// match the pieces.
absl::StatusOr<ShareLayout> LayOutShare(const ExchangePlan& plan,
                                        absl::Span<const ShardDesc> shards);

}  // namespace tessera

#endif  // TESSERA_WORKER_EXCHANGE_LAYOUT_H_
