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

// A random range of a random sub-box of an array holding 0, 1, 2, ...;
// `want` is what CopyBoxToFlatRange reads for it.
struct RandomCase {
  Shape shape;
  std::vector<int64_t> offsets, sizes;
  int64_t begin = 0, count = 0;
  std::vector<int32_t> array, want;
};

RandomCase MakeRandomCase(std::mt19937& rng) {
  RandomCase c;
  const size_t rank = 1 + rng() % 4;
  c.shape.resize(rank);
  c.offsets.resize(rank);
  c.sizes.resize(rank);
  int64_t box_elements = 1, total = 1;
  for (size_t d = 0; d < rank; ++d) {
    c.shape[d] = 1 + rng() % 6;
    c.offsets[d] = rng() % c.shape[d];
    c.sizes[d] = 1 + rng() % (c.shape[d] - c.offsets[d]);
    box_elements *= c.sizes[d];
    total *= c.shape[d];
  }
  c.array.resize(total);
  for (int64_t i = 0; i < total; ++i) c.array[i] = static_cast<int32_t>(i);
  c.begin = rng() % box_elements;
  c.count = rng() % (box_elements - c.begin + 1);
  c.want.resize(c.count);
  CopyBoxToFlatRange(c.array.data(), c.shape, c.offsets, c.sizes, c.begin,
                     c.count, c.want.data(), 4);
  return c;
}

TEST(BoxRunsTest, AgreesWithCopyBoxToFlatRangeOnRandomBoxes) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const RandomCase c = MakeRandomCase(rng);
    std::vector<int32_t> got(c.count, -1);
    ForEachBoxRun(c.shape, c.offsets, c.sizes, c.begin, c.count,
                  [&](int64_t a, int64_t r, int64_t n) {
                    for (int64_t k = 0; k < n; ++k) got[r + k] = c.array[a + k];
                  });
    EXPECT_EQ(got, c.want) << "trial " << trial;
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
  ForEachBoxBlock(
      shape, offsets, sizes, begin, count,
      [&](int64_t e, int64_t r, int64_t run, int64_t rows, int64_t pitch) {
        blocks.push_back({e, r, run, rows, pitch});
      });
  return blocks;
}

TEST(BoxSpanStartTest, OnlyABoxThatIsOneSpanHasAStart) {
  // Whole rows, one partial row, and whole trailing planes are one span.
  EXPECT_EQ(BoxSpanStart({3, 4}, {1, 0}, {2, 4}), 4);
  EXPECT_EQ(BoxSpanStart({3, 4}, {2, 1}, {1, 2}), 9);
  EXPECT_EQ(BoxSpanStart({3, 4, 4}, {1, 0, 0}, {2, 4, 4}), 16);
  EXPECT_EQ(BoxSpanStart({5}, {2}, {3}), 2);
  // Columns, part of two rows, and rows of a partial plane are not.
  EXPECT_EQ(BoxSpanStart({3, 4}, {0, 1}, {3, 2}), std::nullopt);
  EXPECT_EQ(BoxSpanStart({3, 4}, {0, 2}, {2, 2}), std::nullopt);
  EXPECT_EQ(BoxSpanStart({3, 4, 4}, {0, 0, 0}, {2, 2, 4}), std::nullopt);
  EXPECT_EQ(BoxSpanStart({3, 4}, {0, 0}, {0, 4}), std::nullopt);  // empty
}

// Against the runs themselves: a start exactly when every run follows the
// one before it in memory, and it is where the first run starts.
TEST(BoxSpanStartTest, AgreesWithTheRunsOfRandomBoxes) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t rank = 1 + random() % 4;
    std::vector<int64_t> shape(rank), offsets(rank), sizes(rank);
    int64_t count = 1;
    for (size_t d = 0; d < rank; ++d) {
      shape[d] = 1 + static_cast<int64_t>(random() % 4);
      sizes[d] = static_cast<int64_t>(random() % (shape[d] + 1));
      offsets[d] = static_cast<int64_t>(random() % (shape[d] - sizes[d] + 1));
      count *= sizes[d];
    }
    std::optional<int64_t> want;
    bool one_span = count > 0;
    int64_t next = -1;
    ForEachBoxRun(shape, offsets, sizes, 0, count,
                  [&](int64_t element, int64_t, int64_t n) {
                    if (next < 0) want = element;
                    if (next >= 0 && element != next) one_span = false;
                    next = element + n;
                  });
    if (!one_span) want = std::nullopt;
    EXPECT_EQ(BoxSpanStart(shape, offsets, sizes), want)
        << "shape " << ::testing::PrintToString(shape) << " offsets "
        << ::testing::PrintToString(offsets) << " sizes "
        << ::testing::PrintToString(sizes);
  }
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
    const RandomCase c = MakeRandomCase(rng);
    std::vector<int32_t> got(c.count, -1);
    ForEachBoxBlock(
        c.shape, c.offsets, c.sizes, c.begin, c.count,
        [&](int64_t e, int64_t r, int64_t run, int64_t rows, int64_t pitch) {
          ASSERT_GE(pitch, run);
          for (int64_t i = 0; i < rows; ++i) {
            for (int64_t j = 0; j < run; ++j) {
              got[r + i * run + j] = c.array[e + i * pitch + j];
            }
          }
        });
    EXPECT_EQ(got, c.want) << "trial " << trial;
  }
}

}  // namespace
}  // namespace tessera
