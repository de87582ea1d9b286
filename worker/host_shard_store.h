// HostShardStore: shards in host memory. Thread-safe. Each shard's buffer is
// reference-counted, so reads in flight keep it alive after Free.
//
// Given a SharedMemoryArena, large shards live in its shared-memory blocks,
// so that a process on the same host can map them (Worker.MapShard and the
// arena name the block behind a pinned shard) instead of streaming them over
// TCP; a shard's block loses its name when the shard is freed, and its pages
// may serve a later shard of the same size once the last reader lets go
// (never a put's shards, which clients write). Without an arena, or without
// room in /dev/shm, shards live in private memory.
#ifndef TESSERA_WORKER_HOST_SHARD_STORE_H_
#define TESSERA_WORKER_HOST_SHARD_STORE_H_

#include <memory>

#include "absl/container/flat_hash_map.h"
#include "core/limits.h"
#include "transport/shared_memory_arena.h"
#include "worker/shard_files.h"
#include "worker/shard_store.h"
#include "worker/shard_table.h"

namespace tessera {

struct HostShardStoreOptions {
  // Most shard bytes held; 0 = no limit beyond what the system gives.
  // Counted as ShardStore::ChargedBytes says: each shard at least
  // `shard_charge_bytes`, freed shards until their readers let go.
  int64_t capacity_bytes = 0;
  int64_t shard_charge_bytes = kShardChargeBytes;
  // Where shards of at least `shared_memory_min_bytes` live; null: all
  // shards in private memory. Smaller ones stay private: a segment per tiny
  // shard costs a file and a mapping each, and small reads gain nothing
  // from it (they go by one gRPC call).
  std::shared_ptr<SharedMemoryArena> arena;
  int64_t shared_memory_min_bytes = kChunkBytes;
  // --store_dir: every shard in its own file there instead (the arena is
  // not used), persisted when committed (worker/shard_files.h).
  std::shared_ptr<ShardFiles> files;
};

class HostShardStore : public ShardStore {
 public:
  // Private memory only. capacity_bytes = 0: no limit beyond what the
  // system gives.
  explicit HostShardStore(int64_t capacity_bytes = 0);
  explicit HostShardStore(HostShardStoreOptions options);
  ~HostShardStore() override;

  using ShardStore::Allocate;
  absl::Status Allocate(uint64_t id, const ShardDesc& desc,
                        const InitFill& init) override;
  absl::Status Write(uint64_t id, int64_t byte_offset,
                     absl::string_view data) override;
  absl::Status WriteBox(uint64_t id, const Box& box, int64_t flat_begin,
                        int64_t count, const char* src) override;
  absl::Status ReadBox(uint64_t id, const Box& box, int64_t flat_begin,
                       int64_t count, char* dst) override;
  absl::Status CopyLocal(uint64_t src_id, const Box& src_box, uint64_t dst_id,
                         absl::Span<const int64_t> dst_offsets) override;
  absl::StatusOr<ShardDesc> Describe(uint64_t id) const override;
  absl::StatusOr<PinnedShard> Pin(uint64_t id) override;
  absl::Status Persist(uint64_t id, absl::string_view cluster_id) override;
  absl::Status Free(uint64_t id) override;
  int64_t BytesUsed() const override;
  int64_t ChargedBytes() const override;
  int64_t PinnedBytes() const override;
  std::vector<uint64_t> ShardIds() const override;

  // With `files`: takes back every intact shard the store directory holds
  // (call once, before serving), mapped as it was. Returns what the scan
  // found, and each shard's cluster in `owners`.
  absl::Status SetAside(uint64_t id) override;
  ShardFiles::ScanResult Reattach(
      absl::flat_hash_map<uint64_t, std::string>* owners);

 private:
  struct Shard;

  const HostShardStoreOptions options_;
  ShardTable<Shard> table_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_HOST_SHARD_STORE_H_
