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
  ASSERT_EQ(AllDTypes().size(), 10u);
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
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
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

}  // namespace
}  // namespace tessera
