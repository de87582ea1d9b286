// Geometry planning at 100k shards on layouts built to defeat a sort and
// sweep along one dim, each next to a reference measured in the same run:
//  * Validate/<layout>: ValidateLayout (bounds, overlap, cover), against
//    Sort/<layout>, sorting the same boxes once by their offsets;
//  * Reshard/<layout>: PlanReshard to a mirrored layout (no shard kept),
//    against the same Sort;
//  * ReshardColumns/<n>: n column chunks to n-1 column chunks, against
//    SortColumns/<n>;
//  * RegionIndexed: PlanRegion of a 4 KiB region of a 100k-shard tensor
//    through a prebuilt BoxIndex, against RegionScan (PlanRegion looking at
//    every shard, as callers without an index do) and IndexBuild (building
//    that index once).
// bench/run.sh turns the pairs into ratios (of CPU time: the planners are
// single-threaded, and CPU time is steadier than wall time on a shared
// machine).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/box.h"
#include "core/box_index.h"
#include "core/region_plan.h"
#include "core/reshard_plan.h"
#include "core/shard_layout.h"
#include "core/sharding_spec.h"
#include "core/testing/adversarial_layouts.h"

namespace tessera {
namespace {

struct Layout {
  std::string name;
  Shape shape;
  std::vector<Box> boxes;
  bool tiles;                 // else: disjoint but not covering
  std::vector<Box> mirrored;  // another tiling of the same tensor
};

// Rank 2 and 3: dims reversed; rank 4: the cells of dims 2 and 3 swapped.
std::vector<Box> Mirror(std::vector<Box> boxes) {
  for (Box& b : boxes) {
    if (b.rank() == 4) {
      std::swap(b.offsets[2], b.offsets[3]);
      std::swap(b.sizes[2], b.sizes[3]);
    } else {
      std::reverse(b.offsets.begin(), b.offsets.end());
      std::reverse(b.sizes.begin(), b.sizes.end());
    }
  }
  return boxes;
}

const std::vector<Layout>& Layouts() {
  static const auto* layouts = [] {
    auto* out = new std::vector<Layout>;
    out->push_back({"rank2_shells", {50000, 50000}, Shells(2, 50000), true});
    out->push_back(
        {"rank3_shells", {33334, 33334, 33334}, Shells(3, 33334), true});
    out->push_back({"rank4_suffix_tiling",
                    {183, 183, 183, 183},
                    Suffixes(183, true),
                    true});
    out->push_back({"rank4_suffix_boxes",
                    {316, 316, 316, 316},
                    Suffixes(316, false),
                    false});
    for (Layout& l : *out) {
      if (l.tiles) l.mirrored = Mirror(l.boxes);
    }
    return out;
  }();
  return *layouts;
}

std::vector<PlacedBox> Placed(const std::vector<Box>& boxes, size_t shift) {
  std::vector<PlacedBox> out;
  out.reserve(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    out.push_back({boxes[i], {"w" + std::to_string((i + shift) % 64)}});
  }
  return out;
}

// The reference: the n boxes sorted once by their offsets.
void SortBoxes(benchmark::State& state, const std::vector<Box>& boxes) {
  std::vector<uint32_t> order(boxes.size());
  for (auto _ : state) {
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return boxes[a].offsets < boxes[b].offsets;
    });
    benchmark::DoNotOptimize(order.data());
  }
  state.counters["shards"] = boxes.size();
}

void Validate(benchmark::State& state, const Layout& l) {
  for (auto _ : state) {
    absl::Status s = ValidateLayout(l.shape, l.boxes, LayoutKind::kEnumerable);
    if (s.ok() != l.tiles || (!s.ok() && !absl::IsInvalidArgument(s)) ||
        (!s.ok() && s.message().find("cover") == absl::string_view::npos)) {
      state.SkipWithError(("unexpected: " + s.ToString()).c_str());
      break;
    }
  }
  state.counters["shards"] = l.boxes.size();
}

void Reshard(benchmark::State& state, const std::vector<Box>& from,
             const std::vector<Box>& to) {
  const std::vector<PlacedBox> a = Placed(from, 0);
  const std::vector<PlacedBox> b = Placed(to, 1);
  size_t pieces = 0;
  for (auto _ : state) {
    ReshardPlan plan = PlanReshard(a, b, 1);
    pieces = plan.pieces.size();
    benchmark::DoNotOptimize(plan.pieces.data());
  }
  state.counters["shards"] = from.size();
  state.counters["pieces"] = pieces;
}

std::vector<Box> Columns(int64_t n, int64_t chunks) {
  auto boxes = ChunkBoxes({64, 8 * n}, 1, chunks);
  if (!boxes.ok()) std::abort();
  return *std::move(boxes);
}

// 316 x 317 shards of 64 x 64 int8 (4 KiB each): 100,172 shards.
std::vector<Box> Grid() {
  std::vector<Box> boxes;
  for (int64_t r = 0; r < 316; ++r) {
    for (int64_t c = 0; c < 317; ++c) {
      boxes.push_back({{r * 64, c * 64}, {64, 64}});
    }
  }
  return boxes;
}

// A 4 KiB region (64 x 64 int8) across four shards.
const Box kRegion{{150 * 64 + 32, 200 * 64 + 32}, {64, 64}};

void RegionIndexed(benchmark::State& state) {
  const std::vector<Box> boxes = Grid();
  const BoxIndex index(boxes);
  for (auto _ : state) {
    std::vector<RegionPiece> pieces = PlanRegion(index, boxes, kRegion);
    if (pieces.size() != 4) state.SkipWithError("expected 4 pieces");
    benchmark::DoNotOptimize(pieces.data());
  }
  state.counters["shards"] = boxes.size();
}

void RegionScan(benchmark::State& state) {
  const std::vector<Box> boxes = Grid();
  for (auto _ : state) {
    std::vector<RegionPiece> pieces = PlanRegion(boxes, kRegion);
    if (pieces.size() != 4) state.SkipWithError("expected 4 pieces");
    benchmark::DoNotOptimize(pieces.data());
  }
  state.counters["shards"] = boxes.size();
}

void IndexBuild(benchmark::State& state) {
  const std::vector<Box> boxes = Grid();
  for (auto _ : state) {
    BoxIndex index(boxes);
    benchmark::DoNotOptimize(&index);
  }
  state.counters["shards"] = boxes.size();
}

void RegisterAll() {
  for (const Layout& l : Layouts()) {
    benchmark::RegisterBenchmark(("Sort/" + l.name).c_str(), SortBoxes, l.boxes)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("Validate/" + l.name).c_str(), Validate, l)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    if (l.tiles) {
      benchmark::RegisterBenchmark(("Reshard/" + l.name).c_str(), Reshard,
                                   l.boxes, l.mirrored)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
  for (int64_t n : {2500, 10000, 100000}) {
    const std::vector<Box> from = Columns(n, n);
    const std::vector<Box> to = Columns(n, n - 1);
    benchmark::RegisterBenchmark(("SortColumns/" + std::to_string(n)).c_str(),
                                 SortBoxes, from)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(
        ("ReshardColumns/" + std::to_string(n)).c_str(), Reshard, from, to)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark("RegionIndexed", RegionIndexed)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("RegionScan", RegionScan)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("IndexBuild", IndexBuild)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  tessera::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
