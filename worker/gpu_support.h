// A worker's GPU side as the daemon sees it. Only a build with CUDA has one:
// worker/cuda_support.cc, which --config=cuda links into tessera-worker,
// registers it before main. A registry rather than a dependency of the
// daemon, so that CUDA's headers reach only the sources that use them and a
// --config=cuda build recompiles those alone, not every target that links
// the worker.
#ifndef TESSERA_WORKER_GPU_SUPPORT_H_
#define TESSERA_WORKER_GPU_SUPPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/device_exchange.h"
#include "worker/shard_store.h"

namespace tessera {

struct GpuSupport {
  // OK when CUDA device `index` can be used; else why not (no GPU, no
  // driver, index out of range).
  absl::Status (*check_device)(int index);
  // A store of `capacity_bytes` in device `index`'s memory.
  std::unique_ptr<ShardStore> (*make_store)(int index, int64_t capacity_bytes);
  // Device `index`'s UUID (core/placement.h GpuUuid).
  absl::StatusOr<std::string> (*device_uuid)(int index);
  // NCCL send/recv between GPU workers over `store`, a store make_store
  // returned (not owned; outlives the exchange).
  std::unique_ptr<DeviceExchange> (*make_exchange)(ShardStore* store);
};

// The registered GPU side, or null in a build without CUDA.
const GpuSupport* RegisteredGpuSupport();

// Registers `support` (static, not owned); returns true, for use in a
// static initializer.
bool RegisterGpuSupport(const GpuSupport* support);

}  // namespace tessera

#endif  // TESSERA_WORKER_GPU_SUPPORT_H_
