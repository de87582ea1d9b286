#include "core/layout_spec.h"

#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<Placement> Ranks(int n) {
  std::vector<Placement> out(n);
  for (int i = 0; i < n; ++i) out[i].rank = i;
  return out;
}

TEST(LayoutSpecTest, ChunkSpecGivesTorchChunkBoxes) {
  EXPECT_THAT(
      LayoutBoxes({5, 2}, LayoutSpec::Chunk(0, Ranks(4))),
      IsOkAndHolds(ElementsAre(Box{{0, 0}, {2, 2}}, Box{{2, 0}, {2, 2}},
                               Box{{4, 0}, {1, 2}}, Box{{6, 0}, {0, 2}})));
  EXPECT_THAT(LayoutBoxes({5, 2}, LayoutSpec::Chunk(2, Ranks(2))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid sharding dim")));
  EXPECT_THAT(LayoutBoxes({5, 2}, LayoutSpec::Chunk(0, {})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("at least one placement")));
}

TEST(LayoutSpecTest, EnumerableSpecIsValidated) {
  const std::vector<Box> halves = {Box{{0}, {5}}, Box{{5}, {5}}};
  EXPECT_THAT(LayoutBoxes({10}, LayoutSpec::Enumerable(halves, Ranks(2))),
              IsOkAndHolds(ElementsAre(halves[0], halves[1])));
  EXPECT_THAT(LayoutBoxes({10}, LayoutSpec::Enumerable(halves, Ranks(3))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("2 boxes but 3 placements")));
  EXPECT_THAT(
      LayoutBoxes({10}, LayoutSpec::Enumerable({Box{{0}, {6}}, Box{{5}, {5}}},
                                               Ranks(2))),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
  EXPECT_THAT(
      LayoutBoxes({10}, LayoutSpec::Enumerable({Box{{0}, {6}}}, Ranks(1))),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cover")));
}

}  // namespace
}  // namespace tessera
