// DeviceLikeStore: a HostShardStore that reports a GPU. Its bytes stay in
// host memory, so the paths a worker takes for device shards — staged reads
// (Worker.StageRead), device answers to MapShard, peers pulling staged — run
// on machines without a GPU. Tests and fuzzers only; the CUDA copies behind
// those paths run in tests/gpu_test.
#ifndef TESSERA_WORKER_TESTING_DEVICE_LIKE_STORE_H_
#define TESSERA_WORKER_TESTING_DEVICE_LIKE_STORE_H_

#include <optional>
#include <string>

#include "worker/host_shard_store.h"

namespace tessera {

class DeviceLikeStore : public HostShardStore {
 public:
  using HostShardStore::HostShardStore;
  // The device's 16 UUID bytes, as CUDA would report them.
  static std::string Uuid() { return std::string(16, 'u'); }
  std::optional<DeviceInfo> Device() const override {
    DeviceInfo info;
    info.uuid = Uuid();
    return info;
  }
  std::optional<DeviceMemory> DeviceMemoryNow() const override {
    DeviceMemory memory;
    memory.total_bytes = int64_t{1} << 30;
    memory.free_bytes = int64_t{1} << 29;
    return memory;
  }
};

}  // namespace tessera

#endif  // TESSERA_WORKER_TESTING_DEVICE_LIKE_STORE_H_
