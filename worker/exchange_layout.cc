#include "worker/exchange_layout.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "core/box.h"
#include "core/box_runs.h"
#include "core/status_macros.h"

namespace tessera {

absl::StatusOr<ShareLayout> LayOutShare(const ExchangePlan& plan,
                                        absl::Span<const ShardDesc> shards) {
  if (shards.size() != plan.sends.size() + plan.recvs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(shards.size(), " shards for ",
                     plan.sends.size() + plan.recvs.size(), " pieces"));
  }
  ShareLayout layout;
  size_t next = 0;
  for (const auto* pieces : {&plan.sends, &plan.recvs}) {
    const bool sends = pieces == &plan.sends;
    for (size_t i = 0; i < pieces->size(); ++i, ++next) {
      const ExchangePiece& piece = (*pieces)[i];
      const ShardDesc& shard = shards[next];
      TESSERA_RETURN_IF_ERROR(
          CheckWithin(piece.box(), shard.box.sizes,
                      absl::StrCat(sends ? "sends[" : "recvs[", i, "]")));
      const int64_t item = static_cast<int64_t>(ItemSize(shard.dtype));
      PostedPiece posted;
      posted.piece = &piece;
      posted.shard = next;
      posted.peer = piece.peer;
      posted.bytes = piece.box().NumElements() * item;
      if (posted.bytes == 0) continue;
      if (const std::optional<int64_t> first =
              BoxSpanStart(shard.box.sizes, piece.offsets, piece.sizes)) {
        posted.shard_offset = *first * item;
      } else {
        posted.buffer_offset = layout.buffer_bytes;
        layout.buffer_bytes += (posted.bytes + kExchangeBufferAlignment - 1) /
                               kExchangeBufferAlignment *
                               kExchangeBufferAlignment;
      }
      if (!sends) layout.received_bytes += posted.bytes;
      (sends ? layout.sends : layout.recvs).push_back(posted);
    }
  }
  return layout;
}

}  // namespace tessera
