#include "core/shard_layout.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/sharding_spec.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr LayoutKind kEnum = LayoutKind::kEnumerable;

TEST(ShardLayoutTest, TwoHalvesCoverAMatrix) {
  std::vector<Box> boxes = {{{0, 0}, {5, 20}}, {{5, 0}, {5, 20}}};
  EXPECT_THAT(ValidateLayout({10, 20}, boxes, kEnum), IsOk());
}

TEST(ShardLayoutTest, ChunkLayoutsWithEmptyShardsPastTheEndAreValid) {
  for (int64_t n : {0, 1, 2, 3, 5, 10, 17}) {
    for (int64_t k : {1, 2, 3, 4, 8}) {
      auto boxes = ChunkBoxes({n, 3}, 0, k);
      ASSERT_THAT(boxes, IsOk());
      EXPECT_THAT(ValidateLayout({n, 3}, *boxes, LayoutKind::kChunk), IsOk())
          << n << " " << k;
    }
  }
  // The same boxes given as an enumerable layout are out of bounds.
  auto boxes = ChunkBoxes({2}, 0, 4);
  EXPECT_THAT(ValidateLayout({2}, *boxes, kEnum),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("shard 3 (3:3) is out of bounds")));
}

TEST(ShardLayoutTest, SizeZeroEnumerableBoxesAreLegalButBoundsChecked) {
  std::vector<Box> boxes = {{{0}, {10}}, {{10}, {0}}, {{4}, {0}}};
  EXPECT_THAT(ValidateLayout({10}, boxes, kEnum), IsOk());
  boxes.push_back({{11}, {0}});
  EXPECT_THAT(ValidateLayout({10}, boxes, kEnum),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("shard 3 (11:11) is out of bounds")));
}

TEST(ShardLayoutTest, OverlappingBoxesAreRejectedNamingBothShards) {
  std::vector<Box> boxes = {
      {{0, 0}, {5, 20}}, {{5, 0}, {5, 10}}, {{4, 10}, {6, 10}}};
  EXPECT_THAT(
      ValidateLayout({10, 20}, boxes, kEnum),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          AllOf(HasSubstr("overlap"), HasSubstr("shard 0 (0:5,0:20)"),
                HasSubstr("shard 2 (4:10,10:20)"), HasSubstr("4:5,10:20"))));
}

TEST(ShardLayoutTest, OverlapIsFoundInOneAndThreeDims) {
  std::vector<Box> one = {{{0}, {4}}, {{8}, {2}}, {{4}, {5}}};
  EXPECT_THAT(ValidateLayout({10}, one, kEnum),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("overlap"), HasSubstr("shard 1"),
                             HasSubstr("shard 2"))));
  std::vector<Box> nested = {{{0}, {10}}, {{2}, {1}}};
  EXPECT_THAT(
      ValidateLayout({10}, nested, kEnum),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
  // Disjoint on dim 2 only: no overlap; then one that meets another.
  std::vector<Box> three = {
      {{0, 0, 0}, {4, 4, 2}}, {{0, 0, 2}, {4, 4, 2}}, {{0, 4, 0}, {4, 1, 4}}};
  EXPECT_THAT(ValidateLayout({4, 5, 4}, three, kEnum), IsOk());
  three.push_back({{3, 1, 1}, {1, 1, 1}});
  EXPECT_THAT(ValidateLayout({4, 5, 4}, three, kEnum),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("overlap"), HasSubstr("shard 0"),
                             HasSubstr("shard 3"))));
}

TEST(ShardLayoutTest, EmptyBoxesNeverOverlap) {
  std::vector<Box> boxes = {{{0, 0}, {10, 20}}, {{3, 3}, {0, 5}}};
  EXPECT_THAT(ValidateLayout({10, 20}, boxes, kEnum), IsOk());
}

TEST(ShardLayoutTest, UncoveredElementsAreCounted) {
  std::vector<Box> boxes = {{{0, 0}, {5, 20}}, {{5, 0}, {5, 15}}};
  EXPECT_THAT(
      ValidateLayout({10, 20}, boxes, kEnum),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("cover"), HasSubstr("25 of the 200 elements"))));
  EXPECT_THAT(ValidateLayout({10, 20}, {}, kEnum),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cover")));
  EXPECT_THAT(ValidateLayout({0, 20}, {}, kEnum), IsOk());
}

