#include "client/device_access.h"

#include <atomic>

namespace tessera {
namespace {

std::atomic<DeviceAccessMaker> registered{nullptr};

}  // namespace

DeviceAccessMaker RegisteredDeviceAccess() { return registered.load(); }

bool RegisterDeviceAccess(DeviceAccessMaker maker) {
  registered.store(maker);
  return true;
}

}  // namespace tessera
