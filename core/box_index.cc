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

// Boxes in rank space, as the pair search moves them. On every active dim
// each item has a distinct rank `lo` (its start among all starts, ties
// broken by item) and `hi`, the number of starts below its end, so that item
// a's start lies in item b's range on that dim exactly when
// lo(b) < lo(a) < hi(b), and two non-empty boxes meet on a dim exactly when
// one's start lies in the other's range.
//
// Up to 8 dims the ranks travel with the item (contiguous, no indirection);
// beyond, an item is its number and the ranks stay in one array.
template <size_t N>
struct PackedItem {
  int32_t r[2 * N];  // (lo, hi) per dim
  uint32_t id;
};

template <size_t N>
struct PackedAccess {
  int32_t Lo(const PackedItem<N>& x, size_t k) const { return x.r[2 * k]; }
  int32_t Hi(const PackedItem<N>& x, size_t k) const { return x.r[2 * k + 1]; }
  uint32_t Id(const PackedItem<N>& x) const { return x.id; }
  PackedItem<N> Make(uint32_t t) const {
    PackedItem<N> x{};
    for (size_t k = 0; k < dims; ++k) {
      x.r[2 * k] = (*ranks)[(k * items + t) * 2];
      x.r[2 * k + 1] = (*ranks)[(k * items + t) * 2 + 1];
    }
    x.id = t;
    return x;
  }
  const std::vector<int32_t>* ranks;
  size_t items;
  size_t dims;
};

struct IndirectAccess {
  int32_t Lo(uint32_t t, size_t k) const {
    return (*ranks)[(k * items + t) * 2];
  }
  int32_t Hi(uint32_t t, size_t k) const {
    return (*ranks)[(k * items + t) * 2 + 1];
  }
  uint32_t Id(uint32_t t) const { return t; }
  uint32_t Make(uint32_t t) const { return t; }
  const std::vector<int32_t>* ranks;
  size_t items;
  size_t dims;
};

// The streamed segment tree (Zomorodian and Edelsbrunner): reports every
// pair (point, interval) of items that meet, where the point's start lies
// in the interval's range on the top dim. The top dim is split at the
// median start of the points; intervals spanning a whole segment meet all
// its points there, and the pairs they make are decided on the dims below,
// in both roles.
template <typename Item, typename Access>
class PairStream {
 public:
  PairStream(Access access, absl::FunctionRef<bool(uint32_t, uint32_t)> report,
             const StopCondition& stop)
      : a_(access),
        items_(static_cast<int32_t>(access.items)),
        report_(report),
        stop_(stop) {}

  // False when stopped (by report_ or by stop_; see status()).
  bool Run(std::vector<Item>& points, std::vector<Item>& intervals) {
    return Stream(points.data(), points.size(), intervals.data(),
                  intervals.size(), a_.dims - 1, 0, items_);
  }

  const absl::Status& status() const { return status_; }

