#include "tests/test_arrays.h"

#include <cstring>
#include <random>

namespace tessera {

std::vector<Placement> Ranks(std::initializer_list<int> ranks) {
  std::vector<Placement> out;
  for (int r : ranks) {
    Placement p;
    p.rank = r;
    out.push_back(p);
  }
  return out;
}

LayoutSpec ReplicatedChunks(std::initializer_list<int> ranks, int replicas) {
  LayoutSpec spec = LayoutSpec::Chunk(0, Ranks(ranks));
  spec.replicas = replicas;
  return spec;
}

// A row-major array whose element i holds a value derived from i.
HostArray Iota(DType dtype, const Shape& shape, uint64_t salt) {
  HostArray a = HostArray::Allocate(dtype, shape);
  const size_t item = ItemSize(dtype);
  std::mt19937_64 rng(salt + 17);
  for (int64_t i = 0; i < a.num_bytes; i += item) {
    uint64_t v = rng();
    if (dtype == DType::kBool) v &= 1;
    if (dtype == DType::kFloat32) {
      float f = static_cast<float>(i / item) * 0.5f + static_cast<float>(salt);
      std::memcpy(a.data() + i, &f, 4);
    } else {
      std::memcpy(a.data() + i, &v, item);
    }
  }
  return a;
}

// The sub-box `region` of `src`, computed element by element.
HostArray Slice(const HostArray& src, const Box& region) {
  HostArray out = HostArray::Allocate(src.dtype, ToShape(region.sizes));
  const size_t item = ItemSize(src.dtype);
  const size_t rank = region.rank();
  std::vector<int64_t> idx(rank, 0);
  for (int64_t n = 0; n < out.NumElements(); ++n) {
    int64_t flat = 0;
    for (size_t d = 0; d < rank; ++d)
      flat = flat * src.shape[d] + region.offsets[d] + idx[d];
    std::memcpy(out.data() + n * item, src.data() + flat * item, item);
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++idx[d] < region.sizes[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

HostArray Patched(const HostArray& base, const Box& region,
                  const HostArray& patch) {
  HostArray out = HostArray::Allocate(base.dtype, base.shape);
  std::memcpy(out.data(), base.data(), static_cast<size_t>(base.num_bytes));
  const size_t item = ItemSize(base.dtype);
  const size_t rank = region.rank();
  std::vector<int64_t> idx(rank, 0);
  for (int64_t n = 0; n < patch.NumElements(); ++n) {
    int64_t flat = 0;
    for (size_t d = 0; d < rank; ++d)
      flat = flat * base.shape[d] + region.offsets[d] + idx[d];
    std::memcpy(out.data() + flat * item, patch.data() + n * item, item);
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++idx[d] < region.sizes[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

bool SameBytes(const HostArray& a, const HostArray& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         a.num_bytes == b.num_bytes &&
         std::memcmp(a.data(), b.data(), a.num_bytes) == 0;
}

}  // namespace tessera
