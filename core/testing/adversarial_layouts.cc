#include "core/testing/adversarial_layouts.h"

#include <algorithm>

namespace tessera {

std::vector<Box> RandomTiling(std::mt19937& rng, const Box& whole, size_t n) {
  std::vector<Box> boxes = {whole};
  for (size_t tries = 0; boxes.size() < n && tries < 20 * n; ++tries) {
    size_t i = std::uniform_int_distribution<size_t>(0, boxes.size() - 1)(rng);
    size_t d = std::uniform_int_distribution<size_t>(0, whole.rank() - 1)(rng);
    Box& b = boxes[i];
    if (b.sizes[d] < 2) continue;
    int64_t cut =
        std::uniform_int_distribution<int64_t>(1, b.sizes[d] - 1)(rng);
    Box right = b;
    right.offsets[d] += cut;
    right.sizes[d] -= cut;
    b.sizes[d] = cut;
    boxes.push_back(right);
  }
  std::shuffle(boxes.begin(), boxes.end(), rng);
  return boxes;
}

std::vector<Box> Shells(size_t rank, int64_t m) {
  std::vector<Box> boxes;
  for (int64_t p = 0; p < m; ++p) {
    for (size_t j = 0; j < rank; ++j) {
      Box b;
      for (size_t d = 0; d < rank; ++d) {
        const int64_t lo = d < j ? p + 1 : p;
        const int64_t hi = d == j ? p + 1 : m;
        b.offsets.push_back(lo);
        b.sizes.push_back(hi - lo);
      }
      if (!b.IsEmpty()) boxes.push_back(b);
    }
  }
  return boxes;
}

std::vector<Box> Suffixes(int64_t m, bool fill) {
  std::vector<Box> boxes;
  for (int64_t p = 0; p < m; ++p) {
    for (int64_t q = 0; q < m; ++q) {
      boxes.push_back({{p, q, p, q}, {m - p, m - q, 1, 1}});
      if (!fill) continue;
      if (p > 0) boxes.push_back({{0, 0, p, q}, {p, m, 1, 1}});
      if (q > 0) boxes.push_back({{p, 0, p, q}, {m - p, q, 1, 1}});
    }
  }
  return boxes;
}

}  // namespace tessera
