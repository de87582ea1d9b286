#include "core/strided_copy.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

int64_t Volume(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Flat index of `index` in a row-major array of `shape`.
int64_t Flat(const Shape& shape, const std::vector<int64_t>& index) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + index[d];
  return f;
}

// Calls fn(i, index) for every index of a box of `sizes`, row-major.
template <typename Fn>
void ForEachIndex(const Shape& sizes, Fn fn) {
  const int64_t n = Volume(sizes);
  std::vector<int64_t> index(sizes.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    fn(i, index);
    for (size_t d = sizes.size(); d-- > 0;) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

std::vector<int64_t> Plus(const std::vector<int64_t>& a,
                          const std::vector<int64_t>& b) {
  std::vector<int64_t> out(a.size());
  for (size_t d = 0; d < a.size(); ++d) out[d] = a[d] + b[d];
  return out;
}

std::vector<char> RandomBytes(std::mt19937_64& rng, int64_t n) {
  std::vector<char> out(n);
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

struct RandomCase {
  Shape src_shape, dst_shape, sizes;
  std::vector<int64_t> src_offsets, dst_offsets;
  size_t item;
};

RandomCase MakeCase(std::mt19937_64& rng) {
  RandomCase c;
  const size_t rank = 1 + rng() % 4;
  const size_t items[] = {1, 2, 4, 8};
  c.item = items[rng() % 4];
  for (size_t d = 0; d < rank; ++d) {
    const int64_t size = rng() % 5;  // may be 0
    // Often make the copy span the full dim so runs merge.
    const bool full_src = rng() % 2 == 0;
    const bool full_dst = rng() % 2 == 0;
    const int64_t src_n = full_src ? size : size + rng() % 4;
    const int64_t dst_n = full_dst ? size : size + rng() % 4;
    c.sizes.push_back(size);
    c.src_shape.push_back(src_n);
    c.dst_shape.push_back(dst_n);
    c.src_offsets.push_back(src_n == size ? 0 : rng() % (src_n - size + 1));
    c.dst_offsets.push_back(dst_n == size ? 0 : rng() % (dst_n - size + 1));
  }
  return c;
}

TEST(StridedCopyTest, CopyBoxMatchesPerElementReference) {
  std::mt19937_64 rng(42);
  for (int iter = 0; iter < 3000; ++iter) {
    const RandomCase c = MakeCase(rng);
    const std::vector<char> src =
        RandomBytes(rng, Volume(c.src_shape) * c.item);
    std::vector<char> dst = RandomBytes(rng, Volume(c.dst_shape) * c.item);
    std::vector<char> want = dst;
    ForEachIndex(c.sizes, [&](int64_t, const std::vector<int64_t>& index) {
      std::memcpy(
          want.data() + Flat(c.dst_shape, Plus(index, c.dst_offsets)) * c.item,
          src.data() + Flat(c.src_shape, Plus(index, c.src_offsets)) * c.item,
          c.item);
    });
    CopyBox(src.data(), c.src_shape, c.src_offsets, dst.data(), c.dst_shape,
            c.dst_offsets, c.sizes, c.item);
    ASSERT_EQ(dst, want) << "iteration " << iter;
  }
}

TEST(StridedCopyTest, FlatRangesScatterAndGatherAnyChunking) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    const RandomCase c = MakeCase(rng);
    const int64_t n = Volume(c.sizes);
    // The box's elements in row-major order, as a contiguous buffer.
    const std::vector<char> packed = RandomBytes(rng, n * c.item);
    std::vector<char> dst = RandomBytes(rng, Volume(c.dst_shape) * c.item);
    std::vector<char> want = dst;
    ForEachIndex(c.sizes, [&](int64_t i, const std::vector<int64_t>& index) {
      std::memcpy(
          want.data() + Flat(c.dst_shape, Plus(index, c.dst_offsets)) * c.item,
          packed.data() + i * c.item, c.item);
    });
    // Cut the packed buffer into random chunks, possibly mid-row.
    std::vector<char> gathered(n * c.item);
    int64_t begin = 0;
    while (begin < n) {
      const int64_t count = 1 + rng() % (n - begin);
      CopyFlatRangeToBox(packed.data() + begin * c.item, begin, count, c.sizes,
                         dst.data(), c.dst_shape, c.dst_offsets, c.item);
      begin += count;
    }
    ASSERT_EQ(dst, want) << "iteration " << iter;
    begin = 0;
    while (begin < n) {
      const int64_t count = 1 + rng() % (n - begin);
      CopyBoxToFlatRange(dst.data(), c.dst_shape, c.dst_offsets, c.sizes, begin,
                         count, gathered.data() + begin * c.item, c.item);
      begin += count;
    }
    ASSERT_EQ(gathered, packed) << "iteration " << iter;
  }
}

// Copies large enough to take the streaming-store path (8 MiB and more, runs
// of 0.5-16 KiB), with runs that start unaligned and end mid-line, and whose
// neighbours in the destination must stay untouched.
TEST(StridedCopyTest, LargeStridedCopiesMatchTheReference) {
  std::mt19937_64 rng(11);
  struct Case {
    int64_t rows, src_cols, dst_cols, cols, src_col, dst_col;
  };
  const Case cases[] = {
      {8192, 1024, 256, 256, 512, 0},   // 1 KiB runs into a dense shard
      {9000, 1000, 333, 300, 613, 17},  // 1200 B runs, unaligned both sides
      {2100, 4096, 4100, 1027, 5, 3},   // 4108 B runs, odd tail
      {600, 4097, 4099, 4097, 0, 1},    // 16 KiB + 4 B runs: plain memcpy
  };
  for (const Case& c : cases) {
    const Shape src_shape = {c.rows, c.src_cols};
    const Shape dst_shape = {c.rows, c.dst_cols};
    const std::vector<char> src = RandomBytes(rng, Volume(src_shape) * 4);
    std::vector<char> dst = RandomBytes(rng, Volume(dst_shape) * 4);
    std::vector<char> want = dst;
    for (int64_t r = 0; r < c.rows; ++r) {
      std::memcpy(want.data() + (r * c.dst_cols + c.dst_col) * 4,
                  src.data() + (r * c.src_cols + c.src_col) * 4, c.cols * 4);
    }
    CopyBox(src.data(), src_shape, {0, c.src_col}, dst.data(), dst_shape,
            {0, c.dst_col}, {c.rows, c.cols}, 4);
    ASSERT_TRUE(dst == want) << "runs of " << c.cols * 4 << " bytes";

    // The same box packed and placed as a flat range that starts and ends
    // mid-row (how pieces are staged and delivered).
    const int64_t first = 7, count = c.rows * c.cols - 13;
    std::vector<char> packed(static_cast<size_t>(count) * 4);
    CopyBoxToFlatRange(src.data(), src_shape, {0, c.src_col}, {c.rows, c.cols},
                       first, count, packed.data(), 4);
    std::vector<char> want_packed(packed.size());
    for (int64_t e = 0; e < count; ++e) {
      const int64_t r = (first + e) / c.cols, k = (first + e) % c.cols;
      std::memcpy(want_packed.data() + e * 4,
                  src.data() + (r * c.src_cols + c.src_col + k) * 4, 4);
    }
    ASSERT_TRUE(packed == want_packed) << "packed runs of " << c.cols * 4;
    std::vector<char> placed = RandomBytes(rng, Volume(dst_shape) * 4);
    std::vector<char> want_placed = placed;
    for (int64_t e = 0; e < count; ++e) {
      const int64_t r = (first + e) / c.cols, k = (first + e) % c.cols;
      std::memcpy(want_placed.data() + (r * c.dst_cols + c.dst_col + k) * 4,
                  packed.data() + e * 4, 4);
    }
    CopyFlatRangeToBox(packed.data(), first, count, {c.rows, c.cols},
                       placed.data(), dst_shape, {0, c.dst_col}, 4);
    ASSERT_TRUE(placed == want_placed) << "placed runs of " << c.cols * 4;
  }
}

TEST(StridedCopyTest, FullWidthCopyOfAMatrix) {
  std::vector<int32_t> src(6 * 4);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int32_t>(i);
  std::vector<int32_t> dst(3 * 4, -1);
  CopyBox(src.data(), {6, 4}, {2, 0}, dst.data(), {3, 4}, {0, 0}, {3, 4}, 4);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(dst[i], 8 + i);
}

TEST(StridedCopyTest, ZeroSizedCopiesTouchNothing) {
  std::vector<char> src(16, 'a'), dst(16, 'b');
  CopyBox(src.data(), {4, 4}, {1, 1}, dst.data(), {4, 4}, {0, 0}, {0, 3}, 1);
  CopyFlatRangeToBox(src.data(), 0, 0, {2, 2}, dst.data(), {4, 4}, {0, 0}, 1);
  EXPECT_EQ(dst, std::vector<char>(16, 'b'));
}

}  // namespace
}  // namespace tessera
