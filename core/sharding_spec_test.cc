#include "core/sharding_spec.h"

#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// Offsets and sizes of the chunk dim of ChunkBoxes({n}, 0, k).
void ExpectSplit(int64_t n, int64_t k, std::vector<int64_t> offsets,
                 std::vector<int64_t> sizes) {
  auto boxes = ChunkBoxes({n}, 0, k);
  ASSERT_THAT(boxes, IsOk());
  std::vector<int64_t> got_offsets, got_sizes;
  for (const Box& b : *boxes) {
    got_offsets.push_back(b.offsets[0]);
    got_sizes.push_back(b.sizes[0]);
  }
  EXPECT_EQ(got_offsets, offsets) << "n=" << n << " k=" << k;
  EXPECT_EQ(got_sizes, sizes) << "n=" << n << " k=" << k;
}

TEST(ShardingSpecTest, ChunkSplitMatchesTorchChunk) {
  ExpectSplit(10, 4, {0, 3, 6, 9}, {3, 3, 3, 1});
  ExpectSplit(5, 4, {0, 2, 4, 6}, {2, 2, 1, 0});
  ExpectSplit(2, 4, {0, 1, 2, 3}, {1, 1, 0, 0});
  ExpectSplit(3, 8, {0, 1, 2, 3, 4, 5, 6, 7}, {1, 1, 1, 0, 0, 0, 0, 0});
  ExpectSplit(8, 3, {0, 3, 6}, {3, 3, 2});
  ExpectSplit(12, 4, {0, 3, 6, 9}, {3, 3, 3, 3});
  ExpectSplit(7, 1, {0}, {7});
  ExpectSplit(0, 3, {0, 0, 0}, {0, 0, 0});
  ExpectSplit(9, 6, {0, 2, 4, 6, 8, 10}, {2, 2, 2, 2, 1, 0});
}

TEST(ShardingSpecTest, OtherDimsAreWholeAndNegativeDimsCountFromTheEnd) {
  auto boxes = ChunkBoxes({4, 10}, -1, 3);
  ASSERT_THAT(boxes, IsOk());
  EXPECT_EQ((*boxes)[0], (Box{{0, 0}, {4, 4}}));
  EXPECT_EQ((*boxes)[1], (Box{{0, 4}, {4, 4}}));
  EXPECT_EQ((*boxes)[2], (Box{{0, 8}, {4, 2}}));
  auto same = ChunkBoxes({4, 10}, 1, 3);
  EXPECT_EQ(*same, *boxes);
  auto first = ChunkBoxes({4, 10}, -2, 2);
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ((*first)[1], (Box{{2, 0}, {2, 10}}));
}

TEST(ShardingSpecTest, DimsOutsideTheTensorAreInvalidShardingDims) {
  EXPECT_THAT(NormalizeDim(-1, 3), IsOkAndHolds(2));
  EXPECT_THAT(NormalizeDim(-3, 3), IsOkAndHolds(0));
  EXPECT_THAT(NormalizeDim(2, 3), IsOkAndHolds(2));
  EXPECT_THAT(NormalizeDim(3, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "invalid sharding dim 3 for a tensor with 3 dims"));
  EXPECT_THAT(NormalizeDim(-4, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid sharding dim -4")));
  EXPECT_THAT(ChunkBoxes({10, 20}, 2, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid sharding dim")));
}

TEST(ShardingSpecTest, AtLeastOneChunkIsNeeded) {
  EXPECT_THAT(ChunkBoxes({10}, 0, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("at least one placement")));
}

// Found by fuzz/parse_text_fuzzer: "9223372036854775807,2" chunked in two.
TEST(ShardingSpecTest, HugeDimDoesNotOverflow) {
  ExpectSplit(INT64_MAX, 2, {0, int64_t{1} << 62},
              {int64_t{1} << 62, (int64_t{1} << 62) - 1});
  ExpectSplit(INT64_MAX, 3, {0, 3074457345618258603, 6148914691236517206},
              {3074457345618258603, 3074457345618258603, 3074457345618258601});
  EXPECT_THAT(ChunkBoxes({INT64_MAX - 1, 2}, -2, 1000), IsOk());
}

}  // namespace
}  // namespace tessera
