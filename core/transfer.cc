#include "core/transfer.h"

#include <map>

namespace tessera {

Exchange PlanExchange(absl::Span<const TransferBatch> batches,
                      int64_t item_bytes) {
  Exchange exchange;
  std::map<std::string, int32_t> rank_of;
  for (const TransferBatch& batch : batches) {
    if (batch.src_worker == batch.dst_worker || batch.pieces.empty()) continue;
    rank_of.emplace(batch.src_worker, 0);
    rank_of.emplace(batch.dst_worker, 0);
  }
  for (auto& [name, rank] : rank_of) {
    rank = static_cast<int32_t>(exchange.members.size());
    exchange.members.push_back(name);
  }
  exchange.plans.resize(exchange.members.size());
  for (size_t r = 0; r < exchange.plans.size(); ++r) {
    exchange.plans[r].ranks = static_cast<int32_t>(exchange.members.size());
    exchange.plans[r].rank = static_cast<int32_t>(r);
  }
  for (const TransferBatch& batch : batches) {
    if (batch.src_worker == batch.dst_worker) continue;
    const int32_t src = rank_of[batch.src_worker];
    const int32_t dst = rank_of[batch.dst_worker];
    for (const TransferPiece& piece : batch.pieces) {
      exchange.plans[src].sends.push_back(
          {dst, piece.src_shard_id, piece.src_offsets, piece.sizes});
      exchange.plans[dst].recvs.push_back(
          {src, piece.dst_shard_id, piece.dst_offsets, piece.sizes});
      exchange.bytes += piece.DstBox().NumElements() * item_bytes;
    }
  }
  return exchange;
}

}  // namespace tessera
