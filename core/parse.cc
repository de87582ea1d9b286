#include "core/parse.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/errors.h"
#include "core/status_macros.h"

namespace tessera {
namespace {

// Strict: optional '-' or '+', then digits only.
bool StrictInt64(absl::string_view text, int64_t* out) {
  if (text.empty()) return false;
  absl::string_view digits = text;
  if (digits[0] == '-' || digits[0] == '+') digits.remove_prefix(1);
  if (digits.empty()) return false;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(text, out);
}

absl::StatusOr<DimRange> ParseDimRange(absl::string_view text,
                                       absl::string_view whole) {
  const size_t colon = text.find(':');
  if (colon == absl::string_view::npos ||
      text.find(':', colon + 1) != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid range '", text, "' in '", whole,
                     "' (expected a:b, a:, :b or : per dim, comma-separated)"));
  }
  DimRange range;
  const absl::string_view start = text.substr(0, colon);
  const absl::string_view stop = text.substr(colon + 1);
  int64_t v;
  if (!start.empty()) {
    if (!StrictInt64(start, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid range '", text, "' in '", whole, "': '", start,
                       "' is not an integer"));
    }
    range.start = v;
  }
  if (!stop.empty()) {
    if (!StrictInt64(stop, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid range '", text, "' in '", whole, "': '", stop,
                       "' is not an integer"));
    }
    range.stop = v;
  }
  return range;
}

// NumPy resolution of one dim, without bounds checks. Saturates instead of
// overflowing so absurd inputs stay out of bounds rather than wrapping.
void ResolveDim(const DimRange& range, int64_t n, int64_t* a, int64_t* b) {
  auto resolve = [n](int64_t x) {
    return x < 0 ? x + n : x;  // n >= 0 and x < 0: no overflow
  };
  *a = range.start.has_value() ? resolve(*range.start) : 0;
  *b = range.stop.has_value() ? resolve(*range.stop) : n;
}

std::string RangesToString(absl::Span<const DimRange> ranges) {
  std::string out;
  for (size_t d = 0; d < ranges.size(); ++d) {
    if (d > 0) out += ",";
    if (ranges[d].start.has_value()) absl::StrAppend(&out, *ranges[d].start);
    out += ":";
    if (ranges[d].stop.has_value()) absl::StrAppend(&out, *ranges[d].stop);
  }
  return out;
}

}  // namespace

absl::StatusOr<int64_t> ParseInt64(absl::string_view text) {
  int64_t v;
  if (!StrictInt64(text, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a 64-bit integer"));
  }
  return v;
}

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  static constexpr struct {
    const char* unit;
    int64_t scale;
  } kUnits[] = {{"kib", int64_t{1} << 10},
                {"mib", int64_t{1} << 20},
                {"gib", int64_t{1} << 30},
                {"tib", int64_t{1} << 40},
                {"kb", 1000},
                {"mb", 1000 * 1000},
                {"gb", 1000 * 1000 * 1000},
                {"tb", int64_t{1000} * 1000 * 1000 * 1000},
                {"b", 1}};
  const std::string lower = absl::AsciiStrToLower(text);
  absl::string_view digits = lower;
  int64_t scale = 1;
  for (const auto& u : kUnits) {
    if (absl::ConsumeSuffix(&digits, u.unit)) {
      scale = u.scale;
      break;
    }
  }
  int64_t v = 0;
  if (digits.empty() || digits.front() == '-' || digits.front() == '+' ||
      !StrictInt64(digits, &v) || v < 1 ||
      v > std::numeric_limits<int64_t>::max() / scale) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text,
        "' is not a size (digits and a unit such as 500MB, 5GB or 2GiB)"));
  }
  return v * scale;
}

absl::StatusOr<Shape> ParseShape(absl::string_view text) {
  if (text.empty()) {
    return absl::InvalidArgumentError(
        "the shape is empty (expected sizes like 10,20 with at least one dim)");
  }
  Shape shape;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v;
    if (!StrictInt64(part, &v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid shape '", text, "': '", part,
                       "' is not a size (expected integers >= 0 like 10,20)"));
    }
    shape.push_back(v);
  }
  return shape;
}

