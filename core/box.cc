#include "core/box.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/checked_math.h"
#include "core/errors.h"

namespace tessera {

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t Box::NumElements() const { return ElementCount(sizes); }

bool Box::IsEmpty() const {
  for (int64_t s : sizes) {
    if (s <= 0) return true;
  }
  return false;
}

bool Box::Contains(const Box& other) const {
  if (other.rank() != rank()) return false;
  for (size_t d = 0; d < rank(); ++d) {
    if (other.offsets[d] < offsets[d] ||
        other.offsets[d] + other.sizes[d] > offsets[d] + sizes[d]) {
      return false;
    }
  }
  return true;
}

std::string Box::ToString() const {
  std::string out;
  for (size_t d = 0; d < rank(); ++d) {
    if (d > 0) out += ",";
    int64_t end;
    if (__builtin_add_overflow(offsets[d], sizes[d], &end)) {
      // Unvalidated boxes from RPCs may be absurd; describe, don't overflow.
      absl::StrAppend(&out, "offset ", offsets[d], " size ", sizes[d]);
    } else {
      absl::StrAppend(&out, offsets[d], ":", end);
    }
  }
  return out;
}

Box WholeBox(absl::Span<const int64_t> shape) {
  Box box;
  box.offsets.assign(shape.size(), 0);
  box.sizes.assign(shape.begin(), shape.end());
  return box;
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  if (a.rank() != b.rank()) return std::nullopt;
  // Most pairs are disjoint (a region against many shards): decide that
  // before allocating anything.
  for (size_t d = 0; d < a.rank(); ++d) {
    if (std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]) <=
        std::max(a.offsets[d], b.offsets[d])) {
      return std::nullopt;
    }
  }
  Box out;
  out.offsets.resize(a.rank());
  out.sizes.resize(a.rank());
  for (size_t d = 0; d < a.rank(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi =
        std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (hi <= lo) return std::nullopt;
    out.offsets[d] = lo;
    out.sizes[d] = hi - lo;
  }
  return out;
}

Box Translate(const Box& b, absl::Span<const int64_t> origin) {
  Box out = b;
  for (size_t d = 0; d < out.rank() && d < origin.size(); ++d) {
    out.offsets[d] -= origin[d];
  }
  return out;
}

bool IsWithin(const Box& box, absl::Span<const int64_t> shape) {
  if (box.offsets.size() != box.sizes.size() || box.rank() != shape.size()) {
    return false;
  }
  for (size_t d = 0; d < box.rank(); ++d) {
    const int64_t a = box.offsets[d];
    const int64_t s = box.sizes[d];
    // Written to avoid overflow: a + s <= n  <=>  s <= n - a when a >= 0.
    if (a < 0 || s < 0 || a > shape[d] || s > shape[d] - a) return false;
  }
  return true;
}

absl::Status CheckWithin(const Box& box, absl::Span<const int64_t> shape,
                         absl::string_view what) {
  if (IsWithin(box, shape)) return absl::OkStatus();
  if (box.offsets.size() != box.sizes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", box.offsets.size(), " offsets but ",
                     box.sizes.size(), " sizes"));
  }
  if (box.rank() != shape.size()) {
    return DimsMismatchError(what, box.rank(), shape.size());
  }
  for (size_t d = 0; d < box.rank(); ++d) {
    const int64_t a = box.offsets[d];
    const int64_t s = box.sizes[d];
    const int64_t n = shape[d];
    // Written to avoid overflow: a + s <= n  <=>  s <= n - a when a >= 0.
    if (a < 0 || s < 0 || a > n || s > n - a) {
      std::string range;
      if (s >= 0 && a <= INT64_MAX - s) {
        range = absl::StrCat(a, ":", a + s);
      } else {
        range = absl::StrCat("offset ", a, " size ", s);
      }
      return OutOfBoundsError(
          what, absl::StrCat("dim ", d, " has range ", range,
                             " but the tensor's dim ", d, " has size ", n));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
