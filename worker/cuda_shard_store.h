// CudaShardStore: shards in one GPU's memory. Host-side CUDA runtime calls
// only (no kernels): allocation, memset, and one cudaMemcpy per contiguous
// run of a strided sub-box. Thread-safe; a read in flight keeps its shard's
// device memory alive after Free, and so does an IPC export until its hold
// ends (a sweeper thread lets go within a second of that). Only built with
// --config=cuda.
#ifndef TESSERA_WORKER_CUDA_SHARD_STORE_H_
#define TESSERA_WORKER_CUDA_SHARD_STORE_H_

#include <map>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "worker/shard_store.h"
#include "worker/shard_table.h"

namespace tessera {

// A shard's device memory, kept allocated while `keep` lives (an exchange
// sends from it and receives into it).
struct DeviceShardBytes {
  char* data = nullptr;
  ShardDesc desc;
  std::shared_ptr<void> keep;
};

class CudaShardStore : public ShardStore {
 public:
  // `device`: the CUDA ordinal (checked by CheckCudaDevice beforehand).
  // capacity_bytes = 0: limited only by the GPU.
  CudaShardStore(int device, int64_t capacity_bytes);
  ~CudaShardStore() override;

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
  absl::Status Free(uint64_t id) override;
  int64_t BytesUsed() const override;
  int64_t ChargedBytes() const override;
  int64_t PinnedBytes() const override;
  std::vector<uint64_t> ShardIds() const override;

  std::optional<DeviceInfo> Device() const override;
  std::optional<DeviceMemory> DeviceMemoryNow() const override;
  absl::StatusOr<std::string> ExportDevice(uint64_t id,
                                           absl::Duration hold) override;
  absl::StatusOr<std::shared_ptr<void>> RegisterStaging(void* data,
                                                        int64_t bytes) override;

  int device() const { return device_; }
  // NOT_FOUND when shard `id` is not held.
  absl::StatusOr<DeviceShardBytes> DeviceBytes(uint64_t id) const;

 private:
  struct Shard;
  // An exported shard's memory, kept until `until`.
  struct Hold {
    std::shared_ptr<Shard> shard;
    absl::Time until;
  };
  void DropExpiredHolds() ABSL_LOCKS_EXCLUDED(holds_mu_);

  const int device_;
  std::string uuid_;  // the device's, read once
  ShardTable<Shard> table_;
  absl::Mutex holds_mu_;
  std::map<uint64_t, Hold> holds_ ABSL_GUARDED_BY(holds_mu_);
  absl::Notification stop_;
  std::thread sweeper_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CUDA_SHARD_STORE_H_
