// DeviceShardView: one shard of a tensor, held in GPU memory by a worker on
// this host, opened in this process through CUDA IPC (Client::MapDevice).
// Plain values, so the SDK's header needs no CUDA headers.
#ifndef TESSERA_CLIENT_DEVICE_VIEW_H_
#define TESSERA_CLIENT_DEVICE_VIEW_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "core/box.h"

namespace tessera {

struct DeviceShardView {
  size_t index = 0;  // the shard's place in describe order
  Box box;           // the shard's box in the tensor
  // The shard's bytes, row-major over box.sizes, on CUDA device `device` of
  // this process. Read-only by contract: other readers share them.
  const void* data = nullptr;
  int device = 0;
  std::string worker;  // the worker that holds it
  // The worker keeps the memory at least until then, even if the tensor is
  // replaced or deleted; map again to renew (NOT_FOUND once it is freed).
  absl::Time valid_until;
  std::shared_ptr<const void> mapping;  // keeps this process's mapping open
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_DEVICE_VIEW_H_
