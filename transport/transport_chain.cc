#include "transport/transport_chain.h"

#include <utility>

#include "rpc/channel.h"
#include "transport/grpc_transport.h"
#include "transport/shared_memory.h"

namespace tessera {

TransportChain::TransportChain(std::vector<Link> links) {
  links_.reserve(links.size());
  for (Link& link : links) {
    auto counted = std::make_unique<Counted>();
    counted->link = std::move(link);
    links_.push_back(std::move(counted));
  }
}

std::unique_ptr<TransportChain> TransportChain::Make(
    ChannelCache* channels, const DataPlaneOptions& options) {
  std::vector<Link> links;
  if (options.shared_memory) {
    SharedMemoryTransportOptions shm;
    shm.timeout = options.timeout;
    shm.cache_mappings = options.cache_mappings;
    links.push_back(
        Link{std::make_unique<SharedMemoryTransport>(channels, shm),
             options.shared_memory_min_bytes});
  }
  GrpcTransportOptions grpc;
  grpc.timeout = options.timeout;
  links.push_back(Link{std::make_unique<GrpcTransport>(channels, grpc), 0});
  return std::make_unique<TransportChain>(std::move(links));
}

const std::string& TransportChain::name() const {
  static const std::string* name = new std::string("chain");
  return *name;
}

template <typename Op>
absl::Status TransportChain::Run(int64_t bytes, const Op& op, bool by_size) {
  absl::Status status = absl::FailedPreconditionError(
      "no transport of this data plane can move these bytes");
  for (size_t i = 0; i < links_.size(); ++i) {
    Counted& c = *links_[i];
    if (by_size && bytes < c.link.min_bytes) continue;
    status = op(*c.link.transport);
    if (status.ok()) {
      c.bytes.fetch_add(bytes, std::memory_order_relaxed);
      return status;
    }
    if (!absl::IsFailedPrecondition(status) || i + 1 == links_.size())
      return status;
    c.fallbacks.fetch_add(1, std::memory_order_relaxed);
  }
  return status;
}

absl::Status TransportChain::Read(const RemoteShard& shard, const Box& box,
                                  const ReadTarget& target) {
  return Run(box.NumElements() * shard.item_bytes,
             [&](ShardTransport& t) { return t.Read(shard, box, target); });
}

absl::Status TransportChain::Write(const RemoteShard& shard,
                                   const WriteSource& source) {
  return Run(WholeBox(shard.shape).NumElements() * shard.item_bytes,
             [&](ShardTransport& t) { return t.Write(shard, source); });
}

absl::Status TransportChain::ReadRows(absl::Span<const ShardRows> entries,
                                      const RowSink& sink) {
  int64_t bytes = 0;
  for (const ShardRows& entry : entries) {
    bytes += static_cast<int64_t>(entry.rows.size()) *
             RowBytes(entry.shard.shape, entry.shard.item_bytes);
  }
  return Run(
      bytes, [&](ShardTransport& t) { return t.ReadRows(entries, sink); },
      /*by_size=*/false);
}

absl::Status TransportChain::WriteBox(const RemoteShard& shard, const Box& box,
                                      const WriteSource& source) {
  return Run(box.NumElements() * shard.item_bytes, [&](ShardTransport& t) {
    return t.WriteBox(shard, box, source);
  });
}

DataPlaneStats TransportChain::Stats() const {
  DataPlaneStats stats;
  for (const auto& c : links_) {
    const std::string& name = c->link.transport->name();
    stats.bytes[name] += c->bytes.load(std::memory_order_relaxed);
    stats.fallbacks[name] += c->fallbacks.load(std::memory_order_relaxed);
  }
  return stats;
}

}  // namespace tessera
