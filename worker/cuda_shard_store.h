// CudaShardStore: shards in one GPU's memory. Host-side CUDA runtime calls
// only (no kernels): allocation, memset, and one cudaMemcpy per contiguous
// run of a strided sub-box. Thread-safe; a read in flight keeps its shard's
// device memory alive after Free. Only built with --config=cuda.
#ifndef TESSERA_WORKER_CUDA_SHARD_STORE_H_
#define TESSERA_WORKER_CUDA_SHARD_STORE_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "worker/shard_store.h"

namespace tessera {

class CudaShardStore : public ShardStore {
 public:
  // `device`: the CUDA ordinal (checked by CheckCudaDevice beforehand).
  // capacity_bytes = 0: limited only by the GPU.
  CudaShardStore(int device, int64_t capacity_bytes);
  ~CudaShardStore() override;

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
  absl::Status Free(uint64_t id) override ABSL_LOCKS_EXCLUDED(mu_);
  int64_t BytesUsed() const override ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<uint64_t> ShardIds() const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Shard;
  absl::StatusOr<std::shared_ptr<Shard>> Find(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);

  const int device_;
  const int64_t capacity_bytes_;
  // Invariant: bytes_used_ == sum of the shards' bytes plus reservations of
  // allocations in progress.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Shard>> shards_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CUDA_SHARD_STORE_H_
