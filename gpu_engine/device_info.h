#pragma once
// Which GPU we run on, for reports ("NVIDIA H100 80GB HBM3, sm_90") and for gpu tests that must
// skip, with the reason, on machines without one (CI).
#include <optional>
#include <string>

namespace qparity::gpu {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  size_t total_memory = 0;
  int multiprocessors = 0;
  std::string sm() const { return "sm_" + std::to_string(sm_major) + std::to_string(sm_minor); }
};

// The device, or nullopt with `why_not` saying why (no driver, no device, ...).
std::optional<DeviceInfo> query_device(int index, std::string* why_not);

}  // namespace qparity::gpu
