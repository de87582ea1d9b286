// BoxIndex: a static spatial index over the shard boxes of one tensor, for
// the three questions the planners ask: which boxes meet this box (region
// planning), which pairs of one set meet (overlap validation), and which
// pairs of two sets meet (reshard planning). Bounded for every input, not
// only for friendly layouts:
//
//  * one query: a k-d tree over the boxes seen as points (lo, hi) in 2*rank
//    dims, median splits in turn on every coordinate: O(n^(1-1/(2r)) + k)
//    in the worst case, O(log n + k) for grids and chunked layouts;
//  * all meeting pairs: the streamed segment tree of Zomorodian and
//    Edelsbrunner ("Fast software for box intersections", 2002) over the
//    boxes' ranks: O(n log^r n + k) time and O(n) memory, whatever the
//    boxes, and it stops at the first pair when asked to.
//
// Boxes are half-open; empty boxes (some size <= 0) are not indexed and meet
// nothing. REQUIRES: offset + size fits in int64 on every dim of every box
// and query (true of boxes validated against a shape), and fewer than 2^31
// boxes. Immutable once built: safe to query from many threads at once.
#ifndef TESSERA_CORE_BOX_INDEX_H_
#define TESSERA_CORE_BOX_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/stop.h"  // StopCondition, polled by long queries

namespace tessera {

class BoxIndex {
 public:
  // What the index will be asked. kPairsOnly skips building the k-d tree
  // (a third of the build time); ForEachIntersecting then looks at every box.
  enum class Use { kQueriesAndPairs, kPairsOnly };

  // Indexes the non-empty ones among `boxes`, which should all have one
  // rank (a non-empty box of another rank than the first non-empty one is
  // left out). Indices in answers are positions in `boxes`. O(n log n).
  explicit BoxIndex(absl::Span<const Box> boxes,
                    Use use = Use::kQueriesAndPairs);
  // The same for `count` boxes that `box_of(i)` returns.
  BoxIndex(size_t count, const std::function<const Box&(size_t)>& box_of,
           Use use = Use::kQueriesAndPairs);

  BoxIndex(BoxIndex&&) = default;
  BoxIndex& operator=(BoxIndex&&) = default;

  // The rank of the indexed boxes (0 when none is indexed).
  size_t rank() const { return rank_; }
  // The number of boxes given, empty ones included.
  size_t size() const { return size_; }
  // The number of non-empty boxes indexed.
  size_t indexed() const { return ids_.size(); }

  // Calls `fn(i)` for every indexed box i that shares an element with
  // `query`, in no particular order, until `fn` returns false. Returns false
  // when `fn` stopped it. A query of another rank meets nothing.
  bool ForEachIntersecting(const Box& query,
                           absl::FunctionRef<bool(size_t)> fn) const;

  // The indices of the boxes meeting `query`, ascending.
  std::vector<size_t> Intersecting(const Box& query) const;

  // Calls `fn(i, j)` with i < j once for every pair of indexed boxes that
  // share an element, until `fn` returns false. OK when done or stopped by
  // `fn`; CANCELLED or DEADLINE_EXCEEDED when `stop` says so.
  absl::Status ForEachIntersectingPair(
      absl::FunctionRef<bool(size_t, size_t)> fn,
      const StopCondition& stop = {}) const;

  // Calls `fn(i, j)` once for every box i of this index and box j of
  // `other` that share an element (nothing when the ranks differ), until
  // `fn` returns false. Status as above.
  absl::Status ForEachIntersectingPair(
      const BoxIndex& other, absl::FunctionRef<bool(size_t, size_t)> fn,
      const StopCondition& stop = {}) const;

 private:
  struct Node {
    uint32_t begin = 0, end = 0;  // items [begin, end) in k-d order
    int32_t left = -1;            // children left, left + 1; -1: a leaf
  };

  void Build(size_t count, const std::function<const Box&(size_t)>& box_of,
             Use use);
  int64_t Lo(size_t item, size_t d) const {
    return coords_[item * 2 * rank_ + 2 * d];
  }
  int64_t Hi(size_t item, size_t d) const {
    return coords_[item * 2 * rank_ + 2 * d + 1];
  }
  bool Visit(size_t node, const Box& query,
             absl::FunctionRef<bool(size_t)> fn) const;

  size_t rank_ = 0;
  size_t size_ = 0;
  std::vector<uint32_t> ids_;    // item -> index in the boxes given
  std::vector<int64_t> coords_;  // item -> (lo, hi) per dim
  std::vector<Node> nodes_;      // nodes_[0] is the root
  // Per node and dim: min lo, max lo, min hi, max hi of its items.
  std::vector<int64_t> bounds_;
};

}  // namespace tessera

#endif  // TESSERA_CORE_BOX_INDEX_H_
