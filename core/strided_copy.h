// Copies of N-d sub-boxes between row-major buffers, by memcpy of the
// longest runs that are contiguous on both sides (a full-width copy is one
// memcpy). Used to place fetched pieces into an output buffer and to cut
// pieces out of a shard. Pure functions on caller-owned memory; safe to call
// concurrently on disjoint destinations.
#ifndef TESSERA_CORE_STRIDED_COPY_H_
#define TESSERA_CORE_STRIDED_COPY_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"
#include "core/box.h"

namespace tessera {

// Copies the box of `copy_sizes` at `src_offsets` in `src` (a row-major
// array of `src_shape`) to the box at `dst_offsets` in `dst` (of
// `dst_shape`). REQUIRES: all of rank >= 1 and equal, both boxes in bounds,
// src and dst do not overlap in memory.
void CopyBox(const void* src, absl::Span<const int64_t> src_shape,
             absl::Span<const int64_t> src_offsets, void* dst,
             absl::Span<const int64_t> dst_shape,
             absl::Span<const int64_t> dst_offsets,
             absl::Span<const int64_t> copy_sizes, size_t item_size);

// `src_chunk` holds elements [flat_begin, flat_begin + flat_count) of a
// row-major array of shape `box_sizes`; writes them to their places in
// `dst` (of `dst_shape`), where the box sits at `dst_offsets`. The chunk may
// start and end mid-row. REQUIRES: the box in bounds of dst and
// flat_begin + flat_count <= the box's element count.
void CopyFlatRangeToBox(const void* src_chunk, int64_t flat_begin,
                        int64_t flat_count, absl::Span<const int64_t> box_sizes,
                        void* dst, absl::Span<const int64_t> dst_shape,
                        absl::Span<const int64_t> dst_offsets,
                        size_t item_size);

// The inverse: reads elements [flat_begin, flat_begin + flat_count), in
// row-major order, of the box of `box_sizes` at `src_offsets` in `src` (of
// `src_shape`) into the contiguous `dst_chunk`.
void CopyBoxToFlatRange(const void* src, absl::Span<const int64_t> src_shape,
                        absl::Span<const int64_t> src_offsets,
                        absl::Span<const int64_t> box_sizes, int64_t flat_begin,
                        int64_t flat_count, void* dst_chunk, size_t item_size);

}  // namespace tessera

#endif  // TESSERA_CORE_STRIDED_COPY_H_
