#include "core/box_index.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace tessera {
namespace {

constexpr size_t kLeafSize = 8;
// Below this many points or intervals a node of the segment tree tests
// every pair directly.
constexpr size_t kScanCutoff = 16;
// Steps between two polls of the StopCondition.
constexpr uint64_t kStepsPerCheck = 1 << 16;

// The streamed segment tree over boxes given by their ranks. On every
// active dim each item has a distinct rank `lo` (its start among all
// starts, ties broken by item) and `hi`, the number of starts below its
// end, so that item a's start lies in item b's range on that dim exactly
// when lo(b) < lo(a) < hi(b), and two non-empty boxes meet on a dim exactly
// when one's start lies in the other's range.
class PairStream {
 public:
  PairStream(size_t dims, size_t items, std::vector<int32_t> ranks,
             absl::FunctionRef<bool(uint32_t, uint32_t)> report,
             const StopCondition& stop)
      : dims_(dims),
        items_(static_cast<int32_t>(items)),
        ranks_(std::move(ranks)),
        report_(report),
        stop_(stop) {}

  // Reports every (p, i), p from `points`, i from `intervals`, that meet:
  // p starts inside i on the top dim, and they meet on the others.
  // False when stopped (by report_ or by stop_; see status()).
  bool Run(std::vector<uint32_t>& points, std::vector<uint32_t>& intervals) {
    return Stream(points.data(), points.size(), intervals.data(),
                  intervals.size(), dims_ - 1, 0, items_);
  }

  const absl::Status& status() const { return status_; }

 private:
  int32_t Lo(uint32_t t, size_t k) const {
    return ranks_[(k * items_ + t) * 2];
  }
  int32_t Hi(uint32_t t, size_t k) const {
    return ranks_[(k * items_ + t) * 2 + 1];
  }
  // p's start lies in i's range on dim k.
  bool StartsIn(uint32_t p, uint32_t i, size_t k) const {
    return Lo(i, k) < Lo(p, k) && Lo(p, k) < Hi(i, k);
  }
  // a and b meet on every dim below k.
  bool MeetBelow(uint32_t a, uint32_t b, size_t k) const {
    for (size_t j = 0; j < k; ++j) {
      if (!(StartsIn(a, b, j) || StartsIn(b, a, j))) return false;
    }
    return true;
  }

  bool Tick(size_t steps) {
    steps_ += steps;
    if (steps_ < next_check_) return true;
    next_check_ = steps_ + kStepsPerCheck;
    status_ = stop_.Check();
    return status_.ok();
  }

  // Points p[0, np) all start in [lo, hi) on dim k; intervals i[0, ni) all
  // reach into it. Reports the pairs where the point starts inside the
  // interval on dim k and the two meet on every dim below k.
  bool Stream(uint32_t* p, size_t np, uint32_t* i, size_t ni, size_t k,
              int32_t lo, int32_t hi) {
    if (np == 0 || ni == 0) return true;
    if (!Tick(np + ni)) return false;
    if (k == 0) return Scan(p, np, i, ni);
    if (np < kScanCutoff || ni < kScanCutoff) {
      if (!Tick(np * ni)) return false;
      for (size_t a = 0; a < np; ++a) {
        for (size_t b = 0; b < ni; ++b) {
          if (StartsIn(p[a], i[b], k) && MeetBelow(p[a], i[b], k) &&
              !report_(p[a], i[b])) {
            return false;
          }
        }
      }
      return true;
    }
    // Intervals spanning all of [lo, hi) hold every point on dim k: what is
    // left to decide lies in the dims below, in both roles.
    uint32_t* span_end = std::partition(
        i, i + ni, [&](uint32_t t) { return Lo(t, k) < lo && Hi(t, k) >= hi; });
    const size_t ns = span_end - i;
    if (ns > 0 && !(Stream(p, np, i, ns, k - 1, 0, items_) &&
                    Stream(i, ns, p, np, k - 1, 0, items_))) {
      return false;
    }
    uint32_t* rest = span_end;
    const size_t nr = ni - ns;
    // Split the points at their median start; each interval goes to the
    // halves it reaches into.
    const size_t half = np / 2;
    std::nth_element(p, p + half, p + np, [&](uint32_t a, uint32_t b) {
      return Lo(a, k) < Lo(b, k);
    });
    const int32_t mid = Lo(p[half], k);
    uint32_t* left_end = std::partition(rest, rest + nr, [&](uint32_t t) {
      return std::max(Lo(t, k) + 1, lo) < std::min(Hi(t, k), mid);
    });
    if (!Stream(p, half, rest, left_end - rest, k, lo, mid)) return false;
    uint32_t* right_end = std::partition(rest, rest + nr, [&](uint32_t t) {
      return std::max(Lo(t, k) + 1, mid) < std::min(Hi(t, k), hi);
    });
    return Stream(p + half, np - half, rest, right_end - rest, k, mid, hi);
  }

