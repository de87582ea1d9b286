#include "core/relay_plan.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace tessera {

int64_t RelayChunkBytes(int64_t bytes, int64_t item) {
  item = std::max<int64_t>(item, 1);
  int64_t chunk = (bytes + kRelayChunksPerShard - 1) / kRelayChunksPerShard;
  chunk = std::clamp(chunk, kMinRelayChunkBytes, kMaxRelayChunkBytes);
  return std::max(item, chunk / item * item);
}

std::vector<Box> RelayChunks(absl::Span<const int64_t> shape, int64_t item,
                             int64_t chunk_bytes) {
  const size_t rank = shape.size();
  std::vector<Box> chunks;
  const Box whole = WholeBox(shape);
  if (rank == 0 || whole.NumElements() == 0) {
    chunks.push_back(whole);
    return chunks;
  }
  // The outermost dimension one index of which fits a chunk.
  std::vector<int64_t> inner(rank);  // bytes of one index along dim d
  int64_t bytes = std::max<int64_t>(item, 1);
  for (size_t d = rank; d-- > 0;) {
    inner[d] = bytes;
    bytes *= shape[d];
  }
  size_t split = rank - 1;
  for (size_t d = 0; d < rank; ++d) {
    if (inner[d] <= chunk_bytes) {
      split = d;
      break;
    }
  }
  const int64_t per = std::max<int64_t>(1, chunk_bytes / inner[split]);
  int64_t outer = 1;
  for (size_t d = 0; d < split; ++d) outer *= shape[d];
  for (int64_t o = 0; o < outer; ++o) {
    std::vector<int64_t> offsets(rank, 0);
    std::vector<int64_t> sizes(shape.begin(), shape.end());
    int64_t rest = o;
    for (size_t d = split; d-- > 0;) {
      offsets[d] = rest % shape[d];
      rest /= shape[d];
      sizes[d] = 1;
    }
    for (int64_t start = 0; start < shape[split]; start += per) {
      offsets[split] = start;
      sizes[split] = std::min(per, shape[split] - start);
      chunks.emplace_back(absl::Span<const int64_t>(offsets),
                          absl::Span<const int64_t>(sizes));
    }
  }
  return chunks;
}

std::string AddressHost(absl::string_view address) {
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close != absl::string_view::npos) {
      return std::string(address.substr(1, close - 1));
    }
  }
  const size_t colon = address.rfind(':');
  return std::string(
      colon == absl::string_view::npos ? address : address.substr(0, colon));
}

namespace {

int TreeDepth(size_t k) {  // levels below the source of a K-node tree
  int depth = 0;
  for (size_t level = 2, filled = 0; filled < k; level *= 2) {
    filled += level;
    ++depth;
  }
  return depth;
}

}  // namespace

RelayPlan PlanRelay(const RelayMember& source,
                    const std::vector<RelayMember>& destinations,
                    int64_t chunks) {
  const size_t k = destinations.size();
  auto zone_of = [](const RelayMember& m) {
    return m.zone.empty() ? m.host : m.zone;
  };
  // Each zone and host ranks by its least busy member (then name); the
  // source's own come first.
  std::map<std::string, std::pair<int64_t, std::string>> zone_rank, host_rank;
  for (const RelayMember& m : destinations) {
    const std::pair<int64_t, std::string> mine{m.busy, m.name};
    auto keep_least = [&](auto& ranks, const std::string& key) {
      auto [it, added] = ranks.emplace(key, mine);
      if (!added) it->second = std::min(it->second, mine);
    };
    keep_least(zone_rank, zone_of(m));
    keep_least(host_rank, m.host);
  }
  std::vector<int> order(k);
  for (size_t i = 0; i < k; ++i) order[i] = static_cast<int>(i);
  auto key = [&](int i) {
    const RelayMember& m = destinations[static_cast<size_t>(i)];
    const std::string zone = zone_of(m);
    return std::make_tuple(zone != zone_of(source), zone_rank[zone], zone,
                           m.host != source.host, host_rank[m.host], m.host,
                           m.busy, m.name, i);
  };
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return key(a) < key(b); });
  RelayPlan plan;
  plan.order = order;
  plan.parent.assign(k, -1);
  const int64_t chain_time = static_cast<int64_t>(k) - 1;
  const int64_t tree_time =
      std::max<int64_t>(chunks, 1) + 2 * static_cast<int64_t>(TreeDepth(k));
  plan.tree = k > 2 && chain_time > tree_time;
  for (size_t j = 1; j < k; ++j) {
    const size_t parent_slot = plan.tree ? (j < 2 ? k : (j - 2) / 2) : j - 1;
    if (parent_slot < k) {
      plan.parent[static_cast<size_t>(order[j])] = order[parent_slot];
    }
  }
  return plan;
}

}  // namespace tessera
