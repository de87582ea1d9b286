#include "core/box_runs.h"

#include <random>
#include <vector>

#include "core/strided_copy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;

struct BoxRun {
  int64_t array_element, range_element, n;
  bool operator==(const BoxRun& o) const {
    return array_element == o.array_element &&
           range_element == o.range_element && n == o.n;
  }
};

std::vector<BoxRun> Runs(const Shape& shape, std::vector<int64_t> offsets,
                         std::vector<int64_t> sizes, int64_t begin,
                         int64_t count) {
  std::vector<BoxRun> runs;
  ForEachBoxRun(shape, offsets, sizes, begin, count,
                [&](int64_t a, int64_t r, int64_t n) {
                  runs.push_back({a, r, n});
                });
  return runs;
}

TEST(BoxRunsTest, SubBoxOfAMatrixIsOneRunPerRow) {
  // 2x2 box at (1, 1) of a 3x4 array: elements 5,6 and 9,10.
  EXPECT_THAT(Runs({3, 4}, {1, 1}, {2, 2}, 0, 4),
              ElementsAre(BoxRun{5, 0, 2}, BoxRun{9, 2, 2}));
}

TEST(BoxRunsTest, RangeStartingMidRowIsSplitAtRowEnds) {
  EXPECT_THAT(Runs({3, 4}, {0, 0}, {3, 4}, 3, 6),
              ElementsAre(BoxRun{3, 0, 1}, BoxRun{4, 1, 4}, BoxRun{8, 5, 1}));
}

TEST(BoxRunsTest, EmptyRangeVisitsNothing) {
  EXPECT_TRUE(Runs({3, 4}, {0, 0}, {3, 4}, 2, 0).empty());
}

TEST(BoxRunsTest, AgreesWithCopyBoxToFlatRangeOnRandomBoxes) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t rank = 1 + rng() % 4;
    Shape shape(rank);
    std::vector<int64_t> offsets(rank), sizes(rank);
    int64_t box_elements = 1, total = 1;
    for (size_t d = 0; d < rank; ++d) {
      shape[d] = 1 + rng() % 6;
      offsets[d] = rng() % shape[d];
      sizes[d] = 1 + rng() % (shape[d] - offsets[d]);
      box_elements *= sizes[d];
      total *= shape[d];
    }
    std::vector<int32_t> array(total);
    for (int64_t i = 0; i < total; ++i) array[i] = static_cast<int32_t>(i);
    const int64_t begin = rng() % box_elements;
    const int64_t count = rng() % (box_elements - begin + 1);
    std::vector<int32_t> want(count), got(count, -1);
    CopyBoxToFlatRange(array.data(), shape, offsets, sizes, begin, count,
                       want.data(), 4);
    ForEachBoxRun(shape, offsets, sizes, begin, count,
                  [&](int64_t a, int64_t r, int64_t n) {
                    for (int64_t k = 0; k < n; ++k) got[r + k] = array[a + k];
                  });
    EXPECT_EQ(got, want) << "trial " << trial;
  }
}

struct Block {
  int64_t element, range, run, rows, pitch;
  bool operator==(const Block& o) const {
    return element == o.element && range == o.range && run == o.run &&
           rows == o.rows && pitch == o.pitch;
  }
};

std::vector<Block> Blocks(const Shape& shape, std::vector<int64_t> offsets,
                          std::vector<int64_t> sizes, int64_t begin,
                          int64_t count) {
  std::vector<Block> blocks;
  ForEachBoxBlock(shape, offsets, sizes, begin, count,
                  [&](int64_t e, int64_t r, int64_t run, int64_t rows,
                      int64_t pitch) {
                    blocks.push_back({e, r, run, rows, pitch});
                  });
  return blocks;
}

TEST(BoxBlocksTest, WholeArrayIsOneContiguousBlock) {
  EXPECT_THAT(Blocks({3, 4}, {0, 0}, {3, 4}, 0, 12),
              ElementsAre(Block{0, 0, 4, 3, 4}));
}

TEST(BoxBlocksTest, SubBoxIsOnePitchedBlock) {
  EXPECT_THAT(Blocks({3, 4}, {1, 1}, {2, 2}, 0, 4),
              ElementsAre(Block{5, 0, 2, 2, 4}));
}

TEST(BoxBlocksTest, PartialRowsStandAlone) {
  EXPECT_THAT(Blocks({3, 4}, {0, 0}, {3, 4}, 3, 6),
              ElementsAre(Block{3, 0, 1, 1, 1}, Block{4, 1, 4, 1, 4},
                          Block{8, 5, 1, 1, 1}));
}

TEST(BoxBlocksTest, AgreesWithCopyBoxToFlatRangeOnRandomBoxes) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t rank = 1 + rng() % 4;
    Shape shape(rank);
    std::vector<int64_t> offsets(rank), sizes(rank);
    int64_t box_elements = 1, total = 1;
    for (size_t d = 0; d < rank; ++d) {
      shape[d] = 1 + rng() % 6;
      offsets[d] = rng() % shape[d];
      sizes[d] = 1 + rng() % (shape[d] - offsets[d]);
      box_elements *= sizes[d];
      total *= shape[d];
    }
    std::vector<int32_t> array(total);
    for (int64_t i = 0; i < total; ++i) array[i] = static_cast<int32_t>(i);
    const int64_t begin = rng() % box_elements;
    const int64_t count = rng() % (box_elements - begin + 1);
    std::vector<int32_t> want(count), got(count, -1);
    CopyBoxToFlatRange(array.data(), shape, offsets, sizes, begin, count,
                       want.data(), 4);
    ForEachBoxBlock(shape, offsets, sizes, begin, count,
                    [&](int64_t e, int64_t r, int64_t run, int64_t rows,
                        int64_t pitch) {
                      ASSERT_GE(pitch, run);
                      for (int64_t i = 0; i < rows; ++i) {
                        for (int64_t j = 0; j < run; ++j) {
                          got[r + i * run + j] = array[e + i * pitch + j];
                        }
                      }
                    });
    EXPECT_EQ(got, want) << "trial " << trial;
  }
}

}  // namespace
}  // namespace tessera
