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

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "worker/shard_store.h"

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

  absl::Status Allocate(uint64_t id, const ShardDesc& desc, const InitSpec& init) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Write(uint64_t id, int64_t byte_offset, absl::string_view data) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WriteBox(uint64_t id, const Box& box, int64_t flat_begin, int64_t count,
                        const char* src) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReadBox(uint64_t id, const Box& box, int64_t flat_begin, int64_t count,
                       char* dst) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CopyLocal(uint64_t src_id, const Box& src_box, uint64_t dst_id,
                         absl::Span<const int64_t> dst_offsets) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ShardDesc> Describe(uint64_t id) const override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<PinnedShard> Pin(uint64_t id) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Free(uint64_t id) override ABSL_LOCKS_EXCLUDED(mu_);
  int64_t BytesUsed() const override ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<uint64_t> ShardIds() const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Shard;
  absl::StatusOr<std::shared_ptr<Shard>> Find(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);

  const HostShardStoreOptions options_;
  // Invariant: bytes_used_ == sum of ByteSize() over shards_ plus bytes
  // reserved by allocations in progress.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Shard>> shards_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_HOST_SHARD_STORE_H_
