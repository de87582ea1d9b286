// TensorMetadata: the global metadata of one version of a sharded tensor, as
// the coordinator keeps it and clients see it (PyTorch's
// ShardedTensorMetadata plus name, version and where each shard lives).
// A plain value type; not synchronized.
#ifndef TESSERA_CORE_TENSOR_METADATA_H_
#define TESSERA_CORE_TENSOR_METADATA_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/placement.h"

namespace tessera {

// One shard: its box in the tensor, the worker and device holding it, and
// the id of its memory on that worker (the RRef-like handle).
struct ShardInfo {
  Box box;
  int32_t rank = 0;
  Device device;
  std::string worker;   // worker name
  std::string address;  // worker's gRPC address
  uint64_t shard_id = 0;
  bool available = true;  // false when the worker is dead or lost the shard

  // "rank:N/DEVICE".
  std::string PlacementString() const;
};

struct TensorMetadata {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  bool requires_grad = false;
  bool pin_memory = false;
  uint64_t version = 1;
  // Which tensor of this name: drawn at create, kept by every version, so
  // a grant for a deleted tensor never reaches a later one of its name
  // (0: a tensor recorded before incarnations).
  uint64_t incarnation = 0;
  // The put or update that made this version, while it can be committed
  // or abandoned (0: none). Its write grants name it; commit and abandon
  // must. Issued with the reply that starts it; never stored.
  uint64_t change = 0;
  std::vector<ShardInfo> shards;  // in the order the spec gave them
  // What the holder of this copy may do on each worker (worker name ->
  // signed capability, core/capability.h). Issued by the coordinator with
  // each reply; never stored.
  std::map<std::string, std::string> capabilities;
  // A change of the tensor not committed yet, in words (a describe's
  // reply); never stored.
  std::string pending;

  std::vector<Box> Boxes() const;
  int64_t NumElements() const;  // assumes a validated shape
  int64_t ByteSize() const;     // assumes a validated shape
  // Printable handle of shard `index`: "NAME@vVERSION#SHARD_ID".
  std::string HandleString(size_t index) const;
};

// Where a shard's bytes can be read: a worker, its address, and the id of
// the shard's memory there.
struct ShardLocation {
  std::string worker;
  std::string address;
  uint64_t shard_id = 0;
  bool available = true;
  std::string capability;  // presented to the worker with each call
};

// Every place shard `index` of `meta` can be read from, best first. Today a
// shard has one owner; replicas will add entries here, and every reader
// goes through this function.
std::vector<ShardLocation> ReadLocations(const TensorMetadata& meta,
                                         size_t index);
// Where shard `index` of `meta` is written: its owner, with the capability
// the metadata carries for it.
ShardLocation OwnerLocation(const TensorMetadata& meta, size_t index);

}  // namespace tessera

#endif  // TESSERA_CORE_TENSOR_METADATA_H_
