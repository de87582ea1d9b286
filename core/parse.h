// Text forms of the CLI: shapes "10,20", ranges "0:5,:,-3:", enumerable
// shard lists "BOX@P;BOX@P", and their resolution against a shape with
// NumPy's rules. Pure functions; safe to call from any thread.
#ifndef TESSERA_CORE_PARSE_H_
#define TESSERA_CORE_PARSE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/placement.h"

namespace tessera {

// A strict decimal int64 ("-12"; no spaces, no trailing junk).
absl::StatusOr<int64_t> ParseInt64(absl::string_view text);

// A size as Hugging Face writes one: digits, then an optional unit (any
// case) of B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB
// (powers of 1024): "5GB" is 5 * 10^9 bytes. At least 1, and no overflow.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

// "10,20": at least one dim, every size an integer >= 0.
absl::StatusOr<Shape> ParseShape(absl::string_view text);

// One dim of a range "a:b", "a:", ":b" or ":" as written (may be negative).
struct DimRange {
  std::optional<int64_t> start;
  std::optional<int64_t> stop;

  friend bool operator==(const DimRange& a, const DimRange& b) {
    return a.start == b.start && a.stop == b.stop;
  }
};

// Comma-separated DimRanges; syntax only. "" is INVALID_ARGUMENT.
absl::StatusOr<std::vector<DimRange>> ParseRanges(absl::string_view text);

// Resolves a region with NumPy's rules: a negative number counts from the
// end, a missing start is 0, a missing stop is n, missing trailing dims are
// whole. More ranges than dims is DimsMismatchError; afterwards
// 0 <= a <= b <= n must hold, else OutOfBoundsError (no clamping).
absl::StatusOr<Box> ResolveRegion(absl::Span<const DimRange> ranges,
                                  const Shape& shape);

// Resolves an enumerable shard box the same way, but the number of ranges
// must equal the rank (else DimsMismatchError) and bounds are NOT checked:
// the box may reach outside the tensor or have a negative size, for
// ValidateLayout to report in its order.
absl::StatusOr<Box> ResolveBox(absl::Span<const DimRange> ranges,
                               const Shape& shape);

// One "BOX@P" of an enumerable sharding.
struct ShardText {
  std::vector<DimRange> ranges;
  Placement placement;
};

// "BOX@P;BOX@P;..." (a trailing ';' is tolerated); at least one shard.
absl::StatusOr<std::vector<ShardText>> ParseShardList(absl::string_view text);

// The one of `known` a user most likely meant by `typed` ("lst" -> "ls",
// "emd" -> "emb", "--outptu" -> "--output"): the nearest by edit distance
// (a swap of two neighbours counts as one edit), when it is at most 2
// edits away and fewer than `typed` has characters; a unique one of
// `known` that starts with `typed` otherwise. Empty: no good guess (a tie
// is no guess).
std::string ClosestName(absl::string_view typed,
                        const std::vector<std::string>& known);

}  // namespace tessera

#endif  // TESSERA_CORE_PARSE_H_