  // Dim 0, the last: every point starting inside an interval is a pair.
  bool Scan(uint32_t* p, size_t np, uint32_t* i, size_t ni) {
    std::sort(p, p + np,
              [&](uint32_t a, uint32_t b) { return Lo(a, 0) < Lo(b, 0); });
    for (size_t b = 0; b < ni; ++b) {
      const int32_t lo = Lo(i[b], 0);
      const int32_t hi = Hi(i[b], 0);
      uint32_t* it = std::upper_bound(
          p, p + np, lo, [&](int32_t v, uint32_t t) { return v < Lo(t, 0); });
      for (; it != p + np && Lo(*it, 0) < hi; ++it) {
        if (!report_(*it, i[b])) return false;
        if (!Tick(1)) return false;
      }
    }
    return Tick(np + ni);
  }

  const size_t dims_;
  const int32_t items_;
  const std::vector<int32_t> ranks_;
  const absl::FunctionRef<bool(uint32_t, uint32_t)> report_;
  const StopCondition& stop_;
  uint64_t steps_ = 0;
  uint64_t next_check_ = kStepsPerCheck;
  absl::Status status_;
};

// Items 0..n-1 given by `lo(t, d)` / `hi(t, d)` on `rank` dims: their ranks
// on the dims where they are not all the same interval (the others never
// tell two boxes apart), dim-major: item t's (lo, hi) on the k-th such dim
// at 2 * (k * n + t). Returns the number of such dims.
template <typename LoFn, typename HiFn>
size_t RankSpace(size_t n, size_t rank, LoFn lo, HiFn hi,
                 std::vector<int32_t>* ranks) {
  std::vector<size_t> active;
  for (size_t d = 0; d < rank; ++d) {
    for (size_t t = 1; t < n; ++t) {
      if (lo(t, d) != lo(0, d) || hi(t, d) != hi(0, d)) {
        active.push_back(d);
        break;
      }
    }
  }
  const size_t dims = active.size();
  ranks->assign(n * 2 * dims, 0);
  std::vector<std::pair<int64_t, uint32_t>> starts(n);
  std::vector<int64_t> sorted(n);
  for (size_t k = 0; k < dims; ++k) {
    const size_t d = active[k];
    for (size_t t = 0; t < n; ++t) starts[t] = {lo(t, d), t};
    std::sort(starts.begin(), starts.end());
    for (size_t r = 0; r < n; ++r) {
      (*ranks)[(k * n + starts[r].second) * 2] = static_cast<int32_t>(r);
      sorted[r] = starts[r].first;
    }
    for (size_t t = 0; t < n; ++t) {
      (*ranks)[(k * n + t) * 2 + 1] = static_cast<int32_t>(
          std::lower_bound(sorted.begin(), sorted.end(), hi(t, d)) -
          sorted.begin());
    }
  }
  return dims;
}

}  // namespace

absl::Status StopCondition::Check() const {
  if (cancelled && cancelled()) {
    return absl::CancelledError("cancelled while planning shard geometry");
  }
  if (deadline != absl::InfiniteFuture() && absl::Now() >= deadline) {
    return absl::DeadlineExceededError(
        "deadline exceeded while planning shard geometry");
  }
  return absl::OkStatus();
}

BoxIndex::BoxIndex(absl::Span<const Box> boxes) {
  Build(boxes.size(), [&](size_t i) -> const Box& { return boxes[i]; });
}

