#include "core/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

TEST(DTypeTest, NamesRoundTripAndItemSizes) {
  ASSERT_EQ(AllDTypes().size(), 15u);
  for (DType dtype : AllDTypes()) {
    EXPECT_THAT(ParseDType(DTypeName(dtype)), IsOkAndHolds(dtype));
  }
  EXPECT_EQ(ItemSize(DType::kFloat32), 4u);
  EXPECT_EQ(ItemSize(DType::kFloat64), 8u);
  EXPECT_EQ(ItemSize(DType::kFloat16), 2u);
  EXPECT_EQ(ItemSize(DType::kBFloat16), 2u);
  EXPECT_EQ(ItemSize(DType::kInt8), 1u);
  EXPECT_EQ(ItemSize(DType::kUInt8), 1u);
  EXPECT_EQ(ItemSize(DType::kInt16), 2u);
  EXPECT_EQ(ItemSize(DType::kInt32), 4u);
  EXPECT_EQ(ItemSize(DType::kInt64), 8u);
  EXPECT_EQ(ItemSize(DType::kBool), 1u);
  EXPECT_EQ(ItemSize(DType::kUInt16), 2u);
  EXPECT_EQ(ItemSize(DType::kUInt32), 4u);
  EXPECT_EQ(ItemSize(DType::kUInt64), 8u);
  EXPECT_EQ(ItemSize(DType::kFloat8E4M3FN), 1u);
  EXPECT_EQ(ItemSize(DType::kFloat8E5M2), 1u);
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeName(DType::kFloat8E4M3FN), "float8_e4m3fn");
}

TEST(DTypeTest, UnknownNamesAreRejectedWithTheWordDtype) {
  for (const char* bad : {"", "Float32", "float", "f4", "int128", "float32 "}) {
    EXPECT_THAT(ParseDType(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("unknown dtype")))
        << bad;
  }
}

TEST(DTypeTest, FloatingAndIntegerClasses) {
  EXPECT_TRUE(IsFloating(DType::kBFloat16));
  EXPECT_FALSE(IsFloating(DType::kInt8));
  EXPECT_TRUE(IsInteger(DType::kUInt8));
  EXPECT_TRUE(IsInteger(DType::kInt64));
  EXPECT_FALSE(IsInteger(DType::kBool));
  EXPECT_FALSE(IsInteger(DType::kFloat16));
}

// Values from NumPy: np.array([v], np.float64).astype(np.float16).
TEST(DTypeTest, DoubleToHalfMatchesNumPy) {
  const struct {
    double value;
    uint16_t bits;
  } kCases[] = {
      {0.0, 0x0000},           {-0.0, 0x8000},
      {1.0, 0x3c00},           {-2.5, 0xc100},
      {0.1, 0x2e66},           {1.0 / 3, 0x3555},
      {65504.0, 0x7bff},       {65519.99, 0x7bff},
      {65520.0, 0x7c00},       {65536.0, 0x7c00},
      {1e10, 0x7c00},          {-1e10, 0xfc00},
      {6.1e-05, 0x03ff},       {5.96e-08, 0x0001},
      {2.98e-08, 0x0000},      {1e-09, 0x0000},
      {3e-05, 0x01f7},         {2049.0, 0x6800},
      {2051.0, 0x6802},        {1.0009765625, 0x3c01},
      {1.00048828125, 0x3c00}, {1.0004882812500002, 0x3c01},
      {6.1035156e-05, 0x0400}, {4097.0, 0x6c00},
      {1e-07, 0x0002},
  };
  for (const auto& c : kCases) {
    EXPECT_EQ(DoubleToHalf(c.value), c.bits) << c.value;
  }
  EXPECT_EQ(DoubleToHalf(std::numeric_limits<double>::infinity()), 0x7c00);
  EXPECT_EQ(DoubleToHalf(-std::numeric_limits<double>::infinity()), 0xfc00);
  EXPECT_EQ(DoubleToHalf(std::numeric_limits<double>::denorm_min()), 0);
  // 2^-25 is the tie between 0 and the smallest subnormal: even is 0, and
  // anything above it rounds up.
  EXPECT_EQ(DoubleToHalf(std::ldexp(1.0, -25)), 0x0000);
  EXPECT_EQ(DoubleToHalf(std::nextafter(std::ldexp(1.0, -25), 1.0)), 0x0001);
  const uint16_t nan = DoubleToHalf(std::nan(""));
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
}

TEST(DTypeTest, DoubleToHalfRoundsOnceUnlikeViaFloat) {
  // 1 + 2^-11 + 2^-40: through float32 it becomes the tie 1 + 2^-11 (-> 1.0),
  // rounded once from double it is above the tie (-> 1 + 2^-10).
  const double v = 1.0004882812500002;
  EXPECT_EQ(FloatToHalf(static_cast<float>(v)), 0x3c00);
  EXPECT_EQ(DoubleToHalf(v), 0x3c01);
}

TEST(DTypeTest, EveryHalfSurvivesARoundTripThroughFloat) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) << h;
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << h;
  }
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0xc100), -2.5f);
  EXPECT_TRUE(std::isinf(HalfToFloat(0xfc00)));
}

TEST(DTypeTest, BFloat16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is a tie: to even (1.0). 1 + 3*2^-8 ties up to 1 + 2^-6.
  EXPECT_EQ(FloatToBFloat16(1.00390625f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.01171875f), 0x3f82);
  EXPECT_EQ(FloatToBFloat16(1.0040f), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(3.4e38f), 0x7f80);  // rounds up to infinity
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  // A NaN whose payload sits only in the low bits stays a NaN.
  uint32_t low_nan_bits = 0x7f800001;
  float low_nan;
  std::memcpy(&low_nan, &low_nan_bits, 4);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(low_nan))));
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBFloat16(f), b);
    ASSERT_EQ(DoubleToBFloat16(f), b);
  }
}

