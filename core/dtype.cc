#include "core/dtype.h"

#include <cmath>
#include <cstring>

#include "core/errors.h"

namespace tessera {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  size_t item_size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "float32", 4}, {DType::kFloat64, "float64", 8},
    {DType::kFloat16, "float16", 2}, {DType::kBFloat16, "bfloat16", 2},
    {DType::kInt8, "int8", 1},       {DType::kUInt8, "uint8", 1},
    {DType::kInt16, "int16", 2},     {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},     {DType::kBool, "bool", 1},
};

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<int>(dtype)]; }

// Rounds the positive value m * 2^e2 (m > 0) to nearest even in a binary
// format with `man_bits` stored mantissa bits and `exp_bits` exponent bits,
// returning the bits without the sign. Overflow gives infinity.
uint16_t RoundToSmallFloat(uint64_t m, int e2, int man_bits, int exp_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int emin = 1 - bias;
  const uint16_t inf = static_cast<uint16_t>(((1 << exp_bits) - 1) << man_bits);
  const int p = 63 - __builtin_clzll(m);  // position of the leading 1
  const int e = p + e2;                   // value is in [2^e, 2^(e+1))
  if (e > bias) return inf;
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

uint16_t DoubleToSmallFloat(double value, int man_bits, int exp_bits) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 63) << 15);
  const int exp = static_cast<int>((bits >> 52) & 0x7ff);
  const uint64_t mant = bits & ((uint64_t{1} << 52) - 1);
  const uint16_t inf = static_cast<uint16_t>(((1 << exp_bits) - 1) << man_bits);
  if (exp == 0x7ff) {
    if (mant == 0) return sign | inf;
    return sign | inf | static_cast<uint16_t>(1 << (man_bits - 1));  // qNaN
  }
  if (exp == 0) {
    if (mant == 0) return sign;
    return sign | RoundToSmallFloat(mant, -1074, man_bits, exp_bits);
  }
  return sign | RoundToSmallFloat(mant | (uint64_t{1} << 52), exp - 1075,
                                  man_bits, exp_bits);
}

uint16_t Int64ToSmallFloat(int64_t value, int man_bits, int exp_bits) {
  if (value == 0) return 0;
  const uint16_t sign = value < 0 ? 0x8000 : 0;
  const uint64_t mag = value < 0 ? uint64_t{0} - static_cast<uint64_t>(value)
                                 : static_cast<uint64_t>(value);
  return sign | RoundToSmallFloat(mag, 0, man_bits, exp_bits);
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
      return true;
    default:
      return false;
  }
}

uint16_t FloatToHalf(float value) {
  return DoubleToSmallFloat(static_cast<double>(value), 10, 5);
}

uint16_t DoubleToHalf(double value) { return DoubleToSmallFloat(value, 10, 5); }

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
  return DoubleToSmallFloat(value, 7, 8);
}

uint16_t Int64ToHalf(int64_t value) { return Int64ToSmallFloat(value, 10, 5); }

uint16_t Int64ToBFloat16(int64_t value) {
  return Int64ToSmallFloat(value, 7, 8);
}

}  // namespace tessera