TEST(ShardLayoutTest, ValidationOrderIsDimsBoundsOverlapCover) {
  // Shard 1 overlaps shard 0, shard 2 is out of bounds, shard 3 has 1 dim:
  // the dims error wins even though it comes last.
  std::vector<Box> boxes = {
      {{0, 0}, {5, 5}}, {{4, 0}, {5, 5}}, {{0, 0}, {11, 5}}, {{0}, {5}}};
  EXPECT_THAT(ValidateLayout({10, 20}, boxes, kEnum),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shard 3 has 1 dims but the tensor has 2")));
  boxes.pop_back();
  EXPECT_THAT(ValidateLayout({10, 20}, boxes, kEnum),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("shard 2 (0:11,0:5) is out of bounds")));
  boxes.pop_back();
  EXPECT_THAT(
      ValidateLayout({10, 20}, boxes, kEnum),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
  boxes.pop_back();
  EXPECT_THAT(ValidateLayout({10, 20}, boxes, kEnum),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cover")));
}

std::vector<Box> Grid(int64_t rows, int64_t cols) {
  std::vector<Box> boxes;
  boxes.reserve(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      boxes.push_back({{r * 3, c * 2}, {3, 2}});
    }
  }
  return boxes;
}

TEST(ShardLayoutTest, HundredThousandShardGridValidates) {
  std::vector<Box> boxes = Grid(316, 317);  // 100,172 shards
  EXPECT_THAT(ValidateLayout({316 * 3, 317 * 2}, boxes, kEnum), IsOk());
}

TEST(ShardLayoutTest, HundredThousandRowsValidate) {
  std::vector<Box> boxes;
  for (int64_t r = 0; r < 100000; ++r) boxes.push_back({{r, 0}, {1, 7}});
  EXPECT_THAT(ValidateLayout({100000, 7}, boxes, kEnum), IsOk());
  boxes.push_back({{99999, 6}, {1, 1}});
  EXPECT_THAT(ValidateLayout({100000, 7}, boxes, kEnum),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("overlap"), HasSubstr("shard 99999 "),
                             HasSubstr("shard 100000 "))));
}

TEST(ShardLayoutTest, OneOverlapPlantedAtTheEndOfAHugeGridIsFound) {
  std::vector<Box> boxes = Grid(316, 317);
  const size_t last = boxes.size() - 1;
  // Stretch the last shard one column to the left, into its neighbour.
  boxes[last].offsets[1] -= 1;
  boxes[last].sizes[1] += 1;
  EXPECT_THAT(ValidateLayout({316 * 3, 317 * 2}, boxes, kEnum),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("overlap"),
                             HasSubstr(absl::StrCat("shard ", last - 1, " ")),
                             HasSubstr(absl::StrCat("shard ", last, " ")))));
}

TEST(ShardLayoutTest, ThreeDimGridValidates) {
  std::vector<Box> boxes;
  for (int64_t a = 0; a < 20; ++a)
    for (int64_t b = 0; b < 20; ++b)
      for (int64_t c = 0; c < 20; ++c)
        boxes.push_back({{a, b * 2, c}, {1, 2, 1}});
  EXPECT_THAT(ValidateLayout({20, 40, 20}, boxes, kEnum), IsOk());
  boxes.push_back({{19, 39, 19}, {1, 1, 1}});
  EXPECT_THAT(
      ValidateLayout({20, 40, 20}, boxes, kEnum),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
}

TEST(ShardLayoutTest, HundredThousandSlicesAlongTheLastOfThreeDimsValidate) {
  // Every box spans dims 0 and 1 whole, so only dim 2 tells them apart.
  std::vector<Box> boxes;
  for (int64_t c = 0; c < 100000; ++c) boxes.push_back({{0, 0, c}, {3, 2, 1}});
  EXPECT_THAT(ValidateLayout({3, 2, 100000}, boxes, kEnum), IsOk());
  boxes.push_back({{2, 1, 50000}, {1, 1, 2}});
  EXPECT_THAT(ValidateLayout({3, 2, 100000}, boxes, kEnum),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("overlap"), HasSubstr("shard 50000 "),
                             HasSubstr("shard 100000 "))));
}

TEST(ShardLayoutTest, HundredThousandColumnsValidate) {
  std::vector<Box> boxes;
  for (int64_t c = 0; c < 100000; ++c) boxes.push_back({{0, c}, {7, 1}});
  EXPECT_THAT(ValidateLayout({7, 100000}, boxes, kEnum), IsOk());
}

TEST(ShardLayoutTest, TotalShardBytesSumsEveryBox) {
  std::vector<Box> boxes = {
      {{0, 0}, {5, 20}}, {{5, 0}, {5, 20}}, {{10, 0}, {0, 20}}};
  EXPECT_THAT(TotalShardBytes(boxes, 4), IsOkAndHolds(800));
}

}  // namespace
}  // namespace tessera