BoxIndex::BoxIndex(size_t count,
                   const std::function<const Box&(size_t)>& box_of) {
  Build(count, box_of);
}

void BoxIndex::Build(size_t count,
                     const std::function<const Box&(size_t)>& box_of) {
  size_ = count;
  bool have_rank = false;
  std::vector<uint32_t> ids;
  std::vector<int64_t> coords;
  for (size_t i = 0; i < count; ++i) {
    const Box& box = box_of(i);
    if (box.offsets.size() != box.rank() || box.IsEmpty()) continue;
    if (!have_rank) {
      rank_ = box.rank();
      have_rank = true;
    }
    if (box.rank() != rank_) continue;
    ids.push_back(static_cast<uint32_t>(i));
    for (size_t d = 0; d < rank_; ++d) {
      coords.push_back(box.offsets[d]);
      coords.push_back(box.offsets[d] + box.sizes[d]);
    }
  }
  const size_t m = ids.size();
  if (m == 0) return;
  const size_t width = 2 * rank_;

  // The k-d tree: median splits on lo0, hi0, lo1, hi1, ... in turn.
  std::vector<uint32_t> perm(m);
  std::iota(perm.begin(), perm.end(), 0);
  nodes_.push_back({0, static_cast<uint32_t>(m), -1});
  std::vector<std::pair<size_t, size_t>> todo = {{0, 0}};  // (node, depth)
  while (!todo.empty()) {
    const auto [v, depth] = todo.back();
    todo.pop_back();
    const uint32_t begin = nodes_[v].begin;
    const uint32_t end = nodes_[v].end;
    if (end - begin <= kLeafSize || width == 0) continue;
    const size_t c = depth % width;
    const uint32_t mid = begin + (end - begin) / 2;
    std::nth_element(perm.begin() + begin, perm.begin() + mid,
                     perm.begin() + end, [&](uint32_t a, uint32_t b) {
                       return coords[a * width + c] < coords[b * width + c];
                     });
    nodes_[v].left = static_cast<int32_t>(nodes_.size());
    nodes_.push_back({begin, mid, -1});
    nodes_.push_back({mid, end, -1});
    todo.push_back({nodes_[v].left, depth + 1});
    todo.push_back({nodes_[v].left + 1, depth + 1});
  }
  ids_.resize(m);
  coords_.resize(m * width);
  for (size_t t = 0; t < m; ++t) {
    ids_[t] = ids[perm[t]];
    std::copy_n(coords.begin() + perm[t] * width, width,
                coords_.begin() + t * width);
  }
  // Bounds of the leaves from their items, of the others from their
  // children (which come after them in nodes_).
  bounds_.resize(nodes_.size() * 4 * rank_);
  for (size_t v = nodes_.size(); v-- > 0;) {
    int64_t* b = bounds_.data() + v * 4 * rank_;
    const Node& node = nodes_[v];
    for (size_t d = 0; d < rank_; ++d) {
      int64_t* out = b + 4 * d;
      if (node.left >= 0) {
        const int64_t* l = bounds_.data() + node.left * 4 * rank_ + 4 * d;
        const int64_t* r = l + 4 * rank_;
        out[0] = std::min(l[0], r[0]);
        out[1] = std::max(l[1], r[1]);
        out[2] = std::min(l[2], r[2]);
        out[3] = std::max(l[3], r[3]);
        continue;
      }
      out[0] = out[1] = Lo(node.begin, d);
      out[2] = out[3] = Hi(node.begin, d);
      for (uint32_t t = node.begin + 1; t < node.end; ++t) {
        out[0] = std::min(out[0], Lo(t, d));
        out[1] = std::max(out[1], Lo(t, d));
        out[2] = std::min(out[2], Hi(t, d));
        out[3] = std::max(out[3], Hi(t, d));
      }
    }
  }
}

