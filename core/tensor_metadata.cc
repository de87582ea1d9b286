#include "core/tensor_metadata.h"

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"

namespace tessera {

std::string ShardInfo::PlacementString() const {
  return absl::StrCat("rank:", rank, "/", device.ToString());
}

std::vector<Box> TensorMetadata::Boxes() const {
  std::vector<Box> boxes;
  boxes.reserve(shards.size());
  for (const ShardInfo& s : shards) boxes.push_back(s.box);
  return boxes;
}

int64_t TensorMetadata::NumElements() const { return ElementCount(shape); }

int64_t TensorMetadata::ByteSize() const {
  return NumElements() * static_cast<int64_t>(ItemSize(dtype));
}

std::string TensorMetadata::HandleString(size_t index) const {
  return absl::StrCat(name, "@v", version, "#", shards[index].shard_id);
}

ShardLocation OwnerLocation(const TensorMetadata& meta, size_t index) {
  const ShardInfo& shard = meta.shards[index];
  auto capability = meta.capabilities.find(shard.worker);
  return ShardLocation{
      shard.worker, shard.address, shard.shard_id, shard.available,
      capability == meta.capabilities.end() ? std::string()
                                            : capability->second};
}

std::vector<ShardLocation> ReadLocations(const TensorMetadata& meta,
                                         size_t index) {
  return {OwnerLocation(meta, index)};
}

}  // namespace tessera
