// Fuzzes the layout rules: random boxes -> ValidateLayout (both kinds),
// ChunkBoxes, PlanRegion and PlanReshard.
//
// First byte even: "small" mode. Ranks 1-3, dims 0-6, up to 8 boxes with
// offsets/sizes in [-3, 8]; ValidateLayout must agree with a brute-force
// oracle that counts how often each element is covered (order: dims,
// bounds, overlap, cover). On a valid layout, PlanRegion's pieces must sum
// to the region's volume and lie in both region and shard, and a reshard
// to a chunk layout (and back) must move exactly the bytes of the shards it
// does not keep.
// First byte odd: "wide" mode. Arbitrary int64 shapes, offsets and sizes;
// nothing may overflow (UBSan) or crash, and whatever validates lies within
// the tensor.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/box.h"
#include "core/checked_math.h"
#include "core/region_plan.h"
#include "core/reshard_plan.h"
#include "core/shard_layout.h"
#include "core/sharding_spec.h"
#include "fuzz/fuzz_util.h"

namespace tessera {
namespace {

enum class Verdict { kOk, kDims, kBounds, kOverlap, kCover };

const char* Name(Verdict v) {
  switch (v) {
    case Verdict::kOk:
      return "ok";
    case Verdict::kDims:
      return "dims";
    case Verdict::kBounds:
      return "bounds";
    case Verdict::kOverlap:
      return "overlap";
    case Verdict::kCover:
      return "cover";
  }
  return "?";
}

Verdict Classify(const absl::Status& s) {
  if (s.ok()) return Verdict::kOk;
  if (absl::IsOutOfRange(s)) return Verdict::kBounds;
  const std::string msg(s.message());
  if (msg.find("overlap") != std::string::npos) return Verdict::kOverlap;
  if (msg.find("cover") != std::string::npos) return Verdict::kCover;
  return Verdict::kDims;
}

std::string Describe(const Shape& shape, const std::vector<Box>& boxes) {
  std::string out = ShapeToString(shape);
  for (const Box& b : boxes) absl::StrAppend(&out, " [", b.ToString(), "]");
  return out;
}

// Brute force over every element (the tensor has at most 6^3 elements).
Verdict Oracle(const Shape& shape, const std::vector<Box>& boxes,
               LayoutKind kind) {
  for (const Box& b : boxes) {
    if (b.rank() != shape.size()) return Verdict::kDims;
  }
  for (const Box& b : boxes) {
    if (kind == LayoutKind::kChunk && b.IsEmpty()) continue;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (b.offsets[d] < 0 || b.sizes[d] < 0 ||
          b.offsets[d] + b.sizes[d] > shape[d]) {
        return Verdict::kBounds;
      }
    }
  }
  int64_t total = 1;
  for (int64_t n : shape) total *= n;
  std::vector<int> count(static_cast<size_t>(total), 0);
  for (const Box& b : boxes) {
    if (b.IsEmpty()) continue;
    std::vector<int64_t> idx(b.offsets.begin(), b.offsets.end());
    for (int64_t e = 0; e < b.NumElements(); ++e) {
      int64_t flat = 0;
      for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
      if (++count[static_cast<size_t>(flat)] > 1) return Verdict::kOverlap;
      for (size_t d = shape.size(); d-- > 0;) {
        if (++idx[d] < b.offsets[d] + b.sizes[d]) break;
        idx[d] = b.offsets[d];
      }
    }
  }
  for (int c : count) {
    if (c == 0) return Verdict::kCover;
  }
  return Verdict::kOk;
}

void CheckRegionPlan(const Shape& shape, const std::vector<Box>& boxes,
                     const Box& region) {
  const std::vector<RegionPiece> pieces = PlanRegion(boxes, region);
  const int64_t want = region.IsEmpty() ? 0 : region.NumElements();
  FUZZ_CHECK(
      PiecesElements(pieces) == want,
      absl::StrCat(Describe(shape, boxes), " region ", region.ToString()));
  for (const RegionPiece& p : pieces) {
    FUZZ_CHECK(p.shard_index < boxes.size(), "shard index");
    FUZZ_CHECK(
        region.Contains(p.global) && boxes[p.shard_index].Contains(p.global),
        p.global.ToString());
    FUZZ_CHECK(p.in_shard == Translate(p.global, boxes[p.shard_index].offsets),
               "in_shard");
    FUZZ_CHECK(p.in_region == Translate(p.global, region.offsets), "in_region");
  }
}

void CheckReshard(const std::vector<PlacedBox>& from,
                  const std::vector<PlacedBox>& to, size_t item) {
  const ReshardPlan plan = PlanReshard(from, to, item);
  FUZZ_CHECK(plan.kept_from.size() == to.size(), "kept_from size");
  std::vector<int64_t> filled(to.size(), 0);
  std::vector<bool> old_used(from.size(), false);
  int64_t kept = 0, moved = 0, bytes_moved = 0, bytes_local = 0;
  for (size_t j = 0; j < to.size(); ++j) {
    const int64_t k = plan.kept_from[j];
    if (k < 0) continue;
    FUZZ_CHECK(static_cast<size_t>(k) < from.size() && !old_used[k],
               "kept twice");
    old_used[k] = true;
    FUZZ_CHECK(from[k].box == to[j].box && from[k].workers == to[j].workers,
               "kept differs");
    ++kept;
  }
  for (const ReshardPiece& p : plan.pieces) {
    FUZZ_CHECK(p.src_shard < from.size() && p.dst_shard < to.size(),
               "piece index");
    FUZZ_CHECK(plan.kept_from[p.dst_shard] < 0, "piece into a kept shard");
    FUZZ_CHECK(from[p.src_shard].box.Contains(p.global) &&
                   to[p.dst_shard].box.Contains(p.global),
               p.global.ToString());
    FUZZ_CHECK(!p.global.IsEmpty(), "empty piece");
    FUZZ_CHECK(p.bytes == p.global.NumElements() * static_cast<int64_t>(item),
               "piece bytes");
    FUZZ_CHECK(p.dst_replica < to[p.dst_shard].workers.size(), "dst replica");
    const std::string& dst_worker = to[p.dst_shard].workers[p.dst_replica];
    const auto& src_workers = from[p.src_shard].workers;
    FUZZ_CHECK(p.local == (std::find(src_workers.begin(), src_workers.end(),
                                     dst_worker) != src_workers.end()),
               "local flag");
    FUZZ_CHECK(!p.local || (p.src_replica < src_workers.size() &&
                            src_workers[p.src_replica] == dst_worker),
               "local source");
    filled[p.dst_shard] += p.global.NumElements();
    if (p.local) {
      bytes_local += p.bytes;
    } else {
      ++moved;
      bytes_moved += p.bytes;
    }
  }
  for (size_t j = 0; j < to.size(); ++j) {
    if (plan.kept_from[j] >= 0 || to[j].box.IsEmpty()) continue;
    // Every replica gets the whole box.
    FUZZ_CHECK(filled[j] == to[j].box.NumElements() *
                                static_cast<int64_t>(to[j].workers.size()),
               absl::StrCat("new shard ", j, " gets ", filled[j], " elements"));
  }
  FUZZ_CHECK(plan.shards_kept == kept && plan.pieces_moved == moved &&
                 plan.bytes_moved == bytes_moved &&
                 plan.bytes_copied_locally == bytes_local,
             "plan totals");
}

void SmallMode(FuzzedDataProvider& in) {
  const size_t rank = in.ConsumeIntegralInRange<size_t>(1, 3);
  Shape shape(rank);
  for (int64_t& n : shape) n = in.ConsumeIntegralInRange<int64_t>(0, 6);
  const size_t count = in.ConsumeIntegralInRange<size_t>(1, 8);
  std::vector<Box> boxes(count);
  for (Box& b : boxes) {
    size_t r = rank;
    if (in.ConsumeIntegralInRange<int>(0, 31) == 0)
      r = in.ConsumeIntegralInRange<size_t>(0, 4);
    for (size_t d = 0; d < r; ++d) {
      b.offsets.push_back(in.ConsumeIntegralInRange<int64_t>(-3, 8));
      b.sizes.push_back(in.ConsumeIntegralInRange<int64_t>(-3, 8));
    }
  }
  for (LayoutKind kind : {LayoutKind::kEnumerable, LayoutKind::kChunk}) {
    const absl::Status s = ValidateLayout(shape, boxes, kind);
    const Verdict want = Oracle(shape, boxes, kind);
    if (Classify(s) != want) {
      fuzz::Fail(
          "ValidateLayout disagrees with the oracle",
          absl::StrCat(Describe(shape, boxes), " kind ",
                       kind == LayoutKind::kChunk ? "chunk" : "enum", ": got ",
                       s.ToString(), ", oracle says ", Name(want)));
    }
  }
  // Chunk layouts validate.
  const int64_t dim = in.ConsumeIntegralInRange<int64_t>(-4, 3);
  const int64_t chunks = in.ConsumeIntegralInRange<int64_t>(0, 9);
  absl::StatusOr<std::vector<Box>> chunk = ChunkBoxes(shape, dim, chunks);
  if (chunk.ok()) {
    const absl::Status s = ValidateLayout(shape, *chunk, LayoutKind::kChunk);
    FUZZ_CHECK(s.ok(), s.ToString());
  }
  if (!ValidateLayout(shape, boxes, LayoutKind::kEnumerable).ok()) return;

  Box region;
  for (size_t d = 0; d < rank; ++d) {
    const int64_t a = in.ConsumeIntegralInRange<int64_t>(0, shape[d]);
    region.offsets.push_back(a);
    region.sizes.push_back(in.ConsumeIntegralInRange<int64_t>(0, shape[d] - a));
  }
  CheckRegionPlan(shape, boxes, region);
  if (!chunk.ok()) return;
  CheckRegionPlan(shape, *chunk, region);

  // One replica per shard mostly, sometimes two on distinct workers.
  const char* kWorkers[] = {"w0", "w1", "w2"};
  auto placed = [&](const Box& b) {
    PlacedBox out{b, {}};
    const int first = in.ConsumeIntegralInRange(0, 2);
    out.workers.push_back(kWorkers[first]);
    if (in.ConsumeIntegralInRange(0, 3) == 0) {
      out.workers.push_back(
          kWorkers[(first + in.ConsumeIntegralInRange(1, 2)) % 3]);
    }
    return out;
  };
  std::vector<PlacedBox> old_layout, new_layout;
  for (const Box& b : boxes) old_layout.push_back(placed(b));
  for (const Box& b : *chunk) new_layout.push_back(placed(b));
  const size_t item = size_t{1} << in.ConsumeIntegralInRange(0, 3);
  CheckReshard(old_layout, new_layout, item);
  CheckReshard(new_layout, old_layout, item);
  CheckReshard(old_layout, old_layout, item);
}

int64_t WideValue(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:
      return in.ConsumeIntegralInRange<int64_t>(-4, 16);
    case 1:
      return INT64_MAX - in.ConsumeIntegralInRange<int64_t>(0, 4);
    case 2:
      return INT64_MIN + in.ConsumeIntegralInRange<int64_t>(0, 4);
    default:
      return in.ConsumeIntegral<int64_t>();
  }
}

