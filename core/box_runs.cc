#include "core/box_runs.h"

#include <algorithm>
#include <vector>

namespace tessera {

void ForEachBoxRun(absl::Span<const int64_t> array_shape,
                   absl::Span<const int64_t> box_offsets,
                   absl::Span<const int64_t> box_sizes, int64_t flat_begin,
                   int64_t count,
                   const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const size_t rank = array_shape.size();
  if (count <= 0 || rank == 0) return;
  std::vector<int64_t> strides(rank, 1);
  for (size_t d = rank - 1; d > 0; --d)
    strides[d - 1] = strides[d] * array_shape[d];
  const int64_t inner = box_sizes[rank - 1];
  const int64_t end = flat_begin + count;
  for (int64_t f = flat_begin; f < end;) {
    int64_t row = f / inner;
    const int64_t col = f % inner;
    int64_t element = box_offsets[rank - 1] + col;
    for (size_t d = rank - 1; d > 0; --d) {
      const int64_t index = row % box_sizes[d - 1];
      row /= box_sizes[d - 1];
      element += (box_offsets[d - 1] + index) * strides[d - 1];
    }
    const int64_t n = std::min(inner - col, end - f);
    fn(element, f - flat_begin, n);
    f += n;
  }
}

void ForEachBoxBlock(absl::Span<const int64_t> array_shape,
                     absl::Span<const int64_t> box_offsets,
                     absl::Span<const int64_t> box_sizes, int64_t flat_begin,
                     int64_t count,
                     const std::function<void(int64_t, int64_t, int64_t,
                                              int64_t, int64_t)>& fn) {
  // The block being gathered; `last` is where its last run starts.
  int64_t element = 0, range = 0, run = 0, rows = 0, pitch = 0, last = 0;
  const auto flush = [&] {
    if (rows > 0) fn(element, range, run, rows, rows > 1 ? pitch : run);
    rows = 0;
  };
  ForEachBoxRun(
      array_shape, box_offsets, box_sizes, flat_begin, count,
      [&](int64_t at, int64_t position, int64_t n) {
        if (rows > 0 && n == run && position == range + rows * run) {
          const int64_t step = at - last;
          if ((rows == 1 && step >= n) || (rows > 1 && step == pitch)) {
            pitch = step;
            ++rows;
            last = at;
            return;
          }
        }
        flush();
        element = last = at;
        range = position;
        run = n;
        rows = 1;
      });
  flush();
}

std::optional<int64_t> BoxSpanStart(absl::Span<const int64_t> array_shape,
                                    absl::Span<const int64_t> box_offsets,
                                    absl::Span<const int64_t> box_sizes) {
  const size_t rank = array_shape.size();
  if (rank == 0) return std::nullopt;
  for (int64_t size : box_sizes) {
    if (size == 0) return std::nullopt;
  }
  // Leading dims of one index, then one dim of any length, then whole dims:
  // decided from the shape alone, however many rows the box has.
  size_t first_long = 0;
  while (first_long < rank && box_sizes[first_long] == 1) ++first_long;
  for (size_t d = first_long + 1; d < rank; ++d) {
    if (box_sizes[d] != array_shape[d]) return std::nullopt;
  }
  int64_t start = 0;
  for (size_t d = 0; d < rank; ++d)
    start = start * array_shape[d] + box_offsets[d];
  return start;
}

}  // namespace tessera