 private:
  int32_t Lo(const Item& x, size_t k) const { return a_.Lo(x, k); }
  int32_t Hi(const Item& x, size_t k) const { return a_.Hi(x, k); }
  // p's start lies in i's range on dim k.
  bool StartsIn(const Item& p, const Item& i, size_t k) const {
    return Lo(i, k) < Lo(p, k) && Lo(p, k) < Hi(i, k);
  }
  // a and b meet on every dim below k.
  bool MeetBelow(const Item& a, const Item& b, size_t k) const {
    for (size_t j = 0; j < k; ++j) {
      if (!(StartsIn(a, b, j) || StartsIn(b, a, j))) return false;
    }
    return true;
  }
  bool Report(const Item& p, const Item& i) {
    return report_(a_.Id(p), a_.Id(i));
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
  bool Stream(Item* p, size_t np, Item* i, size_t ni, size_t k, int32_t lo,
              int32_t hi) {
    if (np == 0 || ni == 0) return true;
    if (!Tick(np + ni)) return false;
    if (k == 0) return Scan(p, np, i, ni);
    if (np < kScanCutoff || ni < kScanCutoff) {
      if (!Tick(np * ni)) return false;
      for (size_t x = 0; x < np; ++x) {
        for (size_t y = 0; y < ni; ++y) {
          if (StartsIn(p[x], i[y], k) && MeetBelow(p[x], i[y], k) &&
              !Report(p[x], i[y])) {
            return false;
          }
        }
      }
      return true;
    }
    // Intervals spanning all of [lo, hi) hold every point on dim k: what is
    // left to decide lies in the dims below, in both roles.
    Item* span_end = std::partition(i, i + ni, [&](const Item& t) {
      return Lo(t, k) < lo && Hi(t, k) >= hi;
    });
    const size_t ns = span_end - i;
    if (ns > 0 && !(Stream(p, np, i, ns, k - 1, 0, items_) &&
                    Stream(i, ns, p, np, k - 1, 0, items_))) {
      return false;
    }
    Item* rest = span_end;
    const size_t nr = ni - ns;
    // Split the points at their median start; each interval goes to the
    // halves it reaches into.
    const size_t half = np / 2;
    std::nth_element(p, p + half, p + np, [&](const Item& a, const Item& b) {
      return Lo(a, k) < Lo(b, k);
    });
    const int32_t mid = Lo(p[half], k);
    Item* left_end = std::partition(rest, rest + nr, [&](const Item& t) {
      return std::max(Lo(t, k) + 1, lo) < std::min(Hi(t, k), mid);
    });
    if (!Stream(p, half, rest, left_end - rest, k, lo, mid)) return false;
    Item* right_end = std::partition(rest, rest + nr, [&](const Item& t) {
      return std::max(Lo(t, k) + 1, mid) < std::min(Hi(t, k), hi);
    });
    return Stream(p + half, np - half, rest, right_end - rest, k, mid, hi);
  }

  // Dim 0, the last: every point starting inside an interval is a pair.
  bool Scan(Item* p, size_t np, Item* i, size_t ni) {
    std::sort(p, p + np, [&](const Item& a, const Item& b) {
      return Lo(a, 0) < Lo(b, 0);
    });
    for (size_t y = 0; y < ni; ++y) {
      const int32_t lo = Lo(i[y], 0);
      const int32_t hi = Hi(i[y], 0);
      Item* it = std::upper_bound(p, p + np, lo, [&](int32_t v, const Item& t) {
        return v < Lo(t, 0);
      });
      for (; it != p + np && Lo(*it, 0) < hi; ++it) {
        if (!Report(*it, i[y]) || !Tick(1)) return false;
      }
    }
    return Tick(np + ni);
  }

  const Access a_;
  const int32_t items_;
  const absl::FunctionRef<bool(uint32_t, uint32_t)> report_;
  const StopCondition& stop_;
  uint64_t steps_ = 0;
  uint64_t next_check_ = kStepsPerCheck;
  absl::Status status_;
};

template <typename Item, typename Access>
absl::Status StreamPairsWith(Access access, absl::Span<const uint32_t> first,
                             absl::Span<const uint32_t> second, bool both_roles,
                             absl::FunctionRef<bool(uint32_t, uint32_t)> report,
                             const StopCondition& stop) {
  std::vector<Item> a, b;
  a.reserve(first.size());
  b.reserve(second.size());
  for (uint32_t t : first) a.push_back(access.Make(t));
  for (uint32_t t : second) b.push_back(access.Make(t));
  PairStream<Item, Access> stream(access, report, stop);
  if (stream.Run(a, b) && both_roles) stream.Run(b, a);
  return stream.status();
}

// Every pair (x from `first`, y from `second`) of items that meet, given
// their ranks on `dims` dims: with `both_roles`, two disjoint sets; else
// one set given twice, each pair reported once. OK, or why `stop` stopped.
absl::Status StreamPairs(size_t dims, size_t items,
                         const std::vector<int32_t>& ranks,
                         absl::Span<const uint32_t> first,
                         absl::Span<const uint32_t> second, bool both_roles,
                         absl::FunctionRef<bool(uint32_t, uint32_t)> report,
                         const StopCondition& stop) {
  switch (dims) {
#define TESSERA_PACKED_CASE(n, N)                                        \
  case n:                                                                \
    return StreamPairsWith<PackedItem<N>>(                               \
        PackedAccess<N>{&ranks, items, dims}, first, second, both_roles, \
        report, stop);
    TESSERA_PACKED_CASE(1, 1)
    TESSERA_PACKED_CASE(2, 2)
    TESSERA_PACKED_CASE(3, 3)
    TESSERA_PACKED_CASE(4, 4)
    TESSERA_PACKED_CASE(5, 8)
    TESSERA_PACKED_CASE(6, 8)
    TESSERA_PACKED_CASE(7, 8)
    TESSERA_PACKED_CASE(8, 8)
#undef TESSERA_PACKED_CASE
    default:
      return StreamPairsWith<uint32_t>(IndirectAccess{&ranks, items, dims},
                                       first, second, both_roles, report, stop);
  }
}

// Items 0..n-1 given by `lo(t, d)` / `hi(t, d)` on `rank` dims: their ranks
// on the dims where they are not all the same interval (the others never
// tell two boxes apart), dim-major: item t's (lo, hi) on the k-th such dim
// at 2 * (k * n + t). Returns the number of such dims.
//
// The dims are ordered by how many starts their intervals hold in all, most
// first: the pair search splits the last dim first, and intervals that hold
// few starts there rarely span a segment and send few pairs down to the
// next dims (on the suffix layout of the benchmark, 5x less work than the
// other order).
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
    // A merge sort: layouts made of a few repeating start patterns drive
    // std::sort into its heap-sort fallback, several times slower.
    std::stable_sort(starts.begin(), starts.end());
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
  std::vector<std::pair<int64_t, size_t>> load(dims);  // (-starts held, k)
  for (size_t k = 0; k < dims; ++k) {
    int64_t held = 0;
    for (size_t t = 0; t < n; ++t) {
      held += (*ranks)[(k * n + t) * 2 + 1] - (*ranks)[(k * n + t) * 2] - 1;
    }
    load[k] = {-held, k};
  }
  std::stable_sort(load.begin(), load.end());
  std::vector<int32_t> ordered(ranks->size());
  for (size_t k = 0; k < dims; ++k) {
    std::copy_n(ranks->begin() + load[k].second * 2 * n, 2 * n,
                ordered.begin() + k * 2 * n);
  }
  *ranks = std::move(ordered);
  return dims;
}

}  // namespace

BoxIndex::BoxIndex(absl::Span<const Box> boxes, Use use) {
  Build(
      boxes.size(), [&](size_t i) -> const Box& { return boxes[i]; }, use);
}

BoxIndex::BoxIndex(size_t count,
                   const std::function<const Box&(size_t)>& box_of, Use use) {
  Build(count, box_of, use);
}

void BoxIndex::Build(size_t count,
                     const std::function<const Box&(size_t)>& box_of, Use use) {
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
    if (end - begin <= kLeafSize || width == 0 || use == Use::kPairsOnly) {
      continue;  // a leaf (with kPairsOnly, the root is the only one)
    }
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
  std::vector<uint32_t> all(m);
  std::iota(all.begin(), all.end(), 0);
  return StreamPairs(dims, m, ranks, all, all, /*both_roles=*/false, report,
                     stop);
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
  return StreamPairs(dims, n, ranks, mine, theirs, /*both_roles=*/true, report,
                     stop);
}

}  // namespace tessera
