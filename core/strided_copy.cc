#include "core/strided_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tessera {
namespace {

// Number of leading ("outer") dims left after merging the trailing dims
// whose copy spans the full row of every array involved into one run.
size_t OuterDims(absl::Span<const int64_t> copy_sizes,
                 absl::Span<const int64_t> a,
                 const absl::Span<const int64_t>* b) {
  size_t k = copy_sizes.size() - 1;  // dims [k, rank) form the run
  while (k > 0 && copy_sizes[k] == a[k] &&
         (b == nullptr || copy_sizes[k] == (*b)[k])) {
    --k;
  }
  return k;
}

// Byte strides of a row-major array.
std::vector<int64_t> ByteStrides(absl::Span<const int64_t> shape,
                                 size_t item_size) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = static_cast<int64_t>(item_size);
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = s;
    s *= shape[d];
  }
  return strides;
}

int64_t BaseOffset(absl::Span<const int64_t> offsets,
                   absl::Span<const int64_t> strides) {
  int64_t base = 0;
  for (size_t d = 0; d < offsets.size(); ++d) base += offsets[d] * strides[d];
  return base;
}

// Walks the runs of one box inside a row-major array: dims [0, outer) are
// iterated, dims [outer, rank) form contiguous runs of `run_elems`.
class RunWalker {
 public:
  RunWalker(absl::Span<const int64_t> shape, absl::Span<const int64_t> offsets,
            absl::Span<const int64_t> sizes, size_t outer, size_t item_size)
      : sizes_(sizes.begin(), sizes.begin() + outer),
        strides_(ByteStrides(shape, item_size)),
        index_(outer, 0),
        position_(BaseOffset(offsets, strides_)) {
    strides_.resize(outer);
  }

  // Moves to outer run number `run` (row-major over dims [0, outer)).
  void Seek(int64_t run) {
    for (size_t d = sizes_.size(); d-- > 0;) {
      const int64_t i = run % sizes_[d];
      run /= sizes_[d];
      position_ += (i - index_[d]) * strides_[d];
      index_[d] = i;
    }
  }

  // Byte offset of the current run's first element.
  int64_t position() const { return position_; }

  // Advances to the next run (odometer).
  void Next() {
    for (size_t d = sizes_.size(); d-- > 0;) {
      position_ += strides_[d];
      if (++index_[d] < sizes_[d]) return;
      position_ -= index_[d] * strides_[d];
      index_[d] = 0;
    }
  }

 private:
  std::vector<int64_t> sizes_;
  std::vector<int64_t> strides_;
  std::vector<int64_t> index_;
  int64_t position_;
};

// Hardware prefetchers stop at 4 KiB page boundaries and need a few lines to
// pick a stream up again, so strided runs of 0.5-16 KiB ran at 0.4-0.55x of
// one long memcpy. Prefetching the next run while copying this one brings
// them to ~0.7x (bench/strided_copy_bench). Longer runs stream well alone.
constexpr size_t kPrefetchMinRun = 512;
constexpr size_t kPrefetchMaxRun = 16 << 10;

inline void PrefetchRun(const char* run, size_t bytes, bool for_write) {
  if (bytes < kPrefetchMinRun || bytes > kPrefetchMaxRun) return;
  for (size_t b = 0; b < bytes; b += 64) {
    if (for_write) {
      __builtin_prefetch(run + b, 1, 3);
    } else {
      __builtin_prefetch(run + b, 0, 3);
    }
  }
}

// A strided copy of at least this many bytes in runs of
// [kPrefetchMinRun, kPrefetchMaxRun] writes with non-temporal stores: a
// destination this large is not read back from cache, and streaming stores
// skip reading each destination line before overwriting it. glibc's memcpy
// streams single copies past most of the last-level cache, but each run
// alone is far below that. 1 KiB runs of 64 MiB ran 1.2-1.6x faster.
constexpr int64_t kStreamMinBytes = 8 << 20;

