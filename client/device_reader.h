// DeviceReader: the SDK's GPU side (built only with --config=cuda). For a
// client that has a GPU, shards that a worker on the same host keeps in GPU
// memory are opened through CUDA IPC (Worker.MapShard with device_handle)
// and either handed out as device pointers (zero copy: the weight-loading
// case, an engine mapping its weights from the worker daemon) or copied
// device to device into the caller's own device buffer. Shards it cannot
// open that way (another host, host memory, a GPU this process does not
// see) are read through the host data plane into page-locked memory and
// copied up. Each shard is opened from the first of its replicas, nearest
// first, that opens here: a replica whose worker is gone is passed over by
// the rule host reads follow (ReadFromAnyReplica).
//
// An opened shard is valid until the worker's export hold ends
// (`valid_until`); a later use renews it with another MapShard, which fails
// with NOT_FOUND once the shard is freed. Opened handles are kept (at most
// kMaxOpened, least recently renewed dropped first); a sweeper closes those
// past their hold that no view uses within a second, since an open handle
// keeps the worker's device memory allocated. Thread-safe.
#ifndef TESSERA_CLIENT_DEVICE_READER_H_
#define TESSERA_CLIENT_DEVICE_READER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/connection.h"
#include "client/device_access.h"
#include "client/device_view.h"
#include "core/box.h"
#include "core/box_index.h"
#include "core/tensor_metadata.h"
#include "transport/shard_transport.h"

namespace tessera {

// OK when this process can use a GPU; otherwise FAILED_PRECONDITION with
// CUDA's words (no GPU, no driver).
absl::Status CheckCudaAvailable();

class DeviceReader : public DeviceAccess {
 public:
  static constexpr size_t kMaxOpened = 1024;

  // `connection` is not owned and outlives the reader.
  explicit DeviceReader(Connection* connection);
  ~DeviceReader() override;

  // DeviceAccess:
  absl::Status GatherRegion(const TensorMetadata& meta, const BoxIndex* index,
                            const Box& region, char* dst, int device) override;
  absl::StatusOr<std::vector<DeviceShardView>> Map(
      const TensorMetadata& meta) override;
  int64_t ipc_bytes() const override { return ipc_bytes_.load(); }

 private:
  struct Opened;
  // Shard `shard` opened here, renewed if its hold is near its end.
  absl::StatusOr<std::shared_ptr<Opened>> Open(const RemoteShard& shard)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The local ordinal of the GPU with this 16-byte UUID, or -1.
  int DeviceWithUuid(const std::string& uuid);

  Connection* const connection_;
  std::atomic<int64_t> ipc_bytes_{0};
  absl::Mutex mu_;
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<Opened>> opened_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::string> uuids_ ABSL_GUARDED_BY(mu_);  // by ordinal
  bool uuids_read_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stop_;
  std::thread sweeper_;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_DEVICE_READER_H_