bool BoxIndex::Visit(size_t v, const Box& query,
                     absl::FunctionRef<bool(size_t)> fn) const {
  const Node& node = nodes_[v];
  const int64_t* b = bounds_.data() + v * 4 * rank_;
  bool all = true;  // every item of the node meets the query
  for (size_t d = 0; d < rank_; ++d) {
    const int64_t lo = query.offsets[d];
    const int64_t hi = lo + query.sizes[d];
    if (b[4 * d] >= hi || b[4 * d + 3] <= lo) return true;
    if (b[4 * d + 1] >= hi || b[4 * d + 2] <= lo) all = false;
  }
  if (all || node.left < 0) {
    for (uint32_t t = node.begin; t < node.end; ++t) {
      bool meets = true;
      for (size_t d = 0; !all && d < rank_; ++d) {
        const int64_t lo = query.offsets[d];
        if (Lo(t, d) >= lo + query.sizes[d] || Hi(t, d) <= lo) meets = false;
      }
      if (meets && !fn(ids_[t])) return false;
    }
    return true;
  }
  return Visit(node.left, query, fn) && Visit(node.left + 1, query, fn);
}

bool BoxIndex::ForEachIntersecting(const Box& query,
                                   absl::FunctionRef<bool(size_t)> fn) const {
  if (nodes_.empty() || query.rank() != rank_ ||
      query.offsets.size() != rank_ || query.IsEmpty()) {
    return true;
  }
  return Visit(0, query, fn);
}

std::vector<size_t> BoxIndex::Intersecting(const Box& query) const {
  std::vector<size_t> out;
  ForEachIntersecting(query, [&](size_t i) {
    out.push_back(i);
    return true;
  });
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status BoxIndex::ForEachIntersectingPair(
    absl::FunctionRef<bool(size_t, size_t)> fn,
    const StopCondition& stop) const {
  const size_t m = ids_.size();
  auto report = [&](uint32_t a, uint32_t b) {
    return ids_[a] < ids_[b] ? fn(ids_[a], ids_[b]) : fn(ids_[b], ids_[a]);
  };
  std::vector<int32_t> ranks;
  const size_t dims = RankSpace(
      m, rank_, [&](size_t t, size_t d) { return Lo(t, d); },
      [&](size_t t, size_t d) { return Hi(t, d); }, &ranks);
  if (dims == 0) {  // all boxes alike: every pair meets
    for (uint32_t a = 0; a < m; ++a) {
      for (uint32_t b = a + 1; b < m; ++b) {
        if (!report(a, b)) return absl::OkStatus();
      }
      if ((a & 1023) == 0) {
        absl::Status s = stop.Check();
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }
  std::vector<uint32_t> points(m), intervals(m);
  std::iota(points.begin(), points.end(), 0);
  std::iota(intervals.begin(), intervals.end(), 0);
  PairStream stream(dims, m, std::move(ranks), report, stop);
  stream.Run(points, intervals);
  return stream.status();
}

absl::Status BoxIndex::ForEachIntersectingPair(
    const BoxIndex& other, absl::FunctionRef<bool(size_t, size_t)> fn,
    const StopCondition& stop) const {
  if (rank_ != other.rank_ || ids_.empty() || other.ids_.empty()) {
    return absl::OkStatus();
  }
  const size_t na = ids_.size();
  const size_t n = na + other.ids_.size();
  auto report = [&](uint32_t x, uint32_t y) {
    return x < na ? fn(ids_[x], other.ids_[y - na])
                  : fn(ids_[y], other.ids_[x - na]);
  };
  std::vector<int32_t> ranks;
  const size_t dims = RankSpace(
      n, rank_,
      [&](size_t t, size_t d) {
        return t < na ? Lo(t, d) : other.Lo(t - na, d);
      },
      [&](size_t t, size_t d) {
        return t < na ? Hi(t, d) : other.Hi(t - na, d);
      },
      &ranks);
  if (dims == 0) {
    for (uint32_t a = 0; a < na; ++a) {
      for (uint32_t b = na; b < n; ++b) {
        if (!report(a, b)) return absl::OkStatus();
      }
      if ((a & 1023) == 0) {
        absl::Status s = stop.Check();
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }
  std::vector<uint32_t> mine(na), theirs(n - na);
  std::iota(mine.begin(), mine.end(), 0);
  std::iota(theirs.begin(), theirs.end(), static_cast<uint32_t>(na));
  PairStream stream(dims, n, std::move(ranks), report, stop);
  if (stream.Run(mine, theirs)) stream.Run(theirs, mine);
  return stream.status();
}

}  // namespace tessera
