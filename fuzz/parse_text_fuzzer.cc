// Fuzzes every parser of CLI text: shapes, ranges, regions, boxes, shard
// lists, placements, devices, dtypes and init modes, then resolves what
// parses against the parsed shape and validates the layouts it makes.
//
// Input: lines (split on '\n'):
//   0 shape "10,20"   1 region "0:5,:"   2 shard list "0:5,:@rank:0;..."
//   3 placements "rank:0,w1/cpu"   4 init "full:3"   5 dtype "int8"
//   6 chunk dim "-1"
// Every parser also runs on every line. Invariants checked (trap on failure):
// a resolved region lies inside the shape; a layout LayoutBoxes accepts
// covers the tensor exactly (element counts add up); FillBox succeeds on an
// accepted region with a checked init value unless the tensor's element
// count overflows.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/checked_math.h"
#include "core/dtype.h"
#include "core/init_fill.h"
#include "core/layout_spec.h"
#include "core/parse.h"
#include "core/placement.h"
#include "fuzz/fuzz_util.h"

namespace tessera {
namespace {

// Elements FillBox may write per input (keeps each run fast).
constexpr int64_t kMaxFillElements = 1 << 16;

void AllParsers(absl::string_view line) {
  (void)ParseInt64(line);
  (void)ParseShape(line);
  (void)ParseRanges(line);
  (void)ParseShardList(line);
  (void)ParsePlacement(line);
  (void)ParsePlacementList(line);
  (void)ParseDevice(line);
  (void)ParseDType(line);
  absl::StatusOr<InitSpec> init = ParseInit(line);
  if (init.ok()) {
    for (DType t : AllDTypes()) (void)CheckInitValue(*init, t);
    // What parses prints back to something that parses to the same spec.
    absl::StatusOr<InitSpec> again = ParseInit(init->ToString());
    FUZZ_CHECK(again.ok() && *again == *init, init->ToString());
  }
  absl::StatusOr<Placement> p = ParsePlacement(line);
  if (p.ok()) {
    absl::StatusOr<Placement> again = ParsePlacement(p->ToString());
    FUZZ_CHECK(again.ok() && *again == *p, p->ToString());
  }
  (void)IsValidTensorName(line);
  (void)CheckWorkerName(line);
}

void Run(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<absl::string_view> lines = absl::StrSplit(input, '\n');
  for (absl::string_view line : lines) AllParsers(line);
  lines.resize(7);
  const absl::string_view shape_text = lines[0], region_text = lines[1],
                          shards_text = lines[2], placements_text = lines[3],
                          init_text = lines[4], dtype_text = lines[5],
                          dim_text = lines[6];

  absl::StatusOr<Shape> shape = ParseShape(shape_text);
  if (!shape.ok()) return;
  absl::StatusOr<DType> dtype = ParseDType(dtype_text);
  const DType t = dtype.ok() ? *dtype : DType::kFloat32;

  // Region: resolved boxes lie inside the shape.
  absl::StatusOr<std::vector<DimRange>> ranges = ParseRanges(region_text);
  if (ranges.ok()) {
    absl::StatusOr<Box> region = ResolveRegion(*ranges, *shape);
    if (region.ok()) {
      FUZZ_CHECK(CheckWithin(*region, *shape, "region").ok(),
                 region->ToString());
      absl::StatusOr<InitSpec> init = ParseInit(init_text);
      absl::StatusOr<int64_t> n = NumElements(region->sizes);
      if (init.ok() && CheckInitValue(*init, t).ok() && n.ok() &&
          *n <= kMaxFillElements) {
        std::vector<char> buf(static_cast<size_t>(*n) * ItemSize(t) + 1);
        absl::Status s = FillBox(*init, t, *shape, *region, buf.data());
        // Only a tensor whose element count overflows is refused.
        FUZZ_CHECK(s.ok() || !NumElements(*shape).ok(), s.ToString());
      }
    }
    (void)ResolveBox(*ranges, *shape);
  }

  // Enumerable layout from the shard list.
  absl::StatusOr<std::vector<ShardText>> shards = ParseShardList(shards_text);
  absl::StatusOr<int64_t> total = NumElements(*shape);
  if (shards.ok()) {
    std::vector<Box> boxes;
    std::vector<Placement> placements;
    bool resolved = true;
    for (const ShardText& s : *shards) {
      absl::StatusOr<Box> box = ResolveBox(s.ranges, *shape);
      if (!box.ok()) {
        resolved = false;
        break;
      }
      boxes.push_back(*box);
      placements.push_back(s.placement);
    }
    if (resolved) {
      absl::StatusOr<std::vector<Box>> out =
          LayoutBoxes(*shape, LayoutSpec::Enumerable(boxes, placements));
      if (out.ok() && total.ok()) {
        int64_t sum = 0;
        for (const Box& b : *out) {
          FUZZ_CHECK(CheckWithin(b, *shape, "shard").ok(), b.ToString());
          sum += b.NumElements();
        }
        FUZZ_CHECK(sum == *total, absl::StrCat(sum, " != ", *total));
      }
    }
  }

  // Chunk layout from the placement list.
  absl::StatusOr<std::vector<Placement>> placements =
      ParsePlacementList(placements_text);
  absl::StatusOr<int64_t> dim = ParseInt64(dim_text);
  if (placements.ok()) {
    absl::StatusOr<std::vector<Box>> out = LayoutBoxes(
        *shape, LayoutSpec::Chunk(dim.ok() ? *dim : 0, *placements));
    if (out.ok())
      FUZZ_CHECK(out->size() == placements->size(), "one box per placement");
    if (out.ok() && total.ok()) {
      int64_t sum = 0;
      for (const Box& b : *out) {
        if (!b.IsEmpty()) sum += b.NumElements();
      }
      FUZZ_CHECK(sum == *total, absl::StrCat(sum, " != ", *total));
    }
  }
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::Run(data, size);
  return 0;
}