void WideMode(FuzzedDataProvider& in) {
  const size_t rank = in.ConsumeIntegralInRange<size_t>(1, 4);
  Shape shape(rank);
  for (int64_t& n : shape) {
    n = WideValue(in);
    if (n < 0) n = 0;
  }
  const size_t count = in.ConsumeIntegralInRange<size_t>(1, 6);
  std::vector<Box> boxes(count);
  for (Box& b : boxes) {
    for (size_t d = 0; d < rank; ++d) {
      b.offsets.push_back(WideValue(in));
      b.sizes.push_back(WideValue(in));
    }
  }
  for (LayoutKind kind : {LayoutKind::kEnumerable, LayoutKind::kChunk}) {
    if (!ValidateLayout(shape, boxes, kind).ok()) continue;
    for (const Box& b : boxes) {
      if (kind == LayoutKind::kChunk && b.IsEmpty()) continue;
      FUZZ_CHECK(CheckWithin(b, shape, "shard").ok(), Describe(shape, boxes));
    }
  }
  (void)TotalShardBytes(boxes, 1 + in.ConsumeIntegralInRange<size_t>(0, 7));
  absl::StatusOr<std::vector<Box>> chunk = ChunkBoxes(
      shape, WideValue(in), in.ConsumeIntegralInRange<int64_t>(-1, 64));
  if (chunk.ok()) {
    // Valid unless the shape's own element count overflows.
    const absl::Status s = ValidateLayout(shape, *chunk, LayoutKind::kChunk);
    FUZZ_CHECK(s.ok() || !NumElements(shape).ok(), s.ToString());
    (void)TotalShardBytes(*chunk, 8);
  }
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  FuzzedDataProvider in(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    tessera::SmallMode(in);
  } else {
    tessera::WideMode(in);
  }
  return 0;
}
