// Moving bytes between two workers: the pieces of a reshard (or any move)
// grouped per pair of workers, and what a reshard cost. Shared by the
// coordinator (which plans and orders moves), the worker (which executes
// them) and the SDK (which reports the cost).
#ifndef TESSERA_CORE_TRANSFER_H_
#define TESSERA_CORE_TRANSFER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "core/box.h"

namespace tessera {

// One piece: `sizes` elements of the source shard at `src_offsets` land in
// the destination shard at `dst_offsets` (each in its shard's own
// coordinates).
struct TransferPiece {
  uint64_t src_shard_id = 0;
  std::vector<int64_t> src_offsets;
  uint64_t dst_shard_id = 0;
  std::vector<int64_t> dst_offsets;
  std::vector<int64_t> sizes;

  Box SrcBox() const {
    return Box(absl::Span<const int64_t>(src_offsets),
               absl::Span<const int64_t>(sizes));
  }
  Box DstBox() const {
    return Box(absl::Span<const int64_t>(dst_offsets),
               absl::Span<const int64_t>(sizes));
  }
};

// A copy further up a relay (core/relay_plan.h) than a hop's parent: where
// the hop carries on from when its parent fails.
struct RelayUpstream {
  std::string worker;
  std::string address;
  uint64_t shard_id = 0;
  std::string capability;  // lets the hop read it (minted per worker)
  bool filling = false;    // a hop of the same relay (else a whole copy)
  // Its copy of the earlier version the hop's own copy holds (0: none): the
  // hop then pulls chunks as changes (ReadShardDelta).
  uint64_t base_shard_id = 0;
};

// Most copies a relay hop may name further up than its parent.
inline constexpr int kMaxRelayUpstreams = 64;

// A batch that is one hop of a relay: one piece, a whole shard onto a
// whole shard of the same shape, pulled in chunks of `chunk_bytes`, each
// only once the source holds it when the source is itself `filling` (a hop
// of relay `id`). `fallbacks` are the copies further up, nearest first.
struct RelayHop {
  uint64_t id = 0;  // 0: not a relay
  int64_t chunk_bytes = 0;
  bool src_filling = false;
  std::vector<RelayUpstream> fallbacks;
  // An update's relay: the destination's and the source's copies of the
  // version before (0: none). Each chunk then crosses as its changes
  // (core/delta_codec.h), applied to the destination's copy and checked
  // against the source's CRC-32; whole when not shorter or a check fails.
  uint64_t base_shard_id = 0;
  uint64_t src_base_shard_id = 0;
};

// Bytes each worker sent to others (worker name -> bytes): what a move
// cost each source (CLI.md "Relay", `"sent"`).
using SentBytes = std::map<std::string, int64_t>;

// What crossed between workers in all (CLI.md `"relayed_bytes"`).
inline int64_t TotalSent(const SentBytes& sent) {
  int64_t total = 0;
  for (const auto& [worker, bytes] : sent) total += bytes;
  return total;
}

// Every piece that moves from one worker to another, named with both ends
// so that a transport needing both ends to act (send/recv) can be driven
// from one batch.
struct TransferBatch {
  std::string tensor;        // whose pieces move (for capabilities, messages)
  uint64_t incarnation = 0;  // the tensor's (for capabilities)
  uint64_t src_version = 0;  // the version the pieces are read from
  std::string src_worker;
  std::string src_address;
  std::string dst_worker;
  std::string dst_address;
  std::vector<TransferPiece> pieces;
  // Lets the destination read the pieces from the source (a read
  // capability for the source worker, core/capability.h).
  std::string src_capability;
  RelayHop relay;

  // A batch with no pieces yet that moves pieces of `tensor`, read at
  // `src_version`, from `src_worker` (reached at `src_address`) to
  // `dst_worker` (at `dst_address`). The incarnation, the capability and the
  // relay are left for the caller to set.
  static TransferBatch Between(std::string tensor, uint64_t src_version,
                               std::string src_worker, std::string src_address,
                               std::string dst_worker, std::string dst_address);
};

// One end of a piece moved by a two-sided exchange (NCCL send/recv): the
// box of a shard held by this member that goes to, or comes from, the
// member of rank `peer`.
struct ExchangePiece {
  int32_t peer = 0;
  uint64_t shard_id = 0;
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;

  Box box() const {
    return Box(absl::Span<const int64_t>(offsets),
               absl::Span<const int64_t>(sizes));
  }
};

// Bounds of an exchange: the communicator id's size (an ncclUniqueId), the
// members, and the pieces of one member's share, sends and receives
// together. Each piece is one operation in the member's NCCL group, which
// NCCL bounds (2048 in its documentation): the coordinator pulls a larger
// share instead, and a worker refuses one from the wire.
inline constexpr size_t kExchangeIdBytes = 128;
inline constexpr int32_t kMaxExchangeRanks = 4096;
inline constexpr int kMaxExchangePieces = 2048;

// One member's share of an exchange among `ranks` workers: what it sends
// and receives, each list in the order its peers post the matching pieces
// (NCCL matches a pair's sends and receives by order).
struct ExchangePlan {
  std::string unique_id;  // the communicator's (ncclUniqueId bytes)
  int32_t ranks = 0;
  int32_t rank = 0;
  std::vector<ExchangePiece> sends;
  std::vector<ExchangePiece> recvs;
};

// The members of an exchange that moves every piece of `batches` (pieces
// between two different workers only) and each member's plan, by worker
// name. Members are ranked in name order; a piece is a send on its source
// and a receive on its destination, listed in batch order on both ends.
struct Exchange {
  std::vector<std::string> members;  // by rank
  std::vector<ExchangePlan> plans;   // by rank; unique_id left empty
  int64_t bytes = 0;                 // element bytes of every piece
};
Exchange PlanExchange(absl::Span<const TransferBatch> batches,
                      int64_t item_bytes);

// The bytes every piece of `batch` moves.
int64_t BatchBytes(const TransferBatch& batch, int64_t item_bytes);

// `batch` as batches of at most `max_bytes` each, in order, pieces cut
// along their outer dims where one is larger (a piece never goes below one
// innermost row, which may exceed `max_bytes` alone). The coordinator sends
// them one after the other, so that it knows the bytes landed so far of a
// move that takes seconds (the progress a reshard reports); each is
// still large enough that the call costs nothing beside its bytes.
std::vector<TransferBatch> SplitBatch(const TransferBatch& batch,
                                      int64_t item_bytes, int64_t max_bytes);

// How far the move of a tensor's pieces running now (a reshard, a repair)
// has got: bytes landed in their new shards of all it moves.
struct MoveProgress {
  bool running = false;
  int64_t bytes_total = 0;
  int64_t bytes_done = 0;
};

// What a reshard did (CLI.md "reshard --json").
struct ReshardResult {
  uint64_t version = 0;
  int64_t pieces_moved = 0;
  int64_t bytes_moved = 0;
  int64_t bytes_copied_locally = 0;
  int64_t shards_kept = 0;
  double seconds = 0;
  SentBytes sent;  // what each worker sent to others for it
};

}  // namespace tessera

#endif  // TESSERA_CORE_TRANSFER_H_
