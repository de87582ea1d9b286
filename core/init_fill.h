// Initial values of a new tensor (--init): empty, zeros, ones, full:V,
// arange and rand:SEED, with NumPy's casting rules. FillBox computes the
// values of any box of the tensor on its own, so every shard can be filled
// where it lives and the result does not depend on the sharding. Pure
// functions on caller-owned memory; safe to call concurrently.
#ifndef TESSERA_CORE_INIT_FILL_H_
#define TESSERA_CORE_INIT_FILL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/box.h"
#include "core/dtype.h"

namespace tessera {

struct InitSpec {
  enum class Kind { kEmpty, kZeros, kOnes, kFull, kArange, kRand };
  Kind kind = Kind::kEmpty;
  std::string value;  // the text of V, for kFull
  uint64_t seed = 0;  // for kRand

  // "empty", "zeros", "ones", "full:V", "arange" or "rand:SEED".
  std::string ToString() const;

  friend bool operator==(const InitSpec& a, const InitSpec& b) {
    return a.kind == b.kind && a.value == b.value && a.seed == b.seed;
  }
};

// Parses "empty", "zeros", "ones", "full:V", "arange" or "rand:SEED" (SEED
// a non-negative integer). Syntax errors are INVALID_ARGUMENT.
absl::StatusOr<InitSpec> ParseInit(absl::string_view text);

// For kFull: V must be a number (an integer literal is kept exactly as an
// int64, anything else is a double); `true`/`false` are allowed for every
// dtype; `nan`/`inf` only for floating dtypes. OK for the other kinds.
absl::Status CheckInitValue(const InitSpec& spec, DType dtype);

// An InitSpec made ready for one dtype: V parsed, checked and cast once, so
// that filling the many shards of one request pays for the parse once (a
// 4 MiB V costs milliseconds to parse). A small value; copyable, and safe to
// use from many threads.
class InitFill {
 public:
  // `spec` checked as CheckInitValue does (INVALID_ARGUMENT on a bad V).
  static absl::StatusOr<InitFill> Make(const InitSpec& spec, DType dtype);

  InitSpec::Kind kind() const { return kind_; }
  DType dtype() const { return dtype_; }

  // What FillBox(spec, dtype, ...) does, without parsing V again.
  absl::Status Fill(const Shape& tensor_shape, const Box& box, void* dst) const;

 private:
  InitFill() = default;
  InitSpec::Kind kind_ = InitSpec::Kind::kEmpty;
  DType dtype_ = DType::kFloat32;
  uint64_t seed_ = 0;      // kRand
  char pattern_[8] = {0};  // kOnes, kFull: one element's bytes
};

// Writes the values of the tensor's elements inside `box`, row-major over
// the box, to `dst` (box.NumElements() * ItemSize(dtype) bytes):
//  * full:V is np.full(shape, V).astype(T) (integer V exact, wrapping into
//    narrower integers; float V truncated toward zero; bool is V != 0;
//    float16/bfloat16 rounded to nearest even once);
//  * arange: the element at flat row-major index i is np.arange(n)[i]
//    cast to T;
//  * rand:SEED: a pure function of (SEED, flat index): floats uniform in
//    [0, 1), integers uniform in [0, 100), bools uniform;
//  * empty leaves `dst` as it is.
// Errors: the box outside the tensor, or an invalid V. Parses V on every
// call: to fill many boxes, make one InitFill.
absl::Status FillBox(const InitSpec& spec, DType dtype,
                     const Shape& tensor_shape, const Box& box, void* dst);

}  // namespace tessera

#endif  // TESSERA_CORE_INIT_FILL_H_
