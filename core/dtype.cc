#include "core/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/errors.h"

namespace tessera {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  size_t item_size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "float32", 4},
    {DType::kFloat64, "float64", 8},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kInt8, "int8", 1},
    {DType::kUInt8, "uint8", 1},
    {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kBool, "bool", 1},
    {DType::kUInt16, "uint16", 2},
    {DType::kUInt32, "uint32", 4},
    {DType::kUInt64, "uint64", 8},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1},
    {DType::kFloat8E5M2, "float8_e5m2", 1},
};

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<int>(dtype)]; }

// A binary float format: stored mantissa and exponent bits; `finite`
// formats (float8_e4m3fn) use the top exponent for numbers too, keep only
// all-ones bits for NaN and have no infinity.
struct SmallFloat {
  int man_bits;
  int exp_bits;
  bool finite = false;
};
constexpr SmallFloat kHalf{10, 5};
constexpr SmallFloat kBFloat{7, 8};
constexpr SmallFloat kE4M3FN{3, 4, true};
constexpr SmallFloat kE5M2{2, 5};

// The bits, without the sign, of what overflows the format: infinity, or
// NaN for a finite format.
uint16_t OverflowBits(SmallFloat f) {
  const uint16_t top =
      static_cast<uint16_t>(((1 << f.exp_bits) - 1) << f.man_bits);
  return f.finite ? static_cast<uint16_t>(top | ((1 << f.man_bits) - 1)) : top;
}

// Rounds the positive value m * 2^e2 (m > 0) to nearest even in format `f`,
// returning the bits without the sign. Overflow gives OverflowBits.
uint16_t RoundToSmallFloat(uint64_t m, int e2, SmallFloat f) {
  const int man_bits = f.man_bits;
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const int emin = 1 - bias;
  const int emax = f.finite ? bias + 1 : bias;
  const uint16_t inf = OverflowBits(f);
  const int p = 63 - __builtin_clzll(m);  // position of the leading 1
  const int e = p + e2;                   // value is in [2^e, 2^(e+1))
  if (e > emax) return inf;
  // Units of the result's last place.
  const int ulp_exp = (e >= emin ? e : emin) - man_bits;
  const int shift = ulp_exp - e2;
  uint64_t q;
  if (shift <= 0) {
    q = m << -shift;  // exact; fits because p - man_bits < shift <= 0
  } else if (shift >= 64) {
    q = 0;  // m < 2^64 <= half an ulp... strictly below half: rounds to 0
    if (shift == 64 && m > (uint64_t{1} << 63)) q = 1;
  } else {
    q = m >> shift;
    const uint64_t rem = m & ((uint64_t{1} << shift) - 1);
    const uint64_t half = uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
  }
  uint64_t bits;
  if (e >= emin) {
    // q holds the implicit bit at 1 << man_bits; adding (e - emin) << man_bits
    // gives the biased exponent; a rounding carry moves up one binade.
    bits = (static_cast<uint64_t>(e - emin) << man_bits) + q;
  } else {
    bits = q;  // subnormal; a carry lands on the smallest normal
  }
  if (bits >= inf) return inf;
  return static_cast<uint16_t>(bits);
}

// The format's bits with the sign at its top bit (bit 1 + exp + man).
uint16_t DoubleToSmallFloat(double value, SmallFloat f) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const int sign_shift = f.exp_bits + f.man_bits;
  const uint16_t sign = static_cast<uint16_t>((bits >> 63) << sign_shift);
  const int exp = static_cast<int>((bits >> 52) & 0x7ff);
  const uint64_t mant = bits & ((uint64_t{1} << 52) - 1);
  const uint16_t top =
      static_cast<uint16_t>(((1 << f.exp_bits) - 1) << f.man_bits);
  if (exp == 0x7ff) {
    if (mant == 0) return sign | OverflowBits(f);
    if (f.finite) return sign | OverflowBits(f);  // its one NaN
    return sign | top | static_cast<uint16_t>(1 << (f.man_bits - 1));  // qNaN
  }
  if (exp == 0) {
    if (mant == 0) return sign;
    return sign | RoundToSmallFloat(mant, -1074, f);
  }
  return sign | RoundToSmallFloat(mant | (uint64_t{1} << 52), exp - 1075, f);
}

