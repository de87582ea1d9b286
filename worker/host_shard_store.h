// HostShardStore: shards in host memory. Thread-safe. Each shard's buffer is
// reference-counted, so reads in flight keep it alive after Free.
//
// Large shards live in POSIX shared-memory segments (/dev/shm), so that a
// client on the same host can map them read-only (Worker.MapShard) instead of
// streaming them over TCP. Segment names carry the worker's pid and a random
// suffix and are never reused; a segment is unlinked when its shard is freed
// (existing mappings keep the old bytes), and segments of dead workers are
// removed when a store starts. Without /dev/shm space the store falls back
// to private memory.
#ifndef TESSERA_WORKER_HOST_SHARD_STORE_H_
#define TESSERA_WORKER_HOST_SHARD_STORE_H_

#include <memory>

#include "worker/shard_store.h"
#include "worker/shard_table.h"

namespace tessera {

struct HostShardStoreOptions {
  // Most shard bytes held; 0 = no limit beyond what the system gives.
  int64_t capacity_bytes = 0;
  // Keep shards of at least `shared_memory_min_bytes` in shared memory.
  // Smaller ones stay private: a segment per tiny shard costs a file and a
  // mapping each, and small reads gain nothing from it.
  bool shared_memory = true;
  int64_t shared_memory_min_bytes = 1 << 20;
};

class HostShardStore : public ShardStore {
 public:
  // capacity_bytes = 0: no limit beyond what the system gives.
  explicit HostShardStore(int64_t capacity_bytes = 0);
  explicit HostShardStore(HostShardStoreOptions options);
  ~HostShardStore() override;

  absl::Status Allocate(uint64_t id, const ShardDesc& desc,
                        const InitSpec& init) override;
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
  absl::Status Free(uint64_t id) override;
  int64_t BytesUsed() const override;
  std::vector<uint64_t> ShardIds() const override;

 private:
  struct Shard;

  const HostShardStoreOptions options_;
  ShardTable<Shard> table_;
  // See PinnedShard::liveness; empty without shared memory.
  std::string liveness_;
  int liveness_fd_ = -1;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_HOST_SHARD_STORE_H_
