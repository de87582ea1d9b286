#include "core/relay_plan.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;

RelayMember Member(const std::string& name, const std::string& host,
                   const std::string& zone = "", int64_t busy = 0) {
  return RelayMember{name, host, zone, busy};
}

TEST(RelayChunkBytes, AboutA128thClampedToWholeElements) {
  EXPECT_EQ(RelayChunkBytes(int64_t{256} << 20, 4), int64_t{2} << 20);
  EXPECT_EQ(RelayChunkBytes(100, 4), kMinRelayChunkBytes);
  EXPECT_EQ(RelayChunkBytes(int64_t{64} << 30, 2), kMaxRelayChunkBytes);
  EXPECT_EQ(RelayChunkBytes(int64_t{256} << 20, 12) % 12, 0);
}

// The chunks tile the shard exactly, in memory order, each contiguous.
void ExpectTiles(const std::vector<int64_t>& shape, int64_t item,
                 int64_t chunk_bytes) {
  SCOPED_TRACE(
      absl::StrCat("shape rank ", shape.size(), " chunk ", chunk_bytes));
  const std::vector<Box> chunks = RelayChunks(shape, item, chunk_bytes);
  int64_t total = 1;
  for (int64_t s : shape) total *= s;
  int64_t next = 0;  // the next flat element
  for (const Box& chunk : chunks) {
    ASSERT_EQ(chunk.rank(), shape.size());
    EXPECT_LE(chunk.NumElements() * item, std::max(chunk_bytes, item));
    // The chunk's first element, flat, is where the last one ended; its
    // elements are contiguous (a box that varies only in one dimension
    // after dims of size 1, with whole dims inside).
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      flat = flat * shape[d] + chunk.offsets[d];
    }
    EXPECT_EQ(flat, next);
    size_t first_varied = 0;  // dims before it have size 1
    while (first_varied + 1 < shape.size() && chunk.sizes[first_varied] == 1)
      ++first_varied;
    for (size_t d = first_varied + 1; d < shape.size(); ++d) {
      EXPECT_EQ(chunk.sizes[d], shape[d]);
      EXPECT_EQ(chunk.offsets[d], 0);
    }
    next += chunk.NumElements();
  }
  EXPECT_EQ(next, total);
}

TEST(RelayChunks, TileTheShardInMemoryOrder) {
  ExpectTiles({1000}, 4, 1024);
  ExpectTiles({1000, 3, 100}, 4, 4096);
  ExpectTiles({3, 1000000}, 4, 1 << 20);  // rows larger than a chunk
  ExpectTiles({2, 3, 5, 7}, 8, 16);
  ExpectTiles({7}, 4, 1 << 20);  // one chunk
  ExpectTiles({1, 1, 64}, 2, 8);
}

TEST(RelayChunks, ScalarAndEmptyShardsAreOneChunk) {
  EXPECT_EQ(RelayChunks({}, 4, 1 << 20).size(), 1u);
  EXPECT_EQ(RelayChunks({0, 5}, 4, 1 << 20).size(), 1u);
}

TEST(RelayChunks, ManySmallRowsGoTogether) {
  // 1e6 rows of 1200 bytes in 4 MiB chunks: about 287 chunks, not 1e6.
  EXPECT_LT(RelayChunks({1000000, 3, 100}, 4, 4 << 20).size(), 300u);
}

