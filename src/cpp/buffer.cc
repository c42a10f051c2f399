#include <ringtree/buffer.h>

#include <string>

namespace ringtree {

const char* deviceTypeName(DeviceType type) {
  switch (type) {
    case DeviceType::kCpu: return "cpu";
    case DeviceType::kCuda: return "cuda";
  }
  return "unknown device type";
}

std::string deviceName(const Device& device) {
  if (device.type == DeviceType::kCpu) return "cpu";
  return std::string(deviceTypeName(device.type)) + ":" + std::to_string(device.index);
}

}  // namespace ringtree
