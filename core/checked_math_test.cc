#include "core/checked_math.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "core/box.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(CheckedMathTest, AddAndMulDetectOverflow) {
  EXPECT_THAT(CheckedAdd(2, 3), IsOkAndHolds(5));
  EXPECT_THAT(CheckedAdd(kMax, 1), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("size overflows")));
  EXPECT_THAT(CheckedMul(1 << 20, 1 << 20), IsOkAndHolds(int64_t{1} << 40));
  EXPECT_THAT(CheckedMul(int64_t{1} << 32, int64_t{1} << 31),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("size overflows")));
}

TEST(CheckedMathTest, NumElementsMultipliesAndRejectsNegatives) {
  EXPECT_THAT(NumElements(std::vector<int64_t>{10, 20}), IsOkAndHolds(200));
  EXPECT_THAT(NumElements(std::vector<int64_t>{}), IsOkAndHolds(1));
  EXPECT_THAT(NumElements(std::vector<int64_t>{kMax, kMax, 0}),
              IsOkAndHolds(0));
  EXPECT_THAT(NumElements(std::vector<int64_t>{3, -1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative size -1")));
  EXPECT_THAT(
      NumElements(std::vector<int64_t>{kMax, 2}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
}

// An empty tensor may have huge other dims: its count is 0 whatever their
// product (found by the coordinator request fuzzer: a shard box of an empty
// tensor overflowed while counting), and a count that cannot fit saturates.
TEST(CheckedMathTest, ElementCountOfEmptyOrHugeBoxesIsDefined) {
  const int64_t big = int64_t{1} << 30;
  EXPECT_EQ(ElementCount({big, big, 8, 0}), 0);
  EXPECT_EQ(ElementCount({0, big, big, big}), 0);
  EXPECT_EQ(ElementCount({big, big, 8, 2}),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(ElementCount({3, 4, 5}), 60);
  EXPECT_EQ(ElementCount({}), 1);
  EXPECT_EQ(Box({0, 0, 0, 0}, {big, big, 8, 0}).NumElements(), 0);
}

TEST(CheckedMathTest, ByteSizeLimitsToOnePebibyte) {
  EXPECT_THAT(ByteSize(std::vector<int64_t>{10, 20}, 4), IsOkAndHolds(800));
  EXPECT_THAT(ByteSize(std::vector<int64_t>{int64_t{1} << 47}, 8),
              IsOkAndHolds(kMaxTensorBytes));
  EXPECT_THAT(
      ByteSize(std::vector<int64_t>{(int64_t{1} << 47) + 1}, 8),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
  EXPECT_THAT(
      ByteSize(std::vector<int64_t>{kMax}, 2),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
}

}  // namespace
}  // namespace tessera
