// Chunk sharding (PyTorch's ChunkShardingSpec / torch.chunk): the boxes of
// the shards when a tensor is split along one dim. Pure functions; safe to
// call from any thread.
#ifndef TESSERA_CORE_SHARDING_SPEC_H_
#define TESSERA_CORE_SHARDING_SPEC_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/box.h"

namespace tessera {

// `dim` in [0, rank); a negative dim counts from the end (-1 is the last).
// Outside [-rank, rank): InvalidShardingDimError.
absl::StatusOr<int64_t> NormalizeDim(int64_t dim, int64_t rank);

// The `num_chunks` boxes of torch.chunk along `dim` (may be negative): with
// split = ceil(n / k), shard i has offset i * split on `dim` (even past the
// end, for trailing empty shards) and size
// max(0, min(n, (i + 1) * split) - i * split); every other dim is whole.
// num_chunks < 1 is INVALID_ARGUMENT.
absl::StatusOr<std::vector<Box>> ChunkBoxes(const Shape& shape, int64_t dim,
                                            int64_t num_chunks);

}  // namespace tessera

#endif  // TESSERA_CORE_SHARDING_SPEC_H_
