#include "core/shard_layout.h"

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/sharding_spec.h"
#include "core/testing/adversarial_layouts.h"
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

struct Adversarial {
  Shape shape;
  std::vector<Box> boxes;
};

std::vector<Adversarial> AdversarialTilings() {
  return {{{3000, 3000}, Shells(2, 3000)},
          {{900, 900, 900}, Shells(3, 900)},
          {{40, 40, 40, 40}, Suffixes(40, true)}};
}

TEST(ShardLayoutTest, AdversarialTilingsValidateInRanksTwoThreeAndFour) {
  for (const Adversarial& a : AdversarialTilings()) {
    EXPECT_THAT(ValidateLayout(a.shape, a.boxes, kEnum), IsOk())
        << ShapeToString(a.shape);
  }
}

TEST(ShardLayoutTest, AdversarialTilingsWithOneHoleAreNotCovered) {
  for (Adversarial a : AdversarialTilings()) {
    const size_t gone = a.boxes.size() / 2;
    const int64_t volume = a.boxes[gone].NumElements();
    a.boxes.erase(a.boxes.begin() + gone);
    EXPECT_THAT(ValidateLayout(a.shape, a.boxes, kEnum),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("cover"),
                               HasSubstr(absl::StrCat(volume, " of the ")))))
        << ShapeToString(a.shape);
  }
}

TEST(ShardLayoutTest, AdversarialTilingsWithOneOverlapNameBothShards) {
  for (Adversarial a : AdversarialTilings()) {
    for (size_t victim : {size_t{0}, a.boxes.size() / 3, a.boxes.size() - 1}) {
      // One element more, inside shard `victim` only.
      Box extra = a.boxes[victim];
      std::fill(extra.sizes.begin(), extra.sizes.end(), 1);
      std::vector<Box> boxes = a.boxes;
      boxes.push_back(extra);
      EXPECT_THAT(
          ValidateLayout(a.shape, boxes, kEnum),
          StatusIs(
              absl::StatusCode::kInvalidArgument,
              AllOf(HasSubstr("overlap"),
                    HasSubstr(absl::StrCat("shard ", victim, " (")),
                    HasSubstr(absl::StrCat("shard ", boxes.size() - 1, " (")),
                    HasSubstr(absl::StrCat("both hold ", extra.ToString())))))
          << ShapeToString(a.shape) << " victim " << victim;
    }
  }
}

TEST(ShardLayoutTest, HundredThousandShardAdversarialTilingsValidate) {
  EXPECT_THAT(ValidateLayout({50000, 50000}, Shells(2, 50000), kEnum), IsOk());
  EXPECT_THAT(ValidateLayout({33334, 33334, 33334}, Shells(3, 33334), kEnum),
              IsOk());
  EXPECT_THAT(ValidateLayout({183, 183, 183, 183}, Suffixes(183, true), kEnum),
              IsOk());
}

TEST(ShardLayoutTest, DisjointSuffixBoxesAreFoundDisjointButNotCovering) {
  // 65,536 disjoint shards whose projections overlap heavily: no overlap,
  // and exactly the elements outside them are reported uncovered.
  const int64_t m = 256;
  const int64_t covered = (m * (m + 1) / 2) * (m * (m + 1) / 2);
  const int64_t total = m * m * m * m;
  EXPECT_THAT(ValidateLayout({m, m, m, m}, Suffixes(m, false), kEnum),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat(total - covered, " of the ",
                                              total, " elements"))));
}

