#include "worker/testing/device_like_gpu.h"

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/placement.h"
#include "worker/gpu_support.h"
#include "worker/testing/device_like_store.h"

namespace tessera {
namespace {

const GpuSupport kDeviceLikeGpu = {
    .check_device = [](int index) -> absl::Status {
      if (index != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("no device ", index, ": the device-like GPU is 0"));
      }
      return absl::OkStatus();
    },
    .make_store = [](int index,
                     int64_t capacity_bytes) -> std::unique_ptr<ShardStore> {
      HostShardStoreOptions options;
      options.capacity_bytes = capacity_bytes;
      return std::make_unique<DeviceLikeStore>(options);
    },
    // The one its stores report, as the CUDA side derives both from the
    // same device.
    .device_uuid = [](int index) -> absl::StatusOr<std::string> {
      unsigned char bytes[16];
      std::memcpy(bytes, DeviceLikeStore::Uuid().data(), sizeof(bytes));
      return GpuUuid(bytes);
    },
    .make_exchange = [](ShardStore* store) -> std::unique_ptr<DeviceExchange> {
      return nullptr;
    },
};

}  // namespace

void UseDeviceLikeGpu() { RegisterGpuSupport(&kDeviceLikeGpu); }

}  // namespace tessera
