// The worker's GPU side (worker/gpu_support.h), registered before main in a
// build with CUDA.
#include <memory>
#include <string>

#include "worker/cuda_shard_store.h"
#include "worker/cuda_status.h"
#include "worker/gpu_support.h"
#include "worker/nccl_exchange.h"

namespace tessera {
namespace {

const GpuSupport kCudaSupport = {
    .check_device = &CheckCudaDevice,
    .make_store = [](int index,
                     int64_t capacity_bytes) -> std::unique_ptr<ShardStore> {
      return std::make_unique<CudaShardStore>(index, capacity_bytes);
    },
    .device_uuid = &CudaDeviceUuid,
    .make_exchange = [](ShardStore* store) -> std::unique_ptr<DeviceExchange> {
      return std::make_unique<NcclExchange>(
          static_cast<CudaShardStore*>(store));
    },
};

const bool registered = RegisterGpuSupport(&kCudaSupport);

}  // namespace
}  // namespace tessera
