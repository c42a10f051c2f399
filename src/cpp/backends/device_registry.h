#pragma once

#include <ringtree/device_backend.h>

namespace ringtree::detail {

// What registerDeviceBackend() recorded for `type`: the factory (null when none) and its
// name (null when none).
struct DeviceBackendRegistration {
  const char* name = nullptr;
  DeviceBackendFactory factory = nullptr;
};
DeviceBackendRegistration registeredDeviceBackend(DeviceType type);

}  // namespace ringtree::detail
