// TensorMetadata: the global metadata of one version of a sharded tensor, as
// the coordinator keeps it and clients see it (PyTorch's
// ShardedTensorMetadata plus name, version and where each shard lives).
// A plain value type; not synchronized.
#ifndef TESSERA_CORE_TENSOR_METADATA_H_
#define TESSERA_CORE_TENSOR_METADATA_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/placement.h"

namespace tessera {

// One copy of a shard's bytes: the worker and device holding it and the id
// of its memory there. Each replica has an id of its own (ids are unique
// across the cluster, so a worker never sees two copies under one id).
struct Replica {
  int32_t rank = 0;  // the worker's rank
  Device device;
  bool available = true;  // false when the worker is dead or lost this copy
  std::string worker;     // worker name
  std::string address;    // worker's gRPC address
  uint64_t shard_id = 0;
  // A mirror copy (CLI.md "Mirrors (v4)"): kept on a worker of the
  // tensor's mirror group, listed after the shard's R replicas, never
  // repaired elsewhere.
  bool mirror = false;

  // "rank:N/DEVICE".
  std::string PlacementString() const;

  friend bool operator==(const Replica& a, const Replica& b) {
    return a.rank == b.rank && a.device == b.device && a.worker == b.worker &&
           a.address == b.address && a.shard_id == b.shard_id &&
           a.available == b.available && a.mirror == b.mirror;
  }
  friend bool operator!=(const Replica& a, const Replica& b) {
    return !(a == b);
  }
};

// A shard's replicas. One replica is held inline: a shard of one replica
// (every shard today) costs no allocation of its own.
using Replicas = absl::InlinedVector<Replica, 1>;

// One shard: its box in the tensor and the replicas holding its bytes.
// `replicas` is never empty in metadata the coordinator made or a
// conversion accepted; replicas[0] is the one the spec's placement named.
// Which replica a read or a write uses is decided only by ReadLocations
// and WriteLocations below; code that keeps books per worker (allocate,
// free, seal, capacity, reconcile, grants) visits every replica.
struct ShardInfo {
  Box box;
  Replicas replicas;
};

// What ShownReplica gives for a shard without replicas (which no valid
// metadata has): an unavailable replica on no worker.
const Replica& NoReplica();

// The replica a shard is shown as where one worker per shard is shown
// (describe's placement, worker, handle and availability; the wire's
// one-owner fields): the first available one, else the first.
inline const Replica& ShownReplica(const ShardInfo& shard) {
  for (const Replica& replica : shard.replicas) {
    if (replica.available) return replica;
  }
  return shard.replicas.empty() ? NoReplica() : shard.replicas.front();
}

// Where a tensor imported from a safetensors file came from, so that an
// export gives the file back as it was: the file's "__metadata__" (in its
// order) and the entry's place among the file's entries.
struct FileOrigin {
  std::vector<std::pair<std::string, std::string>> metadata;
  int64_t entry = 0;  // 1-based place in the file's data order; 0: none
  // The entry was 0-d: tessera tensors have at least one dim, so it is kept
  // as shape [1] and an export writes it back as 0-d.
  bool scalar = false;

  bool operator==(const FileOrigin& other) const {
    return metadata == other.metadata && entry == other.entry &&
           scalar == other.scalar;
  }
};

// Bounds of a FileOrigin (from a client, a peer or a stored record): at
// most kMaxOriginPairs pairs of kMaxOriginBytes in all, entry from 0 to
// kMaxOriginEntry. INVALID_ARGUMENT naming what is past its bound.
inline constexpr int64_t kMaxOriginPairs = 1024;
inline constexpr int64_t kMaxOriginBytes = int64_t{64} << 10;
inline constexpr int64_t kMaxOriginEntry = int64_t{1} << 20;
absl::Status CheckFileOrigin(const FileOrigin& origin);

// Longest principal name an owner field may hold (a token name, a
// certificate's CN).
inline constexpr size_t kMaxOwnerBytes = 1024;  // = kMaxPrincipalBytes

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
  // What a safetensors import recorded (kept by every version).
  FileOrigin origin;
  // The principal that created the tensor (kept by every version): its
  // bytes count against that principal's quota. Empty: no one (created
  // without tokens or client certificates, or before owners were kept).
  std::string owner;
  // The mirror group (a core/labels LabelSelector's text, kept by every
  // version until a reshard changes it): every shard has a mirror copy on
  // each ready worker that matches. Empty: none.
  std::string mirror;
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
  // Printable handle of shard `index`: "NAME@vVERSION#SHARD_ID", the id
  // being its shown replica's.
  std::string HandleString(size_t index) const;
};

// The bytes every replica of every shard `meta` lists takes (what a
// tensor, or a set of new shards, holds in worker memory).
int64_t HeldBytes(const TensorMetadata& meta);

// Where a read or write of a shard's bytes goes: one replica, with what a
// transport needs to reach it.
struct ShardLocation {
  size_t replica = 0;  // index into the shard's replicas
  std::string worker;
  std::string address;
  uint64_t shard_id = 0;
  bool available = true;
  std::string capability;  // presented to the worker with each call
};
// One location inline: a shard of one replica costs no allocation.
using ShardLocations = absl::InlinedVector<ShardLocation, 1>;

// The rule for reads: every replica shard `index` of `meta` can be read
// from, best first — its available replicas in replica order, then the
// unavailable ones (so a caller that finds none available can name them).
// Every reader (clients, device readers, a reshard's sources) goes
// through this function.
ShardLocations ReadLocations(const TensorMetadata& meta, size_t index);
// How near a replica is to its reader: reads go to the nearest available
// replica (CLI.md "Replicas (v3)"): on the reader's host (shared memory),
// then in its zone, then the one with the fewest bytes in flight.
struct ReplicaNearness {
  bool same_host = false;
  bool same_zone = false;
  int64_t bytes_in_flight = 0;
};
// Orders ReadLocations' `locations` nearest first: the available ones by
// `nearness` (replica order breaks ties), the unavailable ones last.
void NearestFirst(
    ShardLocations* locations,
    const std::function<ReplicaNearness(const ShardLocation&)>& nearness);

// The rule for writes: where a client writes shard `index` — its first
// replica alone, with the capability the metadata carries for it. The
// coordinator forwards the bytes to the other replicas at the commit
// (Orchestrator::Commit), so a client sends each byte once whatever R.
ShardLocations WriteLocations(const TensorMetadata& meta, size_t index);

// R: workers holding each shard of `meta` as a replica (every shard has as
// many; its mirror copies, listed after them, are not counted): 1 for a
// tensor without shards.
int64_t ReplicaCount(const TensorMetadata& meta);
// The copies of a shard: its R replicas, then its mirrors.
inline size_t MirrorCount(const ShardInfo& shard) {
  size_t n = 0;
  for (const Replica& r : shard.replicas) n += r.mirror ? 1 : 0;
  return n;
}
// `meta` has a mirror group, or mirror copies still to drop.
inline bool HasMirrors(const TensorMetadata& meta) {
  if (!meta.mirror.empty()) return true;
  for (const ShardInfo& shard : meta.shards) {
    if (MirrorCount(shard) > 0) return true;
  }
  return false;
}

}  // namespace tessera

#endif  // TESSERA_CORE_TENSOR_METADATA_H_
