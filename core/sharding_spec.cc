#include "core/sharding_spec.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/errors.h"
#include "core/status_macros.h"

namespace tessera {

absl::StatusOr<int64_t> NormalizeDim(int64_t dim, int64_t rank) {
  if (dim < -rank || dim >= rank) return InvalidShardingDimError(dim, rank);
  return dim < 0 ? dim + rank : dim;
}

absl::StatusOr<std::vector<Box>> ChunkBoxes(const Shape& shape, int64_t dim,
                                            int64_t num_chunks) {
  TESSERA_ASSIGN_OR_RETURN(const int64_t d, NormalizeDim(dim, shape.size()));
  if (num_chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk sharding needs at least one placement, got ", num_chunks));
  }
  const int64_t n = shape[d];
  // ceil(n / k) without overflow (n >= 0, k >= 1).
  const int64_t split = n / num_chunks + (n % num_chunks != 0 ? 1 : 0);
  std::vector<Box> boxes;
  boxes.reserve(num_chunks);
  for (int64_t i = 0; i < num_chunks; ++i) {
    Box box = WholeBox(shape);
    // i * split <= (k - 1) * ceil(n / k) < n + k, which overflows only for
    // dims near INT64_MAX.
    int64_t begin;
    if (__builtin_mul_overflow(i, split, &begin)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot chunk dim ", d, " of size ", n, " into ",
                       num_chunks, " shards: offsets overflow"));
    }
    const int64_t end = begin >= n - split ? n : begin + split;
    box.offsets[d] = begin;
    box.sizes[d] = std::max<int64_t>(0, end - begin);
    boxes.push_back(std::move(box));
  }
  return boxes;
}

}  // namespace tessera
