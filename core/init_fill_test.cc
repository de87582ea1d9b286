#include "core/init_fill.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

InitSpec Init(absl::string_view text) {
  auto spec = ParseInit(text);
  EXPECT_THAT(spec, IsOk()) << text;
  return *spec;
}

// Fills the whole tensor and returns its values as T.
template <typename T>
std::vector<T> FillAll(absl::string_view init, DType dtype,
                       const Shape& shape) {
  const Box box = WholeBox(shape);
  std::vector<T> out(box.NumElements());
  EXPECT_THAT(FillBox(Init(init), dtype, shape, box, out.data()), IsOk());
  return out;
}

TEST(InitFillTest, ParseAndPrintEveryMode) {
  for (const char* text :
       {"empty", "zeros", "ones", "full:3.5", "full:-7", "full:true", "arange",
        "rand:0", "rand:18446744073709551615"}) {
    EXPECT_EQ(Init(text).ToString(), text);
  }
  EXPECT_EQ(Init("full:2").kind, InitSpec::Kind::kFull);
  EXPECT_EQ(Init("full:2").value, "2");
  EXPECT_EQ(Init("rand:42").seed, 42u);
  for (const char* bad : {"", "zero", "full", "full:", "full:abc", "full:1 ",
                          "rand", "rand:", "rand:-1", "rand:1.5", "Arange",
                          "rand:18446744073709551616", "full:1e", "ones:1"}) {
    EXPECT_THAT(ParseInit(bad), StatusIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
}

TEST(InitFillTest, CheckInitValueAllowsNonFiniteOnlyForFloats) {
  EXPECT_THAT(CheckInitValue(Init("full:nan"), DType::kFloat16), IsOk());
  EXPECT_THAT(CheckInitValue(Init("full:-inf"), DType::kFloat64), IsOk());
  EXPECT_THAT(CheckInitValue(Init("full:nan"), DType::kInt32),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a finite number")));
  EXPECT_THAT(CheckInitValue(Init("full:inf"), DType::kBool),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CheckInitValue(Init("full:true"), DType::kInt8), IsOk());
  EXPECT_THAT(CheckInitValue(Init("full:false"), DType::kFloat32), IsOk());
  EXPECT_THAT(CheckInitValue(Init("zeros"), DType::kBool), IsOk());
  InitSpec huge;
  huge.kind = InitSpec::Kind::kFull;
  huge.value = "99999999999999999999";
  EXPECT_THAT(CheckInitValue(huge, DType::kInt64),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int64")));
}

TEST(InitFillTest, ZerosOnesAndEmpty) {
  EXPECT_THAT(FillAll<float>("zeros", DType::kFloat32, {3, 4}), Each(0.0f));
  EXPECT_THAT(FillAll<double>("ones", DType::kFloat64, {5}), Each(1.0));
  EXPECT_THAT(FillAll<uint16_t>("ones", DType::kFloat16, {5}), Each(0x3c00));
  EXPECT_THAT(FillAll<uint16_t>("ones", DType::kBFloat16, {5}), Each(0x3f80));
  EXPECT_THAT(FillAll<int64_t>("ones", DType::kInt64, {2, 2}), Each(1));
  EXPECT_THAT(FillAll<uint8_t>("ones", DType::kBool, {7}), Each(1));
  std::vector<int32_t> untouched(4, 77);
  EXPECT_THAT(FillBox(Init("empty"), DType::kInt32, {4}, WholeBox({4}),
                      untouched.data()),
              IsOk());
  EXPECT_THAT(untouched, Each(77));
}

// Expected values from NumPy: np.full(shape, V).astype(T).
TEST(InitFillTest, FullCastsLikeNumPy) {
  EXPECT_THAT(FillAll<int8_t>("full:300", DType::kInt8, {3}), Each(44));
  EXPECT_THAT(FillAll<uint8_t>("full:-1", DType::kUInt8, {3}), Each(255));
  EXPECT_THAT(FillAll<int32_t>("full:3.7", DType::kInt32, {3}), Each(3));
  EXPECT_THAT(FillAll<int8_t>("full:-7.9", DType::kInt8, {3}), Each(-7));
  EXPECT_THAT(FillAll<int8_t>("full:300.5", DType::kInt8, {3}), Each(44));
  EXPECT_THAT(FillAll<uint8_t>("full:-1.5", DType::kUInt8, {3}), Each(255));
  EXPECT_THAT(FillAll<int16_t>("full:70000.7", DType::kInt16, {3}), Each(4464));
  EXPECT_THAT(FillAll<int32_t>("full:3e9", DType::kInt32, {3}),
              Each(INT32_MIN));
  EXPECT_THAT(FillAll<int64_t>("full:1e20", DType::kInt64, {3}),
              Each(INT64_MIN));
  EXPECT_THAT(FillAll<int64_t>("full:9007199254740993", DType::kInt64, {3}),
              Each(9007199254740993));
  EXPECT_THAT(FillAll<int16_t>("full:-9223372036854775808", DType::kInt16, {3}),
              Each(0));
  EXPECT_THAT(FillAll<int32_t>("full:1099511627781", DType::kInt32, {3}),
              Each(5));
  EXPECT_THAT(FillAll<uint32_t>("full:1099511627781", DType::kFloat32, {1}),
              Each(1400897536u));
  EXPECT_THAT(FillAll<uint16_t>("full:0.1", DType::kFloat16, {3}), Each(11878));
  EXPECT_THAT(FillAll<uint16_t>("full:65519.99", DType::kFloat16, {3}),
              Each(0x7bff));
  EXPECT_THAT(FillAll<uint32_t>("full:1e-8", DType::kFloat32, {1}),
              Each(841731191u));
  EXPECT_THAT(FillAll<uint8_t>("full:0.5", DType::kBool, {3}), Each(1));
  EXPECT_THAT(FillAll<uint8_t>("full:0", DType::kBool, {3}), Each(0));
  EXPECT_THAT(FillAll<float>("full:true", DType::kFloat32, {3}), Each(1.0f));
  EXPECT_THAT(FillAll<int64_t>("full:false", DType::kInt64, {3}), Each(0));
  // bfloat16: 1 + 2^-8 is a tie and goes to even; 1.01171875 goes up.
  EXPECT_THAT(FillAll<uint16_t>("full:1.00390625", DType::kBFloat16, {2}),
              Each(0x3f80));
  EXPECT_THAT(FillAll<uint16_t>("full:1.01171875", DType::kBFloat16, {2}),
              Each(0x3f82));
  const std::vector<double> nan =
      FillAll<double>("full:nan", DType::kFloat64, {2});
  EXPECT_TRUE(std::isnan(nan[0]));
}

// Expected values from NumPy: np.arange(n).astype(T).
TEST(InitFillTest, ArangeCastsLikeNumPy) {
  const std::vector<uint16_t> half =
      FillAll<uint16_t>("arange", DType::kFloat16, {300000});
  const struct {
    int64_t index;
    uint16_t bits;
  } kHalf[] = {
      {0, 0x0},        {1, 0x3c00},     {2047, 0x67ff},   {2048, 0x6800},
      {2049, 0x6800},  {2050, 0x6801},  {2051, 0x6802},   {4097, 0x6c00},
      {4099, 0x6c01},  {32769, 0x7800}, {65503, 0x7bff},  {65504, 0x7bff},
      {65519, 0x7bff}, {65520, 0x7c00}, {100000, 0x7c00}, {299999, 0x7c00}};
  for (const auto& c : kHalf) EXPECT_EQ(half[c.index], c.bits) << c.index;
  const std::vector<int8_t> i8 = FillAll<int8_t>("arange", DType::kInt8, {300});
  EXPECT_EQ(i8[127], 127);
  EXPECT_EQ(i8[128], -128);
  EXPECT_EQ(i8[255], -1);
  EXPECT_EQ(i8[256], 0);
  EXPECT_EQ(i8[299], 43);
  EXPECT_THAT(FillAll<uint8_t>("arange", DType::kBool, {3}),
              ElementsAre(0, 1, 1));
  EXPECT_THAT(FillAll<float>("arange", DType::kFloat32, {2, 3}),
              ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT(FillAll<uint16_t>("arange", DType::kBFloat16, {260})[257],
              0x4380);
}

TEST(InitFillTest, ArangeOfABoxUsesGlobalFlatIndices) {
  const Shape shape = {4, 5};
  const Box box{{1, 2}, {2, 3}};
  std::vector<int32_t> out(6);
  ASSERT_THAT(FillBox(Init("arange"), DType::kInt32, shape, box, out.data()),
              IsOk());
  EXPECT_THAT(out, ElementsAre(7, 8, 9, 12, 13, 14));
}

template <typename T>
void ExpectBoxesAgreeWithWhole(DType dtype) {
  const Shape shape = {9, 7, 5};
  const Box whole = WholeBox(shape);
  std::vector<T> all(whole.NumElements());
  ASSERT_THAT(FillBox(Init("rand:1234"), dtype, shape, whole, all.data()),
              IsOk());
  for (const Box& box : {Box{{2, 1, 0}, {3, 6, 5}}, Box{{0, 3, 2}, {9, 2, 3}},
                         Box{{8, 6, 4}, {1, 1, 1}}}) {
    std::vector<T> part(box.NumElements());
    ASSERT_THAT(FillBox(Init("rand:1234"), dtype, shape, box, part.data()),
                IsOk());
    int64_t k = 0;
    for (int64_t a = 0; a < box.sizes[0]; ++a) {
      for (int64_t b = 0; b < box.sizes[1]; ++b) {
        for (int64_t c = 0; c < box.sizes[2]; ++c) {
          const int64_t flat =
              ((box.offsets[0] + a) * 7 + box.offsets[1] + b) * 5 +
              box.offsets[2] + c;
          ASSERT_EQ(std::memcmp(&part[k++], &all[flat], sizeof(T)), 0)
              << DTypeName(dtype) << " " << box.ToString();
        }
      }
    }
  }
}

TEST(InitFillTest, RandIsTheSameWhateverTheSharding) {
  ExpectBoxesAgreeWithWhole<float>(DType::kFloat32);
  ExpectBoxesAgreeWithWhole<double>(DType::kFloat64);
  ExpectBoxesAgreeWithWhole<uint16_t>(DType::kFloat16);
  ExpectBoxesAgreeWithWhole<uint16_t>(DType::kBFloat16);
  ExpectBoxesAgreeWithWhole<int8_t>(DType::kInt8);
  ExpectBoxesAgreeWithWhole<int64_t>(DType::kInt64);
  ExpectBoxesAgreeWithWhole<uint8_t>(DType::kBool);
}

TEST(InitFillTest, RandValuesAreInRangeAndDependOnTheSeed) {
  const int64_t n = 100000;
  const auto f32 = FillAll<float>("rand:7", DType::kFloat32, {n});
  const auto f64 = FillAll<double>("rand:7", DType::kFloat64, {n});
  const auto f16 = FillAll<uint16_t>("rand:7", DType::kFloat16, {n});
  const auto bf16 = FillAll<uint16_t>("rand:7", DType::kBFloat16, {n});
  const auto i32 = FillAll<int32_t>("rand:7", DType::kInt32, {n});
  const auto u8 = FillAll<uint8_t>("rand:7", DType::kUInt8, {n});
  const auto b = FillAll<uint8_t>("rand:7", DType::kBool, {n});
  double sum = 0;
  int64_t trues = 0;
  int32_t max_int = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_GE(f32[i], 0.0f);
    ASSERT_LT(f32[i], 1.0f);
    ASSERT_GE(f64[i], 0.0);
    ASSERT_LT(f64[i], 1.0);
    ASSERT_GE(HalfToFloat(f16[i]), 0.0f);
    ASSERT_LT(HalfToFloat(f16[i]), 1.0f);
    ASSERT_GE(BFloat16ToFloat(bf16[i]), 0.0f);
    ASSERT_LT(BFloat16ToFloat(bf16[i]), 1.0f);
    ASSERT_GE(i32[i], 0);
    ASSERT_LT(i32[i], 100);
    ASSERT_LT(u8[i], 100);
    ASSERT_LE(b[i], 1);
    sum += f32[i];
    trues += b[i];
    max_int = std::max(max_int, i32[i]);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_NEAR(static_cast<double>(trues) / n, 0.5, 0.01);
  EXPECT_EQ(max_int, 99);
  EXPECT_NE(FillAll<float>("rand:8", DType::kFloat32, {n}), f32);
  EXPECT_EQ(FillAll<float>("rand:7", DType::kFloat32, {n}), f32);
}

TEST(InitFillTest, BoxesOutsideTheTensorAreRejected) {
  std::vector<float> out(10);
  EXPECT_THAT(
      FillBox(Init("zeros"), DType::kFloat32, {4}, Box{{2}, {5}}, out.data()),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out of bounds")));
  EXPECT_THAT(FillBox(Init("zeros"), DType::kFloat32, {4, 4}, Box{{2}, {1}},
                      out.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dims")));
  EXPECT_THAT(FillBox(Init("arange"), DType::kFloat32, {4, 0},
                      Box{{0, 0}, {4, 0}}, out.data()),
              IsOk());
}

TEST(InitFillTest, SixtyFourMebibyteShardFillsQuickly) {
  const Shape shape = {4096, 4096};  // 64 MiB of float32
  std::vector<float> out(4096 * 4096);
  ASSERT_THAT(FillBox(Init("rand:3"), DType::kFloat32, shape, WholeBox(shape),
                      out.data()),
              IsOk());
  ASSERT_THAT(FillBox(Init("arange"), DType::kFloat32, shape, WholeBox(shape),
                      out.data()),
              IsOk());
  EXPECT_EQ(out[4096 * 4096 - 1], 16777215.0f);
}

TEST(InitFillTest, PreparedFillWritesWhatFillBoxWrites) {
  const Shape shape = {5, 7};
  const Box box{{1, 2}, {3, 4}};
  for (const char* text : {"empty", "zeros", "ones", "full:-3", "full:2.75",
                           "full:true", "full:-inf", "arange", "rand:9"}) {
    for (DType dtype : AllDTypes()) {
      const InitSpec spec = Init(text);
      absl::StatusOr<InitFill> fill = InitFill::Make(spec, dtype);
      if (!CheckInitValue(spec, dtype).ok()) {
        EXPECT_THAT(fill.status(), StatusIs(absl::StatusCode::kInvalidArgument))
            << text << " " << DTypeName(dtype);
        continue;
      }
      ASSERT_THAT(fill.status(), IsOk()) << text;
      EXPECT_EQ(fill->kind(), spec.kind);
      EXPECT_EQ(fill->dtype(), dtype);
      const size_t bytes = 12 * ItemSize(dtype);
      std::vector<char> want(bytes, 'x'), got(bytes, 'x');
      ASSERT_THAT(FillBox(spec, dtype, shape, box, want.data()), IsOk());
      ASSERT_THAT(fill->Fill(shape, box, got.data()), IsOk());
      EXPECT_EQ(got, want) << text << " " << DTypeName(dtype);
    }
  }
  // Bounds are still checked per box.
  absl::StatusOr<InitFill> ones = InitFill::Make(Init("ones"), DType::kFloat32);
  ASSERT_THAT(ones.status(), IsOk());
  std::vector<float> out(8);
  EXPECT_THAT(
      ones->Fill({4}, Box{{2}, {5}}, out.data()),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out of bounds")));
}

TEST(InitFillTest, PreparedHugeValueFillsManyBoxesQuickly) {
  // A 4 MiB V is parsed once by Make, not once per box.
  InitSpec spec{InitSpec::Kind::kFull};
  spec.value = "2." + std::string(4 << 20, '0');
  absl::StatusOr<InitFill> fill = InitFill::Make(spec, DType::kInt16);
  ASSERT_THAT(fill.status(), IsOk());
  const absl::Time start = absl::Now();
  int16_t v = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    ASSERT_THAT(fill->Fill({1000}, Box{{i}, {1}}, &v), IsOk());
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(v, 2);
}

// Found by fuzz/parse_text_fuzzer: arange over "9223372036854775803,13,3,31"
// overflowed the flat index.
TEST(InitFillTest, ShapesWhoseElementCountOverflowsAreRejected) {
  InitSpec arange;
  arange.kind = InitSpec::Kind::kArange;
  char buf[64] = {0};
  EXPECT_THAT(
      FillBox(arange, DType::kInt8, {INT64_MAX - 4, 13, 3, 31},
              Box{{0, 0, 0, 0}, {1, 1, 1, 2}}, buf),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("64 bits")));
  // A tensor with a zero dim has no elements: an empty box is fine.
  EXPECT_THAT(FillBox(arange, DType::kInt8, {INT64_MAX, INT64_MAX, 0},
                      Box{{0, 0, 0}, {1, 1, 0}}, buf),
              IsOk());
}

}  // namespace
}  // namespace tessera
