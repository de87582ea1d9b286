#include "core/errors.h"

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status OutOfBoundsError(absl::string_view what) {
  return absl::OutOfRangeError(absl::StrCat(what, " is out of bounds"));
}

absl::Status OutOfBoundsError(absl::string_view what,
                              absl::string_view detail) {
  return absl::OutOfRangeError(
      absl::StrCat(what, " is out of bounds: ", detail));
}

absl::Status OverlapError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("shards overlap: ", what));
}

absl::Status NotCoveredError(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("shards do not cover the tensor: ", what));
}

absl::Status NotFoundError(absl::string_view kind, absl::string_view name) {
  return absl::NotFoundError(absl::StrCat(kind, " '", name, "' not found"));
}

absl::Status AlreadyExistsError(absl::string_view kind,
                                absl::string_view name) {
  return absl::AlreadyExistsError(
      absl::StrCat(kind, " '", name, "' already exists"));
}

absl::Status DoesNotExistError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " does not exist"));
}

absl::Status InvalidShardingDimError(int64_t dim, int64_t rank) {
  return absl::InvalidArgumentError(absl::StrCat("invalid sharding dim ", dim,
                                                 " for a tensor with ", rank,
                                                 rank == 1 ? " dim" : " dims"));
}

absl::Status UnknownDTypeError(absl::string_view name) {
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name,
      "' (expected one of float32 float64 float16 bfloat16 int8 uint8 int16 "
      "int32 int64 bool uint16 uint32 uint64 float8_e4m3fn float8_e5m2)"));
}

absl::Status DimsMismatchError(absl::string_view what, int64_t got,
                               int64_t want) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, " has ", got, " dims but the tensor has ", want, " dims"));
}

absl::Status UnavailableError(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, " is unavailable"));
}

}  // namespace tessera