TEST(ShardLayoutTest, LongValidationStopsWhenCancelledOrPastItsDeadline) {
  const std::vector<Box> boxes = Suffixes(100, true);
  StopCondition cancelled;
  cancelled.cancelled = [] { return true; };
  EXPECT_THAT(ValidateLayout({100, 100, 100, 100}, boxes, kEnum, cancelled),
              StatusIs(absl::StatusCode::kCancelled));
  StopCondition late;
  late.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_THAT(ValidateLayout({100, 100, 100, 100}, boxes, kEnum, late),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  StopCondition never;
  never.deadline = absl::Now() + absl::Hours(1);
  never.cancelled = [] { return false; };
  EXPECT_THAT(ValidateLayout({100, 100, 100, 100}, boxes, kEnum, never),
              IsOk());
  // Errors found before the search still come first.
  std::vector<Box> bad = boxes;
  bad.push_back({{0, 0, 0}, {1, 1, 1}});
  EXPECT_THAT(ValidateLayout({100, 100, 100, 100}, bad, kEnum, cancelled),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dims")));
}

// The brute-force verdict: dims, bounds, overlap, cover, by counting how
// often each element is held.
std::string Oracle(const Shape& shape, const std::vector<Box>& boxes) {
  for (const Box& b : boxes) {
    for (size_t d = 0; d < shape.size(); ++d) {
      if (b.offsets[d] < 0 || b.sizes[d] < 0 ||
          b.offsets[d] + b.sizes[d] > shape[d]) {
        return "bounds";
      }
    }
  }
  // The first shard that overlaps an earlier one, and the first such one.
  for (size_t j = 0; j < boxes.size(); ++j) {
    for (size_t i = 0; i < j; ++i) {
      if (Intersect(boxes[i], boxes[j]).has_value()) {
        return absl::StrCat("overlap: shard ", i, " and shard ", j);
      }
    }
  }
  int64_t covered = 0, total = 1;
  for (const Box& b : boxes) covered += b.IsEmpty() ? 0 : b.NumElements();
  for (int64_t n : shape) total *= n;
  return covered == total ? "ok" : "cover";
}

std::string Verdict(const absl::Status& s) {
  if (s.ok()) return "ok";
  if (absl::IsOutOfRange(s)) return "bounds";
  if (s.message().find("overlap") != absl::string_view::npos) {
    // "shards overlap: shard I (...) and shard J (...) both hold ..."
    std::vector<std::string> words = absl::StrSplit(s.message(), ' ');
    return absl::StrCat("overlap: shard ", words[3], " and shard ", words[7]);
  }
  if (s.message().find("cover") != absl::string_view::npos) return "cover";
  return std::string(s.message());
}

TEST(ShardLayoutTest, AgreesWithBruteForceOnRandomSmallLayouts) {
  // Overlaps name the first shard that overlaps an earlier one, and the
  // first earlier one it overlaps.
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> coord(0, 4);
  for (int round = 0; round < 3000; ++round) {
    const size_t rank = 1 + round % 4;
    Shape shape(rank);
    for (int64_t& n : shape) n = 1 + coord(rng) % 4;
    std::vector<Box> boxes(1 + round % 9);
    for (Box& b : boxes) {
      for (size_t d = 0; d < rank; ++d) {
        b.offsets.push_back(coord(rng) % shape[d]);
        b.sizes.push_back(coord(rng) % (shape[d] - b.offsets[d] + 1));
      }
    }
    const absl::Status got = ValidateLayout(shape, boxes, kEnum);
    ASSERT_EQ(Verdict(got), Oracle(shape, boxes))
        << ShapeToString(shape) << " round " << round << ": " << got;
  }
}

TEST(ShardLayoutTest, TotalShardBytesSumsEveryBox) {
  std::vector<Box> boxes = {
      {{0, 0}, {5, 20}}, {{5, 0}, {5, 20}}, {{10, 0}, {0, 20}}};
  EXPECT_THAT(TotalShardBytes(boxes, 4), IsOkAndHolds(800));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Empty chunk shards are not checked against the shape (they may lie past
// its end), so the overlap search must leave them out: their offsets and
// sizes may be anything. Overlaps are still named by the caller's indices.
TEST(ShardLayoutTest, EmptyChunkShardsStayOutOfTheOverlapSearch) {
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  const std::vector<Box> tiling = {
      {{0, 0}, {2, 4}}, {{kMin + 4, 5}, {kMin + 1, 0}}, {{2, 0}, {2, 4}}};
  EXPECT_THAT(ValidateLayout({4, 4}, tiling, LayoutKind::kChunk), IsOk());
  const std::vector<Box> overlapping = {
      {{0, 0}, {3, 4}}, {{kMin + 4, 5}, {kMin + 1, 0}}, {{2, 0}, {2, 4}}};
  EXPECT_THAT(ValidateLayout({4, 4}, overlapping, LayoutKind::kChunk),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("shard 0"), HasSubstr("shard 2"))));
}

}  // namespace
}  // namespace tessera