TEST(DTypeTest, IntegersRoundOnceToHalfAndBFloat16) {
  EXPECT_EQ(Int64ToHalf(0), 0x0000);
  EXPECT_EQ(Int64ToHalf(2049), 0x6800);  // tie -> even 2048
  EXPECT_EQ(Int64ToHalf(2051), 0x6802);  // tie -> even 2052
  EXPECT_EQ(Int64ToHalf(-1), 0xbc00);
  EXPECT_EQ(Int64ToHalf(65519), 0x7bff);
  EXPECT_EQ(Int64ToHalf(65520), 0x7c00);
  EXPECT_EQ(Int64ToHalf(std::numeric_limits<int64_t>::min()), 0xfc00);
  EXPECT_EQ(Int64ToBFloat16(257), 0x4380);  // tie -> 256
  EXPECT_EQ(Int64ToBFloat16(259), 0x4382);  // tie -> 260
  // 2^30 + 2^22 + 1 lies just above a tie: rounded once it goes up, while
  // via float it would first become the tie and then round to even.
  const int64_t v = (int64_t{1} << 30) + (int64_t{1} << 22) + 1;
  EXPECT_EQ(Int64ToBFloat16(v), FloatToBFloat16(static_cast<float>(
                                    (int64_t{1} << 30) + (int64_t{1} << 23))));
}

// float8 as PyTorch converts (c10's Float8_e4m3fn / Float8_e5m2): round to
// nearest even; e4m3fn has no infinity (past its range: NaN), e5m2 does.
TEST(DTypeTest, Float8ConversionsMatchPyTorch) {
  EXPECT_EQ(DoubleToFloat8E4M3FN(1.0), 0x38);
  EXPECT_EQ(DoubleToFloat8E4M3FN(0.5), 0x30);
  EXPECT_EQ(DoubleToFloat8E4M3FN(-2.0), 0xc0);
  EXPECT_EQ(DoubleToFloat8E4M3FN(448.0), 0x7e);  // the largest
  EXPECT_EQ(DoubleToFloat8E4M3FN(464.0), 0x7e);  // a tie: to even
  EXPECT_EQ(DoubleToFloat8E4M3FN(470.0), 0x7f);  // rounds past: NaN
  EXPECT_EQ(DoubleToFloat8E4M3FN(1e9), 0x7f);
  EXPECT_EQ(DoubleToFloat8E4M3FN(-INFINITY), 0xff);
  EXPECT_EQ(DoubleToFloat8E4M3FN(NAN), 0x7f);
  EXPECT_EQ(DoubleToFloat8E4M3FN(std::ldexp(1.0, -9)), 0x01);   // subnormal
  EXPECT_EQ(DoubleToFloat8E4M3FN(std::ldexp(1.0, -11)), 0x00);  // below half
  EXPECT_EQ(Int64ToFloat8E4M3FN(17), 0x58);  // 17 is a tie: to 16
  EXPECT_EQ(Int64ToFloat8E4M3FN(-3), 0xc4);
  EXPECT_EQ(DoubleToFloat8E5M2(1.0), 0x3c);
  EXPECT_EQ(DoubleToFloat8E5M2(57344.0), 0x7b);  // the largest
  EXPECT_EQ(DoubleToFloat8E5M2(61440.0), 0x7c);  // a tie past it: infinity
  EXPECT_EQ(DoubleToFloat8E5M2(INFINITY), 0x7c);
  EXPECT_EQ(DoubleToFloat8E5M2(-INFINITY), 0xfc);
  EXPECT_EQ(DoubleToFloat8E5M2(NAN), 0x7e);
  EXPECT_EQ(DoubleToFloat8E5M2(std::ldexp(1.0, -16)), 0x01);
  EXPECT_EQ(Int64ToFloat8E5M2(9), 0x48);  // 9 is a tie: to 8
  EXPECT_EQ(Float8E4M3FNToFloat(0x7e), 448.0f);
  EXPECT_EQ(Float8E4M3FNToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(Float8E4M3FNToFloat(0xff)));
  EXPECT_EQ(Float8E5M2ToFloat(0xfc), -INFINITY);
  EXPECT_TRUE(std::isnan(Float8E5M2ToFloat(0x7d)));
  // Every number survives the round trip; every NaN stays one.
  for (int bits = 0; bits < 256; ++bits) {
    const uint8_t b = static_cast<uint8_t>(bits);
    const float e4 = Float8E4M3FNToFloat(b);
    if (std::isnan(e4)) {
      EXPECT_TRUE(std::isnan(Float8E4M3FNToFloat(DoubleToFloat8E4M3FN(e4))));
    } else if (bits != 0x80) {  // -0 keeps its sign, as checked below
      EXPECT_EQ(DoubleToFloat8E4M3FN(e4), b) << bits;
    }
    const float e5 = Float8E5M2ToFloat(b);
    if (std::isnan(e5)) {
      EXPECT_TRUE(std::isnan(Float8E5M2ToFloat(DoubleToFloat8E5M2(e5))));
    } else {
      EXPECT_EQ(DoubleToFloat8E5M2(e5), b) << bits;
    }
  }
  EXPECT_EQ(DoubleToFloat8E4M3FN(-0.0), 0x80);
}

}  // namespace
}  // namespace tessera
