// DType: the element types tessera stores, their names ("float32"), item
// sizes, and the float16 / bfloat16 conversions (IEEE round-to-nearest-even).
// Pure functions and immutable tables; safe to use from any thread.
#ifndef TESSERA_CORE_DTYPE_H_
#define TESSERA_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

enum class DType : int {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt16,
  kInt32,
  kInt64,
  kBool,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat8E4M3FN,  // 4 exponent, 3 mantissa bits; no infinity; max 448
  kFloat8E5M2,    // 5 exponent, 2 mantissa bits (IEEE-like, with infinity)
};

// Parses an exact lower-case name (float32 float64 float16 bfloat16 int8
// uint8 int16 int32 int64 bool uint16 uint32 uint64 float8_e4m3fn
// float8_e5m2, PyTorch's names); anything else is UnknownDTypeError.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// The canonical name, e.g. "bfloat16".
absl::string_view DTypeName(DType dtype);

// Bytes per element (bool is 1).
size_t ItemSize(DType dtype);

// Every dtype, in enum order.
const std::vector<DType>& AllDTypes();

// float32, float64, float16, bfloat16 and the two float8s.
bool IsFloating(DType dtype);

// The signed and unsigned integer types (not bool).
bool IsInteger(DType dtype);

// IEEE binary16 <-> float, rounding to nearest even; infinities, NaNs and
// subnormals are converted correctly.
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);

// binary16 from a double with a single rounding (as NumPy's astype does from
// float64), not via float.
uint16_t DoubleToHalf(double value);

// bfloat16 (the top 16 bits of a float32) <-> float, rounding to nearest
// even; a NaN stays a NaN.
uint16_t FloatToBFloat16(float value);
float BFloat16ToFloat(uint16_t bits);

// bfloat16 from a double with a single rounding.
uint16_t DoubleToBFloat16(double value);

// binary16 / bfloat16 from an integer with a single rounding.
uint16_t Int64ToHalf(int64_t value);
uint16_t Int64ToBFloat16(int64_t value);

// float8 (PyTorch's float8_e4m3fn and float8_e5m2) from a double or an
// integer with a single rounding to nearest even, and back. e4m3fn has no
// infinity: what rounds past 448 (and infinity) becomes NaN, as PyTorch
// converts; e5m2 overflows to infinity.
uint8_t DoubleToFloat8E4M3FN(double value);
uint8_t DoubleToFloat8E5M2(double value);
uint8_t Int64ToFloat8E4M3FN(int64_t value);
uint8_t Int64ToFloat8E5M2(int64_t value);
float Float8E4M3FNToFloat(uint8_t bits);
float Float8E5M2ToFloat(uint8_t bits);

}  // namespace tessera

#endif  // TESSERA_CORE_DTYPE_H_
