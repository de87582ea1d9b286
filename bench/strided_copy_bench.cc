// core/strided_copy against memcpy of the same bytes. Each case copies a
// sub-box whose inner contiguous run is `run_bytes` out of a row-major
// array twice as wide (so runs are not merged), 64 MiB in all.
// bench/run.sh turns the pairs into ratios.
#include <cstring>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/strided_copy.h"

namespace tessera {
namespace {

constexpr int64_t kTotalBytes = 64 << 20;

struct Buffers {
  explicit Buffers(int64_t bytes) : src(new char[bytes]), dst(new char[bytes]) {
    std::memset(src.get(), 1, bytes);
    std::memset(dst.get(), 2, bytes);
  }
  std::unique_ptr<char[]> src;
  std::unique_ptr<char[]> dst;
};

// Sub-box copy: rows x (run/4) float32 out of rows x (2*run/4).
void BM_StridedCopy(benchmark::State& state) {
  const int64_t run_bytes = state.range(0);
  const int64_t cols = run_bytes / 4;
  const int64_t rows = kTotalBytes / run_bytes;
  Buffers b(2 * kTotalBytes);
  const Shape shape = {rows, 2 * cols};
  for (auto _ : state) {
    CopyBox(b.src.get(), shape, {0, cols / 2}, b.dst.get(), shape,
            {0, cols / 2}, {rows, cols}, 4);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

// The same via flat ranges (what the data plane does with chunks).
void BM_StridedFlatRange(benchmark::State& state) {
  const int64_t run_bytes = state.range(0);
  const int64_t cols = run_bytes / 4;
  const int64_t rows = kTotalBytes / run_bytes;
  Buffers b(2 * kTotalBytes);
  const Shape shape = {rows, 2 * cols};
  const Shape box = {rows, cols};
  for (auto _ : state) {
    CopyFlatRangeToBox(b.src.get(), 0, rows * cols, box, b.dst.get(), shape,
                       {0, cols / 2}, 4);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

// memcpy of the same number of bytes in one call.
void BM_Memcpy(benchmark::State& state) {
  Buffers b(kTotalBytes);
  for (auto _ : state) {
    std::memcpy(b.dst.get(), b.src.get(), kTotalBytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

BENCHMARK(BM_Memcpy)->UseRealTime();
BENCHMARK(BM_StridedCopy)
    ->RangeMultiplier(4)
    ->Range(256, 1 << 20)
    ->UseRealTime();
BENCHMARK(BM_StridedFlatRange)
    ->RangeMultiplier(4)
    ->Range(256, 1 << 20)
    ->UseRealTime();

}  // namespace
}  // namespace tessera
