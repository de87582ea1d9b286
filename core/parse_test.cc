#include "core/parse.h"

#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

DimRange R(std::optional<int64_t> a, std::optional<int64_t> b) {
  return DimRange{a, b};
}

absl::StatusOr<Box> Region(absl::string_view text, const Shape& shape) {
  auto ranges = ParseRanges(text);
  if (!ranges.ok()) return ranges.status();
  return ResolveRegion(*ranges, shape);
}

TEST(ParseTest, Int64IsStrict) {
  EXPECT_THAT(ParseInt64("-12"), IsOkAndHolds(-12));
  EXPECT_THAT(ParseInt64("9223372036854775807"), IsOkAndHolds(INT64_MAX));
  for (const char* bad :
       {"", "-", "1x", " 1", "1 ", "0x10", "1.0", "9223372036854775808"}) {
    EXPECT_THAT(ParseInt64(bad), StatusIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
}

TEST(ParseTest, ShapesNeedOneOrMoreNonNegativeSizes) {
  EXPECT_THAT(ParseShape("10,20"), IsOkAndHolds(ElementsAre(10, 20)));
  EXPECT_THAT(ParseShape("0"), IsOkAndHolds(ElementsAre(0)));
  EXPECT_THAT(ParseShape("3,0,4"), IsOkAndHolds(ElementsAre(3, 0, 4)));
  for (const char* bad : {"", "10,", ",10", "10,-1", "a", "10,,20", "1.5"}) {
    EXPECT_THAT(ParseShape(bad), StatusIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
}

TEST(ParseTest, RangesParseEveryOpenForm) {
  EXPECT_THAT(ParseRanges("0:5,:,-3:,:-1,2:-2"),
              IsOkAndHolds(ElementsAre(R(0, 5), R({}, {}), R(-3, {}), R({}, -1),
                                       R(2, -2))));
  for (const char* bad : {"", "5", "0:5,", "1:2:3", "a:b", "0:5;1:2", " 0:5"}) {
    EXPECT_THAT(ParseRanges(bad), StatusIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
}

TEST(ParseTest, RegionsResolveWithNumPyRules) {
  EXPECT_THAT(Region("0:5,10:20", {10, 20}),
              IsOkAndHolds(Box{{0, 10}, {5, 10}}));
  EXPECT_THAT(Region("-3:,:-5", {10, 20}), IsOkAndHolds(Box{{7, 0}, {3, 15}}));
  EXPECT_THAT(Region(":", {10, 20}), IsOkAndHolds(Box{{0, 0}, {10, 20}}));
  EXPECT_THAT(Region("2:4", {10, 20, 3}),
              IsOkAndHolds(Box{{2, 0, 0}, {2, 20, 3}}));
  EXPECT_THAT(Region("4:4", {10}), IsOkAndHolds(Box{{4}, {0}}));
  EXPECT_THAT(Region("10:", {10}), IsOkAndHolds(Box{{10}, {0}}));
  EXPECT_THAT(Region("-10:-10", {10}), IsOkAndHolds(Box{{0}, {0}}));
}

TEST(ParseTest, RegionsOutsideTheTensorAreOutOfBoundsNotClamped) {
  for (const char* bad : {"0:11", "-11:", "5:3", "11:", ":-11", "-1:-2"}) {
    EXPECT_THAT(Region(bad, {10}),
                StatusIs(absl::StatusCode::kOutOfRange,
                         AllOf(HasSubstr("out of bounds"), HasSubstr("dim 0"))))
        << bad;
  }
}

TEST(ParseTest, RegionsWithTooManyDimsAreDimsErrors) {
  EXPECT_THAT(Region("0:5,0:5,0:1", {10, 20}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "region 0:5,0:5,0:1 has 3 dims but the tensor has 2 "
                       "dims"));
}

TEST(ParseTest, BoxesNeedEveryDimButAreNotBoundsChecked) {
  auto box = [](absl::string_view text, const Shape& shape) {
    auto ranges = ParseRanges(text);
    EXPECT_THAT(ranges, IsOk());
    return ResolveBox(*ranges, shape);
  };
  EXPECT_THAT(box("0:5,-5:", {10, 20}), IsOkAndHolds(Box{{0, 15}, {5, 5}}));
  EXPECT_THAT(box("5:3,0:30", {10, 20}), IsOkAndHolds(Box{{5, 0}, {-2, 30}}));
  EXPECT_THAT(box("0:5", {10, 20}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has 1 dims but the tensor has 2 dims")));
  EXPECT_THAT(box("0:5,:,:", {10, 20}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dims")));
}

TEST(ParseTest, ShardListsSplitOnSemicolonsAndAt) {
  auto shards = ParseShardList("0:5,:@rank:0/cpu;5:10,:@w1;");
  ASSERT_THAT(shards, IsOk());
  ASSERT_THAT(*shards, SizeIs(2));
  EXPECT_THAT((*shards)[0].ranges, ElementsAre(R(0, 5), R({}, {})));
  EXPECT_EQ((*shards)[0].placement.ToString(), "rank:0/cpu");
  EXPECT_EQ((*shards)[1].placement.worker, "w1");
  for (const char* bad : {"", ";", "0:5", "0:5@", "@rank:0", "0:5@rank:x",
                          "0:5@rank:0;;5:10@rank:1", "x@rank:0"}) {
    EXPECT_THAT(ParseShardList(bad),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
}

TEST(ClosestNameTest, GuessesTyposAndNothingElse) {
  const std::vector<std::string> commands = {
      "workers", "create", "put", "get", "describe", "ls", "reshard", "rm"};
  EXPECT_EQ(ClosestName("lst", commands), "ls");
  EXPECT_EQ(ClosestName("wokrers", commands), "workers");  // a swap
  EXPECT_EQ(ClosestName("descibe", commands), "describe");
  EXPECT_EQ(ClosestName("resh", commands), "reshard");  // a unique prefix
  EXPECT_EQ(ClosestName("r", commands), "");            // rm or reshard
  EXPECT_EQ(ClosestName("pet", commands), "");          // put or get: a tie
  EXPECT_EQ(ClosestName("xyz", commands), "");
  EXPECT_EQ(ClosestName("ls", commands), "");  // itself: no guess
  EXPECT_EQ(ClosestName("", commands), "");
  EXPECT_EQ(ClosestName(std::string(10000, 'x'), commands), "");
  EXPECT_EQ(ClosestName("emd", {"emb", "weights"}), "emb");
  EXPECT_EQ(ClosestName("--outptu", {"--output", "--region", "--rows"}),
            "--output");
}

TEST(ParseTest, ByteSizesTakeHuggingFacesUnits) {
  EXPECT_EQ(*ParseByteSize("5GB"), int64_t{5} * 1000 * 1000 * 1000);
  EXPECT_EQ(*ParseByteSize("500mb"), int64_t{500} * 1000 * 1000);
  EXPECT_EQ(*ParseByteSize("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("64KiB"), 65536);
  EXPECT_EQ(*ParseByteSize("10kb"), 10000);
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize("7B"), 7);
  for (const char* bad : {"", "GB", "0", "-1GB", "+5GB", "5 GB", "5PB", "1.5GB",
                          "99999999999TB", "5GBB"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace tessera
