#include "core/file_runs.h"

#include <algorithm>

#include "core/box_runs.h"

namespace tessera {

std::vector<StoredPiece> PiecesOf(const CheckpointEntry& entry) {
  if (!entry.pieces.empty()) {
    std::vector<StoredPiece> pieces = entry.pieces;
    if (entry.shape.empty()) {
      for (StoredPiece& piece : pieces) piece.box = Box({0}, {1});
    }
    return pieces;
  }
  StoredPiece whole;
  whole.box = entry.shape.empty() ? Box({0}, {1}) : WholeBox(entry.shape);
  whole.file = entry.file;
  whole.entry = entry.name;
  whole.data_offset = entry.data_offset;
  whole.bytes = entry.bytes;
  return {whole};
}

std::vector<FileRun> PlanFileRuns(const Box& stored, int64_t file_offset,
                                  const Box& shard, int64_t item_bytes) {
  std::vector<FileRun> runs;
  if (stored.rank() != shard.rank()) return runs;
  if (stored.rank() == 0) {
    runs.push_back({file_offset, item_bytes, 0});
    return runs;
  }
  const std::optional<Box> meet = Intersect(stored, shard);
  if (!meet.has_value() || meet->NumElements() == 0) return runs;
  const size_t rank = meet->rank();
  std::vector<int64_t> in_stored(rank), in_shard(rank);
  for (size_t d = 0; d < rank; ++d) {
    in_stored[d] = meet->offsets[d] - stored.offsets[d];
    in_shard[d] = meet->offsets[d] - shard.offsets[d];
  }
  const absl::Span<const int64_t> sizes(meet->sizes.data(), rank);
  // Runs contiguous in the stored array, each cut where the shard's rows
  // break it (element positions counted in the meeting box's order).
  ForEachBoxRun(
      absl::Span<const int64_t>(stored.sizes.data(), rank), in_stored, sizes, 0,
      meet->NumElements(),
      [&](int64_t stored_element, int64_t range_element, int64_t count) {
        ForEachBoxRun(
            absl::Span<const int64_t>(shard.sizes.data(), rank), in_shard,
            sizes, range_element, count,
            [&](int64_t shard_element, int64_t at, int64_t n) {
              const int64_t file =
                  file_offset + (stored_element + at) * item_bytes;
              FileRun run{file, n * item_bytes, shard_element * item_bytes};
              if (!runs.empty() &&
                  runs.back().file_offset + runs.back().length == file &&
                  runs.back().shard_offset + runs.back().length ==
                      run.shard_offset) {
                runs.back().length += run.length;
              } else {
                runs.push_back(run);
              }
            });
      });
  return runs;
}

std::vector<ReadSpan> CoalesceRuns(absl::Span<const FileRun> runs,
                                   int64_t max_gap, int64_t max_span,
                                   double max_over_read) {
  std::vector<ReadSpan> spans;
  int64_t needed = 0;  // run bytes in the last span
  for (size_t i = 0; i < runs.size(); ++i) {
    const FileRun& run = runs[i];
    if (!spans.empty()) {
      ReadSpan& last = spans.back();
      const int64_t end = last.file_offset + last.length;
      const int64_t joined = run.file_offset + run.length - last.file_offset;
      const int64_t now_needed = needed + run.length;
      if (run.file_offset >= end && run.file_offset - end <= max_gap &&
          joined <= max_span &&
          static_cast<double>(joined - now_needed) <=
              max_over_read * static_cast<double>(now_needed)) {
        last.length = joined;
        ++last.num_runs;
        needed = now_needed;
        continue;
      }
    }
    spans.push_back({run.file_offset, run.length, i, 1});
    needed = run.length;
  }
  return spans;
}

}  // namespace tessera
