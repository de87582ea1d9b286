// Arrays for end-to-end tests: deterministic contents, reference slices
// computed element by element, byte-exact comparison.
#ifndef TESSERA_TESTS_TEST_ARRAYS_H_
#define TESSERA_TESTS_TEST_ARRAYS_H_

#include <initializer_list>
#include <vector>

#include "client/host_array.h"
#include "core/box.h"
#include "core/layout_spec.h"
#include "core/placement.h"

namespace tessera {

// Placements "rank:N" for the given ranks.
std::vector<Placement> Ranks(std::initializer_list<int> ranks);

// Chunks along dimension 0 over `ranks`, each held by `replicas` workers.
LayoutSpec ReplicatedChunks(std::initializer_list<int> ranks, int replicas);

// A row-major array with deterministic contents (float32: 0.5 * index + salt;
// other dtypes: pseudo-random bits seeded by salt; bool: 0 or 1).
HostArray Iota(DType dtype, const Shape& shape, uint64_t salt = 0);

// The sub-box `region` of `src`, computed element by element.
HostArray Slice(const HostArray& src, const Box& region);

// `base` with `region` replaced by `patch` (of the region's sizes), element
// by element: what an update of that region should leave.
HostArray Patched(const HostArray& base, const Box& region,
                  const HostArray& patch);

bool SameBytes(const HostArray& a, const HostArray& b);

}  // namespace tessera

#endif  // TESSERA_TESTS_TEST_ARRAYS_H_
