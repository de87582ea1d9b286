// The SDK's GPU side as Client sees it: device-to-device reads and mapped
// device views of shards. Only a build with CUDA has one:
// client/device_reader.cc (CUDA IPC), which --config=cuda links into the
// SDK's shared library and the Python module, registers its maker before
// main. A registry rather than a dependency of the SDK, so that CUDA's
// headers reach only the sources that use them and a --config=cuda build
// recompiles those alone, not every target that links the SDK.
#ifndef TESSERA_CLIENT_DEVICE_ACCESS_H_
#define TESSERA_CLIENT_DEVICE_ACCESS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/connection.h"
#include "client/device_view.h"
#include "core/box.h"
#include "core/box_index.h"
#include "core/tensor_metadata.h"

namespace tessera {

class DeviceAccess {
 public:
  virtual ~DeviceAccess() = default;

  // Copies `region` (tensor coordinates, validated) of the tensor `meta`
  // describes into `dst`, a row-major device array of region.sizes elements
  // on CUDA device `device`, and waits for the copies.
  virtual absl::Status GatherRegion(const TensorMetadata& meta,
                                    const BoxIndex* index, const Box& region,
                                    char* dst, int device) = 0;

  // Every shard of `meta` held in GPU memory by a worker on this host,
  // opened for this process. FAILED_PRECONDITION naming the shard when one
  // cannot be opened here.
  virtual absl::StatusOr<std::vector<DeviceShardView>> Map(
      const TensorMetadata& meta) = 0;

  // Bytes copied device to device through CUDA IPC so far.
  virtual int64_t ipc_bytes() const = 0;
};

// Makes the GPU side over `connection` (not owned; outlives it), or says
// why this process cannot have one (no GPU, no driver).
using DeviceAccessMaker =
    absl::StatusOr<std::unique_ptr<DeviceAccess>> (*)(Connection* connection);

// The registered maker, or null in a build without CUDA.
DeviceAccessMaker RegisteredDeviceAccess();

// Registers `maker`; returns true, for use in a static initializer.
bool RegisterDeviceAccess(DeviceAccessMaker maker);

}  // namespace tessera

#endif  // TESSERA_CLIENT_DEVICE_ACCESS_H_
