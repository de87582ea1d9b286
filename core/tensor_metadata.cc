#include "core/tensor_metadata.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"

namespace tessera {

std::string Replica::PlacementString() const {
  return absl::StrCat("rank:", rank, "/", device.ToString());
}

absl::Status CheckFileOrigin(const FileOrigin& origin) {
  if (origin.entry < 0 || origin.entry > kMaxOriginEntry) {
    return absl::InvalidArgumentError(absl::StrCat(
        "origin.entry ", origin.entry, " is not from 0 to ", kMaxOriginEntry));
  }
  if (static_cast<int64_t>(origin.metadata.size()) > kMaxOriginPairs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "origin.metadata: ", origin.metadata.size(),
        " pairs are more than a tensor keeps (", kMaxOriginPairs, ")"));
  }
  int64_t bytes = 0;
  for (const auto& [key, value] : origin.metadata) {
    bytes += static_cast<int64_t>(key.size() + value.size());
  }
  if (bytes > kMaxOriginBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("origin.metadata: ", bytes,
                     " bytes of keys and values are more than a tensor keeps (",
                     kMaxOriginBytes, ")"));
  }
  return absl::OkStatus();
}

const Replica& NoReplica() {
  // A shard without replicas (never made by the coordinator or accepted
  // from the wire) shows as held nowhere rather than crash its reader.
  static const Replica* const kNowhere = [] {
    auto* r = new Replica;
    r->available = false;
    return r;
  }();
  return *kNowhere;
}

std::vector<Box> TensorMetadata::Boxes() const {
  std::vector<Box> boxes;
  boxes.reserve(shards.size());
  for (const ShardInfo& s : shards) boxes.push_back(s.box);
  return boxes;
}

int64_t TensorMetadata::NumElements() const { return ElementCount(shape); }

int64_t HeldBytes(const TensorMetadata& meta) {
  const int64_t item = static_cast<int64_t>(ItemSize(meta.dtype));
  int64_t bytes = 0;
  for (const ShardInfo& shard : meta.shards) {
    bytes += shard.box.NumElements() * item *
             static_cast<int64_t>(shard.replicas.size());
  }
  return bytes;
}

int64_t TensorMetadata::ByteSize() const {
  return NumElements() * static_cast<int64_t>(ItemSize(dtype));
}

std::string TensorMetadata::HandleString(size_t index) const {
  return absl::StrCat(name, "@v", version, "#",
                      ShownReplica(shards[index]).shard_id);
}

namespace {

ShardLocation LocationOf(const TensorMetadata& meta, size_t index,
                         size_t replica) {
  const Replica& r = meta.shards[index].replicas[replica];
  ShardLocation location;
  location.replica = replica;
  location.worker = r.worker;
  location.address = r.address;
  location.shard_id = r.shard_id;
  location.available = r.available;
  if (!meta.capabilities.empty()) {
    auto capability = meta.capabilities.find(r.worker);
    if (capability != meta.capabilities.end())
      location.capability = capability->second;
  }
  return location;
}

}  // namespace

ShardLocations ReadLocations(const TensorMetadata& meta, size_t index) {
  const Replicas& replicas = meta.shards[index].replicas;
  ShardLocations out;
  out.reserve(replicas.size());
  for (size_t r = 0; r < replicas.size(); ++r) {
    if (replicas[r].available) out.push_back(LocationOf(meta, index, r));
  }
  for (size_t r = 0; r < replicas.size(); ++r) {
    if (!replicas[r].available) out.push_back(LocationOf(meta, index, r));
  }
  return out;
}

void NearestFirst(
    ShardLocations* locations,
    const std::function<ReplicaNearness(const ShardLocation&)>& nearness) {
  size_t available = 0;
  while (available < locations->size() && (*locations)[available].available)
    ++available;
  if (available < 2) return;
  absl::InlinedVector<std::pair<ReplicaNearness, size_t>, 4> order;
  for (size_t i = 0; i < available; ++i)
    order.emplace_back(nearness((*locations)[i]), i);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) {
                     const ReplicaNearness& x = a.first;
                     const ReplicaNearness& y = b.first;
                     if (x.same_host != y.same_host) return x.same_host;
                     if (x.same_zone != y.same_zone) return x.same_zone;
                     return x.bytes_in_flight < y.bytes_in_flight;
                   });
  ShardLocations sorted;
  sorted.reserve(locations->size());
  for (const auto& [near, i] : order) sorted.push_back((*locations)[i]);
  for (size_t i = available; i < locations->size(); ++i)
    sorted.push_back((*locations)[i]);
  *locations = std::move(sorted);
}

ShardLocations WriteLocations(const TensorMetadata& meta, size_t index) {
  ShardLocations out;
  if (!meta.shards[index].replicas.empty())
    out.push_back(LocationOf(meta, index, 0));
  return out;
}

int64_t ReplicaCount(const TensorMetadata& meta) {
  if (meta.shards.empty()) return 1;
  const ShardInfo& first = meta.shards.front();
  return static_cast<int64_t>(first.replicas.size() - MirrorCount(first));
}

}  // namespace tessera
