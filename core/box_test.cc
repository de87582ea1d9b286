#include "core/box.h"

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Optional;

TEST(BoxTest, ToStringIsHalfOpenRangesPerDim) {
  EXPECT_EQ((Box{{0, 10}, {5, 10}}).ToString(), "0:5,10:20");
  EXPECT_EQ(ShapeToString({10, 20}), "[10, 20]");
  EXPECT_EQ(ShapeToString({7}), "[7]");
}

TEST(BoxTest, NumElementsEmptinessAndEquality) {
  const Box box{{1, 2}, {3, 4}};
  EXPECT_EQ(box.rank(), 2u);
  EXPECT_EQ(box.NumElements(), 12);
  EXPECT_FALSE(box.IsEmpty());
  EXPECT_TRUE((Box{{1, 2}, {0, 4}}).IsEmpty());
  EXPECT_EQ(box, (Box{{1, 2}, {3, 4}}));
  EXPECT_NE(box, (Box{{1, 2}, {3, 5}}));
  EXPECT_EQ(WholeBox({4, 5}), (Box{{0, 0}, {4, 5}}));
}

TEST(BoxTest, ContainsChecksEveryDim) {
  const Box outer{{0, 0}, {10, 10}};
  EXPECT_TRUE(outer.Contains(Box{{2, 3}, {8, 7}}));
  EXPECT_FALSE(outer.Contains(Box{{2, 3}, {9, 7}}));
  EXPECT_FALSE(outer.Contains(Box{{0}, {1}}));
}

TEST(BoxTest, IntersectGivesTheCommonPartOrNothing) {
  EXPECT_THAT(Intersect(Box{{0, 0}, {5, 5}}, Box{{3, 4}, {5, 5}}),
              Optional(Box{{3, 4}, {2, 1}}));
  EXPECT_EQ(Intersect(Box{{0, 0}, {5, 5}}, Box{{5, 0}, {5, 5}}),
            std::nullopt);  // touching only
  EXPECT_EQ(Intersect(Box{{0}, {5}}, Box{{0, 0}, {5, 5}}), std::nullopt);
  EXPECT_EQ(Intersect(Box{{0, 0}, {0, 5}}, Box{{0, 0}, {5, 5}}), std::nullopt);
}

TEST(BoxTest, TranslateSubtractsTheOrigin) {
  EXPECT_EQ(Translate(Box{{5, 7}, {2, 3}}, {5, 4}), (Box{{0, 3}, {2, 3}}));
}

TEST(BoxTest, CheckWithinReportsDimsThenBounds) {
  EXPECT_THAT(CheckWithin(Box{{0, 0}, {10, 20}}, {10, 20}, "region"), IsOk());
  EXPECT_THAT(CheckWithin(Box{{10, 0}, {0, 20}}, {10, 20}, "region"), IsOk());
  EXPECT_THAT(
      CheckWithin(Box{{0, 0, 0}, {5, 5, 1}}, {10, 20}, "region 0:5,0:5,0:1"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "region 0:5,0:5,0:1 has 3 dims but the tensor has 2 "
               "dims"));
  EXPECT_THAT(
      CheckWithin(Box{{0, 18}, {5, 4}}, {10, 20}, "shard 2"),
      StatusIs(absl::StatusCode::kOutOfRange,
               AllOf(HasSubstr("shard 2 is out of bounds"), HasSubstr("dim 1"),
                     HasSubstr("18:22"), HasSubstr("size 20"))));
  EXPECT_THAT(
      CheckWithin(Box{{-1, 0}, {2, 4}}, {10, 20}, "b"),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out of bounds")));
  EXPECT_THAT(
      CheckWithin(Box{{3, 0}, {-1, 4}}, {10, 20}, "b"),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out of bounds")));
  EXPECT_THAT(
      CheckWithin(Box{{11, 0}, {0, 4}}, {10, 20}, "b"),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out of bounds")));
  EXPECT_THAT(
      CheckWithin(Box{{INT64_MAX, 0}, {INT64_MAX, 4}}, {10, 20}, "huge"),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out of bounds")));
}

TEST(BoxTest, IsWithinAgreesWithCheckWithin) {
  Box lopsided{{0, 0}, {1, 1}};
  lopsided.sizes.pop_back();  // one size for two offsets
  const Shape shape{10, 20};
  for (const Box& box :
       {Box{{0, 0}, {10, 20}}, Box{{10, 0}, {0, 20}}, Box{{0, 0, 0}, {5, 5, 1}},
        Box{{0, 18}, {5, 4}}, Box{{-1, 0}, {2, 4}}, Box{{3, 0}, {-1, 4}},
        Box{{11, 0}, {0, 4}}, Box{{INT64_MAX, 0}, {INT64_MAX, 4}}, lopsided}) {
    EXPECT_EQ(IsWithin(box, shape), CheckWithin(box, shape, "b").ok())
        << box.ToString();
  }
}

// Found by fuzz/layout_fuzzer: error messages print unvalidated RPC boxes.
TEST(BoxTest, ToStringOfAbsurdBoxDoesNotOverflow) {
  EXPECT_EQ((Box{{INT64_MAX - 1, 2}, {8, 3}}).ToString(),
            "offset 9223372036854775806 size 8,2:5");
  EXPECT_EQ((Box{{INT64_MIN}, {-1}}).ToString(),
            "offset -9223372036854775808 size -1");
}

}  // namespace
}  // namespace tessera
