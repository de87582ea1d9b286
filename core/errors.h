// The named errors of tessera. The words the CLI contract promises ("out of
// bounds", "overlap", "cover", "not found", "already exists", "does not
// exist", "invalid sharding dim", "dtype", "dims", "unavailable") are written
// only here. Pure functions; safe to call from any thread.
#ifndef TESSERA_CORE_ERRORS_H_
#define TESSERA_CORE_ERRORS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {

// OUT_OF_RANGE "<what> is out of bounds", e.g. "--shard=7 is out of bounds".
absl::Status OutOfBoundsError(absl::string_view what);
// OUT_OF_RANGE "<what> is out of bounds: <detail>".
absl::Status OutOfBoundsError(absl::string_view what, absl::string_view detail);

// INVALID_ARGUMENT "<what>" prefixed by "shards overlap: ".
absl::Status OverlapError(absl::string_view what);

// INVALID_ARGUMENT "shards do not cover the tensor: <what>".
absl::Status NotCoveredError(absl::string_view what);

// NOT_FOUND "<kind> '<name>' not found".
absl::Status NotFoundError(absl::string_view kind, absl::string_view name);

// ALREADY_EXISTS "<kind> '<name>' already exists".
absl::Status AlreadyExistsError(absl::string_view kind, absl::string_view name);

// INVALID_ARGUMENT "<what> does not exist", e.g.
// "placement rank:7: worker rank 7 does not exist".
absl::Status DoesNotExistError(absl::string_view what);

// INVALID_ARGUMENT "invalid sharding dim 3 for a tensor with 2 dims".
absl::Status InvalidShardingDimError(int64_t dim, int64_t rank);

// INVALID_ARGUMENT "unknown dtype 'x' (expected one of float32 ...)".
absl::Status UnknownDTypeError(absl::string_view name);

// INVALID_ARGUMENT "<what> has <got> dims but the tensor has <want> dims".
absl::Status DimsMismatchError(absl::string_view what, int64_t got,
                               int64_t want);

// UNAVAILABLE "<what> is unavailable", e.g.
// "shard 3 on worker w1 is unavailable: worker is dead".
absl::Status UnavailableError(absl::string_view what);

}  // namespace tessera

#endif  // TESSERA_CORE_ERRORS_H_
