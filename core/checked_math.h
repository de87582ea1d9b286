// Overflow-checked arithmetic for element counts and byte sizes. Pure
// functions; safe to call from any thread.
#ifndef TESSERA_CORE_CHECKED_MATH_H_
#define TESSERA_CORE_CHECKED_MATH_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tessera {

// The largest tensor (or shard) tessera accepts, in bytes: 1 PiB.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 50;

// a + b, or INVALID_ARGUMENT "size overflows" when it does not fit in int64.
absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b);

// a * b, or INVALID_ARGUMENT "size overflows" when it does not fit in int64.
absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b);

// The product of `sizes` (1 for an empty list). A negative size or an
// overflow gives INVALID_ARGUMENT.
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> sizes);

// The element count of a box or shape already validated, without undefined
// behaviour for one that is not: 0 when any size is 0 (however large the
// others: an empty tensor may have huge dims), else the product, saturating
// at INT64_MAX where it would overflow.
int64_t ElementCount(absl::Span<const int64_t> sizes);

// NumElements(sizes) * item_size; INVALID_ARGUMENT "too large" beyond
// kMaxTensorBytes.
absl::StatusOr<int64_t> ByteSize(absl::Span<const int64_t> sizes,
                                 size_t item_size);

}  // namespace tessera

#endif  // TESSERA_CORE_CHECKED_MATH_H_
