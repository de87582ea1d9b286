#include "worker/gpu_support.h"

#include <atomic>

namespace tessera {
namespace {

std::atomic<const GpuSupport*> registered{nullptr};

}  // namespace

const GpuSupport* RegisteredGpuSupport() { return registered.load(); }

bool RegisterGpuSupport(const GpuSupport* support) {
  registered.store(support);
  return true;
}

}  // namespace tessera