absl::StatusOr<std::vector<DimRange>> ParseRanges(absl::string_view text) {
  if (text.empty()) {
    return absl::InvalidArgumentError(
        "the range is empty (expected a:b, a:, :b or : per dim, "
        "comma-separated, like 0:5,:)");
  }
  std::vector<DimRange> ranges;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    TESSERA_ASSIGN_OR_RETURN(DimRange range, ParseDimRange(part, text));
    ranges.push_back(range);
  }
  return ranges;
}

absl::StatusOr<Box> ResolveRegion(absl::Span<const DimRange> ranges,
                                  const Shape& shape) {
  const std::string what = absl::StrCat("region ", RangesToString(ranges));
  if (ranges.size() > shape.size()) {
    return DimsMismatchError(what, ranges.size(), shape.size());
  }
  Box box;
  box.offsets.resize(shape.size());
  box.sizes.resize(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t a = 0, b = shape[d];
    if (d < ranges.size()) ResolveDim(ranges[d], shape[d], &a, &b);
    if (a < 0 || a > b || b > shape[d]) {
      return OutOfBoundsError(
          what, absl::StrCat("dim ", d, " resolves to ", a, ":", b,
                             " but must lie within 0:", shape[d]));
    }
    box.offsets[d] = a;
    box.sizes[d] = b - a;
  }
  return box;
}

absl::StatusOr<Box> ResolveBox(absl::Span<const DimRange> ranges,
                               const Shape& shape) {
  if (ranges.size() != shape.size()) {
    return DimsMismatchError(absl::StrCat("box ", RangesToString(ranges)),
                             ranges.size(), shape.size());
  }
  Box box;
  box.offsets.resize(shape.size());
  box.sizes.resize(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t a, b;
    ResolveDim(ranges[d], shape[d], &a, &b);
    int64_t size;
    if (__builtin_sub_overflow(b, a, &size)) {
      return OutOfBoundsError(absl::StrCat("box ", RangesToString(ranges)),
                              absl::StrCat("dim ", d, " range ", a, ":", b,
                                           " is not a valid range"));
    }
    box.offsets[d] = a;
    box.sizes[d] = size;
  }
  return box;
}

absl::StatusOr<std::vector<ShardText>> ParseShardList(absl::string_view text) {
  absl::string_view body = text;
  absl::ConsumeSuffix(&body, ";");
  if (body.empty()) {
    return absl::InvalidArgumentError(
        "the shard list is empty (expected BOX@P;BOX@P;... like "
        "0:5,0:20@rank:0;5:10,0:20@rank:1)");
  }
  std::vector<ShardText> shards;
  for (absl::string_view part : absl::StrSplit(body, ';')) {
    const size_t at = part.rfind('@');
    if (at == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid shard '", part, "' in --shards (expected BOX@P, like ",
          "0:5,0:20@rank:0)"));
    }
    ShardText shard;
    auto ranges = ParseRanges(part.substr(0, at));
    if (!ranges.ok()) {
      return Annotate(ranges.status(), absl::StrCat("shard '", part, "'"));
    }
    shard.ranges = *std::move(ranges);
    auto placement = ParsePlacement(part.substr(at + 1));
    if (!placement.ok()) {
      return Annotate(placement.status(), absl::StrCat("shard '", part, "'"));
    }
    shard.placement = *std::move(placement);
    shards.push_back(std::move(shard));
  }
  return shards;
}

namespace {

// Optimal string alignment distance: insertions, deletions, substitutions
// and swaps of neighbours, each one edit.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1,
                                     std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string ClosestName(absl::string_view typed,
                        const std::vector<std::string>& known) {
  // Names are short; a long one typed is compared with nothing (bounded
  // work for whatever a user pastes).
  if (typed.empty() || typed.size() > 256) return "";
  if (std::find(known.begin(), known.end(), typed) != known.end()) return "";
  size_t best = 3;
  std::string guess;
  bool tie = false;
  for (const std::string& name : known) {
    if (name.size() > 256) continue;
    const size_t distance = EditDistance(typed, name);
    if (distance >= typed.size()) continue;
    if (distance < best) {
      best = distance;
      guess = name;
      tie = false;
    } else if (distance == best) {
      tie = true;
    }
  }
  if (!guess.empty()) return tie ? "" : guess;
  for (const std::string& name : known) {
    if (!absl::StartsWith(name, typed)) continue;
    if (!guess.empty()) return "";  // more than one
    guess = name;
  }
  return guess;
}

}  // namespace tessera