// memcpy of one run with non-temporal stores for its 16-byte aligned body.
// The caller ends its copy with StreamFence.
inline void StreamRun(char* dst, const char* src, size_t bytes) {
#if defined(__SSE2__)
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (head + 64 > bytes) {
    std::memcpy(dst, src, bytes);
    return;
  }
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  const size_t body = bytes & ~size_t{63};
  for (size_t i = 0; i < body; i += 64) {
    const __m128i a =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + body, src + body, bytes - body);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Whether a copy of `total_bytes` in runs of `run_bytes` streams its stores.
bool StreamsRuns(size_t run_bytes, int64_t total_bytes) {
  return run_bytes >= kPrefetchMinRun && run_bytes <= kPrefetchMaxRun &&
         total_bytes >= kStreamMinBytes;
}

// Orders the streaming stores before whatever the caller does next (they
// are weakly ordered): another thread that learns the copy is done sees it.
inline void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

int64_t Product(absl::Span<const int64_t> sizes, size_t from) {
  int64_t n = 1;
  for (size_t d = from; d < sizes.size(); ++d) n *= sizes[d];
  return n;
}

bool AnyZero(absl::Span<const int64_t> sizes) {
  for (int64_t s : sizes) {
    if (s == 0) return true;
  }
  return false;
}

// Copies flat elements [flat_begin, flat_begin + flat_count) of a box
// between a contiguous chunk and the box's place in `array`.
void FlatRangeCopy(absl::Span<const int64_t> array_shape,
                   absl::Span<const int64_t> offsets,
                   absl::Span<const int64_t> box_sizes, int64_t flat_begin,
                   int64_t flat_count, char* array, char* chunk,
                   size_t item_size, bool to_array) {
  if (flat_count <= 0 || AnyZero(box_sizes)) return;
  const size_t outer = OuterDims(box_sizes, array_shape, nullptr);
  const int64_t run = Product(box_sizes, outer);
  // Both ways: a packed chunk this large outgrows the core's cache before it
  // is sent on (UCX reshards ran the same with and without streaming packs).
  const bool stream = StreamsRuns(static_cast<size_t>(run) * item_size,
                                  flat_count * static_cast<int64_t>(item_size));
  RunWalker walker(array_shape, offsets, box_sizes, outer, item_size);
  walker.Seek(flat_begin / run);
  int64_t within = flat_begin % run;
  int64_t left = flat_count;
  while (left > 0) {
    const int64_t n = std::min(run - within, left);
    char* place =
        array + walker.position() + within * static_cast<int64_t>(item_size);
    const size_t bytes = static_cast<size_t>(n) * item_size;
    walker.Next();
    if (left > n) {
      PrefetchRun(array + walker.position(),
                  static_cast<size_t>(std::min(run, left - n)) * item_size,
                  to_array);
    }
    if (stream) {
      if (to_array) {
        StreamRun(place, chunk, bytes);
      } else {
        StreamRun(chunk, place, bytes);
      }
    } else if (to_array) {
      std::memcpy(place, chunk, bytes);
    } else {
      std::memcpy(chunk, place, bytes);
    }
    chunk += bytes;
    left -= n;
    within = 0;
  }
  if (stream) StreamFence();
}

}  // namespace

void CopyBox(const void* src, absl::Span<const int64_t> src_shape,
             absl::Span<const int64_t> src_offsets, void* dst,
             absl::Span<const int64_t> dst_shape,
             absl::Span<const int64_t> dst_offsets,
             absl::Span<const int64_t> copy_sizes, size_t item_size) {
  if (copy_sizes.empty()) {
    std::memcpy(dst, src, item_size);
    return;
  }
  if (AnyZero(copy_sizes)) return;
  const size_t outer = OuterDims(copy_sizes, src_shape, &dst_shape);
  const size_t run_bytes =
      static_cast<size_t>(Product(copy_sizes, outer)) * item_size;
  const int64_t runs = Product(copy_sizes.subspan(0, outer), 0);
  RunWalker from(src_shape, src_offsets, copy_sizes, outer, item_size);
  RunWalker to(dst_shape, dst_offsets, copy_sizes, outer, item_size);
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  const bool stream =
      StreamsRuns(run_bytes, runs * static_cast<int64_t>(run_bytes));
  for (int64_t r = 0; r < runs; ++r) {
    const char* run_src = s + from.position();
    char* run_dst = d + to.position();
    from.Next();
    to.Next();
    if (r + 1 < runs) PrefetchRun(s + from.position(), run_bytes, false);
    if (stream) {
      StreamRun(run_dst, run_src, run_bytes);
    } else {
      std::memcpy(run_dst, run_src, run_bytes);
    }
  }
  if (stream) StreamFence();
}

void CopyFlatRangeToBox(const void* src_chunk, int64_t flat_begin,
                        int64_t flat_count, absl::Span<const int64_t> box_sizes,
                        void* dst, absl::Span<const int64_t> dst_shape,
                        absl::Span<const int64_t> dst_offsets,
                        size_t item_size) {
  if (box_sizes.empty()) {
    if (flat_count > 0) std::memcpy(dst, src_chunk, item_size);
    return;
  }
  FlatRangeCopy(dst_shape, dst_offsets, box_sizes, flat_begin, flat_count,
                static_cast<char*>(dst),
                const_cast<char*>(static_cast<const char*>(src_chunk)),
                item_size, /*to_array=*/true);
}

void CopyBoxToFlatRange(const void* src, absl::Span<const int64_t> src_shape,
                        absl::Span<const int64_t> src_offsets,
                        absl::Span<const int64_t> box_sizes, int64_t flat_begin,
                        int64_t flat_count, void* dst_chunk, size_t item_size) {
  if (box_sizes.empty()) {
    if (flat_count > 0) std::memcpy(dst_chunk, src, item_size);
    return;
  }
  FlatRangeCopy(src_shape, src_offsets, box_sizes, flat_begin, flat_count,
                const_cast<char*>(static_cast<const char*>(src)),
                static_cast<char*>(dst_chunk), item_size,
                /*to_array=*/false);
}

}  // namespace tessera
