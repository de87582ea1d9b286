// Shape and Box: the geometry of tensors and shards. A Box is a half-open
// hyper-rectangle [offset, offset + size) per dim. Value types; not
// synchronized (treat like std::vector).
#ifndef TESSERA_CORE_BOX_H_
#define TESSERA_CORE_BOX_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera {

// Sizes of a tensor's dims, outermost first (row-major).
using Shape = std::vector<int64_t>;

// "[10, 20]".
std::string ShapeToString(const Shape& shape);

// Per-dim coordinates of a box, stored inline up to 4 dims: the coordinator
// keeps one Box per shard, and 100k shards must not mean 200k allocations.
using BoxCoords = absl::InlinedVector<int64_t, 4>;

// A copy of `dims` as a Shape.
inline Shape ToShape(absl::Span<const int64_t> dims) {
  return Shape(dims.begin(), dims.end());
}
// True when two dim lists are equal (whatever containers hold them).
inline bool SameDims(absl::Span<const int64_t> a, absl::Span<const int64_t> b) {
  return a == b;
}

struct Box {
  BoxCoords offsets;
  BoxCoords sizes;  // offsets.size() == sizes.size()

  Box() = default;
  Box(BoxCoords offsets_in, BoxCoords sizes_in)
      : offsets(std::move(offsets_in)), sizes(std::move(sizes_in)) {}
  Box(absl::Span<const int64_t> offsets_in, absl::Span<const int64_t> sizes_in)
      : offsets(offsets_in.begin(), offsets_in.end()),
        sizes(sizes_in.begin(), sizes_in.end()) {}
  Box(std::initializer_list<int64_t> offsets_in,
      std::initializer_list<int64_t> sizes_in)
      : offsets(offsets_in), sizes(sizes_in) {}

  size_t rank() const { return sizes.size(); }

  // The product of sizes. Assumes a validated box (no overflow, sizes >= 0).
  int64_t NumElements() const;

  // True when some size is <= 0.
  bool IsEmpty() const;

  // True when `other` has the same rank and its range lies inside this
  // box's range on every dim.
  bool Contains(const Box& other) const;

  // "0:5,10:20": per dim "offset:offset+size".
  std::string ToString() const;

  friend bool operator==(const Box& a, const Box& b) {
    return a.offsets == b.offsets && a.sizes == b.sizes;
  }
  friend bool operator!=(const Box& a, const Box& b) { return !(a == b); }
};

// The box covering all of `shape` (offsets 0).
Box WholeBox(absl::Span<const int64_t> shape);

// The intersection of `a` and `b`, or nullopt when it is empty or the ranks
// differ.
std::optional<Box> Intersect(const Box& a, const Box& b);

// `b` moved so that `origin` becomes 0: offsets - origin.
Box Translate(const Box& b, absl::Span<const int64_t> origin);

// Whether CheckWithin(box, shape, ...) is OK, without building an error.
bool IsWithin(const Box& box, absl::Span<const int64_t> shape);

// OK when `box` has the rank of `shape` (else DimsMismatchError) and
// 0 <= offset, 0 <= size, offset + size <= n on every dim (else
// OutOfBoundsError naming `what`, the dim and the values).
absl::Status CheckWithin(const Box& box, absl::Span<const int64_t> shape,
                         absl::string_view what);

}  // namespace tessera

#endif  // TESSERA_CORE_BOX_H_