// Every property of a plan, for K destinations over `hosts` hosts.
void ExpectSoundPlan(size_t k, size_t hosts, int64_t chunks) {
  SCOPED_TRACE(absl::StrCat("K=", k, " hosts=", hosts, " chunks=", chunks));
  std::vector<RelayMember> dests;
  for (size_t i = 0; i < k; ++i) {
    const size_t host = (i * 7) % hosts;  // hosts interleaved by name
    dests.push_back(Member(absl::StrCat("w", i), absl::StrCat("h", host),
                           absl::StrCat("z", host % 3),
                           static_cast<int64_t>(i % 4)));
  }
  const RelayMember source = Member("src", "h0", "z0");
  const RelayPlan plan = PlanRelay(source, dests, chunks);
  ASSERT_EQ(plan.order.size(), k);
  ASSERT_EQ(plan.parent.size(), k);
  // A permutation; each parent started before its child.
  std::vector<int> position(k, -1);
  for (size_t j = 0; j < k; ++j) {
    ASSERT_GE(plan.order[j], 0);
    ASSERT_LT(plan.order[j], static_cast<int>(k));
    ASSERT_EQ(position[static_cast<size_t>(plan.order[j])], -1);
    position[static_cast<size_t>(plan.order[j])] = static_cast<int>(j);
  }
  std::map<int, int> children;  // -1: the source
  int max_depth = 0;
  for (size_t i = 0; i < k; ++i) {
    const int parent = plan.parent[i];
    if (parent >= 0) {
      EXPECT_LT(position[static_cast<size_t>(parent)], position[i]);
    }
    ++children[parent];
    int depth = 1;
    for (int p = parent; p >= 0; p = plan.parent[static_cast<size_t>(p)]) {
      ++depth;
      ASSERT_LE(depth, static_cast<int>(k));  // no cycle
    }
    max_depth = std::max(max_depth, depth);
  }
  // No worker sends a shard more than twice (a chain: once).
  for (const auto& [who, count] : children) {
    EXPECT_LE(count, plan.tree ? 2 : 1) << "member " << who;
  }
  if (k > 0) {
    EXPECT_GE(children[-1], 1);
  }
  // A chain is K deep; a tree about log2 K; the plan is never deeper than
  // the chunks can fill plus the tree's depth.
  if (!plan.tree) {
    EXPECT_EQ(max_depth, static_cast<int>(k));
  } else {
    EXPECT_LE(max_depth, 7);  // K <= 64 over 2, 4, 8, ... per level
  }
  EXPECT_LE(static_cast<int64_t>(max_depth) - 1,
            std::max<int64_t>(chunks, 1) + 2 * 6);
  // Each host's members are consecutive in the order, the source's first.
  std::set<std::string> closed;
  std::string current;
  for (size_t j = 0; j < k; ++j) {
    const std::string& host = dests[static_cast<size_t>(plan.order[j])].host;
    if (host == current) continue;
    EXPECT_EQ(closed.count(host), 0u) << host << " split";
    if (!current.empty()) closed.insert(current);
    current = host;
  }
  const bool source_host_used =
      std::any_of(dests.begin(), dests.end(),
                  [](const RelayMember& m) { return m.host == "h0"; });
  if (source_host_used) {
    EXPECT_EQ(dests[static_cast<size_t>(plan.order[0])].host, "h0");
  }
}

TEST(PlanRelay, SoundForEveryKUpTo64) {
  for (size_t k = 1; k <= 64; ++k) {
    for (size_t hosts : {size_t{1}, size_t{4}, k}) {
      for (int64_t chunks : {1, 8, 64, 256}) ExpectSoundPlan(k, hosts, chunks);
    }
  }
}

TEST(PlanRelay, AChainWhileTheChunksOutnumberTheHops) {
  std::vector<RelayMember> dests;
  for (int i = 0; i < 8; ++i) {
    dests.push_back(Member(absl::StrCat("w", i), absl::StrCat("h", i)));
  }
  const RelayPlan chain = PlanRelay(Member("s", "hs"), dests, 64);
  EXPECT_FALSE(chain.tree);
  // One chunk and 64 hops: a tree.
  std::vector<RelayMember> many;
  for (int i = 0; i < 64; ++i) {
    many.push_back(Member(absl::StrCat("w", i), absl::StrCat("h", i)));
  }
  EXPECT_TRUE(PlanRelay(Member("s", "hs"), many, 1).tree);
}

TEST(PlanRelay, KeepsHostsAndZonesTogetherSourceFirstBusyLater) {
  // Zone a holds the source's host; zone b another.
  const std::vector<RelayMember> dests = {Member("b1", "hb", "b"),
                                          Member("a2", "ha2", "a"),
                                          Member("s1", "hs", "a", /*busy=*/3),
                                          Member("s0", "hs", "a"),
                                          Member("a1", "ha1", "a"),
                                          Member("b0", "hb", "b")};
  const RelayPlan plan = PlanRelay(Member("src", "hs", "a"), dests, 64);
  std::vector<std::string> names;
  for (int i : plan.order) names.push_back(dests[static_cast<size_t>(i)].name);
  EXPECT_THAT(names, ElementsAre("s0", "s1", "a1", "a2", "b0", "b1"));
  // A chain: s0 pulls from the source, each next from the one before.
  EXPECT_EQ(plan.parent[3], -1);
  EXPECT_EQ(plan.parent[2], 3);
  EXPECT_EQ(plan.parent[4], 2);
}

TEST(AddressHost, HostPartOfAnAddress) {
  EXPECT_EQ(AddressHost("10.0.0.1:5000"), "10.0.0.1");
  EXPECT_EQ(AddressHost("[::1]:5000"), "::1");
  EXPECT_EQ(AddressHost("node-a"), "node-a");
}

}  // namespace
}  // namespace tessera
