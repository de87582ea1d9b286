#include "core/transfer.h"

#include <algorithm>
#include <map>
#include <utility>

namespace tessera {

TransferBatch TransferBatch::Between(std::string tensor, uint64_t src_version,
                                     std::string src_worker,
                                     std::string src_address,
                                     std::string dst_worker,
                                     std::string dst_address) {
  TransferBatch batch;
  batch.tensor = std::move(tensor);
  batch.src_version = src_version;
  batch.src_worker = std::move(src_worker);
  batch.src_address = std::move(src_address);
  batch.dst_worker = std::move(dst_worker);
  batch.dst_address = std::move(dst_address);
  return batch;
}

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

int64_t BatchBytes(const TransferBatch& batch, int64_t item_bytes) {
  int64_t bytes = 0;
  for (const TransferPiece& piece : batch.pieces)
    bytes += piece.DstBox().NumElements() * item_bytes;
  return bytes;
}

namespace {

// Appends `piece` cut into parts of at most `max_bytes` (down to one
// innermost row) to `out`, outer dims first so that each part stays one
// run of rows where it can.
void SplitPiece(const TransferPiece& piece, int64_t item_bytes,
                int64_t max_bytes, std::vector<TransferPiece>* out) {
  const int64_t bytes = piece.DstBox().NumElements() * item_bytes;
  const size_t rank = piece.sizes.size();
  size_t dim = 0;
  while (dim + 1 < rank && piece.sizes[dim] <= 1) ++dim;
  if (bytes <= max_bytes || rank == 0 || dim + 1 >= rank ||
      piece.sizes[dim] == 0) {
    out->push_back(piece);
    return;
  }
  const int64_t slice_bytes = bytes / piece.sizes[dim];
  const int64_t per_part = std::max<int64_t>(1, max_bytes / slice_bytes);
  for (int64_t at = 0; at < piece.sizes[dim]; at += per_part) {
    TransferPiece part = piece;
    part.sizes[dim] = std::min(per_part, piece.sizes[dim] - at);
    part.src_offsets[dim] += at;
    part.dst_offsets[dim] += at;
    if (part.sizes[dim] == 1 && slice_bytes > max_bytes) {
      SplitPiece(part, item_bytes, max_bytes, out);
    } else {
      out->push_back(std::move(part));
    }
  }
}

}  // namespace

std::vector<TransferBatch> SplitBatch(const TransferBatch& batch,
                                      int64_t item_bytes, int64_t max_bytes) {
  std::vector<TransferPiece> parts;
  for (const TransferPiece& piece : batch.pieces)
    SplitPiece(piece, item_bytes, std::max<int64_t>(1, max_bytes), &parts);
  std::vector<TransferBatch> out;
  int64_t filled = 0;
  for (TransferPiece& part : parts) {
    const int64_t bytes = part.DstBox().NumElements() * item_bytes;
    if (out.empty() || (filled > 0 && filled + bytes > max_bytes)) {
      TransferBatch& next = out.emplace_back(batch);
      next.pieces.clear();
      filled = 0;
    }
    out.back().pieces.push_back(std::move(part));
    filled += bytes;
  }
  if (out.empty()) out.push_back(batch);
  return out;
}

}  // namespace tessera
