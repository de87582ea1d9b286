// The contiguous runs of a sub-box inside a row-major array. Lets stores
// whose memory the CPU cannot touch directly (device memory) move a strided
// sub-box with one copy call per run. Pure function; thread-safe.
#ifndef TESSERA_CORE_BOX_RUNS_H_
#define TESSERA_CORE_BOX_RUNS_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/types/span.h"
#include "core/box.h"

namespace tessera {

// Calls fn(array_element, range_element, num_elements) for each contiguous
// run of elements [flat_begin, flat_begin + count) of the row-major sub-box
// (box_offsets, box_sizes) of an array of `array_shape`: `array_element` is
// the run's first element in the array, `range_element` its position counted
// from flat_begin. Preconditions: the box lies in the array; the range lies
// in the box.
void ForEachBoxRun(
    absl::Span<const int64_t> array_shape,
    absl::Span<const int64_t> box_offsets, absl::Span<const int64_t> box_sizes,
    int64_t flat_begin, int64_t count,
    const std::function<void(int64_t array_element, int64_t range_element,
                             int64_t num_elements)>& fn);

// The same runs gathered into 2-D blocks, for copy engines that take a
// pitched copy in one call (cudaMemcpy2D): fn(array_element, range_element,
// run_elements, rows, array_pitch) covers `rows` runs of `run_elements`
// each, run i at array element array_element + i * array_pitch and range
// position range_element + i * run_elements. Consecutive runs of equal
// length and equal spacing in the array join one block; a block whose
// pitch equals its run length is one contiguous span.
void ForEachBoxBlock(
    absl::Span<const int64_t> array_shape,
    absl::Span<const int64_t> box_offsets, absl::Span<const int64_t> box_sizes,
    int64_t flat_begin, int64_t count,
    const std::function<void(int64_t array_element, int64_t range_element,
                             int64_t run_elements, int64_t rows,
                             int64_t array_pitch)>& fn);

// When the sub-box is one contiguous span of the array (a send or get of
// it needs no packing): the span's first element. nullopt for a box that
// is not, and for an empty box.
std::optional<int64_t> BoxSpanStart(absl::Span<const int64_t> array_shape,
                                    absl::Span<const int64_t> box_offsets,
                                    absl::Span<const int64_t> box_sizes);

}  // namespace tessera

#endif  // TESSERA_CORE_BOX_RUNS_H_
