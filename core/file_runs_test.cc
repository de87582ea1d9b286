#include "core/file_runs.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// The global row-major index of `local` in `box` of a tensor of `shape`.
int64_t GlobalIndex(const std::vector<int64_t>& shape, const Box& box,
                    int64_t local) {
  int64_t index = 0;
  std::vector<int64_t> coord(box.rank());
  for (size_t d = box.rank(); d-- > 0;) {
    coord[d] = local % box.sizes[d] + box.offsets[d];
    local /= box.sizes[d];
  }
  for (size_t d = 0; d < box.rank(); ++d) index = index * shape[d] + coord[d];
  return index;
}

// Every run, applied to a shard buffer from a "file" holding the stored
// box's elements (each its global index, as int32) after a header, fills
// exactly the elements of the shard the stored box covers, with the right
// values, each once.
TEST(PlanFileRunsTest, RunsFillExactlyTheMeetingElementsFromTheFile) {
  std::mt19937 rng(7);
  const std::vector<int64_t> shape = {6, 5, 7};
  auto random_box = [&] {
    Box box;
    for (int64_t n : shape) {
      const int64_t a = std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
      const int64_t b = std::uniform_int_distribution<int64_t>(a + 1, n)(rng);
      box.offsets.push_back(a);
      box.sizes.push_back(b - a);
    }
    return box;
  };
  constexpr int64_t kHeader = 24;
  for (int trial = 0; trial < 500; ++trial) {
    const Box stored =
        trial % 5 == 0 ? Box({0, 0, 0}, {6, 5, 7}) : random_box();
    const Box shard = random_box();
    std::vector<char> file(kHeader + stored.NumElements() * 4, '\0');
    for (int64_t i = 0; i < stored.NumElements(); ++i) {
      const int32_t v = static_cast<int32_t>(GlobalIndex(shape, stored, i));
      std::memcpy(file.data() + kHeader + i * 4, &v, 4);
    }
    std::vector<int32_t> got(shard.NumElements(), -1);
    std::vector<int> writes(shard.NumElements(), 0);
    const std::vector<FileRun> runs = PlanFileRuns(stored, kHeader, shard, 4);
    int64_t last_end = 0;
    for (const FileRun& run : runs) {
      ASSERT_GE(run.file_offset, last_end) << "runs in file order";
      last_end = run.file_offset + run.length;
      ASSERT_GE(run.file_offset, kHeader);
      ASSERT_LE(run.file_offset + run.length,
                static_cast<int64_t>(file.size()));
      ASSERT_EQ(run.length % 4, 0);
      std::memcpy(reinterpret_cast<char*>(got.data()) + run.shard_offset,
                  file.data() + run.file_offset, run.length);
      for (int64_t b = 0; b < run.length; b += 4)
        ++writes[(run.shard_offset + b) / 4];
    }
    const std::optional<Box> meet = Intersect(stored, shard);
    for (int64_t i = 0; i < shard.NumElements(); ++i) {
      const int64_t global = GlobalIndex(shape, shard, i);
      bool inside = meet.has_value();
      int64_t rest = global;
      for (size_t d = shape.size(); d-- > 0 && inside;) {
        const int64_t c = rest % shape[d];
        rest /= shape[d];
        inside =
            c >= stored.offsets[d] && c < stored.offsets[d] + stored.sizes[d];
      }
      ASSERT_EQ(writes[i], inside ? 1 : 0) << trial << " element " << i;
      if (inside) {
        ASSERT_EQ(got[i], global) << trial << " element " << i;
      }
    }
  }
}

TEST(PlanFileRunsTest, RowShardsOfAWholeEntryAreOneRunEach) {
  // A [8, 4] float32 entry at byte 100; the shard of rows 2..5.
  const std::vector<FileRun> runs =
      PlanFileRuns(Box({0, 0}, {8, 4}), 100, Box({2, 0}, {4, 4}), 4);
  EXPECT_THAT(runs, ::testing::ElementsAre(FileRun{100 + 2 * 16, 64, 0}));
  // Columns 1..2: one run per row.
  const std::vector<FileRun> cols =
      PlanFileRuns(Box({0, 0}, {8, 4}), 100, Box({0, 1}, {8, 2}), 4);
  ASSERT_EQ(cols.size(), 8u);
  EXPECT_EQ(cols[1], (FileRun{100 + 16 + 4, 8, 8}));
  // Apart: nothing; rank 0: the one element.
  EXPECT_TRUE(
      PlanFileRuns(Box({0, 0}, {2, 4}), 0, Box({2, 0}, {2, 4}), 4).empty());
  EXPECT_THAT(PlanFileRuns(Box(), 40, Box(), 8),
              ::testing::ElementsAre(FileRun{40, 8, 0}));
}

TEST(CoalesceRunsTest, JoinsAcrossSmallGapsWithinTheSpan) {
  const std::vector<FileRun> runs = {
      {0, 10, 0}, {12, 10, 10}, {100, 10, 20}, {110, 500, 30}, {700, 5, 530}};
  const std::vector<ReadSpan> spans = CoalesceRuns(runs, /*max_gap=*/4,
                                                   /*max_span=*/400);
  ASSERT_EQ(spans.size(), 4u);
  EXPECT_EQ(spans[0].file_offset, 0);
  EXPECT_EQ(spans[0].length, 22);  // two bytes of gap read
  EXPECT_EQ(spans[0].num_runs, 2u);
  EXPECT_EQ(spans[1].first_run, 2u);  // 88 bytes apart: its own read
  EXPECT_EQ(spans[1].num_runs, 1u);   // 500 would pass max_span
  EXPECT_EQ(spans[2].length, 500);    // longer than max_span: alone
  EXPECT_EQ(spans[3].first_run, 4u);
  // No gap allowed: only touching runs join.
  EXPECT_EQ(CoalesceRuns(runs, 0, 1 << 20).size(), 4u);
  EXPECT_TRUE(CoalesceRuns({}, 4, 4).empty());
  // Column pieces: a quarter of each 64-byte row needed. Joining would read
  // four times what is needed: the over-read bound keeps them apart.
  std::vector<FileRun> columns;
  for (int row = 0; row < 8; ++row) columns.push_back({row * 64, 16, row * 16});
  EXPECT_EQ(CoalesceRuns(columns, 1 << 16, 1 << 20).size(), 8u);
  // Most of each row needed: the small gaps are read along.
  for (FileRun& run : columns) run.length = 56;  // gaps of 8: 14% over
  const std::vector<ReadSpan> near = CoalesceRuns(columns, 1 << 16, 1 << 20);
  ASSERT_EQ(near.size(), 1u);
  EXPECT_EQ(near[0].length, 7 * 64 + 56);
}

}  // namespace
}  // namespace tessera
