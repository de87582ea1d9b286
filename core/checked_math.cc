#include "core/checked_math.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace tessera {

absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("size overflows: ", a, " + ", b));
  }
  return out;
}

absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("size overflows: ", a, " * ", b));
  }
  return out;
}

int64_t ElementCount(absl::Span<const int64_t> sizes) {
  for (int64_t s : sizes) {
    if (s == 0) return 0;
  }
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (__builtin_mul_overflow(n, s, &n)) {
      return std::numeric_limits<int64_t>::max();
    }
  }
  return n;
}

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> sizes) {
  for (int64_t s : sizes) {
    if (s < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "negative size ", s, " in [", absl::StrJoin(sizes, ", "), "]"));
    }
  }
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (s == 0) return 0;
  }
  for (int64_t s : sizes) {
    auto product = CheckedMul(n, s);
    if (!product.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "size overflows: the element count of [", absl::StrJoin(sizes, ", "),
          "] does not fit in 64 bits"));
    }
    n = *product;
  }
  return n;
}

absl::StatusOr<int64_t> ByteSize(absl::Span<const int64_t> sizes,
                                 size_t item_size) {
  TESSERA_ASSIGN_OR_RETURN(int64_t n, NumElements(sizes));
  auto bytes = CheckedMul(n, static_cast<int64_t>(item_size));
  if (!bytes.ok() || *bytes > kMaxTensorBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "[", absl::StrJoin(sizes, ", "), "] with ", item_size,
        "-byte items is too large (limit ", kMaxTensorBytes, " bytes)"));
  }
  return *bytes;
}

}  // namespace tessera
