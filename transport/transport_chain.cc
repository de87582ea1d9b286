#include "transport/transport_chain.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/channel.h"
#include "transport/grpc_transport.h"
#include "transport/shared_memory.h"
#include "transport/tcp_transport.h"
#include "transport/ucx_common.h"
#include "transport/ucx_transport.h"

namespace tessera {

absl::Status CheckTransportName(const std::string& name) {
  if (name == "auto" || name == "shm" || name == "ucx" || name == "tcp" ||
      name == "grpc") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown transport '", name, "': use auto, shm, ucx, tcp or grpc"));
}

TransportChain::TransportChain(std::vector<Link> links, bool forced)
    : forced_(forced) {
  links_.reserve(links.size());
  for (Link& link : links) {
    auto counted = std::make_unique<Counted>();
    counted->link = std::move(link);
    links_.push_back(std::move(counted));
  }
}

std::unique_ptr<TransportChain> TransportChain::Make(
    ChannelCache* channels, const DataPlaneOptions& options) {
  const std::string& choice =
      CheckTransportName(options.transport).ok() ? options.transport : "auto";
  const bool automatic = choice == "auto";
  std::vector<Link> links;
  if (choice == "shm" || (automatic && options.shared_memory)) {
    SharedMemoryTransportOptions shm;
    shm.timeout = options.timeout;
    shm.cache_mappings = options.cache_mappings;
    shm.keep_segment_bytes = options.keep_segment_bytes;
    links.push_back(Link{std::make_unique<SharedMemoryTransport>(channels, shm),
                         automatic ? options.shared_memory_min_bytes : 0});
  }
  // UCX bytes would travel outside the channels' TLS: only when asked for.
  const bool tls = channels != nullptr && channels->options().credentials;
  const bool trusted =
      options.ucx_trusted_fabric || TrustedFabricByEnvironment();
  if (choice == "ucx" || (automatic && options.ucx && (!tls || trusted) &&
                          UcxAllowedByEnvironment())) {
    UcxTransportOptions ucx;
    ucx.timeout = options.timeout;
    ucx.trusted_fabric = trusted;
    links.push_back(Link{std::make_unique<UcxTransport>(channels, ucx), 0,
                         automatic ? options.ucx_min_write_bytes : 0});
  }
  // Workers' data ports: never plaintext under channels that run TLS.
  if (choice == "tcp" ||
      (automatic && options.tcp && (!tls || options.tcp_tls != nullptr))) {
    TcpTransportOptions tcp;
    tcp.timeout = std::min(options.timeout, absl::Minutes(1));
    tcp.tls = options.tcp_tls;
    links.push_back(Link{std::make_unique<TcpTransport>(channels, tcp), 0});
  }
  if (choice == "grpc" || automatic) {
    GrpcTransportOptions grpc;
    grpc.timeout = options.timeout;
    links.push_back(Link{std::make_unique<GrpcTransport>(channels, grpc), 0});
  }
  return std::make_unique<TransportChain>(std::move(links), !automatic);
}

const std::string& TransportChain::name() const {
  static const std::string* name = new std::string("chain");
  return *name;
}

template <typename Op>
absl::Status TransportChain::Run(const RemoteShard& shard, int64_t bytes,
                                 const Op& op, bool by_size, bool write) {
  absl::Status status = absl::FailedPreconditionError(
      "no transport of this data plane can move these bytes");
  for (size_t i = 0; i < links_.size(); ++i) {
    Counted& c = *links_[i];
    if (by_size && bytes < c.link.min_bytes) continue;
    if (write && bytes < c.link.min_write_bytes) continue;
    status = op(*c.link.transport);
    if (status.ok()) {
      c.bytes.fetch_add(bytes, std::memory_order_relaxed);
      return status;
    }
    if (!absl::IsFailedPrecondition(status) || i + 1 == links_.size()) break;
    c.fallbacks.fetch_add(1, std::memory_order_relaxed);
  }
  if (forced_ && !links_.empty() &&
      (absl::IsFailedPrecondition(status) || absl::IsUnavailable(status))) {
    // The user named the transport: say which one could not, and where.
    return absl::Status(
        status.code(),
        absl::StrCat("the ", links_.front()->link.transport->name(),
                     " transport cannot reach worker ", shard.location.worker,
                     " (", shard.location.address, "): ", status.message()));
  }
  return status;
}

absl::Status TransportChain::Read(const RemoteShard& shard, const Box& box,
                                  const ReadTarget& target) {
  const int64_t bytes = box.NumElements() * shard.item_bytes;
  const ReadTarget counted = target.CountingInto(&landed_);
  return CountRead(shard, bytes, [&] {
    return Run(shard, bytes,
               [&](ShardTransport& t) { return t.Read(shard, box, counted); });
  });
}

absl::Status TransportChain::CountRead(
    const RemoteShard& shard, int64_t bytes,
    const std::function<absl::Status()>& op) {
  const std::string address = shard.location.address;
  {
    absl::MutexLock lock(&mu_);
    in_flight_[address] += bytes;
  }
  absl::Status status = op();
  absl::MutexLock lock(&mu_);
  // Never erase end() (undefined behaviour). A relay hop was seen spinning
  // at 100 % CPU in this erase: the map was already corrupt, by a cause
  // not yet found (every access here holds mu_ and adds what it takes).
  auto it = in_flight_.find(address);
  if (it != in_flight_.end() && (it->second -= bytes) <= 0) {
    in_flight_.erase(it);
  }
  if (status.ok() && bytes > 0) served_[shard.location.worker] += bytes;
  return status;
}

int64_t TransportChain::InFlight(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(address);
  return it == in_flight_.end() ? 0 : it->second;
}

absl::Status TransportChain::Write(const RemoteShard& shard,
                                   const WriteSource& source) {
  WriteSource counted = source;
  counted.sent = source.sent.With(&sent_);
  return Run(
      shard, WholeBox(shard.shape).NumElements() * shard.item_bytes,
      [&](ShardTransport& t) { return t.Write(shard, counted); },
      /*by_size=*/true, /*write=*/true);
}

absl::Status TransportChain::ReadRows(absl::Span<const ShardRows> entries,
                                      const RowSink& sink) {
  int64_t bytes = 0;
  for (const ShardRows& entry : entries) {
    bytes += static_cast<int64_t>(entry.rows.size()) *
             RowBytes(entry.shard.shape, entry.shard.item_bytes);
  }
  const RemoteShard none;
  const RemoteShard& first = entries.empty() ? none : entries.front().shard;
  absl::Status status = CountRead(first, bytes, [&] {
    return Run(
        first, bytes,
        [&](ShardTransport& t) { return t.ReadRows(entries, sink); },
        /*by_size=*/false);
  });
  // Rows land through the caller's sink: counted once all have.
  if (status.ok()) landed_.fetch_add(bytes, std::memory_order_relaxed);
  return status;
}

absl::Status TransportChain::WriteBox(const RemoteShard& shard, const Box& box,
                                      const WriteSource& source) {
  const int64_t bytes = box.NumElements() * shard.item_bytes;
  absl::Status status = Run(shard, bytes, [&](ShardTransport& t) {
    return t.WriteBox(shard, box, source);
  });
  // A region's bytes are counted once the worker has taken them all.
  if (status.ok()) sent_.fetch_add(bytes, std::memory_order_relaxed);
  return status;
}

DataPlaneStats TransportChain::Stats() const {
  DataPlaneStats stats;
  for (const auto& c : links_) {
    const std::string& name = c->link.transport->name();
    stats.bytes[name] += c->bytes.load(std::memory_order_relaxed);
    stats.fallbacks[name] += c->fallbacks.load(std::memory_order_relaxed);
  }
  stats.landed = landed_.load(std::memory_order_relaxed);
  stats.sent = sent_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  stats.served = served_;
  return stats;
}

}  // namespace tessera