uint16_t Int64ToSmallFloat(int64_t value, SmallFloat f) {
  if (value == 0) return 0;
  const uint16_t sign =
      value < 0 ? static_cast<uint16_t>(1 << (f.exp_bits + f.man_bits)) : 0;
  const uint64_t mag = value < 0 ? uint64_t{0} - static_cast<uint64_t>(value)
                                 : static_cast<uint64_t>(value);
  return sign | RoundToSmallFloat(mag, 0, f);
}

// The value of float8 `bits` in format `f` (exact in float).
float Float8ToFloat(uint8_t bits, SmallFloat f) {
  const bool negative = (bits >> 7) != 0;
  const int exp = (bits >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int mant = bits & ((1 << f.man_bits) - 1);
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  float magnitude;
  if (f.finite && (bits & 0x7f) == 0x7f) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (!f.finite && exp == (1 << f.exp_bits) - 1) {
    magnitude = mant == 0 ? std::numeric_limits<float>::infinity()
                          : std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    magnitude = std::ldexp(static_cast<float>(mant), 1 - bias - f.man_bits);
  } else {
    magnitude = std::ldexp(static_cast<float>(mant + (1 << f.man_bits)),
                           exp - bias - f.man_bits);
  }
  return negative ? -magnitude : magnitude;
}

}  // namespace

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return UnknownDTypeError(name);
}

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

size_t ItemSize(DType dtype) { return Info(dtype).item_size; }

const std::vector<DType>& AllDTypes() {
  static const std::vector<DType>* const kAll = [] {
    auto* all = new std::vector<DType>;
    for (const DTypeInfo& info : kDTypes) all->push_back(info.dtype);
    return all;
  }();
  return *kAll;
}

bool IsFloating(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      return true;
    default:
      return false;
  }
}

bool IsInteger(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
      return true;
    default:
      return false;
  }
}

uint16_t FloatToHalf(float value) {
  return DoubleToSmallFloat(static_cast<double>(value), kHalf);
}

uint16_t DoubleToHalf(double value) { return DoubleToSmallFloat(value, kHalf); }

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exp = (bits >> 10) & 0x1f;
  const uint32_t mant = bits & 0x3ff;
  uint32_t out;
  if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    out = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    out = sign;
  } else {
    // Subnormal: mant * 2^-24, exact in float.
    const float magnitude = std::ldexp(static_cast<float>(mant), -24);
    std::memcpy(&out, &magnitude, sizeof(out));
    out |= sign;
  }
  float result;
  std::memcpy(&result, &out, sizeof(result));
  return result;
}

uint16_t FloatToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040);  // quiet NaN
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float BFloat16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float result;
  std::memcpy(&result, &wide, sizeof(result));
  return result;
}

uint16_t DoubleToBFloat16(double value) {
  return DoubleToSmallFloat(value, kBFloat);
}

uint16_t Int64ToHalf(int64_t value) { return Int64ToSmallFloat(value, kHalf); }

uint16_t Int64ToBFloat16(int64_t value) {
  return Int64ToSmallFloat(value, kBFloat);
}

uint8_t DoubleToFloat8E4M3FN(double value) {
  return static_cast<uint8_t>(DoubleToSmallFloat(value, kE4M3FN));
}
uint8_t DoubleToFloat8E5M2(double value) {
  return static_cast<uint8_t>(DoubleToSmallFloat(value, kE5M2));
}
uint8_t Int64ToFloat8E4M3FN(int64_t value) {
  return static_cast<uint8_t>(Int64ToSmallFloat(value, kE4M3FN));
}
uint8_t Int64ToFloat8E5M2(int64_t value) {
  return static_cast<uint8_t>(Int64ToSmallFloat(value, kE5M2));
}
float Float8E4M3FNToFloat(uint8_t bits) { return Float8ToFloat(bits, kE4M3FN); }
float Float8E5M2ToFloat(uint8_t bits) { return Float8ToFloat(bits, kE5M2); }

}  // namespace tessera
