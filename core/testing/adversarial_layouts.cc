#include "core/testing/adversarial_layouts.h"

namespace tessera {

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
