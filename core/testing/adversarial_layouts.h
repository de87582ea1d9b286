// Shard layouts for the planners' tests and benchmarks: random tilings, and
// adversarial ones: tilings whose boxes are long on several dims, so a
// sweep along any one dim keeps most of them active at once and their
// extents on any other dim overlap (a sort-and-sweep goes quadratic on
// them).
#ifndef TESSERA_CORE_TESTING_ADVERSARIAL_LAYOUTS_H_
#define TESSERA_CORE_TESTING_ADVERSARIAL_LAYOUTS_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "core/box.h"

namespace tessera {

// A random guillotine tiling of `whole` into about `n` boxes (disjoint, and
// covering it), in random order: a box picked at random is cut in two along
// a random dim, until there are `n` boxes or 20 * n tries have been made.
// The same for the same generator state.
std::vector<Box> RandomTiling(std::mt19937& rng, const Box& whole, size_t n);

// Nested corner shells of [m]^rank: shell p = {x : min_d x_d = p}, cut into
// `rank` boxes; box j spans [p+1, m) on the dims before j, [p, p+1) on dim j
// and [p, m) on the dims after it. A tiling of rank * (m - 1) + 1 boxes.
std::vector<Box> Shells(size_t rank, int64_t m);

// In an [m,m,m,m] tensor, the boxes [p:m, q:m, p, q] for every p, q:
// disjoint, but their projections on dims 0 and 1 all overlap. With `fill`,
// also [0:p, 0:m, p, q] and [p:m, 0:q, p, q], which make it a tiling
// (3m^2 - 2m boxes).
std::vector<Box> Suffixes(int64_t m, bool fill);

}  // namespace tessera

#endif  // TESSERA_CORE_TESTING_ADVERSARIAL_LAYOUTS_H_
